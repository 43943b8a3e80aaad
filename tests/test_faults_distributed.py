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
