"""Runtime choices are made once per command, before the model runs: one cache key for every
command, each served model loaded once, int8 as a quantization, profiles read with precise errors."""
import collections
import json
import re

import pytest
import torch

from spanflow.cli.main import main
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.runtime import policy
from spanflow.runtime.cache import cache_path
from spanflow.runtime.files import read_profile
from spanflow.tasks.registry import get

TEXTS = [e.text for e in synthetic_ner(30, seed=1)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from helpers import tiny_bert
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    d = tmp_path_factory.mktemp("runtime")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=0)  # linear layers: int8 has work to do
    enc.save_pretrained(d / "emb")
    tok.save_pretrained(d / "emb")
    train_ner(synthetic_ner(30, seed=2), None, out_dir=str(d / "ner"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=512, max_length=32, stride=8, log_every=0))
    (d / "in.txt").write_text("\n".join(TEXTS) + "\n")
    return {"emb": str(d / "emb"), "ner": str(d / "ner" / "model"), "input": str(d / "in.txt")}


@pytest.fixture
def bf16_cpu(monkeypatch, tmp_path):
    """An empty cache, and bf16 as the CPU's reduced precision: --precision auto checks it."""
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)


@pytest.fixture
def served(monkeypatch):
    """`spanflow serve` up to the point it would listen: the app and options it would serve."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")

    import spanflow.cli.serve as serve_cli

    seen = {"models": []}
    monkeypatch.setattr("spanflow.serving.address.serve_on", lambda socks, app, **kw: seen.update(app=app, **kw))
    real = serve_cli.load_services

    def loaded(a):  # the models that would be served
        services, budgets = real(a)
        seen["models"] += [s.model for s in services]
        return services, budgets

    monkeypatch.setattr(serve_cli, "load_services", loaded)
    monkeypatch.setattr("spanflow.serving.app.start_backend", lambda model, name, *_: None)  # compiling: test_backend.py
    return seen


@pytest.fixture
def load_counts(monkeypatch):
    """Calls of each task's load: how often a model directory is read."""
    counts = collections.Counter()
    for name in ("ner", "embed"):
        task = get(name)
        real = task.load

        def counted(path, *, _real=real, _name=name, **kw):
            counts[_name] += 1
            return _real(path, **kw)

        monkeypatch.setattr(task, "load", counted)
    return counts


def test_serve_loads_its_models_on_the_thread_that_runs_them(model_dirs, served, monkeypatch):
    import threading

    from spanflow.runtime.threads import model_thread

    loaded_on = []
    task = get("embed")
    real = task.load
    monkeypatch.setattr(task, "load", lambda path, **kw: loaded_on.append(threading.current_thread()) or real(path, **kw))
    assert main(["serve", "--model", f"emb={model_dirs['emb']}", "--device", "cpu", "--precision", "fp32"]) == 0
    batch_thread = model_thread().submit(threading.current_thread).result()
    assert loaded_on and set(loaded_on) == {batch_thread}  # a second OpenMP team would slow every batch


def test_serve_precision_auto_loads_each_model_the_fewest_times(model_dirs, bf16_cpu, served, load_counts, capsys):
    argv = ["serve", "--model", f"ner={model_dirs['ner']}", "--model", f"emb={model_dirs['emb']}", "--device", "cpu"]
    assert main(argv) == 0  # no verdict cached: each model checked in fp32 and bf16 on built-in sentences
    # each model makes its bf16 twin from the fp32 weights it holds: one read of each directory
    assert load_counts == {"embed": 1, "ner": 1}
    err = capsys.readouterr().err
    assert err.count("runtime for ") == 2 and "built-in sample texts" in err
    load_counts.clear()
    assert main(argv) == 0  # the verdicts are cached: one load per served model
    assert load_counts == {"embed": 1, "ner": 1}
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("runtime for ")]
    assert len(lines) == 2 and all("(an earlier run's check)" in x for x in lines)
    # each server runs the model in the precision its line names
    assert [f"precision {m.policy.name} (auto: " in x for m, x in zip(served["models"][-2:], lines)] == [True, True]


def test_a_profile_cached_by_predict_is_found_by_serve(model_dirs, bf16_cpu, served, monkeypatch, capsys):
    import spanflow.tuning.auto as auto

    measured = []
    monkeypatch.setattr(auto, "quick_profile", lambda **kw: measured.append(kw) or {
        "task": "ner", "mode": "infer", "precision": kw["precision"], "best": {"max_tokens": 777, "max_length": 32},
        "points": []})
    assert main(["predict", "--model", model_dirs["ner"], "--input", model_dirs["input"], "--output",
                 str(model_dirs["input"]) + ".out.jsonl", "--max-tokens", "auto"]) == 0
    assert len(measured) == 1 and measured[0]["precision"] in ("fp32", "bf16")  # resolved before measuring
    assert "max_tokens 777 (auto: measured now, cached at" in capsys.readouterr().err
    assert main(["serve", "--model", f"ner={model_dirs['ner']}", "--max-tokens", "auto"]) == 0
    out = capsys.readouterr()
    assert "ner (ner, max_tokens 777)" in out.out and "max_tokens 777 (auto: cached" in out.err
    assert len(measured) == 1  # found, not measured again


def test_serve_without_a_cached_profile_names_each_tasks_own_bulk_command(model_dirs, served, monkeypatch, capsys):
    monkeypatch.setenv("SPANFLOW_CACHE", str(model_dirs["input"]) + ".cache")  # no cached profiles
    assert main(["serve", "--model", f"n={model_dirs['ner']}", "--model", f"e={model_dirs['emb']}",
                 "--max-tokens", "auto"]) == 0
    hints = [x for x in capsys.readouterr().err.splitlines() if "no cached profile for" in x]
    assert [h.split("`spanflow ")[1].split(" --model ")[0] for h in hints] == ["predict", "embed"]


def test_predict_max_tokens_auto_measures_on_the_inputs_own_texts(model_dirs, tmp_path, monkeypatch, capsys):
    """No profile cached: predict measures one on its --input, read as predict reads it (here
    JSONL texts under --field body), though it holds no labels."""
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", model_dirs["ner"], "--input", str(src), "--field", "body", "--output", str(out),
                 "--max-tokens", "auto", "--precision", "fp32"]) == 0
    assert "(auto: measured now, cached at" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == len(TEXTS)


def test_evaluate_checks_precision_on_the_texts_of_its_pairs(model_dirs, bf16_cpu, tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\t{i % 5}\n" for i, (a, b) in enumerate(zip(TEXTS, TEXTS[1:]))))
    assert main(["evaluate", "--model", model_dirs["emb"], "--data", str(pairs)]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("runtime: "))
    assert f"on {2 * (len(TEXTS) - 1)} input texts" in line, line  # both sides of each pair, not built-in ones


def test_one_cache_key_of_resolved_choices():
    cpu = torch.device("cpu")
    key = {"model": "m", "device": cpu, "task": "ner", "mode": "infer", "precision": "bf16"}
    assert cache_path("profiles", **key) == cache_path("profiles", **key, quantize=None)
    assert cache_path("profiles", **key) != cache_path("profiles", **{**key, "precision": "fp32"})
    assert cache_path("profiles", **{**key, "precision": "fp32"}) != cache_path(
        "profiles", **{**key, "precision": "fp32"}, quantize="int8")
    assert cache_path("profiles", **key) != cache_path("verdicts", **key)
    with pytest.raises(ValueError, match="resolved precision"):
        cache_path("profiles", **{**key, "precision": "auto"})  # the key serve used to build


def test_precision_int8_is_a_one_line_error_naming_quantize(model_dirs, capsys, tmp_path):
    for argv in (["predict", "--model", model_dirs["ner"], "--input", model_dirs["input"], "--output",
                  str(tmp_path / "o.jsonl")],
                 ["serve", "--model", model_dirs["emb"]]):
        if argv[0] == "serve":
            pytest.importorskip("fastapi")
        assert main(argv + ["--precision", "int8"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--quantize int8" in err[0] and "Traceback" not in err[0]


def test_quantize_is_for_embedding_models_on_cpu(model_dirs, bf16_cpu, served, load_counts, capsys):
    assert main(["serve", "--model", f"ner={model_dirs['ner']}", "--quantize", "int8"]) == 2
    assert "--quantize int8 is for embedding models" in capsys.readouterr().err and not load_counts
    assert main(["serve", "--model", f"emb={model_dirs['emb']}", "--quantize", "int8", "--precision", "bf16"]) == 2
    assert "computes in fp32" in capsys.readouterr().err
    assert main(["serve", "--model", f"emb={model_dirs['emb']}", "--quantize", "int8"]) == 0
    err = capsys.readouterr().err
    assert "device cpu (int8 quantization runs on CPU)" in err and "quantize int8 (mean cosine" in err
    assert re.search(r"quantize int8 \(mean cosine [01]\.\d{4}, min [-01]\.\d{4} to fp32 on ", err)  # its worst text too
    assert "built-in sample texts, gate 0.99" in err and load_counts == {"embed": 1}  # gated on the one load
    # a server of both: the embedding model is quantized, the NER model runs unquantized
    assert main(["serve", "--model", f"emb={model_dirs['emb']}", "--model", f"ner={model_dirs['ner']}",
                 "--quantize", "int8"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("runtime for ")]
    assert ["quantize int8" in x for x in lines] == [True, False]
    assert [getattr(m, "quantize", None) for m in served["models"][-2:]] == ["int8", None]


def test_profile_errors_name_file_field_and_value(tmp_path):
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"task": "ner", "mode": "infer", "best": {"max_tokens": "lots"}}))
    with pytest.raises(ConfigError) as e:
        read_profile(str(p))
    assert str(p) in str(e.value) and "'best.max_tokens'" in str(e.value) and "got \"lots\"" in str(e.value)
    p.write_text(json.dumps({"task": "ner", "mode": "sideways", "best": {"max_tokens": 512}}))
    with pytest.raises(ConfigError, match="'mode'.*got \"sideways\""):
        read_profile(str(p))
    p.write_text(json.dumps({"task": "ner", "best": None, "points": []}))
    with pytest.raises(ConfigError, match="has no best point"):
        read_profile(str(p))
    p.write_text(json.dumps({"task": "ner", "best": {"max_tokens": 512, "oom": True}}))
    with pytest.raises(ConfigError, match=r"best point \(max_tokens 512\) ran out of memory"):
        read_profile(str(p))
    p.write_text(json.dumps({"task": "ner", "precision": "int4", "best": {"max_tokens": 512}}))
    with pytest.raises(ConfigError, match="'precision'.*got \"int4\""):
        read_profile(str(p))
    p.write_text("{")
    with pytest.raises(ConfigError, match="is unreadable"):
        read_profile(str(p))
    with pytest.raises(ConfigError, match="profile not found"):
        read_profile(str(tmp_path / "none.json"))
    p.write_text(json.dumps({"task": "re", "mode": "infer", "best": {"max_tokens": 512}}))
    with pytest.raises(ConfigError, match="measured for task 're', not 'ner'"):
        read_profile(str(p), task="ner")
    # tune's --out, given for its profile (it said `[Errno 21] Is a directory`)
    with pytest.raises(ConfigError, match=f"^profile {tmp_path} is a directory; give the profile tune wrote in it: "
                                          f"{p}$"):
        read_profile(str(tmp_path))


def test_serve_names_its_routes_and_warns_of_an_open_port_without_a_key(model_dirs, served, capsys, monkeypatch):
    monkeypatch.delenv("SPANFLOW_API_KEY", raising=False)
    base = ["serve", "--model", f"emb={model_dirs['emb']}", "--device", "cpu", "--precision", "fp32", "--port", "0"]
    assert main(base) == 0  # loopback: no warning
    out, err = capsys.readouterr()
    assert "routes: POST /v1/embeddings (embed); GET /health, /ready, /v1/models, /metrics, /docs" in out and "--api-key" not in err
    assert main(base + ["--host", "0.0.0.0"]) == 0
    assert "warning: no --api-key (or SPANFLOW_API_KEY): anyone who reaches 0.0.0.0:" in capsys.readouterr().err
    assert main(base + ["--host", "0.0.0.0", "--api-key", "k"]) == 0
    assert "--api-key" not in capsys.readouterr().err
    from spanflow.cli import serve

    loaded = []
    monkeypatch.setattr(serve, "load_services", lambda a: loaded.append(a))
    for empty in ("", " "):  # `--api-key "$KEY"` with KEY unset served without a key, and said nothing
        assert main(base + ["--api-key", empty]) == 2
        assert "error: --api-key is empty (a variable that is not set?)" in capsys.readouterr().err
        assert not loaded  # refused before any model loads
        monkeypatch.setenv("SPANFLOW_API_KEY", empty)
        assert main(base) == 2
        assert "error: SPANFLOW_API_KEY is set but empty" in capsys.readouterr().err
        monkeypatch.delenv("SPANFLOW_API_KEY")
