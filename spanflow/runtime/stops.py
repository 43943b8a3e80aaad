"""Stop signals (Ctrl-C, SIGTERM and the like) held back while a save runs: a stop inside a run's
first save lost the whole run (nothing saved, so its --out was removed); held, it takes effect as
the save ends, which an atomic write keeps short. A second stop while one is held is not held: a
save that hangs (a stalled network disk) still stops."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

# the signals that stop a command as SIGTERM does (a closed terminal's SIGHUP, or torchrun's agent passing
# on the one its launcher got, killed a rank outright); Ctrl-C's SIGINT stops it as an interrupt
STOPS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))

_depth = 0
_pending: int | None = None  # the stop held: one at most


def holding() -> bool:
    """Whether a stop signal that arrives now is held: inside a save, and no stop held yet."""
    return _depth > 0 and _pending is None


def held_back(signum: int) -> bool:
    """For a command's stop handler: True where this stop is held, for held() to raise as its save
    ends; False where the handler stops the command now."""
    global _pending
    if not holding():
        return False
    _pending = signum
    return True


@contextmanager
def held() -> Iterator[None]:
    """Stop signals that arrive inside are handled as it ends, by the handler that held them
    (one that raises: KeyboardInterrupt, or the command's Terminated); where the body raised,
    its error goes on and the stop is dropped (the command stops on that error all the same)."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    except BaseException:
        if _depth == 1:
            _pending = None  # not raised at the end of a later save
        raise
    finally:
        _depth -= 1
    if not _depth and _pending is not None:
        signum, _pending = _pending, None
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
