"""The output directory of a training run: checked writable before any work, held by one run at
a time, and removed again when a run that created it fails before writing anything to keep."""
from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from spanflow.atomic import try_lock, writing
from spanflow.errors import ConfigError
from spanflow.models.directory import check_model_destination
from spanflow.training.checkpoint import check_checkpoint_destination
from spanflow.training.distributed import Dist, on_main

LOCK = ".lock"
KEEP = ("checkpoint", "model")  # what makes a failed run's directory worth keeping (it resumes)


@contextmanager
def claim_out_dir(out_dir: str, dist: Dist = Dist(), *, command: bool = False) -> Iterator[None]:
    """Hold `out_dir` for this run: rank 0 holds it under torchrun, the other ranks share it and
    stop with it (PeerFailed) when rank 0 cannot have it. `command`: the claim of `spanflow train`,
    made before it reads the data; the training's own claim inside it, on this thread, is this one."""
    with ExitStack() as held:
        on_main(lambda: held.enter_context(_claim(out_dir, command)), dist)
        yield


class _Held(threading.local):
    """The directories a command's claim holds, on this thread."""

    def __init__(self):
        self.dirs: set[str] = set()


_HELD = _Held()


@contextmanager
def _claim(out_dir: str, command: bool = False) -> Iterator[None]:
    if out_dir and os.path.isdir(out_dir) and os.path.realpath(out_dir) in _HELD.dirs:  # the command's claim holds it
        yield
        return
    if not out_dir:
        raise ConfigError("--out is '' (an empty path); give a directory")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out {out_dir} is {'a file' if os.path.isfile(out_dir) else 'no directory'}; give a "
                          "directory")
    if os.path.islink(out_dir) and not os.path.exists(out_dir):  # makedirs would say "File exists"
        raise ConfigError(f"--out {out_dir} is a link to {os.readlink(out_dir)}, which does not exist; create it, or "
                          "give another --out")
    check_model_destination(os.path.join(out_dir, "model"))  # now, not at the run's first save
    check_checkpoint_destination(os.path.join(out_dir, "checkpoint"))
    created = not os.path.exists(out_dir)
    lock = os.path.join(out_dir, LOCK)
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd = _lock(lock, out_dir)
    except OSError as e:
        raise ConfigError(f"cannot write to --out {out_dir}: {e.strerror or e}") from None
    ok = False
    held = os.path.realpath(out_dir)
    try:
        with writing("the run's lock file", lock):  # the pid a second run names
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        if command:
            _HELD.dirs.add(held)
        yield
        ok = True
    finally:
        _HELD.dirs.discard(held)
        _release(fd, lock)
        if not ok and created and not any(os.path.exists(os.path.join(out_dir, k)) for k in KEEP):
            shutil.rmtree(out_dir, ignore_errors=True)


def _lock(lock: str, out_dir: str) -> int:
    """An fd holding the lock on the file now at `lock`. A run removes its lock file as it ends, so
    a lock taken on a file removed meanwhile holds nothing: try again on the new one."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        if not try_lock(fd):
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"another run (pid {owner}) is training into {out_dir}; wait for it to finish, or "
                              "choose another --out")
        if _same_file(lock, fd):
            return fd
        os.close(fd)


def _release(fd: int, lock: str) -> None:
    """Remove the lock file while still holding it, then let go: a run that opened the file before
    it went and locks it after finds it removed and locks a new one (_lock), so no two runs ever
    hold the directory at once, and a finished run leaves nothing in OUT but what it wrote."""
    try:
        with writing("the run's lock file", lock):
            if _same_file(lock, fd):  # not a file a user put there after removing ours by hand
                os.unlink(lock)
    finally:
        os.close(fd)


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
