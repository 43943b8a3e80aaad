"""Levers on an eager training step, each measured against the unchanged step in one process.

The step is bench/train_step_profile.py's: the native BERT encoder (MiniLM's shape, random
weights), a token-classification head, forward and backward under the run's autocast, the
gradient norm and fused AdamW. For each lever the steps alternate between the unchanged step
and the step with the lever (the order flipping each pass), so the drift of a shared machine
within minutes falls on both sides; a lever's figure is the median of the paired steps' time
ratios (below 1: the lever is faster). Each lever patches spanflow's native
BERT for its own steps only, and counts the calls that reached its patch: a lever that no
longer reaches the code it changes fails the run instead of measuring nothing.

Levers (all on by default; `--levers a,b` picks):
  fp32_residual         the layers' residual stream in fp32, as autocast leaves it, instead of
                        the products' bf16 (what models/bert.residual_stream gains)
  pcg_masks             dropout's random words from numpy's PCG64 (seeded from torch's
                        generator) instead of torch's Mersenne Twister, faster per word
  bf16_softmax          the attention's softmax returning bf16 instead of fp32 then a cast
  free_dropout_masks    every dropout mask drawn once and reused: what a cost-free generator
                        of masks would save (an upper bound, not a candidate)
  no_attention_dropout  no dropout on the attention probabilities (changes the training)
  bool_masks            the keep mask turned into the compute dtype from bool, as dropout
                        did before it went through uint8 (what that change gained)
  fused_qkv             one product for query, key and value (their weights concatenated in
                        the step, as a fused parameter's gradient would be split)
  compiled_tail         dropout's multiply, the residual add and the layer norm after each
                        output product under torch.compile (the masks drawn as before)
  double_tokens         twice the texts per step: the time per token of a step twice as
                        large (changes the update size)

    python bench/step_levers.py
    python bench/step_levers.py --levers bool_masks,fused_qkv --passes 10
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import median, write_results  # noqa: E402
from train_step_profile import LABELS, SHAPES, training_step  # noqa: E402
import spanflow.models.bert as bert  # noqa: E402
import spanflow.models.dropout as drop  # noqa: E402


@contextlib.contextmanager
def patched(obj, name: str, value) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def with_dropout(fn: Callable, calls: list[int]) -> Iterator[None]:
    """`fn` as dropout for the native BERT (its layers' Dropout and its attention's)."""
    def counted(x, p, training=True):
        calls[0] += 1
        return fn(x, p, training)

    with patched(drop, "dropout", counted), patched(bert, "dropout", counted):
        yield


def lever(name: str, calls: list[int]) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context that turns lever `name` on for one step."""
    original = drop.dropout
    if name == "free_dropout_masks":
        cache: dict = {}

        def fixed(x, p, training=True):
            if not training or p == 0.0:
                return x
            key = (tuple(x.shape), x.dtype, p)
            if key not in cache:
                cache[key] = drop.keep_mask(x.shape, p).view(torch.uint8).to(x.dtype).mul_(1 / (1 - p))
            return x * cache[key]

        return lambda: with_dropout(fixed, calls)
    if name == "bool_masks":
        def from_bool(x, p, training=True):
            if not training or p == 0.0 or x.device.type != "cpu":
                return original(x, p, training)
            drops = drop._drops(p)
            return x * drop.keep_mask(x.shape, p).to(x.dtype).mul_(drop._SPAN / (drop._SPAN - drops))

        return lambda: with_dropout(from_bool, calls)
    if name == "no_attention_dropout":
        attention = bert._train_attention

        def no_drop(q, k, v, mask, p):
            calls[0] += 1
            return attention(q, k, v, mask, 0.0)

        return lambda: patched(bert, "_train_attention", no_drop)
    if name == "fused_qkv":
        return lambda: patched(bert.SelfAttention, "forward", _fused_qkv(calls))
    if name == "compiled_tail":
        return lambda: patched(bert.DenseNorm, "forward", _compiled_tail(calls))
    if name == "pcg_masks":
        import numpy as np

        def pcg(shape, p):
            calls[0] += 1
            seed = int(torch.randint(0, 1 << 62, ()))
            words = np.random.PCG64(seed).random_raw((math.prod(shape) + 3) // 4).view(np.int64)
            return drop.keep_from_words(torch.from_numpy(words), shape, p)

        return lambda: patched(drop, "keep_mask", pcg)
    if name == "bf16_softmax":
        def attention(q, k, v, mask, p):
            calls[0] += 1
            s = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
            if mask is not None:
                s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
            return drop.dropout(torch.softmax(s, -1), p, True) @ v

        return lambda: patched(bert, "_train_attention", attention)
    if name == "fp32_residual":
        def fp32(x, low):
            calls[0] += 1
            return x

        return lambda: patched(bert, "residual_stream", fp32)
    if name == "double_tokens":  # the same code on larger steps (main doubles the texts)
        return contextlib.nullcontext
    raise ValueError(f"unknown lever {name}")


def _fused_qkv(calls: list[int]):
    def forward(self, x, mask, bt):
        calls[0] += 1
        (b, t), h = bt, x.shape[-1]
        m, d = b * t, h // self.heads
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(x, w, bias)[:m].view(b, t, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        y = bert._train_attention(qkv[0], qkv[1], qkv[2], mask, self.p)
        if x.shape[0] == m:
            return y.transpose(1, 2).reshape(m, h)
        out = y.new_zeros((x.shape[0], h))  # the rounded rows the layer runs on, the extra ones zero
        out[:m].view(b, t, self.heads, d).copy_(y.transpose(1, 2))
        return out

    return forward


def _compiled_tail(calls: list[int]):
    @torch.compile(dynamic=True)
    def tail(y, keep, scale: float, residual, weight, bias, eps: float):
        return F.layer_norm((y * keep * scale).float() + residual, (y.shape[-1],), weight, bias, eps)

    def forward(self, x, residual):
        calls[0] += 1
        y = self.dense(x)
        p = self.dropout.p
        keep = drop.keep_mask(y.shape, p).view(torch.uint8)
        with torch.autocast("cpu", enabled=False):
            return tail(y, keep, 1 / (1 - p), residual, self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps)

    return forward


LEVERS = ("fp32_residual", "pcg_masks", "bf16_softmax", "free_dropout_masks", "no_attention_dropout", "bool_masks", "fused_qkv", "compiled_tail", "double_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levers", default=",".join(LEVERS), help="comma-separated, from: " + ", ".join(LEVERS))
    ap.add_argument("--passes", type=int, default=12, help="paired passes over the shapes per lever [%(default)s]")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--name", default="step_levers")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    names = [n for n in a.levers.split(",") if n]
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        ap.error(f"unknown levers {unknown}; known: {', '.join(LEVERS)}")
    step = training_step(a.precision)[2]
    rows = []
    for name in names:
        calls = [0]
        on, patches = lever(name, calls), name != "double_tokens"
        shapes = [((b, t) if patches else (b * 2, t), (b, t)) for b, t in SHAPES]
        started = time.perf_counter()
        for lever_shape, shape in shapes:  # warm-up of both sides: oneDNN's kernels, a compile
            step(*shape)
            with on():
                step(*lever_shape)
        warm_s = time.perf_counter() - started
        calls[0] = 0
        base, with_lever = [], []
        for k in range(a.passes):
            for lever_shape, shape in shapes:
                for side in ((0, 1) if k % 2 == 0 else (1, 0)):
                    if side:
                        with on():
                            with_lever.append(step(*lever_shape)[0] / math.prod(lever_shape))
                    else:
                        base.append(step(*shape)[0] / math.prod(shape))
        if patches and not calls[0]:
            raise SystemExit(f"lever {name} never reached the code it patches: the native BERT changed under it")
        ratios = [w / b for b, w in zip(base, with_lever)]
        tokens = sum(b * t for b, t in SHAPES) / len(SHAPES)
        rows.append({"lever": name, "ratio": round(median(ratios), 3),
                     "ratio_spread": f"{min(ratios):.2f}-{max(ratios):.2f}",
                     "base_ms_per_1k_tokens": round(1e6 * median(base), 1),
                     "lever_ms_per_1k_tokens": round(1e6 * median(with_lever), 1),
                     "pairs": len(ratios),
                     "patched_calls_per_step": round(calls[0] / len(with_lever), 1) if patches else None,
                     "warm_up_s": round(warm_s, 1)})
        print(f"{name}: {rows[-1]['ratio']} (base {rows[-1]['base_ms_per_1k_tokens']} ms per 1000 tokens, "
              f"{len(ratios)} pairs, about {tokens:.0f} tokens a step)", flush=True)
    cmd = "python bench/step_levers.py " + " ".join(sys.argv[1:])
    note = (f"`{cmd.strip()}`: the native encoder (MiniLM's shape, random weights) + a {LABELS}-label head, "
            f"{a.precision}, fused AdamW, shapes {SHAPES}; each lever against the unchanged step in the same process, "
            "steps alternating; ratio: median over the pairs of (step with the lever) / (unchanged step), per token "
            "(below 1: faster); spread: the pairs' lowest and highest ratio")
    path = write_results(a.out, a.name, {"description": note, "command": cmd.strip(), "precision": a.precision,
                                         "passes": a.passes},
                         rows, ["lever", "ratio", "ratio_spread", "base_ms_per_1k_tokens", "lever_ms_per_1k_tokens",
                                "pairs", "patched_calls_per_step", "warm_up_s"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
