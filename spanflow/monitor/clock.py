"""When the command this process runs began: a training run's closing time line counts from there
(reading the data, measuring a --max-tokens auto budget), not from the train function's own start.
Unset outside a command (the Python API): the train function's start."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_began: list[float] = []  # the commands running in this process, outermost first (a command's test calls main)


@contextmanager
def command() -> Iterator[None]:
    """The span of one command (cli.main)."""
    _began.append(time.perf_counter())
    try:
        yield
    finally:
        _began.pop()


def began(own: float) -> float:
    """The start a run's time counts from: the command's, where one runs, else `own`."""
    return min(_began[0], own) if _began else own
