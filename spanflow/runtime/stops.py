"""Stop signals (Ctrl-C, SIGTERM and the like) held back while a save runs: a stop inside a run's
first save lost the whole run (nothing saved, so its --out was removed); held, it takes effect as
the save ends, which an atomic write keeps short. A second stop while one is held is not held: a
save that hangs (a stalled network disk) still stops."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0
_pending: list[int] = []


def holding() -> bool:
    """Whether a stop signal that arrives now is to be held (a command's handler asks): inside a
    save, and no stop held yet."""
    return _depth > 0 and not _pending


def hold(signum: int) -> None:
    """Keep a stop signal that arrived while holding(), for held() to raise as it ends."""
    _pending.append(signum)


@contextmanager
def held() -> Iterator[None]:
    """Stop signals that arrive inside are handled as it ends, by the handler that held them
    (one that raises: KeyboardInterrupt, or the command's Terminated); where the body raised,
    its error goes on and the stop is dropped (the command stops on that error all the same)."""
    global _depth
    _depth += 1
    try:
        yield
    except BaseException:
        if _depth == 1:
            _pending.clear()  # not raised at the end of a later save
        raise
    finally:
        _depth -= 1
    if not _depth and _pending:
        signum = _pending.pop()
        _pending.clear()
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
