"""Async dynamic batcher: requests from all clients queue as units (a text, or a window of
one); a worker cuts batches by token budget, runs the model in a thread and resolves each
request's future. Bounded by queued tokens; a request's units may span several batches."""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from spanflow.batching.batcher import token_budget_batches
from spanflow.runtime.threads import model_thread


class Overloaded(Exception):
    """The queue holds too many tokens, or more work than starts within the wait bound;
    the client should retry later. `why` names the bound that refused it."""

    def __init__(self, retry_after_s: float, why: str = "queue full"):
        self.retry_after_s = retry_after_s
        super().__init__(f"{why}; retry after {self.retry_after}s")

    @property
    def retry_after(self) -> int:
        """Whole seconds, rounded up (the Retry-After header's and the message's: the same)."""
        return max(1, math.ceil(self.retry_after_s))


class TooMuchWork(Exception):
    """A request whose own work, at the fastest rate measured, would outlast its whole timeout even
    on an idle server: refused at once rather than run for the timeout and dropped (413)."""


@dataclass
class _Request:
    units: list  # opaque unit payloads (e.g. token-id lists)
    lengths: list[int]
    future: asyncio.Future
    results: list = field(default_factory=list)
    todo: deque = field(default_factory=deque)  # indices not yet batched
    left: int = 0
    enqueued: float = 0.0  # the batcher's clock at submit
    cancelled: bool = False
    queued: int = 0  # tokens of its units not yet batched
    timed: bool = True  # its batches count in the measured service rate


class ServiceTime:
    """Seconds the model takes for a call on n tokens, fitted as fixed + n / rate to the last
    calls it made. A rate alone (tokens over seconds) read from calls on a request or two, which
    a fixed cost per call dominates, took a burst that one call would serve for seconds of work."""

    def __init__(self, keep: int = 64, floor: int = 0):
        self.calls: deque[tuple[int, float]] = deque(maxlen=keep)
        self._fit: tuple[float, float] | None = None
        # the fewest seconds a token any call of `floor` tokens or more took, fixed cost and all: a
        # small call's fixed cost, spread over its few tokens, would make the bound far too high
        self.best: float | None = None
        self.floor = floor

    def add(self, tokens: int, seconds: float) -> None:
        """A call's size and time (the model thread); the fit is made here, and read as one value."""
        self.calls.append((tokens, max(seconds, 0.0)))
        self._fit = self._fitted()
        if tokens > 0 and tokens >= self.floor:
            each = max(seconds, 0.0) / tokens
            self.best = each if self.best is None else min(self.best, each)

    def least(self, tokens: int) -> float | None:
        """The fewest seconds `tokens` tokens could take: at the fastest rate any call of `floor`
        tokens or more ran (a refusal on this bound is never the fit's error, nor a call slowed
        by other load); None before such a call."""
        return None if self.best is None else tokens * self.best

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds per call, seconds per token), or None before any call. Calls all of one
        size cannot tell the two apart: their time counts as fixed (the server's warm-up measures a
        full call and a single text, so both ends are known from the start)."""
        return self._fit

    def _fitted(self) -> tuple[float, float]:
        n = [c[0] for c in self.calls]
        t = [c[1] for c in self.calls]
        mn, mt = sum(n) / len(n), sum(t) / len(t)
        var = sum((x - mn) ** 2 for x in n) / len(n)
        if var <= (0.1 * mn) ** 2:
            return mt, 0.0
        per_token = sum((x - mn) * (y - mt) for x, y in zip(n, t)) / len(n) / var
        per_token = min(max(per_token, 0.0), mt / max(mn, 1.0))  # between all fixed and no fixed cost
        return mt - per_token * mn, per_token

    def seconds(self, tokens: int, max_tokens: int, calls: int = 0) -> float | None:
        """Estimated seconds to run `tokens` queued tokens in calls of at most `max_tokens` (at
        least `calls` of them: one a request, where requests are not batched together)."""
        fit = self._fit
        if fit is None:
            return None
        fixed, per_token = fit
        return max(calls, math.ceil(tokens / max(max_tokens, 1))) * fixed + tokens * per_token




class DynamicBatcher:
    """`run_batch(units) -> results` runs in a worker thread; one batch at a time.

    `clock` (seconds) times queue waits and the measured service rate; a caller that
    advances a clock of its own gets waits and rates that do not depend on the machine's load.
    `peers`: every batcher whose model runs on the same thread (this one among them; alone by
    default): a request also waits for their queued work.
    """

    def __init__(self, run_batch: Callable[[list], list], *, max_tokens: int, max_wait_ms: float = 5.0,
                 max_queue_tokens: int = 1 << 20, max_queue_wait_s: float | None = None, per_request: bool = False,
                 on_batch: Callable | None = None, min_efficiency: float = 0.9, min_split_tokens: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, peers: list | None = None):
        self.run_batch, self.max_tokens, self.max_wait = run_batch, max_tokens, max_wait_ms / 1000
        self.clock = clock
        self.min_efficiency, self.min_split_tokens = min_efficiency, min_split_tokens
        self.max_queue_tokens, self.max_queue_wait_s = max_queue_tokens, max_queue_wait_s
        self.per_request, self.on_batch = per_request, on_batch
        self._queue: deque[_Request] = deque()  # round-robin order: a big request cannot starve others
        self.queued_tokens = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.service = self._new_service()  # the model's measured calls: waits, and the 413 bound
        self.peers = peers if peers is not None else []
        if self not in self.peers:
            self.peers.append(self)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def close(self) -> None:
        """Finish what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task:
            await self._task

    @property
    def depth(self) -> int:
        return sum(len(r.todo) for r in self._queue)

    async def warm_up(self, units: list, lengths: list[int]) -> None:
        """Run a request whose slow first call must not count in the service time; then time a
        full call (the unit repeated up to the budget) and a single one, so that the fixed and
        per-token costs are known before the first burst (served batches then refine them)."""
        await self.submit(units, lengths, timed=False)
        await asyncio.get_running_loop().run_in_executor(model_thread(), self.time_calls, units, lengths)

    def time_calls(self, units: list, lengths: list[int], *, anew: bool = False) -> None:
        """(On the model thread.) Time a full call and a single one of the first unit; `anew`: in place
        of every call measured so far (a model now compiled: its eager calls, slowed by the compile
        beside them, held the queue wait high enough to refuse most of a burst, and refused requests
        measure nothing)."""
        service = self._new_service() if anew else self.service
        full = max(1, self.max_tokens // max(lengths[0], 1))
        # the first call of a shape pays for its kernels and buffers once: the full call is timed on its second run
        for k, timed in ((full, False), (full, True), (1, True)):
            self._time_call(units[:1] * k, lengths[0] * k, service if timed else None)
        if service.fit() is not None:  # where every call failed, the measure it had is kept
            self.service = service  # one attribute: admission reads the old measure or the new, whole

    def _new_service(self) -> ServiceTime:
        return ServiceTime(floor=self.max_tokens // 2)

    def _time_call(self, units: list, tokens: int, into: ServiceTime | None) -> None:
        start = self.clock()
        try:
            self.run_batch(units)
        except Exception:  # (out of memory at the full budget, say): no point measured; served calls fit it
            return
        if into is not None:
            into.add(tokens, self.clock() - start)

    def queue_wait_s(self) -> float | None:
        """Estimated seconds before work queued now starts: the calls on what is queued ahead of it
        here and at its peers (one thread runs their models), at each one's measured service time;
        None before this model has served a call."""
        if self.service.fit() is None:
            return None
        return sum(b._own_wait() or 0.0 for b in self.peers)

    def _own_wait(self) -> float | None:
        """Seconds before work queued now starts here: all the queued work at most, and with round
        robin no more than one batch of each request ahead of it (a huge request delays a new one
        by one of its batches, not by all of them)."""
        service = self.service  # read once: the model thread may replace it (time_calls)
        calls = len(self._queue) if self.per_request else 0  # unbatched: one call a queued request at least
        whole = service.seconds(self.queued_tokens, self.max_tokens, calls)
        if whole is None:
            return None
        waiting = [r for r in self._queue if r.queued and not r.cancelled]
        if self.per_request:
            turns = sum(service.seconds(min(r.queued, self.max_tokens), self.max_tokens, 1) for r in waiting)
        else:  # a batch of each request larger than one; the small ones share batches
            large = sum(r.queued > self.max_tokens for r in waiting)
            small = sum(r.queued for r in waiting if r.queued <= self.max_tokens)
            turns = (large * service.seconds(self.max_tokens, self.max_tokens, 1)
                     + (service.seconds(small, self.max_tokens) if small else 0.0))
        return min(whole, turns)

    def admit(self, need: int, whole_s: float | None = None) -> None:
        """Refuse work that could not start within max_queue_wait_s at the measured service time
        (429, at once, instead of waiting to time out), or that the queue cannot hold; and work
        that alone, on an idle model at the fastest rate it has run, would outlast its whole
        timeout `whole_s` (TooMuchWork: a request's own size, never the load it met). A request
        that fits one batch is held by the wait bound only: the token bound keeps large requests
        out, never a small one behind a large request an empty queue took."""
        own = self.service.least(need)
        if need and whole_s is not None and own is not None and own > whole_s:
            raise TooMuchWork(f"this request is {need} tokens, at least {own:.2f}s of model time at the fastest rate "
                              f"measured, over its {whole_s:g}s timeout: send fewer or shorter texts a request")
        if not self.queued_tokens:
            return  # an empty queue takes anything (a single request may exceed the bound)
        wait = self.queue_wait_s()
        if wait is not None and self.max_queue_wait_s is not None and wait > self.max_queue_wait_s:
            raise Overloaded(max(1.0, wait), f"the queued work would start in about {wait * 1000:.0f} ms, over the "
                                             f"{self.max_queue_wait_s * 1000:.0f} ms queue wait bound")
        if self.queued_tokens + need > self.max_queue_tokens and need > self.max_tokens:
            raise Overloaded(max(1.0, wait or 1.0), f"queue full ({self.queued_tokens} tokens queued, "
                                                    f"{need} asked, bound {self.max_queue_tokens})")

    def _drop(self, req: _Request) -> None:
        """A request that timed out or whose client went: its units not yet batched leave the queue
        now (not when the worker next reaches it), so admission no longer counts them."""
        req.cancelled = True
        self.queued_tokens -= req.queued
        req.queued = 0
        req.todo.clear()

    def _expire(self, req: _Request) -> None:
        """A request's timeout: it fails with TimeoutError, its queued units dropped."""
        self._drop(req)
        if not req.future.done():
            req.future.set_exception(asyncio.TimeoutError())

    async def submit(self, units: list, lengths: list[int], timeout_s: float | None = None, *,
                     timed: bool = True, whole_s: float | None = None) -> list:
        """Queue a request's units; return their results in order, within `timeout_s` (the time its
        timeout leaves it; `whole_s`: that whole timeout, its default). Raises Overloaded,
        TooMuchWork, TimeoutError. With timed=False its batches are left out of the measured
        service rate."""
        need = sum(lengths)
        self.admit(need, timeout_s if whole_s is None else whole_s)
        req = _Request(units, lengths, asyncio.get_running_loop().create_future(), [None] * len(units),
                       deque(range(len(units))), len(units), self.clock(), timed=timed, queued=need)
        if not units:
            return []
        self._queue.append(req)
        self.queued_tokens += need
        self._wake.set()
        # a timer rather than asyncio.wait_for over a shielded future: two fewer futures and
        # their callbacks per request
        timer = None if timeout_s is None else asyncio.get_running_loop().call_later(timeout_s, self._expire, req)
        try:
            return await req.future
        except (asyncio.TimeoutError, asyncio.CancelledError):
            self._drop(req)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _take(self) -> list[tuple[_Request, int]]:
        """Cut one batch: the next request in round-robin order anchors it; units of similar
        length from any request (only its own with per_request) fill the token budget."""
        while self._queue and (self._queue[0].cancelled or not self._queue[0].todo):
            self._drop(self._queue.popleft())
        if not self._queue:
            return []
        anchor = self._queue[0]
        self._queue.rotate(-1)
        pool = [anchor] if self.per_request else [r for r in self._queue if not r.cancelled]
        first = anchor.todo[0]
        # the anchor's next unit always goes in (that is what round-robin guarantees); the
        # rest are the closest in length, older requests first among equals
        cands = sorted(((abs(r.lengths[i] - anchor.lengths[first]), r.enqueued, i, r)
                        for r in pool for i in r.todo if not (r is anchor and i == first)), key=lambda c: c[:3])
        batch, longest = [(anchor, first)], anchor.lengths[first]
        for _, _, i, r in cands:
            n = r.lengths[i]
            if batch and max(longest, n) * (len(batch) + 1) > self.max_tokens:
                continue
            batch.append((r, i))
            longest = max(longest, n)
        for r, i in batch:
            r.todo.remove(i)
            r.queued -= r.lengths[i]
            self.queued_tokens -= r.lengths[i]
        for r in {id(r): r for r, _ in batch}.values():
            if not r.todo:
                self._queue.remove(r)  # fully batched: it no longer counts as waiting
        return batch

    def _run(self, batch: list[tuple[_Request, int]], t0: float, deliver: Callable, timed: bool) -> None:
        """Run what was taken, cut by the one token-budget batcher into sub-batches of
        similar length (worker thread). All waiting requests of different lengths often fit
        one budget; run as one batch they would be padded to the longest. Each part's
        results are handed to the event loop as soon as they exist: its clients get their
        answers, and send their next requests, while the model runs the rest."""
        lens = [r.lengths[i] for r, i in batch]
        parts = token_budget_batches(lens, self.max_tokens, shuffle=False, min_efficiency=self.min_efficiency,
                                     min_tokens=self.min_split_tokens)
        for part in parts:
            items = [batch[k] for k in part]
            start = self.clock()
            try:
                res = self.run_batch([r.units[i] for r, i in items])
            except Exception as e:  # a failing part fails its requests, not the server
                deliver(items, e)
                continue
            seconds = self.clock() - start  # the model's own time, not a wait for the thread
            if timed:  # a warm-up's first kernels are slow: not the service time, nor a served batch
                self.service.add(sum(lens[k] for k in part), seconds)
            if self.on_batch and timed:
                self.on_batch([lens[k] for k in part], seconds, [t0 - r.enqueued for r, _ in items])
            deliver(items, res)

    def _resolve(self, items: list[tuple[_Request, int]], res) -> None:
        """On the event loop: store a part's results; a request is answered when all its units are."""
        for k, (r, i) in enumerate(items):
            if r.future.done():
                continue
            if isinstance(res, Exception):
                r.future.set_exception(res)
                continue
            r.results[i] = res[k]
            r.left -= 1
            if r.left == 0:
                r.future.set_result(r.results)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()

        def deliver(items, res):  # from the worker thread
            loop.call_soon_threadsafe(self._resolve, items, res)

        lone = True  # the last batch served a single request
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            oldest = min((r.enqueued for r in self._queue if r.todo), default=self.clock())
            wait = self.max_wait - (self.clock() - oldest)
            # waiting pays only when other clients are active: a lone client (the last batch
            # held one request and one is waiting) would only be delayed by it
            alone = lone and len(self._queue) == 1
            if wait > 0 and not alone and self.queued_tokens < self.max_tokens and not self._closing \
                    and not self.per_request:
                await asyncio.sleep(wait)  # let a batch form, but never hold a request past max_wait
            batch = self._take()
            if not batch:
                continue
            lone = len({id(r) for r, _ in batch}) == 1
            t0 = self.clock()
            timed = all(r.timed for r, _ in batch)  # decided here: a warm-up's caller is answered mid-run
            try:
                await loop.run_in_executor(model_thread(), self._run, batch, t0, deliver, timed)
            except Exception as e:  # not the model's failure (that is delivered per part): fail the batch
                self._resolve(batch, e)
