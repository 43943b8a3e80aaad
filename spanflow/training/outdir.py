"""The output directory of a training run: checked writable before any work, held by one run at
a time, and removed again when a run that created it fails before writing anything to keep."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from spanflow.atomic import try_lock, writing
from spanflow.errors import ConfigError
from spanflow.training.distributed import Dist, on_main

LOCK = ".lock"
KEEP = ("checkpoint", "model")  # what makes a failed run's directory worth keeping (it resumes)


@contextmanager
def claim_out_dir(out_dir: str, dist: Dist = Dist()) -> Iterator[None]:
    """Hold `out_dir` for this run: rank 0 holds it under torchrun, the other ranks share it and
    stop with it (PeerFailed) when rank 0 cannot have it."""
    with ExitStack() as held:
        on_main(lambda: held.enter_context(_claim(out_dir)), dist)
        yield


@contextmanager
def _claim(out_dir: str) -> Iterator[None]:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out {out_dir} is a file; give a directory")
    created = not os.path.exists(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd = os.open(os.path.join(out_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ConfigError(f"cannot write to --out {out_dir}: {e.strerror or e}") from None
    ok = False
    try:
        if not try_lock(fd):
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(f"another run (pid {owner}) is training into {out_dir}; wait for it to finish, or "
                              "choose another --out")
        with writing("the run's lock file", os.path.join(out_dir, LOCK)):  # the pid a second run names
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
        ok = True
    finally:
        os.close(fd)  # releases the lock
        if not ok and created and not any(os.path.exists(os.path.join(out_dir, k)) for k in KEEP):
            shutil.rmtree(out_dir, ignore_errors=True)
