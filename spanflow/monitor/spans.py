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

    def __init__(self, device=None, event: Callable[[], object] | None = None):
        if event is None:
            import torch

            def event():
                return torch.cuda.Event(enable_timing=True)
        self._event = event
        self._device = device  # the events go on this device's current stream (None: the event's own choice)
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
        if len(self._pending) > FOLD_AT:  # the older half: hundreds of steps back, done; reading them waits for nothing
            old, self._pending = self._pending[:FOLD_AT // 2], self._pending[FOLD_AT // 2:]
            self._fold(old)

    def take(self) -> dict[str, float]:
        """The seconds per phase since the last take (one wait, for the last event), then reset."""
        self._fold(self._pending)
        out, self._totals, self._pending, self._open = self._totals, {}, [], None
        return out

    def _record(self):
        e = self._event()
        if self._device is None:
            e.record()
        else:
            import torch

            e.record(torch.cuda.current_stream(self._device))
        return e

    def _fold(self, spans: list) -> None:
        if not spans:
            return
        spans[-1][2].synchronize()
        for phase, a, b in spans:
            self._totals[phase] = self._totals.get(phase, 0.0) + a.elapsed_time(b) / 1000.0
