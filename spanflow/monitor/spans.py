"""The step's phases as the device's stream ran them: CUDA events, read once per report.

On a GPU the host's clock around a forward/backward times only the kernel launches; the work
runs later, and its time lands in whichever phase next waits on the device. Events recorded on
the stream at the phase boundaries time the work itself, without a sync per step: they are read
when a report closes, after the last step's work is done.
"""
from __future__ import annotations

from collections.abc import Callable

FOLD_AT = 1024  # pending spans folded into the totals beyond this many (a long period stays bounded)


class StreamSpans:
    """Seconds of stream time per phase between `begin()` and each `end(phase)`."""

    def __init__(self, event: Callable[[], object] | None = None):
        if event is None:
            import torch

            def event():
                return torch.cuda.Event(enable_timing=True)
        self._event = event
        self._open = None
        self._pending: list[tuple[str, object, object]] = []
        self._totals: dict[str, float] = {}

    def begin(self) -> None:
        """Start timing at this point of the stream."""
        self._open = self._record()

    def end(self, phase: str) -> None:
        """Close `phase` here; the next phase starts where this one ends."""
        if self._open is None:
            self.begin()
        e = self._record()
        self._pending.append((phase, self._open, e))
        self._open = e
        if len(self._pending) > FOLD_AT:  # spans this old finished long ago: reading them waits for nothing
            self._fold(self._pending[:-2])
            self._pending = self._pending[-2:]

    def take(self) -> dict[str, float]:
        """The seconds per phase since the last take (one wait, for the last event), then reset."""
        self._fold(self._pending)
        out, self._totals, self._pending, self._open = self._totals, {}, [], None
        return out

    def _record(self):
        e = self._event()
        e.record()
        return e

    def _fold(self, spans: list) -> None:
        if not spans:
            return
        spans[-1][2].synchronize()
        for phase, a, b in spans:
            self._totals[phase] = self._totals.get(phase, 0.0) + a.elapsed_time(b) / 1000.0
