import json
import re

import pytest
import torch

from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.records import unlabelled_sample
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError, DataError
from spanflow.runtime.resolve import Asked, resolve_runtime
from spanflow.tasks.registry import get
from spanflow.tuning.doctor import diagnose, doctor, environment
from spanflow.tuning.sweep import QUALITY_TOLERANCE, Point, pick_best, quality_floor, sweep, within_noise
from spanflow.tuning.tune import tune


def fake_measure(oom_from):
    def measure(b, L):
        if b >= oom_from:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return {"real_tokens_per_s": float(b), "padded_tokens_per_s": float(b), "padding_efficiency": 1.0,
                "latency_p50_ms": b / 100, "latency_p95_ms": b / 50, "peak_memory_bytes": b * 1000,
                "gpu_util": None, "quality": None}
    return measure


def test_sweep_survives_oom_and_picks_below_it():
    points = sweep(fake_measure(2048), [256, 512, 1024, 2048, 4096], [128, 256], log_fn=lambda s: None)
    oom = [(p.max_tokens, p.max_length) for p in points if p.oom]
    assert oom == [(2048, 128), (2048, 256)]  # recorded once per length; 4096 never tried
    assert {p.max_length for p in points if not p.oom} == {128, 256}  # the sweep went on after the OOM
    best = pick_best(points)
    assert best.max_tokens == 1024 and not best.oom


def test_pick_best_respects_limits():
    pts = [Point(b, 128, real_tokens_per_s=b, latency_p95_ms=b / 10, peak_memory_bytes=b * 10) for b in (256, 512, 1024)]
    assert pick_best(pts, max_memory_bytes=6000).max_tokens == 512
    assert pick_best(pts, latency_slo_ms=30).max_tokens == 256
    assert pick_best(pts, latency_slo_ms=1) is None


@pytest.fixture(scope="module")
def ner_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    p = d / "train.jsonl"
    with open(p, "w") as f:
        for e in synthetic_ner(120, seed=3):
            write_jsonl_record(f, e.text, e.spans)
    return str(p)


def test_tune_writes_profile(ner_file, tmp_path):
    lines: list[str] = []
    prof = tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[256, 512, 1024], budget_seconds=30,
                max_lengths=[64],
                sample=64, out=str(tmp_path), log_fn=lines.append)
    said = next(x for x in lines if x.startswith("tuning ner train"))  # the runtime line above says why
    assert "(as asked)" not in said and not any(x.startswith("quality:") for x in lines)  # training: no quality
    assert f"profile: {tmp_path / 'profile.json'}; run it with --profile {tmp_path / 'profile.json'} " \
           "(spanflow train)" in lines
    assert "the best point reads 64 tokens a text: add --max-length 64 to that command (the profile sets the " \
           "token budget only)" in lines  # --max-lengths was swept
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved == prof and {"device", "model", "task", "mode", "best", "points"} <= set(saved)
    keys = {"max_tokens", "max_length", "real_tokens_per_s", "padded_tokens_per_s", "padding_efficiency",
            "latency_p50_ms", "latency_p95_ms", "peak_memory_bytes", "gpu_util", "quality", "oom",
            "real_tokens_per_s_runs", "spread"}
    assert len(saved["points"]) == 3 and all(keys == set(p) for p in saved["points"])
    assert all(len(p["real_tokens_per_s_runs"]) == 2 for p in saved["points"])  # forward, then backward
    assert saved["best"]["real_tokens_per_s"] == max(p["real_tokens_per_s"] for p in saved["points"])
    lines.clear()  # a length the command reads anyway (tiny's limit): no advice to add it
    tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[1024], budget_seconds=5, max_lengths=[512],
         sample=16, repeats=1, out=str(tmp_path / "own"), log_fn=lines.append, plot=False)
    assert not any("add --max-length" in x for x in lines) and any(x.startswith("profile:") for x in lines)


def test_tune_infer_compares_backends_and_plots(ner_file, tmp_path, monkeypatch):
    from spanflow.data.io import read_ner
    from spanflow.tuning import timing
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=2, max_tokens=1024, max_length=64, log_every=0))
    monkeypatch.setattr(timing, "COMPILE_SECONDS", 0.0)  # a tiny encoder compiles in seconds; the budget stays short
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=ner_file, mode="infer", budgets=[512],
                max_lengths=[16, 64], budget_seconds=20, sample=32, out=str(tmp_path), log_fn=lambda s: None)
    assert {p["max_length"] for p in prof["points"]} == {16, 64}
    # the encoder compiled against eager at the best point: what serve --backend auto follows
    b = json.loads((tmp_path / "profile.json").read_text())["backend"]
    assert b["eager"] > 0 and b["best"] in ("eager", "compile")
    assert b["compile"] is None or (b["compile"] > 0 and b["compile_s"] > 0)
    if b["compile"] is not None:  # each side measured twice; eager only where it was faster in every run
        assert len(b["eager_runs"]) == len(b["compile_runs"]) == 2
        assert b["best"] == ("eager" if max(b["compile_runs"]) < min(b["eager_runs"]) else "compile")
    # the default install (make test / make demo) has the plot extra: the picture is drawn
    assert (tmp_path / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_infer_measures_the_windows_predict_reads(ner_file, tmp_path):
    """Without --max-lengths, an NER model is measured at its own max length (what predict
    reads), not at the encoder's limit."""
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import NerModel, train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=1024, max_length=128, log_every=0))
    model = NerModel.load(str(tmp_path / "run" / "model"))
    assert model.max_length < model.limit  # the synthetic texts are short: the model reads less than it may
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=ner_file, mode="infer", budgets=[512],
                budget_seconds=20, sample=32, out=str(tmp_path), backends=False, plot=False, log_fn=lambda s: None)
    assert {p["max_length"] for p in prof["points"]} == {model.max_length}


def test_tune_infer_measures_plain_texts_without_a_quality_column(ner_file, tmp_path):
    """Inference needs no labels: a file of text lines is measured for speed alone."""
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=1024, max_length=64, log_every=0))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(e.text for e in read_ner(ner_file)[:40]) + "\n")
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=str(texts), mode="infer", budgets=[512, 512],
                budget_seconds=20, sample=32, out=str(tmp_path), backends=False, plot=False, log_fn=lambda s: None)
    assert len(prof["points"]) == 1  # a budget given twice is one point, not two rows both "best"
    assert all(p["quality"] is None and p["real_tokens_per_s"] > 0 for p in prof["points"])
    # budgets past the whole sample run its one batch alike: one of them is measured, and the sample's size said
    lines: list[str] = []
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=str(texts), mode="infer",
                budgets=[256, 2048, 4096, 8192], budget_seconds=20, sample=8, repeats=1, out=str(tmp_path / "s"),
                backends=False, plot=False, log_fn=lines.append)
    assert [p["max_tokens"] for p in prof["points"]] == [256, 2048]
    assert any("budgets above 2048 run the whole sample in one batch, as 2048 does: not measured: 4096, 8192" in x
               for x in lines), lines
    assert any(x.startswith("tuning ner infer on 8 inputs of ") for x in lines), lines
    # a point measured once has no spread, said as such (a spread of 0% claimed a certainty it lacked)
    assert all(p["spread"] is None for p in prof["points"]) and any("(1 run: no spread)" in x for x in lines)
    assert any(x.startswith("note: 2 points measured once") for x in lines), lines
    # the best budget far above the sample's one batch: what it would do to a bigger job is not measured, said
    lines.clear()
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=str(texts), mode="infer",
                budgets=[99999999999999], budget_seconds=20, sample=8, repeats=1, out=str(tmp_path / "h"),
                backends=False, plot=False, log_fn=lines.append)
    assert prof["best"]["max_tokens"] == 99999999999999
    assert any(x.startswith("note: max_tokens 99999999999999 ran the whole sample in one batch of ")
               and "whose speed and memory were not measured (a larger --sample measures them)" in x
               for x in lines), lines
    table = tmp_path / "texts.csv"  # a CSV of texts and ids, read as predict reads it: column 0 (was refused as pairs)
    table.write_text("".join(f'"{e.text}",{i}\n' for i, e in enumerate(read_ner(ner_file)[:40])))
    assert unlabelled_sample(str(table), 8, infer=True) == [e.text for e in read_ner(ner_file)[:8]]
    assert unlabelled_sample(str(table), 8) is None  # training: a CSV is the task's to read (embedding pairs)
    with pytest.raises(DataError, match="plain text lines"):  # training still needs labels
        tune(task="ner", model="tiny", data=str(texts), mode="train", budgets=[512], budget_seconds=20, sample=32,
             out=str(tmp_path / "t"), backends=False, plot=False, log_fn=lambda s: None)


def test_a_trained_model_is_tuned_for_its_own_task_and_inference_without_flags_for_them(ner_file, tmp_path, capsys):
    """--task was required even where --model says it, and a trained model was tuned for training
    by default (which then asked for labelled data)."""
    from spanflow.cli.main import main
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=1024, max_length=64, log_every=0))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(e.text for e in read_ner(ner_file)[:16]) + "\n")
    assert main(["tune", "--model", str(tmp_path / "run" / "model"), "--data", str(texts), "--budgets", "256",
                 "--sample", "8", "--repeats", "1", "--no-backends", "--out", str(tmp_path / "p")]) == 0
    saved = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert (saved["task"], saved["mode"]) == ("ner", "infer")
    capsys.readouterr()
    assert main(["tune", "--model", "tiny", "--data", str(texts)]) == 2  # an encoder suits every task
    assert capsys.readouterr().err.startswith("error: --task is needed with --model tiny (an encoder built from "
                                              "scratch to train): give --task ner, re")  # and any task registered


def test_texts_named_by_field_or_column_are_read_as_texts_and_a_wrong_name_is_told(ner_file, tmp_path, capsys):
    """--field/--column say where the texts are: the file is not read as labelled data (a JSONL of
    {"body"} and a CSV with a header were refused as NER data); a name no record has is told with
    the first record's own error, and the --out the refused command made is not left behind."""
    from spanflow.cli.main import main
    from spanflow.data.records import unlabelled_sample

    body = tmp_path / "b.jsonl"
    body.write_text("".join(json.dumps({"id": i, "body": f"Ann went to Paris {i}"}) + "\n" for i in range(6)))
    table = tmp_path / "t.csv"
    table.write_text("id,text\n" + "".join(f"{i},Ann went to Rome {i}\n" for i in range(6)))
    assert unlabelled_sample(str(body), 4, field="body") == [f"Ann went to Paris {i}" for i in range(4)]
    assert unlabelled_sample(str(table), 4, column="text", infer=True) == [f"Ann went to Rome {i}" for i in range(4)]
    assert unlabelled_sample(str(body), 4) is None  # named by nothing: a task reads it as its labelled data
    with pytest.raises(ConfigError, match=r"--field body names the texts of a file of texts; .*train\.jsonl is JSONL "
                                          r"spans .*labelled data read whole: drop it"):
        unlabelled_sample(ner_file, 4, field="body")  # its raw lines were measured as texts
    with pytest.raises(ConfigError, match=r'b\.jsonl: no usable records to tune on; the first error: .*b\.jsonl:1: '
                                          r'expected an object with a string "nope" field; it has "body" '
                                          r'\(--field names the one to read\)$'):
        unlabelled_sample(str(body), 4, field="nope", infer=True)
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=1024, max_length=64, log_every=0))
    out = tmp_path / "profile_out"
    assert main(["tune", "--task", "ner", "--model", str(tmp_path / "run" / "model"), "--data", str(body),
                 "--mode", "infer", "--field", "nope", "--out", str(out)]) == 2
    assert "no usable records to tune on" in capsys.readouterr().err and not out.exists()
    casrel = tmp_path / "c.json"  # a JSON list named by --field: said as labelled data, not as a list to jq
    casrel.write_text(json.dumps([{"text": "Ann lives in Oslo", "triple_list": [["Ann", "lives_in", "Oslo"]]}]))
    assert main(["tune", "--task", "ner", "--model", str(tmp_path / "run" / "model"), "--data", str(casrel),
                 "--mode", "infer", "--field", "foo", "--out", str(out)]) == 2
    assert "labelled data read whole: drop it" in capsys.readouterr().err
    assert main(["tune", "--task", "ner", "--model", "tiny", "--data", str(body), "--field", "body", "--column",
                 "body"]) == 2
    assert capsys.readouterr().err.strip() == "error: --field body and --column body both name the text's column; give one"


FILLER = "the a of and to in on at for with from by as was is it that this".split()
NAMES = "Zorg Mirel Tavik Quon Brell Sarn".split()


def far_cue(n: int, seed: int) -> list:
    """Texts whose one entity is typed only by a cue word 17 to 21 tokens before it (PER after
    'alpha', LOC after 'beta'): a window of 16 tokens around the entity cannot see the cue."""
    import random

    from spanflow.data.examples import NerExample

    rng, out = random.Random(seed), []
    for _ in range(n):
        cue = rng.choice(["alpha", "beta"])
        text = " ".join([cue] + [rng.choice(FILLER) for _ in range(rng.randint(16, 20))]) + " "
        name, start = rng.choice(NAMES), len(text)
        text += name + " " + " ".join(rng.choice(FILLER) for _ in range(2))
        out.append(NerExample(text, [(start, start + len(name), "PER" if cue == "alpha" else "LOC")]))
    return out


def test_short_overlapping_windows_do_not_count_their_repeated_tokens_as_speed(ner_file, tmp_path, monkeypatch):
    """A clock that moves only with the tokens the encoder computes: 8-token windows repeat much
    of each text (overlap, special tokens), so they read the sample slower than whole-text
    windows do, and tune must not pick them (it did when every window token counted)."""
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import NerModel, train_ner
    from spanflow.training.options import TrainOptions

    train_ner(read_ner(ner_file), None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=1024, max_length=64, log_every=0))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(e.text for e in read_ner(ner_file)[:40]) + "\n")
    now = [0.0]
    load = NerModel.load

    def timed_load(*a, **k):
        m = load(*a, **k)
        m.module.register_forward_pre_hook(lambda mod, args: now.__setitem__(0, now[0] + args[0].numel() * 1e-6))
        return m

    monkeypatch.setattr(NerModel, "load", staticmethod(timed_load))
    prof = tune(task="ner", model=str(tmp_path / "run" / "model"), data=str(texts), mode="infer", max_lengths=[8, 64],
                budgets=[512], budget_seconds=10**6, sample=40, repeats=1, out=str(tmp_path), backends=False,
                plot=False, log_fn=lambda s: None, clock=lambda: now[0])
    speed = {p["max_length"]: p for p in prof["points"]}
    assert speed[8]["padded_tokens_per_s"] == pytest.approx(speed[64]["padded_tokens_per_s"], rel=0.01)  # same work rate
    assert speed[8]["real_tokens_per_s"] < 0.7 * speed[64]["real_tokens_per_s"]
    assert prof["best"]["max_length"] == 64


def test_tune_quality_at_each_length_is_the_models_f1_there(tmp_path, capsys, monkeypatch):
    from spanflow.cli.main import main
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner import NerModel, heads, train_ner
    from spanflow.training.options import TrainOptions

    train, held_out = far_cue(300, seed=1), far_cue(60, seed=2)
    enc, tok = build_tiny([e.text for e in train], hidden=64, embedding=32, bigram_buckets=1009)
    # no dropout in encoder or head: whether this small run learns the far cue (asserted below)
    # then depends on its seed alone, not on a dropout kernel's random stream
    enc.config.dropout = 0.0  # read when training starts from this directory
    monkeypatch.setattr(heads, "Dropout", lambda p: torch.nn.Dropout(0.0))
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    train_ner(train, None, model=str(tmp_path / "enc"), out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=80, lr=3e-2, max_tokens=1024, max_length=64, stride=8, log_every=0))
    model_dir, data = str(tmp_path / "run" / "model"), tmp_path / "held_out.jsonl"
    with open(data, "w") as f:
        for e in held_out:
            write_jsonl_record(f, e.text, e.spans)
    assert main(["tune", "--task", "ner", "--mode", "infer", "--model", model_dir, "--data", str(data),
                 "--max-lengths", "16,64", "--budgets", "512", "--budget-seconds", "1", "--repeats", "1",
                 "--precision", "fp32", "--device", "cpu", "--no-backends", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "runtime: device cpu (as asked), precision fp32 (as asked)" in out
    profile = tmp_path / "profile.json"  # the file it wrote is named, with how to use it
    assert (f"profile: {profile}; run it with --profile {profile} (the commands that run this model: predict, "
            "evaluate, serve)") in out  # an NER model's: embed refuses it
    assert "quality: entity F1 on the labelled sample, read at that max length" in out
    quality = {p["max_length"]: p["quality"] for p in json.loads((tmp_path / "profile.json").read_text())["points"]}
    for L in (16, 64):
        model = NerModel.load(model_dir, device="cpu", precision="fp32")
        model.set_max_length(L)
        assert quality[L] == pytest.approx(model.evaluate(held_out)["f1"], abs=1e-12)
    assert quality[64] > quality[16] + 0.2  # the model learnt the cue; 16-token windows lose it
    # a faster max length that loses quality is not the one picked
    assert json.loads((tmp_path / "profile.json").read_text())["best"]["max_length"] == 64


def test_the_best_point_keeps_the_quality_within_the_tolerance():
    fast_worse = Point(1024, 24, real_tokens_per_s=3000.0, quality=0.60)
    slow_best = Point(1024, 80, real_tokens_per_s=2000.0, quality=0.62)
    near = Point(512, 64, real_tokens_per_s=2500.0, quality=0.62 - QUALITY_TOLERANCE / 2)
    points = [fast_worse, slow_best, near]
    assert quality_floor(points) == pytest.approx(0.62 - QUALITY_TOLERANCE)
    assert pick_best(points, min_quality=quality_floor(points)) is near
    assert pick_best([Point(8, 8, real_tokens_per_s=1.0)], min_quality=quality_floor([])) is not None  # training


def test_points_the_runs_do_not_tell_from_the_best_are_named():
    best = Point(1024, 64, real_tokens_per_s=1000.0, spread=0.02)
    close = Point(2048, 64, real_tokens_per_s=950.0, spread=0.08)  # within its own spread of the best
    apart = Point(512, 64, real_tokens_per_s=900.0, spread=0.05)  # 10% slower, neither spread reaches it
    assert within_noise(best, [best, close, apart]) == [close]
    assert within_noise(best, [best, Point(256, 64, real_tokens_per_s=970.0, spread=0.0)]) == []  # past 2%
    assert within_noise(Point(1024, 64, real_tokens_per_s=1000.0, spread=0.2), [apart]) == [apart]
    # runs known: a point is near where its fastest run reaches the best's slowest, however wide its spread
    top = Point(1024, 64, real_tokens_per_s=25526.0, spread=0.14, real_tokens_per_s_runs=[27297.0, 23755.0])
    wide = Point(512, 64, real_tokens_per_s=13047.0, spread=0.57, real_tokens_per_s_runs=[16765.0, 9329.0])
    touching = Point(2048, 64, real_tokens_per_s=22000.0, spread=0.16, real_tokens_per_s_runs=[23800.0, 20200.0])
    assert within_noise(top, [top, wide, touching]) == [touching]


def test_max_tokens_resolution(ner_file, tmp_path, monkeypatch):
    ner, log = get("ner"), []

    def resolve(max_tokens=None, profile=None, job="train", data=ner_file, **kw):
        return resolve_runtime(ner, "tiny", Asked(device="cpu", precision="fp32", max_tokens=max_tokens,
                                                  profile=profile),
                               job=job, data=data, log=log.append, **kw).max_tokens

    assert resolve("1234") == 1234
    with pytest.raises(ConfigError, match="must be a number or 'auto', got 'lots'"):
        resolve("lots")
    assert resolve() is None and "sized from the data" in log[-1]  # training sizes its budget from the data
    assert resolve(job="infer") == 2048 and resolve(job="serve") == 4096  # the budget table's, on CPU
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"task": "ner", "mode": "train", "best": {"max_tokens": 777}, "points": []}))
    assert resolve(profile=str(prof)) == 777 and f"max_tokens 777 (from {prof})" in log[-1]
    prof.write_text(json.dumps({"task": "ner", "mode": "train", "precision": "bf16", "best": {"max_tokens": 777},
                                "points": []}))  # measured in another precision: said, the budget still taken
    assert resolve(profile=str(prof)) == 777
    assert f"max_tokens 777 (from {prof}; measured in bf16, this run is fp32: tune again in it)" in log[-1]
    with pytest.raises(ConfigError, match="measured for mode 'train', not 'infer'"):
        resolve(profile=str(prof), job="infer")
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_measure(**kw):
        calls.append(kw)
        return {"task": "ner", "mode": "train", "best": {"max_tokens": 2048}, "points": []}

    assert resolve("auto", measure=fake_measure) == 2048
    assert resolve("auto", measure=fake_measure) == 2048
    assert len(calls) == 1  # the second run read the cached profile
    assert calls[0]["precision"] == "fp32" and calls[0]["mode"] == "train"  # what was resolved, never "auto"
    assert "auto: cached" in log[-1]
    (cached,) = (tmp_path / "cache" / "profiles").iterdir()
    cached.write_text('{"best": nu')  # a damaged cache entry is measured again, not an error for good
    assert resolve("auto", measure=fake_measure) == 2048 and len(calls) == 2
    assert any("the cached profile is unreadable" in x and "measuring it again" in x for x in log)
    assert resolve("auto", measure=fake_measure) == 2048 and len(calls) == 2 and "auto: cached" in log[-1]
    # 'tiny' is built from the data it trains on: other data is another model, measured anew (its cache
    # entry was the first data's); the same data rewritten too
    other = tmp_path / "other.conll"
    other.write_text("Ada B-person\nsings O\n", encoding="utf-8")
    assert resolve("auto", measure=fake_measure, data=str(other)) == 2048 and len(calls) == 3
    assert calls[-1]["data"] == str(other) and "auto: measured now" in log[-1]
    assert resolve("auto", measure=fake_measure, data=str(other)) == 2048 and len(calls) == 3
    other.write_text("Ada B-person\nsings O\nloud O\n", encoding="utf-8")
    assert resolve("auto", measure=fake_measure, data=str(other)) == 2048 and len(calls) == 4
    prof.write_text(json.dumps({"task": "ner", "mode": "train", "device": "NVIDIA H100 80GB HBM3",
                                "best": {"max_tokens": 262144}, "points": []}))  # another device's budget: said
    assert resolve(profile=str(prof)) == 262144
    assert "measured on NVIDIA H100 80GB HBM3, this run is on cpu (" in log[-1] and "threads): tune again here)" in log[-1]
    prof.write_text(json.dumps({"task": "ner", "mode": "train", "device": "cpu (96 threads)",
                                "best": {"max_tokens": 777}, "points": []}))  # a CPU's threads hold no memory,
    assert resolve(profile=str(prof)) == 777  # but the fastest budget of 96 threads is not of these: said
    assert (f"measured on cpu (96 threads), this run is on cpu ({torch.get_num_threads()} threads): its fastest "
            "budget may differ here (tune again here)") in log[-1]
    from spanflow.runtime.cache import cpu_description, device_name

    here = device_name(torch.device("cpu"))
    for cpu, said in ((cpu_description(), None), (None, None),  # this CPU, or a profile naming none: nothing said
                      ("Other CPU | x86_64 | family 6 model 143 | bf16 True | amx True", "Other CPU"),
                      (cpu_description().replace("family", "family 1"), cpu_description().replace("family", "family 1"))):
        prof.write_text(json.dumps({"task": "ner", "mode": "train", "device": here, "cpu": cpu,
                                    "best": {"max_tokens": 777}, "points": []}))
        assert resolve(profile=str(prof)) == 777
        assert ("measured on" not in log[-1] if said is None else  # a vague name alone is said whole
                f"measured on {here} of {said}, this run is on {here} of " in log[-1]), log[-1]
    for model, said in (("/some/other/encoder", True), ("tiny", False)):  # another model's budget: said, still taken
        prof.write_text(json.dumps({"task": "ner", "mode": "train", "model": model, "best": {"max_tokens": 777},
                                    "points": []}))
        assert resolve(profile=str(prof)) == 777
        assert (f"measured for {model}, this run is tiny: tune again for it" in log[-1]) == said, log[-1]


def test_train_max_tokens_auto_is_resolved_after_parsing_and_cached(ner_file, tmp_path, monkeypatch, capsys):
    """Parsing `train --max-tokens auto` measures nothing; the run resolves it once, then trains with it."""
    import spanflow.tuning.auto as auto
    from spanflow.cli.main import build_parser, main
    from spanflow.tasks.ner.task import NerTask

    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    calls, trained = [], []
    monkeypatch.setattr(auto, "quick_profile", lambda **kw: calls.append(kw) or {
        "task": "ner", "mode": "train", "best": {"max_tokens": 640}, "points": []})
    monkeypatch.setattr(NerTask, "train_from_args", lambda self, a, options: trained.append(options) or "trained")
    argv = ["train", "ner", "--train", ner_file, "--out", str(tmp_path / "run"), "--max-tokens", "auto"]
    assert build_parser().parse_args(argv).max_tokens == "auto" and not calls
    assert main(argv) == 0 and main(argv) == 0
    assert len(calls) == 1 and [o.max_tokens for o in trained] == [640, 640]
    out = capsys.readouterr().out
    assert "max_tokens 640 (auto: measured now" in out and "max_tokens 640 (auto: cached" in out


def test_doctor_names_starvation(ner_file):
    starved = doctor(model="tiny", data=ner_file, batch_size=1, steps=6, log_fn=lambda s: None)
    assert starved["findings"] and "batch of 1 text" in starved["findings"][0]
    lines: list[str] = []
    healthy = doctor(model="tiny", data=ner_file, max_tokens=768, steps=4, log_fn=lines.append)
    assert not any("batch of" in f or "padding" in f for f in healthy["findings"])
    # its MFU as training's report computes it, printed; a budget asked for is not explained
    assert 0 < healthy["probe"]["mfu"] < 1 and f"MFU {healthy['probe']['mfu']:.1%}" in "\n".join(lines)
    # of the peak the tiny model's work runs at on a CPU (its recurrence stays fp32 under autocast), said
    from spanflow.monitor.report import device_peak

    assert healthy["probe"]["peak_flops"] == device_peak(torch.device("cpu"), "fp32")[0]
    assert f"of {healthy['probe']['peak_flops'] / 1e12:.2f} TFLOP/s (measured fp32 peak)" in "\n".join(lines)
    assert "probe: 4 updates of token-budget batches, max_tokens 768" in lines
    assert any(x.startswith("probing `spanflow train ner` (--task), device ") for x in lines)  # the task it probed
    with pytest.raises(ConfigError, match=r"^--max-tokens 8 is below the longest training item of the sample, \d+ "
                                          r"tokens: one must fit in a batch"):  # probed above it, yet named as 8
        doctor(model="tiny", data=ner_file, max_tokens=8, steps=2, log_fn=lambda s: None)
    lines.clear()
    doctor(model="tiny", data=ner_file, steps=2, log_fn=lines.append)  # the default: said what it stands for
    assert any(x.startswith("probe: 2 updates of token-budget batches, max_tokens ")
               and "(the most `spanflow train` takes on this device" in x for x in lines), lines


def test_diagnose_padding_and_environment():
    r = {"padding_efficiency": 0.45, "texts_per_update": 32, "data_frac": 0.05, "optimizer_frac": 0.05,
         "real_tokens_per_s": 100.0}
    assert "padding efficiency 0.45" in diagnose(r)[0]
    # spanflow's own batches are what it would advise: their padding is no finding with that fix
    assert not any("padding" in f for f in diagnose(r, own=True))
    env = environment()
    assert {"torch", "cuda_available", "cpu_threads", "nvml", "cpu_bf16"} <= set(env)


def test_diagnose_names_only_losses_its_fix_removes():
    r = {"padding_efficiency": 0.6, "texts_per_update": 4, "data_frac": 0.05, "optimizer_frac": 0.05,
         "real_tokens_per_s": 100.0}
    # random batches that pad as token-budget batches do on this data: padding is not what they lose
    same = diagnose(r, {**r, "padding_efficiency": 0.62, "texts_per_update": 30, "real_tokens_per_s": 300.0})
    assert not any("padding" in f for f in same) and "batch by token budget" in same[0]
    better = diagnose(r, {**r, "padding_efficiency": 0.95, "texts_per_update": 30, "real_tokens_per_s": 300.0})
    assert any("padding efficiency 0.60" in f and "0.95 on this data" in f for f in better)
    # spanflow's own batches at a budget given: the budget is the fix, not "batch by token budget"
    own = diagnose(r, own=True, asked=True)
    assert own and "raise --max-tokens" in own[0] and "batch by token budget" not in own[0]
    # at training's own budget, a few long texts an update are not underfeeding
    assert diagnose(r, own=True, asked=False) == []
    # 8 texts an update, measured 4.7x slower than token-budget batches: said ("no loss found" before)
    eight = {**r, "padding_efficiency": 0.9, "texts_per_update": 8}
    said = diagnose(eight, {**eight, "texts_per_update": 60, "real_tokens_per_s": 470.0})
    assert said == ["token-budget batches ran this data 4.7x as fast as batches of 8 texts: batch by token budget "
                    "(spanflow train sizes it to the data: docs/defaults.md)"]
    assert diagnose(eight, {**eight, "texts_per_update": 60, "real_tokens_per_s": 150.0}) == []  # within noise


def test_doctor_probes_any_task_and_a_sample_smaller_than_its_steps(tmp_path):
    import json

    from spanflow.data.synthetic import synthetic_re

    data = [{"text": e.text, "triple_list": [[e.text[s[0]:s[1]], r, e.text[o[0]:o[1]]] for s, r, o in e.triples]}
            for e in synthetic_re(6, seed=1)]
    (tmp_path / "re.json").write_text(json.dumps(data))
    out = doctor(model="tiny", data=str(tmp_path / "re.json"), task="re", steps=5, log_fn=lambda s: None)
    assert out["probe"]["steps"] == 5 and out["probe"]["real_tokens_per_s"] > 0
    # a batch size above the data's count: the probe's batches hold all of it, said so (not "of 100 texts")
    lines: list[str] = []
    whole = doctor(model="tiny", data=str(tmp_path / "re.json"), task="re", steps=1, batch_size=100,
                   log_fn=lines.append)
    assert "probe: 1 update of all 6 text(s) read (--batch-size 100 holds them all)" in lines
    # the token-budget batches hold the same texts: no second probe whose noise would read as a finding
    assert whole["healthy"] is None and not any("as fast as" in f for f in whole["findings"])


def test_doctor_says_why_its_peak_is_another_precisions(ner_file):
    lines: list[str] = []
    out = doctor(model="tiny", data=ner_file, precision="bf16", steps=1, log_fn=lines.append)
    # the tiny model's recurrence stays fp32 under bf16 autocast on a CPU: the fp32 peak, and why
    assert out["probe"]["peak"] == "measured fp32 peak: the model's matmuls run in fp32 under bf16"
    assert any("(measured fp32 peak: the model's matmuls run in fp32 under bf16)" in x for x in lines), lines


def test_sweep_interleaves_repeats_so_order_favours_no_point():
    calls = []

    def drifting(b, L):  # the machine speeds up as the sweep goes on; the points themselves are equal
        calls.append((b, L))
        return {"real_tokens_per_s": 1000.0 + 10 * len(calls), "padded_tokens_per_s": 1.0, "padding_efficiency": 1.0,
                "latency_p50_ms": 1.0, "latency_p95_ms": 1.0, "peak_memory_bytes": 1, "gpu_util": None,
                "quality": None}

    once = sweep(drifting, [256], [16, 32, 64], log_fn=lambda s: None, repeats=1)
    assert len({p.real_tokens_per_s for p in once}) == 3  # one pass: the later lengths look faster
    calls.clear()
    twice = sweep(drifting, [256], [16, 32, 64], log_fn=lambda s: None, repeats=2)
    assert len({p.real_tokens_per_s for p in twice}) == 1 and all(p.spread > 0 for p in twice)
    assert calls == [(256, 16), (256, 32), (256, 64), (256, 64), (256, 32), (256, 16)]


def test_probe_memory_is_per_point_not_the_process_high_water():
    import numpy as np

    from spanflow.tuning.probe import run_probe

    def step_of(mb):
        def step(batch):
            a = np.ones(mb * 2**20 // 8)  # pages touched: they count in RSS while the step runs
            assert a[-1] == 1.0
        return step

    big = run_probe(step_of(400), [[0]], [1], device=torch.device("cpu"), warmup=0, max_steps=3)
    small = run_probe(step_of(8), [[0]], [1], device=torch.device("cpu"), warmup=0, max_steps=3)
    assert big["peak_memory_bytes"] - small["peak_memory_bytes"] > 300 * 2**20


@pytest.mark.parametrize("kw, said", [
    (dict(budgets=[16, 32]), "--budgets 16,32: each is below the max length 64"),
    (dict(budgets=[0]), "--budgets must each be >= 1, got 0"),
    (dict(sample=0), "--sample must be >= 1, got 0"),
    (dict(repeats=0), "--repeats must be >= 1, got 0"),
    (dict(max_memory_gb=0.0), "--max-memory must be > 0 GiB, got 0"),
    (dict(latency_slo_ms=0.0), "--latency-slo must be > 0 ms, got 0"),
    (dict(quantize="int8"), "--quantize int8 is for inference"),  # it wrote an fp32 profile named int8
    # the Python API's types: TypeErrors from a comparison before
    (dict(budgets="256"), "budgets takes a list of whole numbers, got str '256'"),
    (dict(max_lengths=[64.0]), "max_lengths takes a list of whole numbers, got list"),
    (dict(sample="16"), "sample takes a whole number, got str '16'"),
    (dict(budget_seconds=None), "budget_seconds takes a number, got NoneType"),
    (dict(log_fn="tune.log"), "log_fn takes a function of one line (None: quiet), got str 'tune.log'"),
])
def test_tune_refuses_values_it_cannot_measure_with(ner_file, tmp_path, kw, said):
    args = dict(task="ner", model="tiny", data=ner_file, mode="train", max_lengths=[64], budget_seconds=20,
                sample=16, out=str(tmp_path), log_fn=lambda s: None)
    with pytest.raises(ConfigError, match=re.escape(said)):
        tune(**{**args, **kw})


def test_tune_refuses_what_it_would_find_only_after_measuring(ner_file, tmp_path, monkeypatch):
    from spanflow.tuning import tune as tune_module

    args = dict(task="ner", model="tiny", data=ner_file, mode="train", budget_seconds=20, sample=16,
                log_fn=lambda s: None)
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(tune_module, "resolve_runtime", lambda *a, **kw: pytest.fail("a model was set up"))
    with pytest.raises(ConfigError, match="afile: a file stands where a directory should be"):
        tune(**args, max_lengths=[64], out=str(tmp_path / "afile"))  # was told after the whole sweep
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="--max-lengths must each be at most the model's limit 512, got 2000"):
        tune(**args, max_lengths=[64, 2000], out=str(tmp_path))  # was measured at 512 without a word


def test_tune_with_limits_no_point_meets_keeps_the_earlier_profile(ner_file, tmp_path):
    earlier = tmp_path / "profile.json"
    earlier.write_text('{"earlier": true}')
    lines: list[str] = []
    with pytest.raises(ConfigError, match=r"no point met --latency-slo 0.001 ms \(the lowest p95: [0-9.]+ ms\); "
                                          f"{earlier} not written"):
        tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[256, 512], max_lengths=[64],
             budget_seconds=20, sample=16, repeats=1, latency_slo_ms=0.001, out=str(tmp_path), log_fn=lines.append)
    assert earlier.read_text() == '{"earlier": true}' and not (tmp_path / "profile.png").exists()
    assert any("max_tokens" in x and "real tok/s" in x for x in lines)  # the measured table is still shown
    # half a doctor's probe, or a batch that cannot be, is refused rather than ignored
    with pytest.raises(ConfigError, match="--model without --data"):
        doctor(model="tiny", log_fn=lambda s: None)
    with pytest.raises(ConfigError, match="--batch-size must be >= 1, got -4"):
        doctor(model="tiny", data=ner_file, batch_size=-4, log_fn=lambda s: None)
    with pytest.raises(ConfigError, match="^--batch-size sets the training probe, which needs --model and --data$"):
        doctor(batch_size=8, log_fn=lambda s: None)  # the machine report alone ignored it
    with pytest.raises(ConfigError, match="^--device gpu: not a device name"):
        doctor(device="gpu", log_fn=lambda s: None)
    lines = []
    doctor(log_fn=lines.append)  # the CPU its peaks are keyed on, and what training would run in
    assert any(x.strip().startswith("cpu: ") for x in lines)
    assert any(x.strip().startswith("training runs: device ") for x in lines)


def test_why_no_point_was_picked_names_what_ruled_them_out(monkeypatch):
    from spanflow.tuning import auto
    from spanflow.tuning import tune as tune_module
    from spanflow.tuning.tune import NoBestPoint, _missed

    fast = Point(1024, 64, real_tokens_per_s=900.0, latency_p95_ms=40.0, peak_memory_bytes=2**30)
    slow = Point(512, 64, real_tokens_per_s=500.0, latency_p95_ms=20.0, peak_memory_bytes=2**29)
    assert _missed([fast, slow], None, 10.0) == "no point met --latency-slo 10 ms (the lowest p95: 20.0 ms)"
    # within the limits but below the quality floor: the limits are not blamed
    assert _missed([fast, slow], 2.0, 50.0).startswith("no point within the limits kept the quality")
    assert _missed([Point(512, 64, oom=True)], None, None) == "no point ran: each was out of memory"

    def nothing_fits(**kw):
        raise NoBestPoint("no point ran: each was out of memory", f"{kw['out']}/profile.json")

    monkeypatch.setattr(tune_module, "tune", nothing_fits)  # --max-tokens auto's temporary profile is not named
    with pytest.raises(ConfigError, match="^max_tokens auto: no point ran: each was out of memory$"):
        auto.quick_profile(task="ner", model="tiny", data="d", mode="train", precision="fp32")


def test_a_tiny_folder_in_the_working_directory_does_not_hide_the_tiny_encoder(tmp_path, monkeypatch):
    from spanflow.errors import ModelDirError
    from spanflow.tasks.registry import check_model_for

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()  # e.g. an earlier `train ner --model tiny --out tiny`
    assert check_model_for("tiny", "ner", start=True).name == "ner"
    with pytest.raises(ModelDirError):
        check_model_for("tiny", "ner")  # inference needs a trained model: this folder holds none


def test_training_is_tuned_at_the_samples_longest_text_not_the_encoders_limit(ner_file, tmp_path):
    # short texts: training's own budget (256) fits them; measured at the limit (512) it was refused
    prof = tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[256], budget_seconds=20, sample=16,
                repeats=1, out=str(tmp_path), log_fn=lambda s: None)
    assert [p["max_tokens"] for p in prof["points"]] == [256] and 8 <= prof["points"][0]["max_length"] < 256


def test_a_directory_named_as_an_output_of_tune_is_refused_before_the_sweep(ner_file, tmp_path):
    for name in ("profile.json", "profile.png"):
        out = tmp_path / name.split(".")[1]
        (out / name).mkdir(parents=True)
        with pytest.raises(DataError, match=f"{name}: is a directory"):
            tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[512], budget_seconds=20, sample=32,
                 out=str(out), backends=False, plot=True, log_fn=lambda s: pytest.fail(f"the sweep ran: {s}"))


@pytest.mark.parametrize("argv, flag", [(["--steps", "3"], "--steps"), (["--task", "re"], "--task")])
def test_doctor_without_a_probe_refuses_the_probes_own_flags(capsys, argv, flag):
    """`doctor --steps 3` or `--task re` alone printed the machine report and ignored them."""
    from spanflow.cli.main import main

    assert main(["doctor", *argv]) == 2
    assert f"error: {flag} sets the training probe, which needs --model and --data" in capsys.readouterr().err


def test_tune_with_log_fn_none_is_quiet(ner_file, tmp_path, capsys):
    """None silences it, as it silences the train functions (a TypeError: 'NoneType' object is not
    callable, before)."""
    prof = tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[256], max_lengths=[64],
                budget_seconds=20, sample=16, out=str(tmp_path), plot=False, log_fn=None)
    assert prof["best"] and capsys.readouterr().out == ""


def test_a_stop_while_the_plot_is_drawn_leaves_the_earlier_profile(ner_file, tmp_path, monkeypatch):
    """Ctrl-C while tune drew its plot left a new profile.json beside the old profile.png, and the
    run said it was interrupted: the profile is now written after the plot."""
    import spanflow.tuning.plot as plot

    before = '{"earlier": true}'
    (tmp_path / "profile.json").write_text(before)

    def stopped(profile, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(plot, "plot_profile", stopped)
    with pytest.raises(KeyboardInterrupt):
        tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[1024], budget_seconds=5, sample=16,
             repeats=1, out=str(tmp_path), log_fn=lambda s: None)
    assert (tmp_path / "profile.json").read_text() == before

    def broken(profile, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "plot_profile", broken)  # a picture that cannot be saved costs no profile
    lines = []
    tune(task="ner", model="tiny", data=ner_file, mode="train", budgets=[1024], budget_seconds=5, sample=16,
         repeats=1, out=str(tmp_path), log_fn=lines.append)
    assert json.loads((tmp_path / "profile.json").read_text())["best"]["max_tokens"] == 1024
    assert "plot failed (OSError: [Errno 28] No space left on device); the profile is written" in lines



def test_doctor_counts_a_pairs_tokens_as_training_does(tmp_path):
    """A pair's sides are padded apart: its len() is twice its longer side, which doctor counted as
    its real tokens (1.84x training's figure on query/passage pairs); the collated batch's count is it."""
    long = " ".join(f"word{i}" for i in range(30))
    pairs = tmp_path / "qp.csv"
    pairs.write_text("".join(f"q {i},{long} {i},{i % 5}.0\n" for i in range(24)))
    r = doctor(model="tiny", data=str(pairs), task="embed", steps=2, log_fn=lambda s: None)["probe"]
    assert 0 < r["padding_efficiency"] <= 1
    # a 2-word query beside a 31-word passage: about 33 words and marks a pair, not twice the passage's
    assert r["real_tokens"] / r["items"] < 0.75 * 2 * (31 + 2)
