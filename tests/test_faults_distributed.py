"""Faults under torchrun: when rank 0 cannot write (a full disk, an output held by another run),
every rank stops with it at once, and the job ends in rank 0's one line and its exit code, not in
ranks left waiting at a collective, a peer's traceback or the launcher's failure report."""
import fcntl
import os
import socket
import subprocess
import sys
import time

import pytest
import torch.multiprocessing as mp

from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out):
    import errno

    from spanflow.errors import PeerFailed, WriteError
    from spanflow.training.distributed import Dist, exit_now, init_from_env, on_main, shutdown

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), SPANFLOW_DEVICE="cpu")
    d: Dist = init_from_env()

    def save():
        raise WriteError("the best model", "/x/model", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    try:
        on_main(save, d)
        got = "no error"
    except (WriteError, PeerFailed) as e:
        got = f"{type(e).__name__}: {e}"
    after = on_main(lambda: "rank 0's value", d)  # the group still works: no rank is stuck in a collective
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
        f.write(f"{got}\n{after}\n")
    shutdown()
    exit_now(0)


def test_a_rank_0_write_error_stops_every_rank(tmp_path):
    ctx = mp.start_processes(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):  # False while a rank still runs
            assert time.monotonic() < deadline, "a rank is still waiting"  # one left in a collective never returns
    finally:
        for p in ctx.processes:
            p.kill()
    r0 = (tmp_path / "rank0.txt").read_text().splitlines()
    r1 = (tmp_path / "rank1.txt").read_text().splitlines()
    assert r0 == ["WriteError: cannot write the best model to /x/model: No space left on device", "rank 0's value"]
    assert r1 == ["PeerFailed: rank 0 stopped: cannot write the best model to /x/model: No space left on device",
                  "None"]


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    with open(path, "w") as f:
        for e in synthetic_ner(40, seed=2, max_clauses=2):
            write_jsonl_record(f, e.text, e.spans)
    return path


def train_two_ranks(train, out):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "spanflow", "train", "ner", "--train", str(train), "--dev", str(train),
                           "--out", str(out), "--epochs", "1", "--max-tokens", "512", "--max-length", "64",
                           "--devices", "2"], capture_output=True, text=True, timeout=300, env=env)


def assert_one_line(r, line: str) -> None:
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 2, r.stderr[-2000:]
    assert errors == [line], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "FAILED" not in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_an_out_dir_held_by_another_run_is_one_line_under_torchrun(train_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, b"4242", 0)
        r = train_two_ranks(train_file, out)
    finally:
        os.close(fd)
    assert_one_line(r, f"error: another run (pid 4242) is training into {out}; wait for it to finish, or choose "
                       "another --out")


@pytest.mark.slow
def test_a_full_disk_under_torchrun_is_one_line(train_file, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True,
                       check=False)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        r = train_two_ranks(train_file, disk / "run")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert_one_line(r, f"error: cannot write the best model to {disk / 'run' / 'model'}: No space left on device")


def _other_lengths(rank):
    """The same words, tokens and count of texts on each rank, cut into texts of other lengths."""
    from spanflow.data.examples import NerExample

    cuts = ["Ann met Bob", "in Rome today"] if rank == 0 else ["Ann met", "Bob in Rome today"]
    return [NerExample(t, [(0, 3, "PER")]) for t in cuts] * 10


def _train_worker(rank, world, port, out, data="same", outs=("run", "run"), steps=None, resume=False):
    """One rank's training into OUT/outs[rank], on `data`: the same on each rank, or another node's
    copy ("other": another count of texts; "lengths": the same words in texts of other lengths)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), SPANFLOW_DEVICE="cpu", OMP_NUM_THREADS="1")
    from spanflow.tasks.ner import train_ner
    from spanflow.training.distributed import exit_now, shutdown
    from spanflow.training.options import TrainOptions

    examples = (_other_lengths(rank) if data == "lengths"
                else synthetic_ner(36 if rank and data == "other" else 40, seed=2, max_clauses=2))
    try:
        train_ner(examples, None, out_dir=os.path.join(out, outs[rank]), log_fn=lambda s: None,
                  options=TrainOptions(epochs=1, max_tokens=512, max_length=64, log_every=0, max_steps=steps,
                                       resume=resume))
        got = "trained"
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
        f.write(got + "\n")
    shutdown()
    exit_now(0)


def _two(worker, *args) -> list[str]:
    """Each rank's outcome line, with two processes running `worker(rank, 2, port, *args)`."""
    ctx = mp.start_processes(worker, args=(2, free_port(), *args), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 240
    try:
        while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):
            assert time.monotonic() < deadline, "a rank is still waiting"
    finally:
        for p in ctx.processes:
            p.kill()
    return [open(os.path.join(args[0], f"rank{k}.txt")).read().strip() for k in range(2)]


@pytest.mark.parametrize("same_size", [False, True])
def test_processes_that_read_other_data_are_told_before_training(same_size):
    """Each node reads its own copy of the data: another copy trained on silently, or (a tiny
    vocabulary built from it) met DDP's traceback of parameter sizes. Rank 0 names the rank and
    what differs; the other stops quietly."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        r0, r1 = _two(_train_worker, out, "lengths" if same_size else "other")
        assert not os.path.exists(os.path.join(out, "run", "model"))
    if same_size:
        assert r0.startswith("DataError: rank 1 has training data of other lengths (as many items and tokens as "
                             "rank 0's, 20 and "), r0
    else:
        assert r0.startswith("DataError: rank 1 has training data of 36 items") and "against rank 0's 40" in r0, r0
    assert r0.endswith("every process of a run must read the same training data (on several machines, the same "
                       "file on each)"), r0
    assert r1.startswith("PeerFailed:"), r1


def test_ranks_that_find_other_checkpoints_on_resume_are_told():
    """A node whose --out is on its own disk finds no checkpoint on --resume: it started over
    beside a rank that resumed, with another plan of steps, and the job hung."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        assert _two(_train_worker, out, "same", ["run", "run"], 2) == ["trained", "trained"]  # stopped at step 2
        os.mkdir(os.path.join(out, "local"))  # rank 1's own disk: no checkpoint there
        r0, r1 = _two(_train_worker, out, "same", ["run", "local"], None, True)
        ckpt = os.path.join(out, "run", "checkpoint")
    assert r0 == (f"ConfigError: --resume: rank 1 finds no checkpoint in {ckpt}, rank 0 a checkpoint at step 2: "
                  "every process resumes from one checkpoint (on several machines, an --out on a file system each of "
                  "them reads)"), r0
    assert r1.startswith("PeerFailed:"), r1


def _cli_worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), SPANFLOW_DEVICE="cpu", OMP_NUM_THREADS="1")
    sys.stderr = open(os.path.join(out, f"err{rank}.txt"), "w")
    from spanflow.cli.main import main

    rc = main(["train", "ner", "--train", os.path.join(out, f"train{rank}.conll"), "--model", "tiny", "--out",
               os.path.join(out, "run"), "--epochs", "1", "--max-tokens", "512", "--max-length", "64"])
    os._exit(rc)  # (a rank that stopped on an error has left already, with its code)


def test_a_rank_that_stops_on_its_own_data_stops_the_others():
    """Each machine reads its own copy of the data; one copy is bad. Its rank stopped before it
    joined the group, and the others waited at the group's start (gloo: half an hour)."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        good = "".join(f"Ann{k}\tB-PER\nwent\tO\nhome\tO\n\n" for k in range(8))
        open(os.path.join(out, "train0.conll"), "w").write(good)
        open(os.path.join(out, "train1.conll"), "w").write(good + "Bob\tX-Y-Z\n\n")
        ctx = mp.start_processes(_cli_worker, args=(2, free_port(), out), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 240
        try:
            for p in ctx.processes:  # each waited for itself: ctx.join would stop the others at the first failure
                p.join(timeout=max(0.0, deadline - time.monotonic()))
                assert p.exitcode is not None, "a rank is still waiting for its peer"
        finally:
            for p in ctx.processes:
                p.kill()
        codes = [p.exitcode for p in ctx.processes]
        errs = [open(os.path.join(out, f"err{r}.txt")).read() for r in range(2)]
    assert codes == [1, 2], (codes, errs)
    assert "train1.conll:33: unknown tag 'X-Y-Z'" in errs[1], errs[1]
    assert "error: another process of this training job stopped" in errs[0], errs[0]
    assert "Traceback" not in errs[0] + errs[1], errs
