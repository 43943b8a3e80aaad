"""When the command this process runs began: a training run's closing time line counts from there
(reading the data, measuring a --max-tokens auto budget), not from the train function's own start.
Unset outside a command (the Python API): the train function's start. Kept per thread (a server
started by main() in one thread does not set another thread's start)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_began: ContextVar[tuple[float, ...]] = ContextVar("spanflow_command_began", default=())
# a launcher's start, passed to the processes it starts (perf_counter is the system's monotonic clock:
# the same in every process of a machine)
ENV = "SPANFLOW_COMMAND_BEGAN"


@contextmanager
def command(process: bool = False) -> Iterator[None]:
    """The span of one command (cli.main): from now, or (`process`: the command is the process's
    own) from the process's start, its imports included; under `--devices N`, from its launcher's."""
    now = time.perf_counter()
    start = now - _age() if process else now
    try:
        launched = float(os.environ.get(ENV, "nan"))
    except ValueError:
        launched = float("nan")
    token = _began.set((*_began.get(), launched if launched <= start else start))  # nan: no launcher's
    try:
        yield
    finally:
        _began.reset(token)


def began(own: float) -> float:
    """The start a run's time counts from: the innermost command's, where one runs, else `own`."""
    starts = _began.get()
    return min(starts[-1], own) if starts else own


def current() -> float | None:
    """The innermost running command's start (None outside one)."""
    starts = _began.get()
    return starts[-1] if starts else None


def _age() -> float:
    """Seconds since this process started (0 where that cannot be read)."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # no psutil, or a platform that does not say: the command's own start
        return 0.0
