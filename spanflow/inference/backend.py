"""How the encoder runs: eager PyTorch, or compiled with torch.compile for a long-lived server
(which of the two a command runs is spanflow/runtime/backend.py's choice)."""
from __future__ import annotations

import copy
import os
import sys
import threading
import time
from collections.abc import Callable

# texts of 1 to 60 words: warm-up batches whose shapes span what requests bring
WARM_TEXTS = ["word " * k for k in range(1, 61, 4)]


def use_backend(model, backend: str, log: Callable[[str], None] = print) -> str:
    """Run `model`'s encoder (a task model whose `module` holds `.encoder`) on `backend`.

    Compiling happens here, on warm-up batches through the model's own serving path
    (`units`, `run_batch`), not on the first request. When it fails (no C++ compiler, an
    operator the compiler does not take), the model stays eager and one line says why.
    Returns the backend in use.
    """
    module = _compilable(model, log) if backend == "compile" else None
    if module is None:
        return "eager"
    seconds = _compile(module, lambda: _warm(model, model.units(WARM_TEXTS)[0]), log)
    if seconds is None:
        return "eager"
    log(f"backend compile: warm-up compiled in {seconds:.1f} s")
    return "compile"


def _compilable(model, log: Callable[[str], None]):
    """`model`'s module where it has an encoder to compile, else None with one line that says so."""
    module = getattr(model, "module", None)
    if module is None or not hasattr(module, "encoder"):
        log("backend compile: this model has no encoder to compile; running eager")
        return None
    return module


def _warm(model, units: list) -> None:
    """Warm-up batches through the model's own serving path, of sizes whose shapes a server meets."""
    for n in (1, 2, 5, len(units)):
        model.run_batch(units[:n])


def compile_aside(model, log: Callable[[str], None] = print,
                  swapped: Callable[[], object] | None = None) -> threading.Thread | None:
    """Compile `model`'s encoder on a thread of its own, its warm-up batches run through a shadow
    of the model, and swap it in when done: a server is ready, and serves eager, while the compile
    (seconds to tens of seconds) runs. Where it fails the model stays eager and one line says why.
    `swapped()` is called after the swap (a server measures its model's calls again: those timed
    beside the compile were slow). Returns the thread (None for a model with no encoder to compile)."""
    module = _compilable(model, log)
    if module is None:
        return None
    shadow = copy.copy(model)
    shadow.module = copy.copy(module)
    shadow.module._modules = dict(module._modules)  # its own encoder slot; the weights are the same tensors
    try:  # here: a tokenizer is never entered by two threads at once
        units, _, _ = model.units(WARM_TEXTS)
    except Exception as e:  # noqa: BLE001 - as a failed compile: the model stays eager, and says why
        log(f"backend compile failed ({type(e).__name__}: {str(e)[:200]}); running eager")
        return None

    def run() -> None:
        from spanflow.inference.heap import settle
        from spanflow.runtime.threads import said_cpu_at_end

        _background(log)
        with _one_at_a_time:  # a server of several models compiles them in turn, not all at once
            seconds = _compile(shadow.module, lambda: _warm(shadow, units), log)
        if seconds is not None:
            module.encoder = shadow.module.encoder  # one attribute: the next batch runs compiled
            log(f"backend compile: compiled in {seconds:.1f} s while serving eager; batches now run compiled")
            if swapped is not None:
                try:
                    swapped()
                except Exception as e:  # noqa: BLE001 - (a pool shut down as the server stops): the model runs on
                    log(f"backend compile: timing the compiled calls failed ({type(e).__name__}: {str(e)[:200]})")
        settle()  # the compiler's objects, made after the server's own were settled, out of full collections
        said_cpu_at_end()

    thread = threading.Thread(target=run, name="spanflow-compile", daemon=True)
    _aside[id(module)] = thread
    thread.start()
    return thread


# how much the compile thread's niceness is raised: at 10 the eager serving beside the compile kept
# its median latency and the compile still ended soon; 19 starved the compile, 0 the serving
# (bench/serve_startup.py)
NICE = 10


def _background(log: Callable[[str], None]) -> None:
    """This thread (and the compiler processes it starts, which inherit it) NICE steps lower in
    CPU priority than it was: the server's own threads, serving eager meanwhile, come first.
    Linux only, where a thread has a priority of its own (elsewhere the id would name a process);
    a system that refuses it is said in one line, and the compile runs at the server's priority."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
    except OSError as e:
        log(f"backend compile: runs at the server's own CPU priority, the eager batches beside it slower "
            f"(lowering it was refused: {e.strerror or e})")


_aside: dict[int, threading.Thread] = {}  # a compiling module (by id) -> its thread
_one_at_a_time = threading.Lock()


def start_backend(model, backend: str, log: Callable[[str], None] = print,
                  swapped: Callable[[], object] | None = None) -> None:
    """A server's start: `compile` runs aside (compile_aside), so that the server is ready at once;
    `swapped` is called (on the compile's thread) once batches run compiled."""
    if backend == "compile":
        compile_aside(model, log, swapped)


def compiling() -> bool:
    """Whether a compile started aside still runs (a process that stops then ends at once: waiting
    for the thread would wait for the compile)."""
    return any(t.is_alive() for t in _aside.values())


def backend_of(model) -> str:
    """What runs `model`'s encoder now: compiling (eager until it is done), compile or eager."""
    module = getattr(model, "module", None)
    thread = _aside.get(id(module))
    if thread is not None and thread.is_alive():
        return "compiling"
    return "compile" if hasattr(getattr(module, "encoder", None), "_orig_mod") else "eager"


def compare_backends(module, measure: Callable[[], dict], log: Callable[[str], None] = print,
                     repeats: int = 2) -> dict:
    """Real tokens/s of `module`'s encoder eager and compiled, each by `measure()` (one point
    of a tune sweep) `repeats` times in turn (eager, compiled, eager, ...): one run of each is
    noise enough to flip the verdict between two tunes. The compile itself happens in a
    discarded first run and is timed apart. The encoder is eager again afterwards. Compiled
    wins unless every eager run was faster than every compiled one: the batching server's own
    default where the runs cannot tell them apart. Returns {"eager", "compile" (medians), "eager_runs",
    "compile_runs", "compile_s", "best"}."""
    import statistics

    eager = module.encoder
    runs: dict[str, list[float]] = {"eager": [measure()["real_tokens_per_s"]], "compile": []}
    compile_s = _compile(module, measure, log)
    if compile_s is None:
        return {"eager": runs["eager"][0], "compile": None, "compile_s": None, "best": "eager"}
    compiled = module.encoder
    try:
        for k in range(2 * max(1, repeats) - 1):  # compiled, eager, compiled, ...: each side `repeats` times
            name = "compile" if k % 2 == 0 else "eager"
            module.encoder = compiled if name == "compile" else eager
            runs[name].append(measure()["real_tokens_per_s"])
    finally:
        module.encoder = eager
    mid = {k: statistics.median(v) for k, v in runs.items()}
    slower = max(runs["compile"]) < min(runs["eager"])
    best = "eager" if slower else "compile"
    log(f"backend: eager {mid['eager']:.0f}, compile {mid['compile']:.0f} real tok/s at the best point, medians of "
        f"{len(runs['eager'])} runs each (compiled in {compile_s:.1f} s): a batching server runs {best}"
        + ("" if slower or min(runs["compile"]) > max(runs["eager"]) else
           " (the runs overlap: its default)"))
    return {"eager": mid["eager"], "compile": mid["compile"], "eager_runs": runs["eager"],
            "compile_runs": runs["compile"], "compile_s": round(compile_s, 1), "best": best}


def _compile(module, warm: Callable[[], object], log: Callable[[str], None]) -> float | None:
    """Swap `module.encoder` for its torch.compile'd self and run `warm()`, which compiles it:
    the seconds that took, or None with the eager encoder back and one line saying why."""
    import torch

    eager = module.encoder
    t = time.perf_counter()
    try:
        module.encoder = torch.compile(eager, dynamic=True)
        warm()
    except Exception as e:  # noqa: BLE001 - inductor raises many types; any of them means: run eager
        module.encoder = eager
        reason = str(e).splitlines()[0][:200] if str(e) else ""
        log(f"backend compile failed ({type(e).__name__}: {reason}); running eager")
        return None
    return time.perf_counter() - t
