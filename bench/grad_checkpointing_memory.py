"""Gradient checkpointing: peak memory and step time of one training step at max length 512.

Each setting runs in a fresh process, gradients allocated up front, so the peak measured
over the first step is its activations: on CPU the resident-memory high-water mark over
the resident size just before the step, on CUDA max_memory_allocated over allocated.
Step time is the median of the following steps.

    python bench/grad_checkpointing_memory.py [--model MINILM_DIR] [--batch 8] [--length 512]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import default_minilm, median, write_results  # noqa: E402


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(model_dir: str, batch: int, length: int, ckpt: bool, device: str, precision: str, steps: int) -> dict:
    import torch

    from spanflow.models.encoder import enable_checkpointing, load_encoder
    from spanflow.tasks.ner.heads import EncoderWithHead, TokenClassificationHead
    from spanflow.runtime.policy import resolve_policy

    policy = resolve_policy(precision, device)
    encoder, _ = load_encoder(model_dir)
    model = EncoderWithHead(encoder, TokenClassificationHead(hidden_size=encoder.config.hidden_size, num_labels=13))
    model.to(policy.device).train()
    if ckpt:
        enable_checkpointing(encoder)
    ids = torch.randint(1000, 20000, (batch, length), device=policy.device)
    mask = torch.ones_like(ids)
    cuda = policy.device.type == "cuda"
    for p in model.parameters():  # gradients allocated up front: the step's growth is then its activations
        p.grad = torch.zeros_like(p)
    # the first step of a fresh process: no allocator cache yet, so the growth of the
    # high-water mark over the resident size just before it is the step's peak
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_now()
    times, peak = [], None
    for _ in range(steps):
        t = time.perf_counter()
        with policy.autocast():
            model(ids, mask).float().square().mean().backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if peak is None:
            peak = (torch.cuda.max_memory_allocated() if cuda
                    else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"checkpointing": ckpt, "device": str(policy.device), "precision": policy.name, "batch": batch,
            "length": length, "peak_step_mib": (peak - base) / 2**20, "step_s": median(times[1:] or times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--child", choices=["0", "1"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(one(a.model, a.batch, a.length, a.child == "1", a.device, a.precision, a.steps)))
        return
    if not a.model:
        sys.exit("no --model given and the offline MiniLM package is not installed")
    rows = []
    for ckpt in ("0", "1"):
        cmd = [sys.executable, __file__, "--child", ckpt, "--model", a.model, "--batch", str(a.batch),
               "--length", str(a.length), "--device", a.device, "--precision", a.precision, "--steps", str(a.steps)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))
    rows[1]["memory_vs_off"] = rows[1]["peak_step_mib"] / rows[0]["peak_step_mib"]
    rows[1]["time_vs_off"] = rows[1]["step_s"] / rows[0]["step_s"]
    name = "grad_checkpointing_memory" + ("_cuda" if rows[0]["device"].startswith("cuda") else "")
    write_results(a.out, name, {
        "description": f"one forward+backward of {os.path.basename(str(a.model))} + token head, batch {a.batch} x "
                       f"{a.length} tokens; peak = memory the first step of a fresh process adds over model + "
                       "gradients (CPU: RSS high-water mark; CUDA: max_memory_allocated)"},
        rows, ["checkpointing", "device", "precision", "batch", "length", "peak_step_mib", "memory_vs_off",
               "step_s", "time_vs_off"])


if __name__ == "__main__":
    main()
