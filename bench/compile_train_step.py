"""A compiled training step against the eager one: the native BERT encoder's forward and
backward under the run's autocast, eager and through torch.compile (dynamic shapes, and
static shapes recompiled per batch shape; on a GPU also with CUDA graphs, torch.compile's
"reduce-overhead"), each mode in a fresh process, the order of the modes alternating between
repeats, on this machine's GPU when it has one (--device).

The encoder is the offline all-MiniLM-L6-v2's shape (its config.json when installed, else
the same numbers), from random weights: speed does not depend on the values. Each step is a
batch of token-budget shape (B texts of T tokens, about 1300 tokens, the last 5 positions
padded), a loss on the last hidden state, backward, gradients cleared; --shapes distinct
shapes cycle, as token-budget batches of varied lengths do. The first pass over the shapes
is timed apart (the compile happens there); the step time is the median of the passes after.

    python bench/compile_train_step.py
    python bench/compile_train_step.py --repeats 1 --passes 2   # a check that it runs
    python bench/compile_train_step.py --modes eager,compile_cudagraphs --name gpu_compile_train_step
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import default_minilm, median, write_results  # noqa: E402

MODES = ("eager", "compile_dynamic", "compile_static", "compile_cudagraphs")
SHAPES = [(32, 40), (24, 52), (40, 32), (28, 45)]  # (texts, tokens) of about 1300 tokens each
MINILM = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "model_type": "bert"}


def encoder():
    from spanflow.models.bert import BERT_DEFAULTS, NativeBert
    from spanflow.models.files import Config

    cfg = dict(MINILM)
    path = default_minilm()
    if path and os.path.exists(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = {k: v for k, v in json.load(f).items() if k in MINILM or k in BERT_DEFAULTS}
    torch.manual_seed(0)
    return NativeBert(Config(**{**BERT_DEFAULTS, **cfg})).train()


def one_mode(mode: str, passes: int, precision: str, device: torch.device) -> dict:
    model = encoder().to(device)
    if mode == "eager":
        fn = model
    elif mode == "compile_cudagraphs":  # each shape's step captured once and replayed
        fn = torch.compile(model, mode="reduce-overhead", dynamic=False)
    else:
        fn = torch.compile(model, dynamic=mode == "compile_dynamic")
    dtype = torch.bfloat16 if precision == "bf16" else None
    vocab = model.config.vocab_size

    def step(b: int, t: int) -> None:
        ids = torch.randint(1, vocab, (b, t), device=device)
        mask = torch.ones(b, t, dtype=torch.long, device=device)
        mask[:, t - 5:] = 0
        with torch.autocast(device.type, dtype or torch.float32, enabled=dtype is not None):
            loss = fn(ids, mask).last_hidden_state.float().pow(2).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step's time includes its kernels

    t = time.perf_counter()
    for shape in SHAPES:
        step(*shape)
    first = time.perf_counter() - t
    times = []
    for _ in range(passes):
        for shape in SHAPES:
            t = time.perf_counter()
            step(*shape)
            times.append(time.perf_counter() - t)
    return {"mode": mode, "first_pass_s": round(first, 2), "step_ms": round(1000 * median(times), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per mode [%(default)s]")
    ap.add_argument("--passes", type=int, default=5, help="timed passes over the shapes [%(default)s]")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N [auto: the GPU when there is one]")
    ap.add_argument("--modes", default=None, help="comma-separated, of: " + ", ".join(MODES) + " [all but "
                    "compile_cudagraphs on a CPU, all on a GPU]")
    ap.add_argument("--name", default="compile_train_step")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child process: one mode
    a = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    if a.mode:
        print("ROW " + json.dumps(one_mode(a.mode, a.passes, a.precision, device)), flush=True)
        return
    modes = [m.strip() for m in a.modes.split(",")] if a.modes else \
        [m for m in MODES if device.type == "cuda" or m != "compile_cudagraphs"]
    if unknown := sorted(set(modes) - set(MODES)):
        ap.error(f"--modes: unknown mode {', '.join(unknown)} (modes: {', '.join(MODES)})")
    if "eager" not in modes:
        ap.error("--modes: the table compares with eager; include it")
    if "compile_cudagraphs" in modes and device.type != "cuda":
        ap.error("--modes: compile_cudagraphs needs a CUDA device (CUDA graphs)")
    modes.sort(key=lambda m: m != "eager")  # eager first: each row's ratio is known as it is saved
    rows = []
    for r in range(a.repeats):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--mode", mode],
                               capture_output=True, text=True)
            row = next((json.loads(x[4:]) for x in p.stdout.splitlines() if x.startswith("ROW ")), None)
            if p.returncode or row is None:
                raise SystemExit(f"mode {mode} failed ({p.returncode}):\n{p.stderr[-3000:]}")
            rows.append({"repeat": r, **row})
            print(rows[-1], flush=True)
            path = save(a, device, rows)  # after every mode: a run cut short keeps the rows it has
    print(f"wrote {path}")


def save(a, device: torch.device, rows: list[dict]) -> str:
    """The rows so far, each against the median eager step so far."""
    eager = median([x["step_ms"] for x in rows if x["mode"] == "eager"])
    for x in rows:
        x["step_vs_eager"] = round(x["step_ms"] / eager, 2)
    cmd = "python bench/compile_train_step.py " + " ".join(sys.argv[1:])
    note = (f"`{cmd.strip()}`; the native encoder ({'offline MiniLM config' if default_minilm() else 'MiniLM shape'}, "
            f"random weights) forward + backward under {a.precision} autocast on {device.type}, shapes {SHAPES} "
            "cycling; first_pass_s: the first pass over the shapes (compiling); step_ms: median of the passes "
            "after; step_vs_eager: over the median eager step")
    return write_results(a.out, a.name, {"description": note, "command": cmd.strip(), "device": str(device),
                                         "shapes": SHAPES},
                         rows, ["repeat", "mode", "first_pass_s", "step_ms", "step_vs_eager"])


if __name__ == "__main__":
    main()
