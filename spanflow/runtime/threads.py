"""The one thread of a process that loads and runs its models on a CPU."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

_MODEL_THREAD: ThreadPoolExecutor | None = None


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
    return model_thread().submit(fn, *args, **kwargs).result()
