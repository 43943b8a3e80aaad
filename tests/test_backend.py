"""The compiled backend gives the eager model's results, and falls back to eager when it cannot compile."""
import os
import sys
import threading

import pytest
import torch
from helpers import tiny_bert

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.inference import backend
from spanflow.runtime.backend import choose_backend
from spanflow.tasks.ner import NerModel

TEXTS = [e.text for e in synthetic_ner(40, seed=5)]
LINUX = sys.platform.startswith("linux")


def tiny_ner() -> NerModel:
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=1)
    model = NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=64, head_type="softmax")
    with torch.no_grad():  # a head that tags something, so the comparison is not between empty lists
        model.module.head.proj.bias[1] += 2.0
    return model


def test_auto_compiles_only_for_a_batching_server():
    assert choose_backend("auto", batching=True) == "compile"
    assert choose_backend("auto", batching=False) == "eager"
    assert choose_backend("eager", batching=True) == "eager"
    # a profile from `spanflow tune --mode infer` that measured eager faster is followed
    assert choose_backend("auto", batching=True, measured="eager") == "eager"
    assert choose_backend("auto", batching=False, measured="compile") == "eager"
    with pytest.raises(ConfigError):
        choose_backend("onnx", batching=True)


def test_compiled_model_tags_what_the_eager_model_tags():
    model = tiny_ner()
    want = model.predict(TEXTS)
    assert sum(len(s) for s in want) > 0
    lines = []
    assert backend.use_backend(model, "compile", lines.append) == "compile"
    assert "compiled" in lines[0]
    assert model.module.encoder is not model.module.encoder._orig_mod  # the compiled wrapper runs
    assert model.predict(TEXTS) == want
    units, _, ctx = model.units(TEXTS[:7])
    assert model.assemble(TEXTS[:7], units, model.run_batch(units), ctx) == want[:7]


def test_a_failed_compile_runs_eager_and_says_why(monkeypatch):
    model = tiny_ner()
    eager = model.module.encoder

    class Broken(torch.nn.Module):  # what a compile that fails at its first call looks like
        def forward(self, *a, **k):
            raise RuntimeError("no C++ compiler found")

    def broken(module, **_):
        return Broken()

    monkeypatch.setattr(torch, "compile", broken)
    lines = []
    assert backend.use_backend(model, "compile", lines.append) == "eager"
    assert model.module.encoder is eager and "no C++ compiler found" in lines[0]
    assert len(model.predict(TEXTS[:3])) == 3


def test_a_server_compiles_aside_and_serves_eager_until_the_compile_is_done(monkeypatch):
    model = tiny_ner()
    eager = model.module.encoder
    want = model.predict(TEXTS[:9])
    release, warming, niceness = threading.Event(), threading.Event(), []

    class Slow(torch.nn.Module):  # a compile that holds its warm-up until released
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

        def forward(self, *a, **k):
            if LINUX:  # the compile yields the CPU to the serving threads
                niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            warming.set()
            assert release.wait(60), "never released"
            return self._orig_mod(*a, **k)

    monkeypatch.setattr(torch, "compile", lambda module, **_: Slow(module))
    lines, swapped = [], []
    thread = backend.compile_aside(model, lines.append, lambda: swapped.append(model.module.encoder))
    assert warming.wait(60)  # the compile's warm-up runs, on its own thread
    assert swapped == []
    assert model.module.encoder is eager and backend.backend_of(model) == "compiling"
    assert model.predict(TEXTS[:9]) == want  # served meanwhile, eager
    here = os.getpriority(os.PRIO_PROCESS, 0) if LINUX else 0  # this thread's, and the process's: unchanged
    assert not LINUX or niceness[0] == min(19, here + backend.NICE) > here or here == 19
    release.set()
    thread.join(60)
    assert isinstance(model.module.encoder, Slow) and model.module.encoder._orig_mod is eager
    assert swapped == [model.module.encoder]  # told once, after the swap (the server times its calls again)
    assert backend.backend_of(model) == "compile" and "batches now run compiled" in lines[-1]
    assert model.predict(TEXTS[:9]) == want
    failing = tiny_ner()
    monkeypatch.setattr(torch, "compile", lambda module, **_: (_ for _ in ()).throw(RuntimeError("no C++ compiler")))
    backend.compile_aside(failing, lines.append, lambda: swapped.append("failed")).join(60)
    assert backend.backend_of(failing) == "eager" and "no C++ compiler" in lines[-1] and len(swapped) == 1


def test_eager_batches_beside_a_compile_keep_their_low_precision_path():
    """torch.compiler.is_compiling() is one flag for the process: while a server compiled aside, the
    eager batches of its model thread skipped the row rounding of bf16 products (models/linear.py)."""
    from spanflow.models.linear import low_precision

    model = tiny_ner()
    x, w = torch.zeros(3, 32, dtype=torch.bfloat16), torch.zeros(32, 32, dtype=torch.bfloat16)
    thread = backend.compile_aside(model, lambda line: None)  # a real compile, on its own thread
    seen = []
    while thread.is_alive():
        seen.append(low_precision(x, w))
    thread.join()
    assert seen and set(seen) == {torch.bfloat16}
    assert backend.backend_of(model) == "compile"


@pytest.mark.parametrize("speeds, best", [
    ((100, 0, 95, 90, 105), "compile"),  # the runs overlap: the first pair alone would have said eager
    ((100, 0, 90, 101, 95), "eager"),    # eager faster in every run
    ((90, 0, 100, 95, 99), "compile"),
])
def test_compare_backends_measures_each_side_in_turn_and_takes_eager_only_when_always_faster(monkeypatch, speeds,
                                                                                               best):
    class Module:
        encoder = "eager"

    module, seen = Module(), []
    monkeypatch.setattr(torch, "compile", lambda enc, **kw: "compiled")
    calls = iter(speeds)  # eager, the compiling run (discarded), compiled, eager, compiled

    def measure():
        seen.append(module.encoder)
        return {"real_tokens_per_s": float(next(calls))}

    out = backend.compare_backends(module, measure, log=lambda s: None)
    assert seen == ["eager", "compiled", "compiled", "eager", "compiled"]
    assert module.encoder == "eager" and out["best"] == best
    assert out["eager_runs"] == [speeds[0], speeds[3]] and out["compile_runs"] == [speeds[2], speeds[4]]


@pytest.mark.skipif(not LINUX, reason="a thread has a CPU priority of its own on Linux only")
def test_a_refused_priority_is_said_and_the_compile_goes_on(monkeypatch):
    def refuse(*a):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    lines = []
    backend._background(lines.append)
    assert lines == ["backend compile: runs at the server's own CPU priority, the eager batches beside it slower "
                     "(lowering it was refused: Operation not permitted)"]
