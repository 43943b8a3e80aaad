"""Where an eager training step's time goes: the native BERT encoder (MiniLM's shape, random
weights) with a token-classification head, forward and backward under the run's autocast,
the gradient norm and fused AdamW, under torch.profiler; the operators' self time grouped
into kinds (matrix products, casts and copies, the optimizer, dropout masks, ...).

The word-embedding table is frozen by default, as the training loop's sparse table costs a
few milliseconds a step (bench/row_catch_up.py); `--dense-table` trains it densely. Each step
is a batch of about 1000 tokens (the default micro-batch), four shapes cycling; the step time
is the median of the timed steps before the profiled ones, its optimizer phase (clip, step,
zero) timed apart, and its MFU the training report's (6N + 12LHT per padded token over the
machine's best measured matmul peak). The kinds count operators by name: a dropout mask's cast
is a cast, its multiply and the clip's scaling are element-wise; the optimizer phase's own
time says what clip and step cost together.

    python bench/train_step_profile.py
    python bench/train_step_profile.py --precision fp32 --name train_step_profile_fp32
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import median, write_results  # noqa: E402
from compile_train_step import encoder  # noqa: E402
from spanflow.monitor.device import peak_flops  # noqa: E402
from spanflow.monitor.report import train_flops_per_token  # noqa: E402

SHAPES = [(32, 32), (24, 42), (40, 25), (28, 36)]  # (texts, tokens), about 1000 tokens each
LABELS = 9
KINDS = {  # an operator's kind: "aten::" names exactly, the others (profiler records) as a part of the name
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm"),
    "casts and copies": ("aten::copy_", "aten::_to_copy", "aten::clone"),
    "optimizer and gradient norm": ("aten::_fused_adamw_", "aten::linalg_vector_norm", "optimizer."),
    "dropout masks": ("aten::random_", "aten::ge"),
    "zero fills": ("aten::fill_", "aten::zero_"),
    "GELU": ("aten::gelu", "aten::gelu_backward"),
    "layer norm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "softmax and masking": ("aten::_softmax", "aten::_softmax_backward_data", "aten::masked_fill_"),
}


def kind(name: str) -> str:
    low = name.lower()
    for k, pats in KINDS.items():
        if any(low == p if p.startswith("aten::") else p in low for p in pats):
            return k
    return "other element-wise and glue"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--passes", type=int, default=5, help="timed passes over the shapes [%(default)s]")
    ap.add_argument("--dense-table", action="store_true", help="train the word-embedding table densely")
    ap.add_argument("--name", default="train_step_profile")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    model, head, step = training_step(a.precision, a.dense_table)
    for shape in SHAPES * 2:  # warm-up: oneDNN's kernels, the allocator
        step(*shape)
    times, optimizer = [], []
    for _ in range(a.passes):
        for shape in SHAPES:
            whole, optimizer_s = step(*shape)
            times.append(whole)
            optimizer.append(optimizer_s)
    started = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for shape in SHAPES * 2:
            step(*shape)
    profiled_s = (time.perf_counter() - started) / (2 * len(SHAPES))  # a profiled step's wall time
    by_kind: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        by_kind[kind(e.key)] += e.self_cpu_time_total
    total = sum(by_kind.values())
    rows = [{"kind": k, "share": round(v / total, 3), "ms_per_step": round(v / 1000 / (2 * len(SHAPES)), 1)}
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    tokens = sum(b * t for b, t in SHAPES) / len(SHAPES)
    flops = train_flops_per_token(_Counted(model, head), sum(t for _, t in SHAPES) / len(SHAPES)) * tokens
    peak = peak_flops("cpu", "cpu", a.precision)[0]  # the best matmul rate measured here, as training reports it
    step_s = median(times)
    cmd = "python bench/train_step_profile.py " + " ".join(sys.argv[1:])
    note = (f"`{cmd.strip()}`: the native encoder (MiniLM's shape, random weights) + a {LABELS}-label head, "
            f"{a.precision}, word-embedding table {'dense' if a.dense_table else 'frozen'}, fused AdamW, shapes "
            f"{SHAPES}; median step {1000 * step_s:.1f} ms over {len(times)} timed steps (optimizer phase: "
            f"clip, step, zero, {1000 * median(optimizer):.1f} ms), MFU {flops / step_s / peak:.1%} of "
            f"{peak / 1e12:.3f} TFLOP/s; operators' self CPU time under torch.profiler over two more passes, by kind")
    path = write_results(a.out, a.name, {"description": note, "command": cmd.strip(), "precision": a.precision,
                                         "step_ms": round(1000 * step_s, 1),
                                         "profiled_step_ms": round(1000 * profiled_s, 1),
                                         "optimizer_ms": round(1000 * median(optimizer), 1),
                                         "tokens_per_step": tokens, "flops_per_step": flops, "peak_tflops":
                                         round(peak / 1e12, 4), "mfu": round(flops / step_s / peak, 4)},
                         rows, ["kind", "share", "ms_per_step"])
    print(f"median step {1000 * step_s:.1f} ms, MFU {flops / step_s / peak:.1%}; wrote {path}")


def training_step(precision: str, dense_table: bool = False):
    """(encoder, head, step): the bench's model (MiniLM's shape, random weights, seeded) and
    `step(texts, tokens)`, one whole update on random ids and labels, returning its seconds and
    those of its optimizer phase (clip, step, zero)."""
    torch.manual_seed(0)
    model = encoder()
    model.embeddings.word_embeddings.weight.requires_grad_(dense_table)
    head = torch.nn.Linear(model.config.hidden_size, LABELS)
    params = [p for p in [*model.parameters(), *head.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(1)

    def step(b: int, t: int) -> tuple[float, float]:
        ids = torch.randint(1, model.config.vocab_size, (b, t), generator=g)
        mask = torch.ones(b, t, dtype=torch.long)
        mask[:, t - 3:] = 0
        started = time.perf_counter()
        with torch.autocast("cpu", dtype, enabled=precision == "bf16"):
            logits = head(model(ids, mask).last_hidden_state).float()
        F.cross_entropy(logits.reshape(-1, LABELS), torch.randint(0, LABELS, (b * t,), generator=g)).backward()
        backward_done = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = time.perf_counter()
        return done - started, done - backward_done

    return model, head, step


class _Counted(torch.nn.Module):
    """The encoder and head as one module, for the training report's FLOP count (its `encoder`
    gives the attention's share)."""

    def __init__(self, encoder: torch.nn.Module, head: torch.nn.Module):
        super().__init__()
        self.encoder, self.head = encoder, head


if __name__ == "__main__":
    main()
