"""Training under write faults: a full disk at a model or checkpoint save (a real tmpfs, and an injected
one that runs everywhere), a kill in the middle of a save, and stdout closed by its reader. Each ends in
one line, leaves the last good model and checkpoint whole and loadable, and --resume then ends with the
weights of an uninterrupted run."""
import errno
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch

from spanflow.atomic import aside_path
from spanflow.cli import evaluate as evaluate_cli
from spanflow.cli.main import main
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.ner import NerModel
from spanflow.errors import ConfigError, WriteError
from spanflow.training.checkpoint import has_checkpoint

# dev F1 improves at every epoch end with these: epoch 2 saves a new best model, over epoch 1's
ARGS = ["--model", "tiny", "--epochs", "3", "--lr", "1e-2", "--max-tokens", "256", "--max-length", "64",
        "--seed", "1", "--precision", "fp32", "--device", "cpu"]
TEMPORARIES = (".model-", ".ckpt-")  # what atomic_dir writes aside


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    data = synthetic_ner(60, seed=6, max_clauses=2)
    for name, part in (("train", data), ("dev", data[:10])):
        with open(d / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for e in part:
                write_jsonl_record(f, e.text, e.spans)
    return d


def train(files, out, *extra) -> int:
    return main(["train", "ner", "--train", str(files / "train.jsonl"), "--dev", str(files / "dev.jsonl"), *ARGS,
                 "--out", str(out), *extra])


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    """An uninterrupted run: what every resumed one must end with."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert train(files, out) == 0
    return out


def params(path) -> dict:
    return {k: v.clone() for k, v in NerModel.load(str(path)).module.state_dict().items()}


def assert_same_weights(a, b) -> None:
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=1e-5, msg=k)


def first_epoch_step(reference) -> int:
    return json.loads((reference / "train_report.jsonl").read_text().splitlines()[0])["step"]


def assert_last_good_kept(out, reference, *, model_of_epoch: int = 1) -> None:
    """OUT/checkpoint is epoch 1's and OUT/model that of `model_of_epoch`, both whole and loadable,
    nothing half-written beside them."""
    assert not any(os.path.exists(aside_path(str(out / name))) for name in ("model", "checkpoint"))
    assert has_checkpoint(str(out / "checkpoint"))
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert (state["epoch"], state["global_step"]) == (1, first_epoch_step(reference))
    trainer = torch.load(out / "checkpoint" / "trainer.pt", map_location="cpu", weights_only=True)
    assert trainer["optimizer"]["state"]
    if model_of_epoch == 1:  # the best model and the checkpoint of epoch 1: untouched by the failed save
        assert_same_weights(out / "model", out / "checkpoint" / "model")
    else:
        NerModel.load(str(out / "model"))


def assert_resumes_to_reference(files, out, reference) -> None:
    assert train(files, out, "--resume") == 0
    assert_same_weights(reference / "model", out / "model")
    assert_same_weights(reference / "checkpoint" / "model", out / "checkpoint" / "model")
    assert not [n for n in os.listdir(out) if n.startswith(TEMPORARIES) or n.endswith(".replaced")]


def assert_one_full_disk_line(err: str, out) -> None:
    """One `error:` line, no traceback: the save that met the full disk and its final path."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    saves = f"the best model to {re.escape(str(out / 'model'))}|the checkpoint to {re.escape(str(out / 'checkpoint'))}"
    assert re.fullmatch(f"error: cannot write ({saves}): No space left on device", lines[0]), lines[0]


def disk_bytes(path) -> int:
    """What the files under `path` take on a tmpfs: each rounded up to whole pages."""
    page = os.sysconf("SC_PAGE_SIZE")
    return sum(-(-os.path.getsize(os.path.join(d, f)) // page) * page for d, _, names in os.walk(path)
               for f in names)


@contextmanager
def small_disk(path, size: int):
    """A tmpfs of `size` bytes at `path`; the test skips where mounting is not allowed."""
    os.makedirs(path)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                           text=True, check=False)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield
    finally:
        # lazily where a failed test's traceback still holds a file open on it: detached all the same
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_at_the_best_model_keeps_the_last_good_one_then_resume(files, reference, tmp_path, capsys):
    model, ckpt = disk_bytes(reference / "model"), disk_bytes(reference / "checkpoint")
    free = model + ckpt + model // 2  # epoch 1's best model and checkpoint fit; epoch 2's best model does not
    filler = 2 * (model + ckpt) + 2**16  # once removed, room for the resumed run's saves written aside
    disk = tmp_path / "disk"
    with small_disk(disk, free + filler):
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * filler)
        out = disk / "run"
        capsys.readouterr()
        assert train(files, out) == 2
        err = capsys.readouterr().err
        assert_one_full_disk_line(err, out)
        assert "the best model" in err
        assert not [n for n in os.listdir(out) if n.startswith(TEMPORARIES)]  # the failed save's copy is gone
        assert_last_good_kept(out, reference)
        os.remove(disk / "filler")  # space freed
        assert_resumes_to_reference(files, out, reference)


def test_full_disk_at_the_trainer_state_keeps_the_last_checkpoint(tmp_path):
    """trainer.pt (torch.save) meeting a full disk: a WriteError naming the checkpoint, the last one kept."""
    from spanflow.errors import WriteError
    from spanflow.training.checkpoint import load_checkpoint, save_checkpoint

    def trainer(n: int):
        p = torch.nn.Parameter(torch.zeros(n))
        opt = torch.optim.Adam([p])
        p.grad = torch.ones(n)
        opt.step()  # Adam's two moments: 8 bytes a parameter in trainer.pt
        return {"optimizer": opt, "scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0), "scaler": None}

    disk = tmp_path / "disk"
    with small_disk(disk, 2**20), torch.random.fork_rng():
        ckpt = disk / "checkpoint"
        state = {"epoch": 0, "step_in_epoch": 1, "global_step": 1, "bad_evals": 0, "stopped": False}
        save_checkpoint(str(ckpt), save_model=os.makedirs, state=state, **trainer(1000))
        with pytest.raises(WriteError, match=f"^cannot write the checkpoint to {re.escape(str(ckpt))}: No space left"):
            save_checkpoint(str(ckpt), save_model=os.makedirs, state={**state, "global_step": 2}, **trainer(10**6))
        assert not [n for n in os.listdir(disk) if n.startswith(TEMPORARIES)]
        assert load_checkpoint(str(ckpt), **trainer(1000)) == state


def test_injected_full_disk_at_a_checkpoint_then_resume(files, reference, tmp_path, capsys, monkeypatch):
    """A full disk at epoch 2's checkpoint, met by an encoder's save_pretrained that raises safetensors'
    own error type (as transformers' does) with half a file written: runs where no tmpfs mounts."""
    from safetensors import SafetensorError

    from spanflow.models.tiny import TinyModel

    real, checkpoints = TinyModel.save_pretrained, []

    def save_pretrained(self, path, **kw):
        checkpoints.extend([path] if f"{os.sep}.ckpt-" in path else [])
        if len(checkpoints) < 2:  # all but the checkpoint of epoch 2
            return real(self, path, **kw)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "model.safetensors"), "wb") as f:
            f.write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(TinyModel, "save_pretrained", save_pretrained)
    out = tmp_path / "run"
    capsys.readouterr()
    assert train(files, out) == 2
    err = capsys.readouterr().err
    assert_one_full_disk_line(err, out)
    assert "the checkpoint" in err
    assert not [n for n in os.listdir(out) if n.startswith(TEMPORARIES)]
    assert_last_good_kept(out, reference, model_of_epoch=2)
    monkeypatch.undo()
    assert_resumes_to_reference(files, out, reference)


# imported at start-up by the child process it is put on PYTHONPATH for: the Nth save that replaces the
# best model dies as a kill -9 would, its new copy written aside, before the rename ("before") or between
# replace_dir's two renames, the old copy moved aside ("between")
KILL_HOOK = """
import os

import spanflow.atomic as atomic

_replace_dir, _replaced = atomic.replace_dir, []


def replace_dir(tmp, final):
    if os.path.basename(final) == "model" and os.path.exists(final):
        _replaced.append(final)
        if len(_replaced) == int(os.environ["SPANFLOW_TEST_KILL_AT"]):
            if os.environ["SPANFLOW_TEST_KILL"] == "between":
                os.replace(final, atomic.aside_path(final))
            os._exit(137)
    _replace_dir(tmp, final)


atomic.replace_dir = replace_dir
"""


# "before": at epoch 2's best model; "between": at epoch 3's, the run's last, so that the resumed run
# saves no later one that would clear what the kill left: it must put the old copy back itself
@pytest.mark.parametrize("when, at", [("before", 1), ("between", 2)])
def test_kill_during_a_model_save_keeps_the_last_good_one_then_resume(files, reference, tmp_path, when, at):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
           "SPANFLOW_TEST_KILL": when, "SPANFLOW_TEST_KILL_AT": str(at)}
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "spanflow", "train", "ner", "--train", str(files / "train.jsonl"),
                        "--dev", str(files / "dev.jsonl"), *ARGS, "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 137, r.stderr[-2000:]
    if when == "between":
        # the old best model is whole beside its final path, and nothing at that path
        assert not os.path.exists(out / "model"), os.listdir(out)
        NerModel.load(aside_path(str(out / "model")))
    else:
        assert_last_good_kept(out, reference)
        assert [n for n in os.listdir(out) if n.startswith(TEMPORARIES)]  # the dead run's copy, left aside
    assert_resumes_to_reference(files, out, reference)


def test_evaluate_json_into_a_closed_pipe_exits_quietly(files, reference):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before spanflow prints a byte (`| head -c 10`, without the race)
    try:
        r = subprocess.run([sys.executable, "-m", "spanflow", "evaluate", "--model", str(reference / "model"),
                            "--data", str(files / "dev.jsonl"), "--json", "--device", "cpu"], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    finally:
        os.close(write)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.parametrize("exc, line", [
    (OSError(errno.ENOSPC, "No space left on device", "/out/x"),
     "error: cannot write: No space left on device (/out/x)"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x"), "error: cannot write: Read-only file system (/ro/x)"),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x"),
     "error: cannot access: Permission denied (/root/x)"),
    (Exception("Error while serializing: I/O error: Disk quota exceeded (os error 122)"),
     "error: cannot write: Disk quota exceeded"),
])
def test_an_unwrapped_write_fault_is_one_line(monkeypatch, capsys, exc, line):
    def run(a):
        raise exc

    monkeypatch.setattr(evaluate_cli, "run", run)
    assert main(["evaluate", "--model", "m", "--data", "d"]) == 2
    assert capsys.readouterr().err.strip() == line


def test_other_errors_keep_their_traceback(monkeypatch):
    def run(a):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/nowhere")

    monkeypatch.setattr(evaluate_cli, "run", run)
    with pytest.raises(FileNotFoundError):
        main(["evaluate", "--model", "m", "--data", "d"])


def test_a_full_disk_at_the_training_report_is_one_line(files, tmp_path, capsys, monkeypatch):
    from spanflow.training import progress

    def full(path, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(progress, "append_jsonl", full)
    out = tmp_path / "run"
    capsys.readouterr()
    assert train(files, out, "--epochs", "1") == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"error: cannot write the training report to {out / 'train_report.jsonl'}: "
                                            "No space left on device")
    assert "Traceback" not in err


def test_a_resume_of_another_run_is_refused_naming_what_differs(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(files, out, "--max-steps", "3") == 0  # stops with a checkpoint to resume from
    capsys.readouterr()
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text('{"model_type": "bert"}')  # an encoder: never loaded here
    (tmp_path / "fewer.jsonl").write_text("".join((files / "train.jsonl").read_text().splitlines(True)[:40]))
    cases = [
        (["--resume", "--lr", "5e-3"], "--lr 0.01 (now 0.005)"),
        (["--resume", "--seed", "2"], "--seed 1 (now 2)"),
        (["--resume", "--max-tokens", "512"], "--max-tokens 256 (now 512)"),
        (["--resume", "--model", str(tmp_path / "enc")], f"--model tiny (now {tmp_path / 'enc'}, another model)"),
    ]
    for extra, said in cases:
        assert train(files, out, *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --resume: the checkpoint in {out / 'checkpoint'} is of a "
                                                   "run with ") and said in err[0], err
    assert main(["train", "ner", "--train", str(tmp_path / "fewer.jsonl"), "--dev", str(files / "dev.jsonl"), *ARGS,
                 "--out", str(out), "--resume"]) == 2
    assert "training data of 60 items" in capsys.readouterr().err
    state_file = out / "checkpoint" / "state.json"  # as a run of --devices 2 records it
    state = json.loads(state_file.read_text())
    assert state["run"]["processes"] == 1
    state_file.write_text(json.dumps({**state, "run": {**state["run"], "processes": 2}}))
    assert train(files, out, "--resume") == 2
    assert "is of a run with 2 processes (now 1: --devices, or torchrun's --nproc-per-node)" in capsys.readouterr().err
    # a rate the processes' update derived is not blamed on --lr, which follows them; rates show 3 digits
    # (nor a budget sized per process on --max-tokens, never given)
    derived = {**state["run"]["options"], "lr": 0.0003535533905932738, "max_tokens": 128}
    state_file.write_text(json.dumps({**state, "run": {**state["run"], "processes": 2, "options": derived}}))
    assert train(files, out, "--resume") == 2
    err = capsys.readouterr().err
    assert "2 processes (now 1" in err and "--lr" not in err and "--max-tokens" not in err, err
    from spanflow.training.checkpoint import check_same_run

    with pytest.raises(ConfigError, match=r"is of a run with 1 process \(now 2: --devices"):
        check_same_run(state["run"], {**state["run"], "processes": 2}, str(out / "checkpoint"))
    state_file.write_text(json.dumps({**state, "run": {**state["run"], "options": derived}}))
    assert train(files, out, "--resume") == 2
    assert "--lr 0.000354 (now 0.01)" in capsys.readouterr().err
    # a checkpoint of a run before --stride could be left unset recorded its default, 32
    options = {**state["run"]["options"], "stride": 32}
    state_file.write_text(json.dumps({**state, "run": {**state["run"], "options": options}}))
    assert train(files, out, "--resume", "--stride", "16") == 2
    assert "--stride 32 (now 16)" in capsys.readouterr().err
    assert train(files, out, "--resume", "--epochs", "4") == 0  # unset: the checkpoint model's own; more epochs
    assert "resumed from" in capsys.readouterr().out
    assert train(files, out, "--max-steps", "1") == 0  # no --resume: a new run, and it says what it replaces
    assert f"note: {out} holds an earlier run's model and checkpoint; this run starts over" in capsys.readouterr().out


# --resume at the edges of a run: a checkpoint older than the report, one taken at an epoch's end by
# --max-steps, one of a finished run, a --max-steps the checkpoint has passed, and the learning
# check's first loss window cut by the stop

def report_lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "train_report.jsonl").read_text().splitlines()]


def checkpoint_state(out) -> dict:
    return json.loads((out / "checkpoint" / "state.json").read_text())


def test_report_lines_past_the_checkpoint_are_not_repeated_after_a_resume(files, tmp_path):
    out = tmp_path / "run"
    assert train(files, out, "--epochs", "1") == 0
    step = report_lines(out)[0]["step"]
    with open(out / "train_report.jsonl", "a") as f:  # written before a full disk refused the next checkpoint
        f.write(json.dumps({"epoch": 2, "step": step * 2, "dev_f1": 0.5}) + "\n")
    assert train(files, out, "--epochs", "2", "--resume") == 0
    assert [(r["epoch"], r["step"]) for r in report_lines(out)] == [(1, step), (2, step * 2)]
    assert report_lines(out)[1]["dev_f1"] != 0.5  # the resumed run's own line, not the one it replaced


def test_a_resume_at_an_epochs_end_reports_no_empty_throughput(files, tmp_path, capsys, monkeypatch):
    from spanflow.training import loop

    probe = tmp_path / "probe"
    assert train(files, probe, "--epochs", "1") == 0
    per_epoch = report_lines(probe)[0]["step"]
    out = tmp_path / "run"
    with monkeypatch.context() as m:  # checkpointed at the first epoch's last step, stopped as it evaluated
        m.setattr(loop, "_evaluate", lambda r: (_ for _ in ()).throw(KeyboardInterrupt))
        assert train(files, out, "--save-every", str(per_epoch)) == 130
    with open(out / "train_report.jsonl", "a") as f:  # the epoch's line, written before its checkpoint failed
        f.write(json.dumps({"epoch": 1, "step": per_epoch, "dev_f1": 0.5}) + "\n")
    capsys.readouterr()
    assert train(files, out, "--resume") == 0
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if x.startswith(f"epoch 1 step {per_epoch}"))
    assert "no steps left in this epoch (resumed at its end)" in line and "tok/s" not in line and "dev F1" in line
    ends = [r for r in report_lines(out) if r["epoch"] == 1 and not r.get("partial")]
    assert len(ends) == 1 and ends[0]["dev_f1"] != 0.5  # the epoch is reported once, by the resumed run
    assert ends[0]["steps"] == 0 and ends[0]["real_tokens_per_s"] is None and ends[0]["mfu"] is None


def test_a_resume_of_a_finished_run_says_so(files, reference, capsys):
    capsys.readouterr()
    for epochs in ("3", "2"):  # the epochs the run did, not the ones given now
        assert train(files, reference, "--resume", "--epochs", epochs) == 0
        assert (f"resumed from {reference / 'checkpoint'}: the run finished its 3 epochs (step"
                in capsys.readouterr().out)
    # --columns picks the columns of embedding pairs: for a NER model it is refused, not ignored
    assert main(["evaluate", "--model", str(reference / "model"), "--data", str(files / "dev.jsonl"),
                 "--columns", "0,1"]) == 2
    assert ("--columns picks the columns of embedding pairs, which the data of a model of task 'ner' does not take"
            in capsys.readouterr().err)


def test_a_max_steps_the_checkpoint_has_passed_is_refused(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(files, out, "--max-steps", "4") == 0
    capsys.readouterr()
    assert train(files, out, "--max-steps", "2", "--resume") == 2
    assert capsys.readouterr().err.strip() == (f"error: --max-steps 2: the checkpoint in {out / 'checkpoint'} is at "
                                               "step 4 already; give a larger --max-steps, or leave it out to train "
                                               "on to the end")


def test_the_first_loss_window_survives_a_stop_before_it_fills(files, reference, tmp_path):
    out = tmp_path / "run"
    assert train(files, out, "--max-steps", "2") == 0
    assert checkpoint_state(out)["first_loss"] is None and len(checkpoint_state(out)["window"]) == 2
    assert train(files, out, "--resume") == 0
    # the same steps' losses as the uninterrupted run's first window, not the window after the resume
    assert abs(checkpoint_state(out)["first_loss"] - checkpoint_state(reference)["first_loss"]) < 1e-6


def test_a_resumed_run_reports_the_losses_of_an_unbroken_one(files, reference, tmp_path):
    """The loss window is in the checkpoint: a run stopped after its first window filled reports,
    once resumed, the epoch losses of the run that was never stopped (they began again from the
    resume's steps alone)."""
    out = tmp_path / "run"
    steps = json.loads((reference / "train_report.jsonl").read_text().splitlines()[0])["step"]
    assert train(files, out, "--max-steps", str(steps - 1)) == 0  # inside epoch 1, its first window full
    assert checkpoint_state(out)["first_loss"] is not None
    assert train(files, out, "--resume") == 0
    want = [json.loads(x)["loss"] for x in (reference / "train_report.jsonl").read_text().splitlines()]
    got = [r["loss"] for r in map(json.loads, (out / "train_report.jsonl").read_text().splitlines())
           if not r.get("partial")]
    assert got == pytest.approx(want, abs=1e-6)


def test_a_step_line_after_a_resume_averages_the_steps_of_an_unbroken_one(files, tmp_path, capsys):
    """A stop between two --log-every points: the first step line after the resume averaged only
    the resumed steps (step 6: 1.3561 where the unbroken run said 1.3284)."""
    def step_lines(*extra) -> dict:
        capsys.readouterr()
        assert train(files, *extra, "--log-every", "3", "--epochs", "1") == 0
        return {x.split()[1]: x.split()[3] for x in capsys.readouterr().out.splitlines() if x.startswith("step ")}

    want = step_lines(tmp_path / "ref")
    step_lines(tmp_path / "run", "--max-steps", "4")  # a stop one step past the step line at 3
    got = step_lines(tmp_path / "run", "--resume")
    assert got and all(got[k] == want[k] for k in got), (got, want)


def test_out_model_that_is_no_model_is_refused_before_training_and_litter_is_not(tmp_path, capsys):
    from spanflow.atomic import recover_dir
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    data = synthetic_ner(12, seed=1)
    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)
    (out / "model" / "mine.txt").write_text("mine")
    with pytest.raises(Exception, match=r"holds 1 other file\(s\) \(e.g. mine.txt\) and no model"):
        train_ner(data, None, model="tiny", out_dir=str(out), options=TrainOptions(epochs=1, stride=0, max_length=32),
                  log_fn=None)
    assert not (out / "checkpoint").exists() and (out / "model" / "mine.txt").read_text() == "mine"
    os.remove(out / "model" / "mine.txt")
    (out / "model" / ".DS_Store").write_text("")  # a file browser's: no file of the user's to keep
    model = train_ner(data, None, model="tiny", out_dir=str(out), options=TrainOptions(epochs=1, stride=0,
                                                                                       max_length=32), log_fn=None)
    assert NerModel.load(str(out / "model")).stride == 0 == model.stride  # a stride of 0 reloads
    # an older spanflow, killed between its two renames, left its copy at NAME.old: taken back, as a model
    os.replace(out / "model", out / "model.old")
    recover_dir(str(out / "model"))
    assert NerModel.load(str(out / "model")).stride == 0 and not (out / "model.old").exists()
    (tmp_path / "notes.old").mkdir()  # but a NAME.old that is no model is never moved
    recover_dir(str(tmp_path / "notes"))
    assert (tmp_path / "notes.old").is_dir() and not (tmp_path / "notes").exists()


def test_a_resume_in_another_precision_is_said(files, tmp_path, capsys):
    """Allowed (a checkpoint moved to another machine), but the steps so far were trained in the
    other: said, where the end line named only the precision of the last run."""
    out = tmp_path / "run"
    assert train(files, out, "--max-steps", "3") == 0
    capsys.readouterr()
    assert train(files, out, "--resume", "--precision", "bf16", "--max-steps", "4") == 0
    assert ("note: the checkpoint's 3 steps were trained in fp32; this run goes on in bf16, and its scores are of a "
            "model trained in both") in capsys.readouterr().out
    assert train(files, out, "--resume", "--precision", "bf16", "--max-steps", "5") == 0
    assert "were trained in" not in capsys.readouterr().out  # the checkpoint's last steps were bf16's


def test_the_outcome_names_the_precision_its_best_was_scored_in(files, reference, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)  # finished in fp32
    capsys.readouterr()
    assert train(files, out, "--resume", "--precision", "bf16") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("best dev F1"))
    assert " (fp32, step " in line, line  # it said bf16, the resuming run's


def test_two_rates_alike_to_three_digits_are_shown_whole():
    from spanflow.errors import ConfigError
    from spanflow.training.checkpoint import check_same_run

    run = {"model": "tiny", "model_files": None, "items": 3, "tokens": 30, "digest": "x", "processes": 1,
           "course": {}, "options": {"lr": 0.00012341}}
    with pytest.raises(ConfigError, match=r"--lr 0\.00012341 \(now 0\.00012339\)"):  # not "0.000123 (now 0.000123)"
        check_same_run(run, {**run, "options": {"lr": 0.00012339}}, "ckpt")
    run["options"] = {"pack": None}
    with pytest.raises(ConfigError, match=r"--pack unset \(now 0\.5\)"):  # not "None"
        check_same_run(run, {**run, "options": {"pack": 0.5}}, "ckpt")


def test_a_fresh_run_stopped_in_a_finished_out_is_never_resumed_as_the_old_run(files, reference, tmp_path, capsys,
                                                                               monkeypatch):
    """A fresh run into a finished --out that stops after its first model, before its first
    checkpoint: --resume took the old run's checkpoint and called this run's model the old best."""
    import shutil

    from spanflow.training import loop

    out = tmp_path / "run"
    shutil.copytree(reference, out)

    def full(*a, **k):
        raise WriteError("the checkpoint", str(out / "checkpoint"), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    with monkeypatch.context() as m:
        m.setattr(loop, "save_checkpoint", full)
        assert train(files, out, "--lr", "3e-3") == 2
    assert (out / "model").is_dir() and not (out / "checkpoint").exists()  # the old run's checkpoint went at the start
    capsys.readouterr()
    assert train(files, out, "--resume") == 0  # a retry goes on from the beginning, and says what it replaces
    assert (f"no checkpoint in {out / 'checkpoint'}; starting from the beginning (warning: {out / 'model'}, a model "
            "saved with no checkpoint beside it (an earlier run's, or the stopped run's before its first checkpoint), "
            "is replaced at this run's first save; its train_report.jsonl goes now)"
            in capsys.readouterr().out)
    assert_same_weights(out / "model", reference / "model")


def test_a_finished_run_resumed_without_its_model_saves_the_last_or_says_it_is_gone(files, reference, tmp_path,
                                                                                    capsys):
    import shutil

    nodev = tmp_path / "nodev"  # no --dev: the last model is the run's; a kill while it was saved left none
    run = ["train", "ner", "--train", str(files / "train.jsonl"), *ARGS, "--epochs", "1", "--out", str(nodev)]
    assert main(run) == 0
    shutil.rmtree(nodev / "model")
    capsys.readouterr()
    assert train(files, nodev, "--epochs", "1", "--resume") == 2  # scored on dev now: its best by two sets
    assert "--resume: the checkpoint in " in capsys.readouterr().err
    assert main([*run, "--resume"]) == 0
    said = capsys.readouterr().out
    assert "the model of the last epoch (step " in said and (nodev / "model").is_dir()
    assert_same_weights(nodev / "model", nodev / "checkpoint" / "model")
    best = tmp_path / "best"  # a best model by dev F1, removed: it cannot be made again
    shutil.copytree(reference, best)
    shutil.rmtree(best / "model")
    assert train(files, best, "--resume") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(x.endswith(f"that model is gone from {best / 'model'} (removed since it was saved); the run's last "
                          f"weights are in {best / 'checkpoint' / 'model'}") for x in lines), lines
    assert not any(x.startswith("next:") for x in lines)
    assert not (best / "model").exists()  # no next: line for a model that is not there


def test_a_checkpoint_with_a_part_missing_or_a_damaged_state_is_refused_not_replaced(files, reference, tmp_path,
                                                                                    capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "checkpoint" / "trainer.pt").unlink()
    assert train(files, out, "--resume") == 2
    assert capsys.readouterr().err.strip() == (f"error: the checkpoint in {out / 'checkpoint'} has no trainer.pt: it "
                                               "is incomplete; remove the checkpoint to start over, or run without "
                                               "--resume")
    assert (out / "checkpoint" / "state.json").exists()  # kept, not started over
    shutil.copy(reference / "checkpoint" / "trainer.pt", out / "checkpoint" / "trainer.pt")
    state = out / "checkpoint" / "state.json"
    for damaged, said in (({}, "'epoch' is missing"), ({**checkpoint_state(reference), "global_step": "3"},
                                                        "'global_step' is \"3\", not a count")):
        state.write_text(json.dumps(damaged))
        assert train(files, out, "--resume") == 2
        assert capsys.readouterr().err.strip() == (f"error: {state} is not a checkpoint's state: {said}; remove the "
                                                   "checkpoint to start over")


@pytest.mark.parametrize("kind", ["file", "folder", "beside"])
def test_a_checkpoint_place_holding_other_files_is_refused_before_the_run(files, tmp_path, capsys, kind):
    out = tmp_path / "run"
    out.mkdir()
    if kind == "beside":  # a checkpoint with a file of the user's in it: a fresh run would remove both
        (out / "checkpoint").mkdir()
        (out / "checkpoint" / "state.json").write_text("{}")
        (out / "checkpoint" / "notes.txt").write_text("notes")
        said = (f"error: {out / 'checkpoint'} holds a checkpoint and 1 other file(s) (e.g. notes.txt): saving there "
                "would replace them; give a new or empty directory, or move them away")
    elif kind == "file":
        (out / "checkpoint").write_text("notes")
        said = f"error: {out / 'checkpoint'} is a file; a checkpoint is saved as a directory: give another path"
    else:
        (out / "checkpoint").mkdir()
        (out / "checkpoint" / "notes.txt").write_text("notes")
        said = (f"error: {out / 'checkpoint'} holds 1 other file(s) (e.g. notes.txt) and no checkpoint: saving there "
                "would replace them; give a new or empty directory")
    assert train(files, out) == 2
    assert capsys.readouterr().err.strip() == said
    assert (out / "checkpoint").exists() and not (out / "model").exists()


@pytest.mark.parametrize("tail", ['{"epoch": 2, "step": 18, "loss": 1.52', '{"note": 1.52}'])
def test_a_report_line_torn_by_a_kill_is_dropped_on_resume(files, tmp_path, tail):
    out = tmp_path / "run"
    assert train(files, out, "--max-steps", "4") == 0
    report = out / "train_report.jsonl"
    with open(report, "a", encoding="utf-8") as f:
        f.write(tail)  # a kill mid-append (no end), or a whole line of the user's: no newline either way
    assert train(files, out, "--resume") == 0
    records = [json.loads(x) for x in report.read_text().splitlines()]  # every line whole: one record each
    assert [r["epoch"] for r in records if "epoch" in r and not r.get("partial")] == [1, 2, 3]
    assert [r for r in records if r.get("loss") == 1.52 or r.get("note") == 1.52] == (
        [] if "epoch" in tail else [{"note": 1.52}])


def test_a_checkpoint_inside_an_epoch_past_epochs_is_refused(files, reference, tmp_path, capsys):
    out = tmp_path / "run"
    step = first_epoch_step(reference) + 2
    assert train(files, out, "--max-steps", str(step)) == 0  # a checkpoint inside epoch 2
    capsys.readouterr()
    assert train(files, out, "--resume", "--epochs", "1") == 2  # it said "the run finished its 1 epoch"
    assert capsys.readouterr().err.strip() == (f"error: --epochs 1: the checkpoint in {out / 'checkpoint'} is at epoch "
                                               f"2 (step {step}) already; give --epochs 2 or more")


def test_a_fresh_run_clears_a_linked_checkpoint_and_one_a_killed_save_left_aside(files, reference, tmp_path):
    import shutil

    out, target = tmp_path / "run", tmp_path / "elsewhere"
    shutil.copytree(reference / "checkpoint", target)
    out.mkdir()
    (out / "checkpoint").symlink_to(target)  # written through, as every save writes through a link
    assert train(files, out, "--epochs", "1") == 0  # rmtree refused the link: a traceback
    assert (out / "checkpoint").is_symlink() and checkpoint_state(out)["epoch"] == 1
    aside = tmp_path / "aside"
    shutil.copytree(reference, aside)
    os.rename(aside / "checkpoint", aside_path(str(aside / "checkpoint")))  # a save killed between its renames
    assert train(files, aside, "--epochs", "1", "--max-steps", "1") == 0
    assert not os.path.exists(aside_path(str(aside / "checkpoint")))  # not brought back by a later --resume
    assert checkpoint_state(aside)["global_step"] == 1


def test_a_resume_scored_on_other_dev_data_is_refused(files, reference, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    other = tmp_path / "dev.jsonl"
    other.write_text("\n".join((files / "dev.jsonl").read_text().splitlines()[:5]) + "\n")
    capsys.readouterr()
    assert main(["train", "ner", "--train", str(files / "train.jsonl"), "--dev", str(other), *ARGS, "--out", str(out),
                 "--resume", "--epochs", "4"]) == 2
    err = capsys.readouterr().err
    assert "--dev 10 examples, digest " in err and "(now 5 examples, digest " in err, err


STOP_IN_A_CALLBACK = r"""
import os, signal, sys, time, weakref
from spanflow.cli import main as m

m._install_handlers(True)


class Held:
    pass


def callback(_):  # as torch.compile's weakref callbacks: a raise in here Python prints and drops
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10**5):
        pass


held = Held()
ref = weakref.ref(held, callback)
try:
    del held  # the callback runs, and the stop lands in it
    end = time.monotonic() + 60
    while time.monotonic() < end:  # the command goes on: the stop must still end it
        pass
    print("ran on, deaf to the stop")
except m.Terminated as e:
    print("stopped", e.signum)
"""


def test_a_stop_that_lands_where_python_cannot_raise_still_stops_the_command():
    """A SIGTERM during torch.compile landed in a weakref callback: Python printed and dropped it, and
    the command ran on to its end with every stop signal ignored."""
    got = subprocess.run([sys.executable, "-c", STOP_IN_A_CALLBACK], capture_output=True, text=True, timeout=120)
    assert got.stdout.strip() == "stopped 15", (got.stdout, got.stderr)
    assert "Exception ignored" not in got.stderr


def test_the_content_digest_holds_no_address_and_sees_a_plugged_items_label():
    """A plain class's repr is its address (a resume of such a task's run was refused as other data);
    a list subclass lost its attributes (its relabelling went unseen)."""
    from spanflow.training.checkpoint import _content

    class Ids(list):  # as tests/textcat_task.py's items are
        def __init__(self, ids, label):
            super().__init__(ids)
            self.label = label

    class Plain:
        def __init__(self, ids, label):
            self.ids, self.label = ids, label

    assert _content([Ids([1, 2], 1)]) != _content([Ids([1, 2], 2)])
    assert _content([Plain([1, 2], 1)]) == _content([Plain([1, 2], 1)])  # two objects, two addresses
    assert _content([Plain([1, 2], 1)]) != _content([Plain([1, 2], 2)])
    assert _content([object()]) is None  # no plain form: not compared, never a false refusal

    class Base:
        __slots__ = ("text",)

    class Item(Base):
        __slots__ = "labels"  # one name, as a str

    def item(text, labels):
        it = Item()
        it.text, it.labels = text, labels
        return it

    assert _content([item("a", [1])]) != _content([item("b", [1])])  # a parent's slot counts
    assert _content([item("a", [1])]) != _content([item("a", [2])])
    assert _content([[None, Plain([1], 1)]]) == _content([[None, Plain([1], 1)]])  # a list not plain throughout
    cycle = Plain([1], 1)
    cycle.parent = cycle
    assert _content([cycle]) is None
    assert _content([{"a": {1, 2}}]) == _content([{"a": {2, 1}}])


def test_a_stop_inside_a_save_takes_effect_as_the_save_ends(tmp_path):
    """SIGTERM in a run's first save (the last epoch's model) threw the whole run away: nothing was
    saved, so --out was removed. A stop inside a save is now raised as the save is done."""
    import os
    import signal

    import torch
    from torch import nn

    from spanflow.cli.main import Terminated, _on_sigterm
    from spanflow.runtime.policy import resolve_policy
    from spanflow.training.loop import train_loop
    from spanflow.training.options import TrainOptions
    from spanflow.training.state import TaskHooks

    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

    def save(path):
        os.makedirs(path, exist_ok=True)
        os.kill(os.getpid(), signal.SIGTERM)  # handled (held) before the next line runs
        (tmp_path / "saved").write_text(path)

    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        hooks = TaskHooks(collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws),
                                              "real_tokens": 8 * len(ws), "padded_tokens": 8 * len(ws)},
                          loss_fn=lambda m, b: m.w.square() * b["x"].numel(), evaluate=None, save_model=save)
        with pytest.raises(Terminated):
            train_loop(One(), [[0] * 8 for _ in range(4)], hooks,
                       opts=TrainOptions(epochs=1, max_tokens=32, log_every=0, lr=0.1, warmup_ratio=0.0,
                                         weight_decay=0.0, max_grad_norm=0.0, patience=0),
                       policy=resolve_policy("fp32", "cpu"), out_dir=str(tmp_path / "run"), log=lambda s: None)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert (tmp_path / "saved").exists()  # the save ran to its end before the stop
    assert (tmp_path / "run" / "checkpoint" / "state.json").exists()  # what the run trained is there to resume


def test_a_held_stop_is_dropped_with_a_failed_save_and_a_second_stop_is_not_held(monkeypatch):
    """A stop held in a save that then failed was raised at the end of the next, unrelated save; and
    every further Ctrl-C was held too, so a save that hangs could not be stopped."""
    import signal

    from spanflow.cli.main import Terminated, _on_sigterm
    from spanflow.runtime import stops

    def stop():
        _on_sigterm(signal.SIGTERM, None)  # as the signal's handler runs it

    monkeypatch.setattr(signal, "getsignal", lambda signum: _on_sigterm)
    with pytest.raises(OSError):
        with stops.held():
            stop()  # held
            raise OSError(28, "No space left on device")
    with stops.held():
        pass  # nothing raised here: the stop went with the failed save
    with pytest.raises(Terminated):
        with stops.held():
            stop()  # held
            stop()  # a second one: raised at once, inside the save
    assert not stops.holding()
