"""Where a real training step's time goes on this device: the training loop of `spanflow train ner`
(or `train re`, `--task re`) with default flags (the model and data given), under torch.profiler
for a window of optimizer steps after a warm-up. It says how long a step takes, how much of it
the host spends issuing operators and how much the accelerator is busy (kernel time), and the
operators that cost most on each side. On a GPU, a step whose kernels fill a small part of its
time is bound by the host.

    python bench/device_step_profile.py --model MINILM --train ../shared/data/wnut17/train.conll
    python bench/device_step_profile.py --task re --model MINILM --train ../shared/data/webnlg/train_triples.json
    python bench/device_step_profile.py --model tiny --steps 4 --skip 2     # synthetic data, quick
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from common import default_minilm, median, model_name, write_results  # noqa: E402
from spanflow.training import loop  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402


def device_us(event) -> float:
    """An averaged event's own time on the accelerator (µs); torch renamed the field once."""
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0) or 0)


def is_kernel(event) -> bool:
    """A kernel (or copy) that ran on the accelerator. An operator's own device time is its
    kernels' time again, and a user annotation spans others: counting either counts twice."""
    return event.device_type != DeviceType.CPU and not getattr(event, "is_user_annotation", False)


def task_parts(task: str):
    """(read the training file, synthetic training data, train) for `task`."""
    from spanflow.data import io, synthetic

    if task == "re":
        from spanflow.tasks.re.train import train_re

        return io.read_re, lambda: synthetic.synthetic_re(2000, seed=1), train_re
    from spanflow.tasks.ner import train_ner

    return io.read_ner, lambda: synthetic.synthetic_ner(2000, seed=1), train_ner


def profiled(a, data, model: str, acts: list, cuda: bool) -> tuple[list[float], object, object]:
    """(the end time of every optimizer step, the profiler, the trained model): the training
    loop's optimizer step, patched for the run, ends each step and advances the profile."""
    train = task_parts(a.task)[2]
    ends: list[float] = []
    real = loop.optimizer_step

    def step(*args, **kw):
        real(*args, **kw)
        if cuda:
            torch.cuda.synchronize()  # the bench's own sync: a step's time includes its kernels
        ends.append(time.perf_counter())
        prof.step()

    loop.optimizer_step = step
    try:
        with profile(activities=acts, schedule=schedule(wait=a.skip, warmup=1, active=a.steps, repeat=1)) as prof:
            with tempfile.TemporaryDirectory() as out:
                opts = TrainOptions(max_steps=a.skip + 1 + a.steps, log_every=0)
                trained = train(data, None, model=model, out_dir=out, options=opts, log_fn=lambda s: None)
    finally:
        loop.optimizer_step = real
    return ends, prof, trained


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=("ner", "re"), default="ner", help="the training loop profiled [%(default)s]")
    ap.add_argument("--model", default=None, help="encoder directory or tiny [the offline MiniLM when installed]")
    ap.add_argument("--train", help="the task's training data [synthetic]")
    ap.add_argument("--skip", type=int, default=10, help="optimizer steps before the profiled window [%(default)s]")
    ap.add_argument("--steps", type=int, default=20, help="profiled optimizer steps [%(default)s]")
    ap.add_argument("--top", type=int, default=12, help="operators listed per side [%(default)s]")
    ap.add_argument("--name", default="device_step_profile")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    read, synthetic, _ = task_parts(a.task)
    model = a.model or default_minilm() or "tiny"
    data = read(a.train) if a.train else synthetic()
    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    ends, prof, trained = profiled(a, data, model, acts, cuda)
    # profiled: the optimizer steps skip+1 .. skip+steps (0-based), each timed from the end of the one before
    window = ends[a.skip:a.skip + 1 + a.steps]
    step_ms = median([(b - e) * 1e3 for e, b in zip(window, window[1:])]) if len(window) > 1 else None
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    host_events = [e for e in events if e.device_type == DeviceType.CPU]
    kernels = [e for e in events if is_kernel(e)]
    host_ms = sum(e.self_cpu_time_total for e in host_events) / 1e3 / a.steps
    device_ms = sum(device_us(e) for e in kernels) / 1e3 / a.steps
    rows = []
    for side, kind, key in (("host", host_events, lambda e: e.self_cpu_time_total), ("device", kernels, device_us)):
        for e in sorted(kind, key=key, reverse=True)[:a.top]:
            if key(e) > 0:
                rows.append({"side": side, "operator": e.key, "calls_per_step": e.count / a.steps,
                             "ms_per_step": key(e) / 1e3 / a.steps})
    summary = {"task": trained.task,  # the trained model's own: the loop profiled was this task's
               "device": torch.cuda.get_device_name(0) if cuda else "cpu", "precision": trained.policy.name,
               "step_ms": step_ms, "host_ms_per_step": host_ms, "device_busy_ms_per_step": device_ms if cuda else None,
               "device_busy_share": device_ms / step_ms if cuda and step_ms else None,
               "aten_calls_per_step": sum(e.count for e in host_events if e.key.startswith("aten::")) / a.steps,
               "profiled_steps": a.steps}
    print(summary, flush=True)
    path = write_results(a.out, a.name, {
        "description": f"the training loop of `spanflow train {a.task}` (default flags) under torch.profiler: "
                       f"{a.steps} optimizer steps after {a.skip + 1}; step time the median between step ends "
                       "(synchronized on a GPU); host time the operators' own CPU time, device time their own kernel "
                       "time, each per step (kernels and copies only: an operator's device time is its kernels'), aten calls "
                       "nested ones included. " + ", ".join(f"{k} {round(v, 3) if isinstance(v, float) else v}"
                                                           for k, v in summary.items()),
        "model": model_name(model),
        "data": a.train or "synthetic", **summary},
        rows, ["side", "operator", "calls_per_step", "ms_per_step"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
