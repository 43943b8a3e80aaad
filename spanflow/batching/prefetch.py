"""Run a producer (collate, tokenization) in a background thread, a few items ahead."""
from __future__ import annotations

import numbers
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

_END = object()


def prefetch(items: Iterable, depth: int = 2) -> Iterator:
    """Yield from `items`, produced by a daemon thread up to `depth` ahead.

    Collation and tokenization release the GIL in their native parts, so the consumer's
    compute overlaps them. An exception in the producer re-raises in the consumer.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
        except BaseException as e:  # hand the error to the consumer
            q.put(_Raise(e))
            return
        q.put(_END)

    t = threading.Thread(target=run, daemon=True, name="spanflow-prefetch")
    t.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Raise):
                raise item.error
            yield item
    finally:
        stop.set()
        while t.is_alive() and not sys.is_finalizing():  # unblock a producer stuck on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(timeout=0.05)


def prepared(chunks: Iterable, prepare: Callable, depth: int = 1) -> Iterator:
    """Yield `prepare(c)` for each chunk of `chunks`, in order, with up to `depth` chunks prepared
    ahead on a worker thread while the consumer computes. The chunks are read on the caller's
    thread, at its pace: a user's iterator may be bound to its thread (a sqlite cursor) or
    endless, which `prefetch` (reading them on its own thread) does not allow."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="spanflow-prepare")
    pending: deque = deque()
    it, failed = iter(chunks), None
    try:
        while failed is None:
            try:
                c = next(it)
            except StopIteration:
                break
            except Exception as e:  # the input failed: the chunks read before it still come first
                failed = e
                break
            pending.append(pool.submit(prepare, c))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        if failed is not None:
            raise failed
    finally:
        # a consumer stopping early waits for no chunk; a stream left unfinished is closed as Python
        # exits, when the pool's modules are torn down (shutdown would print a traceback): its
        # worker thread ends with the process
        if not sys.is_finalizing():
            pool.shutdown(wait=False, cancel_futures=True)


def read_ahead(items: Iterable, size: int = 1024) -> Iterator:
    """`items` as they are, read `size` at a time by a background thread a few lists ahead: for
    spanflow's own record readers, whose parsing then overlaps the model's compute (a user's
    iterator is read on the caller's thread: `prepared`)."""
    lists = prefetch(chunked(items, size))
    try:
        for items_read in lists:
            yield from items_read
    finally:
        lists.close()  # stopped early: the thread stops reading now, not when the generator is collected


def chunked(items: Iterable, size: int) -> Iterator[list]:
    """Lists of `size` consecutive items (the last may be shorter, and so may the one before an
    error of `items`, which is raised after it); a ConfigError where `size` is not a whole number
    >= 1 (0 or "2" would hold the whole input in one list)."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        from spanflow.errors import ConfigError, quote

        raise ConfigError(f"chunk_size must be a whole number of texts >= 1, got {quote(size, 40)}")
    buf = []
    try:
        for x in items:
            buf.append(x)
            if len(buf) == size:
                yield buf
                buf = []
    except Exception:  # the items read before an input error are given first, then the error
        if buf:
            yield buf
        raise
    if buf:
        yield buf


class _Raise:
    def __init__(self, error: BaseException):
        self.error = error
