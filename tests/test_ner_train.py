import json
import os

import pytest
import torch

from spanflow.data.examples import NerExample
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.ner.heads import TokenClassificationHead
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.training.options import TrainOptions

REPORT_KEYS = {"epoch", "step", "real_tokens_per_s", "padded_tokens_per_s", "padding_efficiency", "data_wait_frac",
               "compute_frac", "optimizer_frac", "peak_memory_bytes", "mfu", "gpu_util", "dev_f1"}


def small_opts(**kw):
    base = dict(epochs=12, lr=2e-2, max_tokens=512, max_length=64, warmup_ratio=0.05, patience=0, log_every=0,
                seed=0)
    base.update(kw)
    return TrainOptions(**base)


def test_head_alone():
    head = TokenClassificationHead(hidden_size=8, num_labels=5)
    out = head({"token_embeddings": torch.randn(2, 7, 8)})
    assert out.shape == (2, 7, 5)


def test_overfit_save_load_roundtrip(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path), options=small_opts(),
                      log_fn=lambda s: None)
    m = model.evaluate(data)
    assert m["f1"] >= 0.95, m  # it must memorise 40 sentences
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(reps) == 12 and REPORT_KEYS <= set(reps[0])
    assert 0 < reps[-1]["padding_efficiency"] <= 1 and reps[-1]["real_tokens_per_s"] > 0
    shares = ("data_wait_frac", "compute_frac", "optimizer_frac", "save_frac", "other_frac")
    assert abs(sum(reps[-1][k] for k in shares) - 1) < 1e-6 and all(reps[-1][k] >= 0 for k in shares)
    # the saved directory is self-contained and predicts the same spans
    d = tmp_path / "model"
    assert {"spanflow.json", "head.safetensors", "encoder"} <= set(os.listdir(d))
    assert not [f for f in os.listdir(d / "encoder") if f.endswith((".bin", ".pt", ".pkl"))]
    texts = [e.text for e in data[:10]]
    again = NerModel.load(str(d))
    assert again.predict(texts) == model.predict(texts)


def test_long_texts_are_windowed_not_truncated(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    model = train_ner(data, None, model="tiny", out_dir=str(tmp_path), options=small_opts(max_length=16, stride=4),
                      log_fn=lambda s: None)
    long = " ".join(e.text for e in data[:8])
    spans = model.predict([long])[0]
    # entities of the last sentence lie far beyond 16 tokens and must still be found
    assert max(e for _, e, _ in spans) > len(long) - len(data[7].text)


def params(path):
    m = NerModel.load(path)
    return {k: v.clone() for k, v in m.module.state_dict().items()}


def test_resume_matches_uninterrupted(tmp_path):
    data = synthetic_ner(60, seed=2, max_clauses=2)
    opts = dict(epochs=3, max_tokens=256, patience=0)
    full = tmp_path / "full"
    train_ner(data, data[:10], model="tiny", out_dir=str(full), options=small_opts(**opts), log_fn=lambda s: None)
    part = tmp_path / "part"
    # stop mid-epoch 2, as a kill after a checkpoint would, then resume
    stopped = train_ner(data, data[:10], model="tiny", out_dir=str(part),
                        options=small_opts(**opts, max_steps=7), log_fn=lambda s: None)
    assert stopped is not None and os.path.exists(part / "checkpoint" / "state.json")
    train_ner(data, data[:10], model="tiny", out_dir=str(part), options=small_opts(**opts, resume=True),
              log_fn=lambda s: None)
    a = params(str(full / "checkpoint" / "model"))
    b = params(str(part / "checkpoint" / "model"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_grad_accumulation_trains(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path),
                      options=small_opts(max_tokens=256, grad_accum=2), log_fn=lambda s: None)
    assert model.evaluate(data)["f1"] >= 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_bf16_cuda_trains(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path), options=small_opts(precision="bf16"),
                      log_fn=lambda s: None)
    assert model.evaluate(data)["f1"] >= 0.9


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    """A real kill mid-run (after some checkpoint), then --resume: same final weights."""
    import signal
    import subprocess
    import sys
    import time

    from spanflow.data.formats.jsonl import write_jsonl_record

    data = synthetic_ner(150, seed=6, max_clauses=2)
    train = tmp_path / "train.jsonl"
    with open(train, "w", encoding="utf-8") as f:
        for e in data:
            write_jsonl_record(f, e.text, e.spans)
    args = ["--train", str(train), "--model", "tiny", "--epochs", "3", "--lr", "3e-3", "--max-tokens", "256",
            "--max-length", "64", "--save-every", "3", "--seed", "1"]

    # One OpenMP thread: with two, the first backward pass of a process now and then rounds
    # differently from the same pass repeated in that process (the kernels' own nondeterminism,
    # not the resume's), and Adam on the zero-initialised bigram rows grows that to 1e-4.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cli(out, *extra):
        return subprocess.Popen([sys.executable, "-m", "spanflow", "train", "ner", *args, "--out", str(out), *extra],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    assert cli(tmp_path / "full").wait(timeout=300) == 0
    proc = cli(tmp_path / "part")
    state = tmp_path / "part" / "checkpoint" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if state.exists() and json.loads(state.read_text())["global_step"] >= 9:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = json.loads(state.read_text())["global_step"]
    total = json.loads((tmp_path / "full" / "checkpoint" / "state.json").read_text())["global_step"]
    assert step < total, "the run finished before it was killed; the test proves nothing"
    assert cli(tmp_path / "part", "--resume").wait(timeout=300) == 0
    a = params(str(tmp_path / "full" / "model"))
    b = params(str(tmp_path / "part" / "model"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_progress_bar_on_a_terminal_plain_lines_otherwise(tmp_path, monkeypatch, capsys):
    import sys

    data = synthetic_ner(40, seed=2)
    train_ner(data, data[:10], out_dir=str(tmp_path / "plain"), options=small_opts(epochs=1, log_every=1))
    plain = capsys.readouterr()
    assert "step 1/" in plain.out and "it/s" not in plain.err and "step/s" not in plain.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    train_ner(data, data[:10], out_dir=str(tmp_path / "tty"), options=small_opts(epochs=1, log_every=1))
    tty = capsys.readouterr()
    assert "step 1/" not in tty.out and "loss=" in tty.err and "tok_s=" in tty.err and "step" in tty.err
    assert "dev F1" in tty.out or "dev F1" in tty.err  # the epoch report still prints, above the bar
    # log_fn=None is silent on a terminal too, and a caller's own log_fn gets plain lines, no bar beside them
    train_ner(data, data[:10], out_dir=str(tmp_path / "quiet"), options=small_opts(epochs=1, log_every=1), log_fn=None)
    assert capsys.readouterr() == ("", "")
    lines: list[str] = []
    train_ner(data, data[:10], out_dir=str(tmp_path / "own"), options=small_opts(epochs=1, log_every=1),
              log_fn=lines.append)
    assert capsys.readouterr().err == "" and any(x.startswith("step 1/") for x in lines)


def test_early_stop_is_said_and_the_best_model_kept(tmp_path):
    data = synthetic_ner(30, seed=2, max_clauses=1)
    lines = []
    # a learning rate too small to change dev F1: no evaluation after the first improves on it
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
              options=small_opts(epochs=6, lr=1e-12, max_tokens=256, patience=2, warmup_ratio=0.0))
    epochs = [json.loads(x)["epoch"] for x in (tmp_path / "train_report.jsonl").read_text().splitlines()]
    assert max(epochs) == 3  # one best evaluation, then two without gain
    assert any(s.startswith("early stop after epoch 3") for s in lines), lines
    assert any(s.startswith("best dev F1") and str(tmp_path / "model") in s for s in lines)
    lines.clear()  # patience running out at the last epoch stops nothing early: the run just ended
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path / "last"), log_fn=lines.append,
              options=small_opts(epochs=3, lr=1e-12, max_tokens=256, patience=2, warmup_ratio=0.0))
    assert not any("early stop" in s for s in lines), lines
    assert any(s.startswith("best dev F1") for s in lines)


def test_the_step_gives_the_loss_the_batch_host_values_as_they_are():
    """The collation's host counts (the CRF's labelled width among them) reach the loss as ints,
    the tensors on the device: a step that dropped them would cost the CRF its word width."""
    from spanflow.runtime.policy import resolve_policy
    from spanflow.training.step import as_micro, forward_backward

    model = torch.nn.Linear(3, 1)
    seen = []

    def loss_fn(m, batch):
        seen.append((batch["labelled_width"], batch["x"].device.type))
        return m(batch["x"]).sum()

    batch = {"x": torch.ones(2, 3), "labelled_width": 4, "n_targets": 2, "real_tokens": 6, "padded_tokens": 6}
    forward_backward(model, [as_micro(batch)], loss_fn, resolve_policy("fp32", "cpu"))
    assert seen == [(4, "cpu")] and model.weight.grad is not None


def test_continued_model_takes_given_window_and_stride(tmp_path):
    from spanflow.errors import ConfigError
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.ner.train import start_model

    data, policy = synthetic_ner(20, seed=1, max_clauses=1), resolve_policy("fp32", "cpu")
    labels = sorted({lab for e in data for *_, lab in e.spans})

    def start(model, **kw):
        return start_model(model, data, labels, TrainOptions(**kw), policy)

    assert start("tiny", max_length=16).stride == 7  # the default 32, as far as half a short window takes it
    start("tiny", max_length=48, stride=8).save(str(tmp_path / "m"))
    m = str(tmp_path / "m")
    assert (start(m).limit, start(m).stride) == (48, 8)  # unset: as it was trained
    assert (start(m, max_length=24, stride=4).limit, start(m, max_length=24, stride=4).stride) == (24, 4)
    with pytest.raises(ConfigError, match="--max-length 64 is above"):
        start(m, max_length=64)  # the tiny encoder was built for 48 positions
    with pytest.raises(ConfigError, match=r"--stride must be between 0 and half the window's 46 tokens \(23\), got 24"):
        start(m, stride=24)  # more than windows overlap by: it was taken, saved, and cut to 23 unsaid


def test_entities_off_the_words_are_named_when_training_starts():
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner.features import bio_label_list, prepare_windows

    good = NerExample("Grace Hopper works at Hooli", [(0, 12, "PER"), (22, 27, "ORG")])
    bad = [NerExample("xGrace works", [(1, 6, "PER")]),  # inside a word: trains as the word
           NerExample("GraceHopper works", [(0, 5, "PER"), (5, 11, "ORG")])]  # two in one word: one
    _, tok = build_tiny([e.text for e in [good, *bad]])
    l2i = {lab: i for i, lab in enumerate(bio_label_list(["ORG", "PER"]))}
    said = []
    prepare_windows([good, good], tok, l2i, max_length=32, stride=8, log=said.append)
    assert said == []
    prepare_windows([good, *bad], tok, l2i, max_length=32, stride=8, log=said.append)
    assert len(said) == 1 and said[0].startswith("warning: 3 of 5 training entities do not start and end on the words")
    assert said[0].endswith("the first: 'Grace' (PER) in 'xGrace works' trains as 'xGrace' (PER)")
    as_lists = [NerExample(e.text, [list(s) for s in e.spans]) for e in (good, *bad)]  # as the API takes them
    prepare_windows(as_lists, tok, l2i, max_length=32, stride=8, log=said.append)
    assert said[1] == said[0]


def test_evaluate_warns_of_gold_entities_no_prediction_can_match():
    from spanflow.models.encoder import build_tiny
    from spanflow.runtime.policy import resolve_policy

    texts = ["Grace Hopper works at Hooli", "xGrace works"]
    enc, tok = build_tiny(texts)
    model = NerModel(encoder=enc, tokenizer=tok, labels=["ORG", "PER"], limit=32, policy=resolve_policy("fp32", "cpu"))
    on_words = [NerExample(texts[0], [(0, 12, "PER"), (22, 27, "ORG")])]
    assert "warnings" not in model.evaluate(on_words)
    off = [NerExample(texts[0], [(0, 13, "PER"), (22, 27, "ORG")]), NerExample(texts[1], [(1, 6, "PER")])]
    (said,) = model.evaluate(off)["warnings"]  # a space at the edge, a cut word
    assert said.startswith("2 of the data's 3 gold entities do not start and end on the words the model tags")
    assert said.endswith("the first: 'Grace Hopper ' (PER) in 'Grace Hopper works at Hooli' can only be found as "
                         "'Grace Hopper' (PER)")
