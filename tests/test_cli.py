import gc
import json
import os
import re

import pytest

from spanflow.cli.main import main
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained once through the CLI on synthetic JSONL data."""
    d = tmp_path_factory.mktemp("cli")
    data = synthetic_ner(60, seed=4, max_clauses=1)
    train = d / "train.jsonl"
    with open(train, "w", encoding="utf-8") as f:
        for e in data:
            write_jsonl_record(f, e.text, e.spans)
    rc = main(["train", "ner", "--train", str(train), "--dev", str(train), "--model", "tiny", "--out",
               str(d / "run"), "--epochs", "10", "--lr", "2e-2", "--max-tokens", "512", "--max-length", "64"])
    assert rc == 0
    return d, data


def test_evaluate_json_shape(trained, capsys, monkeypatch):
    import types

    from spanflow.cli import evaluate

    ticks = iter(range(0, 10**6, 7))  # a patched clock: every reading 7 "s" on, so scoring reads 7
    monkeypatch.setattr(evaluate, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    d, _ = trained
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(d / "train.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"f1", "precision", "recall", "support", "per_label"} <= set(out)
    assert out["seconds"] == 7.0  # what scoring took on that clock: the field reports it, as read
    assert out["f1"] > 0.9 and set(out["per_label"]["PER"]) == {"f1", "precision", "recall", "support"}


def test_evaluate_table(trained, capsys):
    d, _ = trained
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(d / "train.jsonl")]) == 0
    out, err = capsys.readouterr()
    assert "overall" in out and "PER" in out and "warning" not in err
    n = sum(1 for _ in open(d / "train.jsonl"))
    assert re.search(rf"^scored {n} examples in [\d.]+ s \(\d+ a second; loading the model and data not counted\)$",
                     out.splitlines()[-1]), out
    plain = d / "no_entities.jsonl"  # texts without entities: F1 0 whatever the model finds, and said so
    plain.write_text('{"text": "nothing to find here", "entities": []}\n', encoding="utf-8")
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(plain)]) == 0
    assert f"warning: {plain} holds no gold entities or triples: recall and F1 are 0 whatever the model finds" in \
        capsys.readouterr().err
    texts = d / "texts.jsonl"  # texts and no labels' key: texts to run a model on, refused as a .txt is (was scored 0)
    texts.write_text('{"text": "nothing to find here"}\n{"text": "nor here", "source": "web"}\n', encoding="utf-8")
    from spanflow.runtime.loads import Loads

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Loads, "__init__", lambda *a, **kw: pytest.fail("a model was loaded"))  # told before
        assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(texts)]) == 2
    assert f'error: {texts}: holds texts and no labels (no JSONL record holds "entities" or "spans")' \
        in capsys.readouterr().err  # a field of metadata beside the text is no label
    late = d / "late.jsonl"  # a labels' key past the sniffed head: labelled data
    late.write_text('{"text": "a b"}\n' * 30 + '{"text": "Ann", "entities": [[0, 3, "PER"]]}\n', encoding="utf-8")
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(late)]) == 0


def test_predict_keeps_order_and_writes_error_records(trained, tmp_path, capsys):
    d, data = trained
    inp = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": data[0].text}), "{broken", json.dumps({"text": ""}), json.dumps({"text": data[1].text})]
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(inp), "--output", str(out)]) == 0
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(recs) == 4
    assert recs[0]["text"] == data[0].text and recs[3]["text"] == data[1].text
    assert recs[1] == {"line": 2, "error": recs[1]["error"]} and "invalid JSON" in recs[1]["error"]
    assert recs[2] == {"text": "", "entities": []}
    assert [(x["start"], x["end"], x["label"]) for x in recs[0]["entities"]] == data[0].spans
    assert all(recs[0]["text"][x["start"]:x["end"]] == x["text"] for x in recs[0]["entities"])
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".predict-")]  # no temp file left behind
    err = capsys.readouterr().err
    assert "text/s" not in err and "\r" not in err  # stderr is no terminal here: no progress-bar frames
    assert gc.get_freeze_count() > 0  # the loaded model was kept out of the collector's full passes


def test_plain_text_predict(trained, tmp_path):
    d, data = trained
    inp = tmp_path / "in.txt"
    inp.write_text(data[2].text + "\n\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(inp), "--output", str(out)]) == 0
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(recs) == 2 and recs[1]["entities"] == []


def run_err(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    return err


def test_user_errors_are_one_line(trained, tmp_path, capsys):
    d, _ = trained
    model = str(d / "run" / "model")
    err = run_err(["train", "ner", "--train", str(tmp_path / "nope.conll"), "--out", str(tmp_path / "o")], capsys)
    assert "nope.conll: file not found" in err
    err = run_err(["predict", "--model", str(tmp_path / "nomodel"), "--input", str(d / "train.jsonl"),
                   "--output", str(tmp_path / "x.jsonl")], capsys)
    assert "model directory not found" in err
    other = tmp_path / "re_model"
    other.mkdir()
    (other / "spanflow.json").write_text(json.dumps({"task": "re"}))
    err = run_err(["train", "ner", "--train", str(d / "train.jsonl"), "--model", str(other), "--out",
                   str(tmp_path / "o2")], capsys)
    assert "is a model of task 're'" in err and "'ner'" in err
    # tune of it as another task, no --mode: tuned as its own task, or training from its encoder (not
    # "training 'ner' starts from an encoder directory", a training never asked for)
    err = run_err(["tune", "--task", "ner", "--model", str(other), "--data", str(d / "train.jsonl"), "--out",
                   str(tmp_path / "t")], capsys)
    assert "is a model of task 're' (its spanflow.json says so), not 'ner': tune measures it as 're'" in err
    assert f"--model {other / 'encoder'} --mode train measures training 'ner' from its encoder" in err
    (other / "spanflow.json").write_text(json.dumps({"task": "parser"}))
    err = run_err(["evaluate", "--model", str(other), "--data", str(d / "train.jsonl")], capsys)
    assert "is a 'parser' model" in err
    err = run_err(["predict", "--model", model, "--input", str(tmp_path / "missing.txt"),
                   "--output", str(tmp_path / "x.jsonl")], capsys)
    assert "missing.txt: file not found" in err
    bad = tmp_path / "bad.conll"
    bad.write_text("a O\nb\n", encoding="utf-8")
    err = run_err(["train", "ner", "--train", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert "bad.conll:2:" in err
    err = run_err(["train", "ner", "--train", str(d / "train.jsonl"), "--model", str(tmp_path / "nodir"),
                   "--out", str(tmp_path / "o")], capsys)
    assert "model directory not found" in err


def test_python_m_entry_point():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "spanflow", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train" in r.stdout and "predict" in r.stdout


def test_a_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """The command's modules take about a second to import (torch): a Ctrl-C then was a traceback."""
    import sys
    import types

    from spanflow.cli import entry

    class Importing(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "spanflow.cli.main", Importing("spanflow.cli.main"))
    assert entry() == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_predict_reads_csv_columns_like_embed(trained, tmp_path):
    d, data = trained
    src = tmp_path / "in.csv"
    src.write_text('id,text\n7,"' + data[0].text.replace('"', '""') + '"\n8,"' + data[1].text + '"\n',
                   encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(src), "--output", str(out),
                 "--column", "1", "--skip-header"]) == 0
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in recs] == [data[0].text, data[1].text]
    # --field names the header's column too, the default's name typed included (not the ids of column 0)
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(src), "--output", str(out),
                 "--field", "text"]) == 0
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in recs] == [data[0].text, data[1].text]


def test_evaluate_names_the_labels_the_model_does_not_know(trained, tmp_path, capsys):
    d, data = trained
    renamed = tmp_path / "renamed.jsonl"  # the same data, its PER spans called "person"
    with open(renamed, "w", encoding="utf-8") as f:
        for e in data:
            write_jsonl_record(f, e.text, [(s, t, "person" if lab == "PER" else lab) for s, t, lab in e.spans])
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(renamed), "--json"]) == 0
    out, err = capsys.readouterr()
    m = json.loads(out)  # stdout keeps its one JSON object; the warning is on stderr and in the object
    warning = "1 of the data's labels is not the model's and counts as a miss: person (the model's PER?)"
    assert [x for x in err.splitlines() if x.startswith("warning")] == [f"warning: {warning}"]
    assert m["warnings"] == [warning]
    assert m["per_label"]["person"]["f1"] == 0.0 and m["per_label"]["LOC"]["f1"] > 0.9
    assert main(["evaluate", "--model", str(d / "run" / "model"), "--data", str(d / "train.jsonl")]) == 0
    assert "warning" not in capsys.readouterr().err  # the model's own labels: nothing to say


def test_predict_on_an_empty_input_says_so(trained, tmp_path, capsys):
    d, _ = trained
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(empty), "--output",
                 str(tmp_path / "out.jsonl")]) == 0
    out, err = capsys.readouterr()
    assert "wrote 0 records" in out and f"warning: {empty} holds no texts (an empty file?)" in err


def test_predict_says_how_fast_its_texts_went(trained, tmp_path, capsys):
    from spanflow.tasks.ner import NerModel

    d, data = trained
    texts = [e.text for e in data[:12]]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(texts) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(inp),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("wrote 12 records"))
    m = re.search(r" in ([\d.]+) s: ([\d.]+) texts/s, ([\d.]+) real tokens/s, padding efficiency ([\d.]+)$", line)
    assert m, line
    per_s, tok_s, eff = float(m[2]), float(m[3]), float(m[4])  # below 10 a rate has two significant digits
    tok = NerModel.load(str(d / "run" / "model")).tokenizer
    real = sum(len(tok(t)["input_ids"]) for t in texts)  # each text one window, its special tokens included
    # both rates are of one time, so they count in the same ratio as the work: the real tokens of a text
    # (what is checked is the counting; the rates themselves are the machine's)
    assert tok_s * 12 == pytest.approx(per_s * real, rel=0.05)
    assert 0 < eff <= 1
    bad = tmp_path / "bad.jsonl"  # error records only: no text ran (it said "977 texts/s")
    bad.write_text('{"text": 5}\n{"body": "x"}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(bad),
                 "--output", str(tmp_path / "bad_out.jsonl")]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("wrote 2 records"))
    assert line == f"wrote 2 records to {tmp_path / 'bad_out.jsonl'} (2 error records)", line


def test_an_error_line_is_one_write(tmp_path, monkeypatch):
    """Unbuffered (PYTHONUNBUFFERED), print wrote a line and its newline apart: the error lines of the
    ranks of --devices N, printed at once, ran together on one line."""
    import sys

    writes = []

    class Stderr:
        def write(self, s):
            writes.append(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Stderr())
    assert main(["convert", str(tmp_path / "missing.conll"), str(tmp_path / "x.jsonl")]) == 2
    assert len(writes) == 1 and writes[0].startswith("error: ") and writes[0].endswith("\n"), writes
