"""What a new user meets training: one line naming where the model is (or that a --max-steps stop
left only the checkpoint), a defaults line that names the tiny start and a run without --dev, no
lock file left in OUT, the umask's modes on every file, a learning check whose loss figures are the
step lines', and a final dev score that `spanflow evaluate` reproduces."""
import json
import os
import re
import stat

import pytest
import torch
from torch import nn

from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.runtime.policy import resolve_policy
from spanflow.training import outdir
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.options import TrainOptions


def _jsonl(path, examples):
    with open(path, "w") as f:
        for e in examples:
            write_jsonl_record(f, e.text, e.spans)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return _jsonl(d / "train.jsonl", synthetic_ner(24, seed=1)), _jsonl(d / "dev.jsonl", synthetic_ner(12, seed=2))


def _train(argv, capsys) -> list[str]:
    from spanflow.cli.main import main

    capsys.readouterr()
    assert main(["train", "ner", *argv, "--max-tokens", "512", "--log-every", "0", "--precision", "fp32"]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_run_without_model_or_dev_names_the_tiny_start_and_keeps_the_last_epoch(data, tmp_path, capsys):
    out = tmp_path / "run"
    lines = _train(["--train", data[0], "--out", str(out), "--epochs", "2"], capsys)
    [defaults] = [x for x in lines if x.startswith("defaults: ")]
    assert "model tiny (a small encoder and vocabulary built from scratch on --train" in defaults
    assert "no --dev: no early stopping, the model of the last epoch is kept" in defaults
    where = [x for x in lines if f"{out}/model" in x and not x.startswith("next: ")]
    assert where == [f"no --dev to pick a best model by: the model of the last epoch (step 4) is in {out}/model"]
    assert lines[-1] == f"next: spanflow predict --model {out}/model --input texts.txt --output spans.jsonl"
    assert sorted(os.listdir(out)) == ["checkpoint", "model", "train_options.json", "train_report.jsonl"]  # no lock
    # what ran, every default filled in: an explicit budget, the rates the defaults took, the head
    ran = json.loads((out / "train_options.json").read_text())
    assert ran["max_tokens"] == 512 and ran["epochs"] == 2 and ran["precision"] == "fp32" and ran["model"] == "tiny"
    assert {"stride", "class_weights", "pack", "head_lr"} <= set(ran)  # NER's own options among them
    assert f"lr {ran['lr']:.2g}" in defaults and ran["train_items"] > 0
    assert any("; head crf; words: " in x for x in lines)  # the head it trained, named though nobody chose it


def test_a_max_steps_stop_says_the_checkpoint_holds_the_weights_then_resume_names_the_model(data, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--train", data[0], "--dev", data[1], "--out", str(out), "--epochs", "2"]
    lines = _train([*args, "--max-steps", "1"], capsys)
    # the last line: what the checkpoint's weights tag is said of no model
    assert lines[-1] == (f"stopped by --max-steps after step 1 (epoch 1): no {out}/model yet; this run's last weights "
                         f"are in {out}/checkpoint/model; the same command with --resume trains on to the end")
    assert not any("model saved" in x or "model is in" in x for x in lines)
    assert sorted(os.listdir(out)) == ["checkpoint", "train_options.json", "train_report.jsonl"]
    lines = _train([*args, "--resume"], capsys)
    where = [x for x in lines if f"{out}/model" in x and not x.startswith("next: ")]
    assert len(where) == 1 and re.fullmatch(rf"best dev F1 \d\.\d{{4}} \(fp32, step \d of 4\): the model is in "
                                            rf"{re.escape(str(out))}/model", where[0]), where
    assert (out / "model").is_dir() and not (out / ".lock").exists()


def test_the_lock_is_removed_when_the_run_ends_and_held_while_it_runs(tmp_path):
    out = str(tmp_path / "run")
    from concurrent.futures import ThreadPoolExecutor

    def claim_elsewhere():  # another run: here a thread of this process (the lock is per open file)
        with outdir.claim_out_dir(out):
            pass

    with outdir.claim_out_dir(out):
        assert os.path.exists(os.path.join(out, outdir.LOCK))
        busy = rf"another run \(pid {os.getpid()}\) is training into"
        with pytest.raises(ConfigError, match=busy), ThreadPoolExecutor(1) as pool:
            pool.submit(claim_elsewhere).result()
        with pytest.raises(ConfigError, match=busy), outdir.claim_out_dir(out):  # on this thread too
            pass
    assert os.listdir(out) == []
    with outdir.claim_out_dir(out, command=True):  # `spanflow train`'s, then its training's inside it
        with outdir.claim_out_dir(out):
            assert os.path.exists(os.path.join(out, outdir.LOCK))
        assert os.path.exists(os.path.join(out, outdir.LOCK))  # still held by the command
        with pytest.raises(ConfigError, match=busy), ThreadPoolExecutor(1) as pool:
            pool.submit(claim_elsewhere).result()
    assert os.listdir(out) == []
    with pytest.raises(RuntimeError), outdir.claim_out_dir(out):  # free again; a run that fails
        os.makedirs(os.path.join(out, "model"))  # after writing something to keep
        raise RuntimeError("the run failed")
    assert os.listdir(out) == ["model"]


def test_a_busy_out_is_told_before_the_data_is_read(tmp_path, capsys):
    """`--out` is locked before any work: a second run into a busy directory read its data (and could
    measure a budget) first, and a mistake in that data hid that the directory was taken."""
    import threading

    from spanflow.cli.main import main

    out = str(tmp_path / "run")
    bad = tmp_path / "train.conll"
    bad.write_text("Ada B-PER\nLovelace I-PER extra\n")  # line 2 has a column too many
    held, done = threading.Event(), threading.Event()

    def hold():  # the other run
        with outdir.claim_out_dir(out):
            held.set()
            done.wait(60)

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert held.wait(60)
        assert main(["train", "ner", "--train", str(bad), "--out", out]) == 2
    finally:
        done.set()
        other.join()
    said = capsys.readouterr()
    assert "is training into" in said.err and "train.conll" not in said.err + said.out


def test_a_lock_taken_on_a_file_its_holder_removed_is_taken_again_on_the_new_one(tmp_path, monkeypatch):
    """A run that opened the lock file just before its holder removed it and let go must not hold the
    directory by that removed file while a third run locks the new one."""
    lock = str(tmp_path / outdir.LOCK)
    open(lock, "w").close()
    real_open, opened = os.open, []

    def racing_open(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if not opened:
            os.unlink(path)  # the holder's clean exit, between this open and this lock
        opened.append(path)
        return fd

    monkeypatch.setattr(outdir.os, "open", racing_open)
    fd = outdir._lock(lock, str(tmp_path))
    try:
        assert len(opened) == 2 and outdir._same_file(lock, fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_every_file_of_a_model_directory_gets_the_umask_mode(tmp_path, mask):
    from safetensors.torch import save_file

    from spanflow.models.directory import write_aside

    old = os.umask(mask)
    try:
        with write_aside(str(tmp_path / "model")) as tmp:
            os.makedirs(os.path.join(tmp, "encoder"))
            save_file({"w": torch.zeros(2)}, os.path.join(tmp, "encoder", "model.safetensors"))  # written 0600
            save_file({"w": torch.zeros(2)}, os.path.join(tmp, "head.safetensors"))
            with open(os.path.join(tmp, "spanflow.json"), "w") as f:
                f.write("{}")
    finally:
        os.umask(old)
    modes = {os.path.relpath(os.path.join(p, n), tmp_path): stat.S_IMODE(os.stat(os.path.join(p, n)).st_mode)
             for p, dirs, files in os.walk(tmp_path) for n in dirs + files}
    assert modes == {"model": 0o777 & ~mask, "model/encoder": 0o777 & ~mask,
                     "model/encoder/model.safetensors": 0o666 & ~mask, "model/head.safetensors": 0o666 & ~mask,
                     "model/spanflow.json": 0o666 & ~mask}


class _Weight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))


def test_the_learning_check_quotes_the_loss_the_step_lines_print(tmp_path):
    items = [[0] * 8 for _ in range(40)]  # 4 per micro-batch of 32 tokens: 10 steps an epoch
    hooks = TaskHooks(collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws), "real_tokens": 8 * len(ws),
                                          "padded_tokens": 8 * len(ws)},
                      loss_fn=lambda m, b: m.w.square() * b["x"].numel(), evaluate=lambda m: {"f1": 0.0},
                      save_model=lambda p: os.makedirs(p, exist_ok=True))
    lines = []
    opts = TrainOptions(epochs=2, lr=0.05, max_tokens=32, patience=0, log_every=5, warmup_ratio=0.0, weight_decay=0.0,
                        max_grad_norm=0.0)
    train_loop(_Weight(), items, hooks, opts=opts, policy=resolve_policy("fp32", "cpu"), out_dir=str(tmp_path),
               log=lines.append)
    steps = {int(m[1]): m[2] for x in lines if (m := re.match(r"step (\d+)/20 loss (\S+)", x))}
    [first, second] = [x for x in lines if "the loss fell" in x]
    assert f"({steps[5]} -> {steps[10]}: the mean step loss of the first 5 steps, then of the last 5)" in first
    assert f"({steps[5]} -> {steps[20]}: " in second


def test_no_learning_check_after_an_evaluation_scored_above_zero(tmp_path):
    """Under --eval-every the epoch can end on a 0 after a score above it: the run has learned
    something, and 'still 0' would be false."""
    items = [[0] * 8 for _ in range(40)]
    scores = iter([0.25] + [0.0] * 20)
    hooks = TaskHooks(collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws), "real_tokens": 8 * len(ws),
                                          "padded_tokens": 8 * len(ws)},
                      loss_fn=lambda m, b: m.w.square() * b["x"].numel(), evaluate=lambda m: {"f1": next(scores)},
                      save_model=lambda p: os.makedirs(p, exist_ok=True))
    lines = []
    opts = TrainOptions(epochs=2, lr=0.05, max_tokens=32, patience=0, log_every=5, eval_every=5, warmup_ratio=0.0,
                        weight_decay=0.0, max_grad_norm=0.0)
    train_loop(_Weight(), items, hooks, opts=opts, policy=resolve_policy("fp32", "cpu"), out_dir=str(tmp_path),
               log=lines.append)
    assert any(x.startswith("step 10: dev F1 0.0000") for x in lines), lines  # the epoch ended on a 0
    assert not [x for x in lines if "still 0" in x or "the loss fell" in x], lines


class _Model:
    """A task model stand-in: an encoder, a fixed dev score, a save that writes a directory."""

    def __init__(self, encoder: nn.Module, f1: float):
        self.module, self.f1 = nn.Module(), f1
        self.module.encoder = encoder

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def evaluate(self, examples, **_) -> dict:
        return {"f1": self.f1}


class _Bilinear(nn.Linear):
    """Another class for the same weights, as spanflow's NativeBert is for transformers' BertModel."""


def test_the_final_dev_score_is_what_evaluate_gives_the_saved_model(tmp_path):
    """Where the saved model loads its encoder as another class than training ran (they round apart
    in bf16), the line gives the saved model's own score and says why training read another."""
    from spanflow.training.defaults import TaskDefaults
    from spanflow.training.fit import Plan, fit

    items = [[0] * 8 for _ in range(8)]
    plan = Plan(model=_Model(nn.Linear(1, 1), 0.5), items=items, defaults=TaskDefaults(lr=1e-3, head_lr=None, epochs=1),
                collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws), "real_tokens": 8 * len(ws),
                                    "padded_tokens": 8 * len(ws)},
                loss_fn=lambda m, b: m.encoder.weight.sum() * 0 + 1.0)
    lines, out = [], tmp_path / "run"
    fit(lambda run: plan, dev=["a dev example"], model="enc", out_dir=str(out), log_fn=lines.append,
        options=TrainOptions(epochs=1, max_tokens=32, log_every=0, precision="fp32", device="cpu"),
        load=lambda path, **_: _Model(_Bilinear(1, 1), 0.625))
    assert lines[-1] == ("best dev F1 0.6250 (fp32, step 2 of 2, as spanflow evaluate scores the saved model; "
                         "training's own evaluation read 0.5000: it ran the encoder as Linear, the saved model runs "
                         f"it as _Bilinear, and the two round differently): the model is in {out}/model")
