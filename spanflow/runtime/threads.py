"""The one thread of a process that loads and runs its models on a CPU; and the CPU seconds of
threads that ended, which a server's /metrics counts."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

_MODEL_THREAD: ThreadPoolExecutor | None = None
_WAITED = 0  # calls of on_model_thread whose work has not ended
_COUNT = threading.Lock()


def model_thread() -> ThreadPoolExecutor:
    """The one thread of this process that loads and runs models.

    Each thread that runs parallel torch CPU ops gets its own OpenMP team; once a process
    holds more OpenMP threads than cores, the OpenMP runtime stops spinning between parallel
    regions, and every op then pays a wake-up: a model loaded (or checked) on one thread and
    run on another runs at about two thirds of its speed on 2 cores (docs/serving.md has the
    measurement). One thread for all of it keeps one team. Servers and Ray actors, whose
    frameworks call them from threads of their own, run their models here.
    """
    global _MODEL_THREAD
    if _MODEL_THREAD is None:
        _MODEL_THREAD = ThreadPoolExecutor(1, thread_name_prefix="spanflow-model")
    return _MODEL_THREAD


def on_model_thread(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` run on model_thread(), waited for; its result, or its error raised here."""
    def run():
        try:
            return fn(*args, **kwargs)
        finally:
            _count(-1)

    _count(1)
    # not undone on a signal's exception: the first submit starts the thread, which may run `run`
    # before submit() returns, and the signal must then find it busy
    try:
        future = model_thread().submit(run)
    except Exception:  # refused (a pool shut down): it never runs
        _count(-1)
        raise
    return future.result()


def _count(step: int) -> None:
    global _WAITED
    with _COUNT:
        _WAITED += step


def model_thread_busy() -> bool:
    """Whether work waited for on the model thread is still running (a caller interrupted while it
    ran): the interpreter would join that thread at exit, after the work (a compile, a load) ends."""
    return _WAITED > 0


_ENDED: dict[int, tuple[str, float]] = {}  # native thread id -> (its name, its CPU seconds), said as it ended


def said_cpu_at_end() -> None:
    """Called last on a thread that ends before its process (a compile aside): its CPU seconds kept,
    as /proc forgets a thread once it is gone (a server's /metrics would lose its last stretch)."""
    _ENDED[threading.get_native_id()] = (threading.current_thread().name, time.thread_time())


def ended_cpu() -> dict[int, tuple[str, float]]:
    """(name, CPU seconds) of the threads that said_cpu_at_end, by native thread id."""
    return dict(_ENDED)
