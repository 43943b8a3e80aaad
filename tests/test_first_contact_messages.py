"""What a new user is told on a first wrong try: data of another task named as what it is (by its
content, whatever its name), a --model that is a training folder or another task's model, a tag
scheme that does not fit, and the formats a command cannot write, each before any model loads."""
import json
import os
import re

import pytest

from spanflow.cli.main import main
from spanflow.data.formats.sniff import sniff
from spanflow.data.io import read_ner, read_re
from spanflow.errors import DataError, ModelDirError
from spanflow.tasks.embed.pairs import read_pairs
from spanflow.tasks.registry import check_model_for, task_of_dir

CASREL = [{"text": "Alan Bean was born in Wheeler .", "triple_list": [["Alan Bean", "birthPlace", "Wheeler"]]},
          {"text": "Ann lives in Rome .", "triple_list": []}]
CONLL = "Ann B-PER\nlives O\nin O\nRome B-LOC\n.\tO\n\nBob B-PER\nsmiled O\n"
SCORED = ('A man is playing a guitar.,A man plays the guitar.,4.8\n'
          'A woman is slicing an onion.,A woman is cutting an onion.,4.2\n'
          '"Dogs run, fast.",A cat sleeps on the sofa.,0.4\n')
RE_JSONL = '{"text": "Ann lives in Rome .", "relations": [{"head": [0, 3], "type": "lives_in", "tail": [13, 17]}]}\n'


def write(tmp_path, name, content):
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content, indent=4), encoding="utf-8")
    return str(p)


@pytest.mark.parametrize("name, content, kind", [
    ("a.json", CASREL, "casrel"),
    ("a.txt", CONLL, "conll"),
    ("a.csv", SCORED, "scored-pairs"),
    ("a.tsv", "Who wrote it?\tShe wrote the book.\nIs it far?\tIt is two miles away.\n", "pairs"),
    ("a.jsonl", RE_JSONL, "re-jsonl"),
    ("a.jsonl", '{"text": "Ann", "entities": [[0, 3, "PER"]]}\n', "ner-jsonl"),
    ("a.jsonl", '{"sentence1": "a b", "sentence2": "c d", "score": 1}\n', "pairs-jsonl"),
    ("a.txt", "The first text is here.\nAnd a second one follows it.\n", "text"),
    ("a.conll", "a O\nb\n", None),  # half tagged: the reader's own line error says more
    ("a.tsv", "a\tb\t0\nc\td\t5\n", None),  # short cells: tokens or texts, not known
])
def test_sniff_tells_formats_by_content(tmp_path, name, content, kind):
    got = sniff(write(tmp_path, name, content))
    assert (got.name if got else None) == kind


def test_a_json_list_whose_first_text_is_long_is_told_by_its_keys(tmp_path):
    """The keys after a first record's text of 100 KB lie past the 64 KiB read first: CasRel JSON
    was read as JSONL and refused as `line 1: expected an object ...`, not named as relation data."""
    import json

    p = tmp_path / "big.json"
    p.write_text(json.dumps([{"text": "word " * 20000, "triple_list": [["word", "r", "word"]]}]), encoding="utf-8")
    assert sniff(p).name == "casrel"
    with pytest.raises(DataError, match=r"this is CasRel JSON"):
        read_ner(str(p))


def test_a_damaged_docbin_is_named_a_docbin_not_text(tmp_path):
    """A DocBin with bytes flipped past its start fails to inflate: it was sniffed as text ("this is
    plain text lines, texts to run a model on"), overruling --from docbin."""
    import zlib

    raw = bytearray(zlib.compress(bytes(range(256)) * 64))
    raw[200:260] = bytes(x ^ 255 for x in raw[200:260])
    p = tmp_path / "d.spacy"
    p.write_bytes(bytes(raw))
    assert sniff(p).name == "docbin"
    latin = tmp_path / "l.conll"  # opens as zlib's header does (x^), but holds no control bytes: text
    latin.write_bytes("x^\tO\ncaf\u00e9\tB-LOC\n\n".encode("latin-1"))
    assert sniff(latin).name == "conll"


def test_a_json_list_of_ner_records_is_told_the_command_that_makes_jsonl(tmp_path):
    """Not "this is ... NER spans ...; convert reads NER data only": the jq line that makes it JSONL."""
    p = write(tmp_path, "list.json", '[\n  {"text": "Ann ran", "entities": [[0, 3, "PER"]]}\n]\n')
    with pytest.raises(DataError) as e:
        read_ner(p)
    assert str(e.value) == (f'{p}: this is a JSON list of {{"text", "entities"}} records; NER spans are read as '
                            f"JSONL, one record a line: jq -c '.[]' {p} > {p[:-5]}.jsonl")


def test_data_of_another_task_is_named_with_what_reads_it(tmp_path):
    casrel, conll, scored = write(tmp_path, "t.json", CASREL), write(tmp_path, "d.conll", CONLL), \
        write(tmp_path, "s.csv", SCORED)
    with pytest.raises(DataError) as e:
        read_ner(casrel)
    assert str(e.value).startswith(f'{casrel}: this is CasRel JSON (a list of {{"text", "triple_list"}} records), '
                                   "relation data ('spanflow train re'; evaluate with a relation model); NER data is ")
    with pytest.raises(DataError, match=r"this is CoNLL columns .*, NER data \('spanflow train ner'; .*; relation "
                                        r"data is CasRel JSON"):
        read_re(conll)
    with pytest.raises(DataError, match=r"this is scored pairs \(sentence, sentence, score\) as CSV, embedding pairs "
                                        r"\('spanflow train embed'"):
        read_ner(scored)
    with pytest.raises(DataError, match=r"this is CoNLL columns .*; embedding data is pairs"):
        read_pairs(conll)
    with pytest.raises(DataError, match="this is CasRel JSON"):
        read_pairs(casrel)


def test_content_wins_over_the_extension(tmp_path):
    assert read_ner(write(tmp_path, "d.json", CONLL))[0].entities() == [("Ann", "PER"), ("Rome", "LOC")]
    (ex,) = read_re(write(tmp_path, "r.json", RE_JSONL))  # JSONL relations named .json
    assert ex.triples == [((0, 3), "lives_in", (13, 17))]
    with pytest.raises(DataError, match=r"format 'jsonl' was asked \(--format; convert's --from\), but this is "
                                        "CoNLL columns .*: leave it out, or ask for 'conll'"):
        read_ner(write(tmp_path, "e.conll", CONLL), fmt="jsonl")


def test_a_scheme_that_does_not_fit_suggests_the_detected_one(tmp_path, asset):
    with pytest.raises(DataError) as e:
        read_ner(asset("resume_like.bmes"), scheme="bio")
    assert "is not valid in the BIO scheme (asked); this file's tags are BMES: use --scheme bmes, or leave " \
           "--scheme out" in str(e.value)


def test_strict_says_what_it_refuses(tmp_path):
    p = write(tmp_path, "o.conll", "Ann B-PER\nin O\nRome I-LOC\n")
    with pytest.raises(DataError) as e:
        read_ner(p, strict=True)
    assert e.value.line == 3 and "read as its start" not in str(e.value)
    assert "tag 'I-LOC' follows no B-LOC tag: strict reading (--strict) refuses an inside tag that opens no " \
           "entity" in str(e.value)


def fake_run(tmp_path, task="ner", saved=True):
    """A training --out folder: OUT/model (or only OUT/checkpoint/model, a run stopped early)."""
    out = tmp_path / "run"
    model = out / ("model" if saved else "checkpoint/model")
    (model / "encoder").mkdir(parents=True)
    (model / "spanflow.json").write_text(json.dumps({"format_version": 2, "task": task}))
    (model / "encoder" / "config.json").write_text("{}")
    return str(out), str(model)


def test_a_training_folder_given_as_model_says_where_the_model_is(tmp_path):
    out, model = fake_run(tmp_path)
    with pytest.raises(ModelDirError, match=f"^{out} is a training output folder, not a model directory: did you "
                                            f"mean {model}\\?$"):
        task_of_dir(out)
    with pytest.raises(ModelDirError, match=f"is a file; a model is a directory: did you mean {model}\\?"):
        task_of_dir(f"{model}/spanflow.json")


def test_a_checkpoint_given_as_model_points_at_the_runs_model(tmp_path):
    out, model = fake_run(tmp_path)
    last = f"{out}/checkpoint/model"
    (tmp_path / "run" / "checkpoint" / "model" / "encoder").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "model" / "spanflow.json").write_text(json.dumps({"format_version": 2,
                                                                                        "task": "ner"}))
    said = (f"{out}/checkpoint is a training run's checkpoint, not a model directory: did you mean the run's "
            f"model, {model}? (the checkpoint's last weights are {last})")
    with pytest.raises(ModelDirError, match=f"^{re.escape(said)}$"):
        task_of_dir(f"{out}/checkpoint")


def test_a_run_that_has_not_saved_a_model_points_at_its_checkpoint(tmp_path):
    out, last = fake_run(tmp_path, saved=False)
    for given in (out, f"{out}/model"):
        with pytest.raises(ModelDirError, match=f"the run in {out} has not saved a model yet, .* its last "
                                                f"checkpoint's model is {last}"):
            task_of_dir(given)


def test_the_python_api_points_from_a_training_folder_to_its_model(tmp_path):
    from spanflow.tasks.ner import NerModel

    out, model = fake_run(tmp_path)
    with pytest.raises(ModelDirError, match=f"^{out} is a training output folder, not a model directory: did you "
                                            f"mean {model}\\?$"):
        NerModel.load(out)
    out2, last = fake_run(tmp_path / "early", saved=False)
    with pytest.raises(ModelDirError, match=f"the run in {out2} has not saved a model yet"):
        NerModel.load(f"{out2}/model")


def test_a_model_of_another_task_names_its_encoder(tmp_path):
    _, model = fake_run(tmp_path)
    with pytest.raises(ModelDirError, match=f"is a model of task 'ner' .*; embeddings come from an encoder or "
                                            f"sentence-transformers directory; its encoder is {model}/encoder"):
        check_model_for(model, "embed")
    with pytest.raises(ModelDirError, match="training 're' starts from an encoder directory, 'tiny', or a 're' model"):
        check_model_for(model, "re", start=True)
    assert check_model_for(f"{model}/encoder", "re", start=True).name == "embed"  # an encoder to start from
    assert check_model_for("tiny", "ner", start=True).name == "ner"


def one_error(argv, capsys) -> str:
    """The one `error:` line of a command that stopped before it started (nothing on stdout)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert out == "" and len(err) == 1 and err[0].startswith("error: "), (out, err)
    return err[0]


def test_commands_check_model_and_data_before_loading(tmp_path, capsys, monkeypatch):
    from spanflow.runtime import loads

    def no_load(self, *args):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loads.Loads, "_load", no_load)
    out, model = fake_run(tmp_path)
    texts = write(tmp_path, "in.txt", "one text here\nand another one here\n")
    err = one_error(["embed", "--model", model, "--input", texts, "--output", str(tmp_path / "o.npy")], capsys)
    assert "is a model of task 'ner'" in err and f"its encoder is {model}/encoder" in err
    err = one_error(["predict", "--model", out, "--input", texts, "--output", str(tmp_path / "o.jsonl")], capsys)
    assert err.endswith(f"did you mean {model}?")
    conll = write(tmp_path, "d.conll", CONLL)
    err = one_error(["predict", "--model", model, "--input", conll, "--output", str(tmp_path / "o.jsonl")], capsys)
    assert "this is CoNLL columns" in err and "texts to run a model on are plain text lines" in err
    casrel = write(tmp_path, "d.json", CASREL)  # a JSON list: the command that writes its texts one a line
    err = one_error(["predict", "--model", model, "--input", casrel, "--output", str(tmp_path / "o.jsonl")], capsys)
    assert err.endswith(f"(its texts, one a line: jq -c '.[] | {{text}}' {casrel} > {tmp_path / 'd.texts.jsonl'})")
    err = one_error(["train", "ner", "--train", conll, "--model", out, "--out", str(tmp_path / "t")], capsys)
    assert err.endswith(f"did you mean {model}?")
    err = one_error(["tune", "--task", "ner", "--model", out, "--data", conll, "--mode", "infer"], capsys)
    assert err.endswith(f"did you mean {model}?")
    # data evaluate could score nothing on is told by its file, before the model loads
    _, re_model = fake_run(tmp_path / "re", task="re")
    empty = write(tmp_path, "empty.json", [])
    assert one_error(["evaluate", "--model", re_model, "--data", empty], capsys) == \
        f"error: {empty}: is an empty list: no records found"
    encoder = tmp_path / "enc"
    encoder.mkdir()
    (encoder / "config.json").write_text("{}")
    one = write(tmp_path, "one.csv", SCORED.splitlines()[0] + "\n")
    assert one_error(["evaluate", "--model", str(encoder), "--data", one], capsys) == \
        f"error: {one} holds 1 pair; it needs at least 2"
    same = write(tmp_path, "same.csv", "".join(line.rsplit(",", 1)[0] + ",3.0\n" for line in SCORED.splitlines()))
    assert one_error(["evaluate", "--model", str(encoder), "--data", same], capsys) == \
        (f"error: {same}: every pair has the same score; a correlation (Spearman) needs scores that vary "
         "(without the score column, the pairs are scored as retrieval: MRR@10)")
    err = one_error(["tune", "--task", "ner", "--model", "tiny", "--data", conll, "--mode", "infer"], capsys)
    assert err.startswith("error: 'tiny' is an encoder built from scratch when training starts; this needs a trained")


def test_export_says_why_a_model_has_no_format_and_keeps_other_files(tmp_path, capsys):
    _, model = fake_run(tmp_path, task="re")
    err = one_error(["export", "--model", model, "--to", "hf", str(tmp_path / "hf")], capsys)
    assert err.startswith(f"error: re models have no export format ({model} is one): other tools have no CasRel head")
    ner = fake_run(tmp_path / "n")[1]
    for out in (ner, str(tmp_path / "n" / "run")):
        assert "the export would replace the model it is made from" in one_error(
            ["export", "--model", ner, "--to", "hf", out], capsys)
    assert f"{ner}/hf is inside the model it is made from ({ner}), which it would change" in one_error(
        ["export", "--model", ner, "--to", "hf", f"{ner}/hf"], capsys)
    litter = tmp_path / "litter"
    litter.mkdir()
    (litter / ".DS_Store").write_bytes(b"\0")  # a file manager's, not the user's: the folder counts as empty
    err = one_error(["export", "--model", ner, "--to", "hf", str(litter)], capsys)
    assert "would replace" not in err and "would change" not in err, err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    assert "holds other files, which the export would replace" in one_error(
        ["export", "--model", ner, "--to", "hf", str(busy)], capsys)
    assert (busy / "notes.txt").read_text() == "keep me"
    other = fake_run(tmp_path / "o")[1]  # another trained model, or the encoder one was trained from
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text('{"model_type": "bert"}')
    for kept in (other, str(tmp_path / "enc")):
        before = sorted(os.listdir(kept))
        assert "holds a model or encoder, which the export would replace" in one_error(
            ["export", "--model", ner, "--to", "hf", kept], capsys)
        assert sorted(os.listdir(kept)) == before


def test_a_file_where_an_output_directory_should_be_is_one_error(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("keep me")
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "Ann lives in Rome .", "entities": [[0, 3, "PER"]]}\n')
    err = one_error(["convert", str(src), str(tmp_path / "f.txt" / "x.conll")], capsys)
    assert err == f"error: {tmp_path / 'f.txt'}: a file stands where a directory should be"
    assert (tmp_path / "f.txt").read_text() == "keep me"
