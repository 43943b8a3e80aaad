"""Host syncs: at most one per optimizer step in training, one per batch in inference (reading
its results). Syncs an op makes implicitly (CasRel's nonzero, which sizes its object pass by
the subjects found) are not counted here.

A host sync is a read of a device tensor's values on the host: .item(), .tolist(), .numpy(),
.cpu(), bool()/int()/float() of a tensor, and torch.cuda.synchronize() (a .to("cpu") cannot
be told from the .to(device) of a CPU run, and spanflow moves results with .cpu()). On a
GPU each one waits for every kernel queued before it, and one per batch is what leaves a small
model's GPU idle. On a CPU nothing waits, so the counter tells device tensors from host ones
itself: the model's parameters and their gradients, whatever goes through .to(device), and
everything computed from those (a TorchFunctionMode follows them). The collation thread's
host tensors do not count; a .tolist() after the .cpu() that moved the values is not a second
sync.
"""
from __future__ import annotations

import threading

import pytest
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from helpers import tiny_bert

import spanflow.training.fit as fit_mod
import spanflow.training.loop as loop_mod
from spanflow.data.synthetic import synthetic_ner, synthetic_pairs, synthetic_re
from spanflow.tasks.embed.pairs import Pair
from spanflow.tasks.embed.train import train_embedder
from spanflow.tasks.ner import train_ner
from spanflow.tasks.re import train_re
from spanflow.training.options import TrainOptions
from spanflow.training.step import forward_backward

READS = {Tensor.item, Tensor.tolist, Tensor.numpy, Tensor.__bool__, Tensor.__int__, Tensor.__float__,
         Tensor.__index__}


def _tensors(x):
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class SyncCounter(TorchFunctionMode):
    """Counts host syncs of the thread it is entered on (see the module's docstring)."""

    def __init__(self):
        super().__init__()
        self.count, self.params = 0, []
        self.seen: list[str] = []
        self._cuda_sync = torch.cuda.synchronize

    def _device(self, t: Tensor) -> bool:
        if getattr(t, "_sf_host", False):  # what .cpu() returned (on a CPU, the tensor itself)
            return False
        return (getattr(t, "_sf_device", False) or isinstance(t, nn.Parameter)
                or any(t is p.grad for p in self.params))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(_tensors((args, kwargs)))
        on_device = any(self._device(t) for t in inputs)
        out = func(*args, **kwargs)
        if func in READS or func is Tensor.cpu:
            if inputs and self._device(inputs[0]):
                self._sync(getattr(func, "__name__", str(func)))
            if func is Tensor.cpu:
                out._sf_host = True
            return out  # on the host now
        if on_device or func in (Tensor.to, Tensor.cuda):
            for t in _tensors(out):
                try:
                    t._sf_device = True
                except (AttributeError, RuntimeError):  # a tensor that takes no attributes: counted as host
                    continue
        return out

    def _sync(self, what: str) -> None:
        import traceback

        self.count += 1
        here = [f for f in traceback.extract_stack()[:-2] if "test_host_syncs" not in f.filename]
        self.seen.append(f"{what} at " + " < ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in here[-8:]))

    def __enter__(self):
        torch.cuda.synchronize = lambda *a, **k: (self._sync("cuda.synchronize"), self._cuda_sync(*a, **k))[1]
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda.synchronize = self._cuda_sync
        return super().__exit__(*exc)


def per_step_syncs(monkeypatch, train) -> list[int]:
    """The host syncs of each optimizer step of `train()` (a training run), on the training thread."""
    counter, marks = SyncCounter(), []
    real_loop, real_step = fit_mod.train_loop, loop_mod.optimizer_step

    def loop(model, *a, **k):
        counter.params = list(model.parameters())
        return real_loop(model, *a, **k)

    def step(*a, **k):
        real_step(*a, **k)
        marks.append(counter.count)

    monkeypatch.setattr(fit_mod, "train_loop", loop)
    monkeypatch.setattr(loop_mod, "optimizer_step", step)
    assert threading.current_thread() is threading.main_thread()
    with counter:
        train()
    per_step = [b - a for a, b in zip(marks, marks[1:])]
    if per_step and max(per_step) > 1:
        print(sorted(set(counter.seen)))
    return per_step


OPTS = dict(epochs=1, lr=1e-3, max_tokens=96, max_length=32, patience=0, log_every=0,
            save_every=10_000, max_steps=10, seed=0)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> str:
    """A from-scratch BERT encoder directory (the encoders users train are transformers)."""
    texts = [e.text for e in synthetic_ner(200, seed=0)] + [t for p in synthetic_pairs(100) for t in p[:2]]
    model, tok = tiny_bert(texts)
    path = str(tmp_path_factory.mktemp("bert"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _ner(encoder, tmp_path, **kw):
    data = synthetic_ner(200, seed=1)
    return lambda: train_ner(data, None, model=encoder, out_dir=str(tmp_path), log_fn=lambda s: None,
                             options=TrainOptions(**{**OPTS, **kw}))


def _re(encoder, tmp_path, **kw):
    data = synthetic_re(200, seed=1)
    return lambda: train_re(data, None, model=encoder, out_dir=str(tmp_path), log_fn=lambda s: None,
                            options=TrainOptions(**{**OPTS, **kw}))


def _embed(encoder, tmp_path, **kw):
    pairs = [Pair(a, b, s) for a, b, s in synthetic_pairs(300, seed=1)]
    return lambda: train_embedder(pairs, None, model=encoder, out_dir=str(tmp_path), log_fn=lambda s: None,
                                  options=TrainOptions(**{**OPTS, **kw}))


@pytest.mark.parametrize("make", [_ner, _re, _embed], ids=["ner", "re", "embed"])
def test_training_syncs_the_host_at_most_once_per_optimizer_step(bert_dir, tmp_path, monkeypatch, make):
    steps = per_step_syncs(monkeypatch, make(bert_dir, tmp_path, grad_accum=2))
    assert len(steps) >= 8
    assert max(steps) <= 1, steps  # the run's one read of its first losses may fall in a step
    assert sum(steps) <= 1, steps


def test_sparse_table_gradients_add_no_host_sync(bert_dir, tmp_path, monkeypatch):
    # the vocabulary table sparse, as on the CPU with a real vocabulary (training/optim.py):
    # the clip norm and the row updates read nothing back
    from spanflow.training import optim

    monkeypatch.setattr(optim, "VOCABULARY_ROWS", 64)
    made = []
    real = optim.sparse_tables
    monkeypatch.setattr(optim, "sparse_tables", lambda m, d, **k: made.extend(real(m, d, **k)) or made)
    steps = per_step_syncs(monkeypatch, _ner(bert_dir, tmp_path, grad_accum=2, device="cpu"))
    assert made and len(steps) >= 8
    assert sum(steps) <= 1, steps


def test_the_counter_sees_an_item_per_micro_batch(bert_dir, tmp_path, monkeypatch):
    # a step that reads each micro-batch's loss (loss.item() to log it) syncs once per micro-batch
    def reads_each_loss(model, micro, loss_fn, *a, **k):
        def loss_read(m, b):
            loss = loss_fn(m, b)
            loss.item()
            return loss
        return forward_backward(model, micro, loss_read, *a, **k)

    monkeypatch.setattr(loop_mod, "forward_backward", reads_each_loss)
    steps = per_step_syncs(monkeypatch, _ner(bert_dir, tmp_path, grad_accum=2))
    assert len(steps) >= 8 and min(steps) >= 2, steps  # what the test above would refuse


def _batches_and_syncs(run) -> tuple[int, SyncCounter]:
    batches = []
    counter = SyncCounter()
    with counter:
        run(lambda *a: batches.append(a) if a[1] else None)
    return len(batches), counter


def test_inference_reads_the_host_once_per_batch(bert_dir, tmp_path):
    from spanflow.tasks.embed.model import Embedder
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.re import ReModel

    ner = train_ner(synthetic_ner(40, seed=1), None, model=bert_dir, out_dir=str(tmp_path / "ner"),
                    log_fn=lambda s: None, options=TrainOptions(**{**OPTS, "max_steps": 2}))
    re_ = train_re(synthetic_re(40, seed=1), None, model=bert_dir, out_dir=str(tmp_path / "re"),
                   log_fn=lambda s: None, options=TrainOptions(**{**OPTS, "max_steps": 2}))
    emb = train_embedder([Pair(a, b, s) for a, b, s in synthetic_pairs(40, seed=1)], None, model=bert_dir,
                         out_dir=str(tmp_path / "emb"), log_fn=lambda s: None,
                         options=TrainOptions(**{**OPTS, "max_steps": 2}))
    texts = [e.text for e in synthetic_ner(120, seed=2)]
    saved = ("checkpoint", "model")  # a run stopped by max_steps leaves its model in its checkpoint
    for name, model in (("ner", NerModel.load(str(tmp_path.joinpath("ner", *saved)))),
                        ("re", ReModel.load(str(tmp_path.joinpath("re", *saved)))),
                        ("embed", Embedder.load(str(tmp_path.joinpath("emb", *saved))))):
        n, counter = _batches_and_syncs(lambda on_batch: list(model.predict_stream(texts, max_tokens=128,
                                                                                 on_batch=on_batch)))
        assert n >= 4, name
        # one read of each batch's results, no more; and counted, so the counter sees them
        assert counter.count == n, (name, n, counter.count, sorted(set(counter.seen)))
    assert ner is not None and re_ is not None and emb is not None
