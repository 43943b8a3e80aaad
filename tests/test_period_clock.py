"""The training report's clock: a period's wall time (and its tokens/s and MFU) leaves out the
evaluations inside it, including the one that ends the epoch before it, and that epoch's
checkpoint; so do its GPU utilisation samples."""
import json
import time
from types import SimpleNamespace

import torch

from test_distributed import setup_task

from spanflow.monitor import report
from spanflow.monitor.device import GpuUtilSampler
from spanflow.training.loop import train_loop
from spanflow.training.options import TrainOptions

EVAL_S = 1000.0  # what each evaluation costs on the patched clock


def test_evaluation_time_is_not_training_time(tmp_path, monkeypatch):
    nm, windows, hooks = setup_task()
    samplers: list = []
    monkeypatch.setattr(report, "GpuUtilSampler", lambda device: samplers.append(GpuUtilSampler(device)) or samplers[-1])
    paused: list[bool] = []
    offset = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def slow_eval(model):  # the clock jumps as if evaluating took EVAL_S
        offset[0] += EVAL_S
        paused.append(samplers[-1].paused)
        return {"f1": 0.5}

    hooks.evaluate = slow_eval
    opts = TrainOptions(epochs=3, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lambda s: None)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(reps) == 3 and offset[0] == 3 * EVAL_S
    assert paused == [True] * 3 and not samplers[-1].paused  # no utilisation sampled while evaluating
    assert all(0 < r["wall_s"] < EVAL_S / 10 for r in reps), [r["wall_s"] for r in reps]

    mid = tmp_path / "mid"  # evaluations every few steps, inside the period
    offset[0] = 0.0
    train_loop(nm.module, windows, hooks, opts=TrainOptions(**{**opts.to_dict(), "epochs": 1, "eval_every": 2}),
               policy=nm.policy, out_dir=str(mid), log=lambda s: None)
    reps = [json.loads(x) for x in open(mid / "train_report.jsonl")]
    assert offset[0] >= 2 * EVAL_S and all(0 < r["wall_s"] < EVAL_S / 10 for r in reps), [r["wall_s"] for r in reps]


def test_the_epochs_checkpoint_is_not_the_next_epochs_time(tmp_path, monkeypatch):
    from spanflow.training import loop

    nm, windows, hooks = setup_task()
    offset, saves = [0.0], []
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])
    save = loop.save_checkpoint

    def slow_save(*a, **k):  # the clock jumps as if writing the checkpoint took EVAL_S
        saves.append(offset[0])
        offset[0] += EVAL_S
        return save(*a, **k)

    monkeypatch.setattr(loop, "save_checkpoint", slow_save)
    opts = TrainOptions(epochs=3, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lambda s: None)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(saves) == 3 and len(reps) == 3
    assert all(0 < r["wall_s"] < EVAL_S / 10 for r in reps), [r["wall_s"] for r in reps]


class _Stops:
    """A sampler's stop event that lets its loop run `n` times, then stops it."""

    def __init__(self, n: int):
        self.n = n

    def wait(self, timeout: float) -> bool:
        self.n -= 1
        return self.n < 0


def test_a_paused_sampler_takes_no_samples():
    s = GpuUtilSampler(torch.device("cpu"))
    s._handle, s._nvml = object(), SimpleNamespace(nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=50))
    s.paused, s._stop = True, _Stops(5)
    s._run(0.0)
    assert s.take() is None
    s.paused, s._stop = False, _Stops(5)
    s._run(0.0)
    assert s.take() == 50.0


def test_the_epoch_line_says_its_seconds_loss_and_which_peak(tmp_path):
    nm, windows, hooks = setup_task()
    hooks.evaluate = lambda model: {"f1": 0.5}
    lines: list[str] = []
    opts = TrainOptions(epochs=2, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lines.append)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    epoch_lines = [x for x in lines if x.startswith("epoch ")]
    assert len(reps) == len(epoch_lines) == 2
    for rep, line in zip(reps, epoch_lines):
        # the loss is there though no step line printed one (--log-every 0), as the report says it
        assert rep["loss"] > 0 and f"loss {rep['loss']:.4f}" in line
        assert line.startswith(f"epoch {rep['epoch']} step {rep['step']} (") and " s training) | loss " in line
        assert f"MFU {rep['mfu'] * 100:.1f}% of the measured matmul peak" in line  # the CPU's basis
        assert "GPU util" not in line and rep["gpu_util"] is None  # nothing sampled: nothing shown


def test_the_epoch_line_names_a_datasheet_peak_and_gpu_utilisation():
    rep = {"epoch": 1, "step": 10, "wall_s": 12.4, "loss": 0.25, "real_tokens_per_s": 900.0,
           "padded_tokens_per_s": 1000.0, "padding_efficiency": 0.9, "data_wait_frac": 0.01, "compute_frac": 0.9,
           "optimizer_frac": 0.09, "peak_memory_bytes": 2**30, "mfu": 0.42, "mfu_basis": "datasheet", "gpu_util": 87.0}
    line = report.format_report(rep)
    assert line.startswith("epoch 1 step 10 (12 s training) | loss 0.2500 | 900 real tok/s")
    assert "MFU 42.0% of the datasheet peak | GPU util 87%" in line
    assert report.format_report({**rep, "wall_s": 1.34}).startswith("epoch 1 step 10 (1.3 s training)")  # tenths


MIB = 2**20


def _touched(mib: int):
    import numpy as np

    return np.ones(mib * MIB, dtype=np.uint8)  # written: resident, not just reserved


def test_a_cpu_periods_memory_peak_is_its_own_not_the_process_high_water_mark():
    meter = report.Meter(torch.device("cpu"), "fp32")
    try:
        meter.report()  # the first period holds the peak's measurement at the start
        base = meter.report()["peak_memory_bytes"]
        big = _touched(256)
        meter.rss.sample()  # what the sampling thread reads every 20 ms
        del big
        first = meter.report()["peak_memory_bytes"]
        second = meter.report()["peak_memory_bytes"]
        with meter.excluded():  # an evaluation's memory is not the period's
            big = _touched(256)
            meter.rss.sample()
            del big
        third = meter.report()["peak_memory_bytes"]
    finally:
        meter.close()
    assert first >= base + 250 * MIB
    assert second < first - 200 * MIB, (first, second)  # a high-water mark cannot fall
    assert third < first - 200 * MIB, (first, third)


def test_the_epoch_report_leaves_out_the_evaluations_memory(tmp_path, monkeypatch):
    nm, windows, hooks = setup_task()
    samplers: list = []
    made = report.RssPeak
    monkeypatch.setattr(report, "RssPeak", lambda: samplers.append(made()) or samplers[-1])
    eval_peaks = []

    def heavy_eval(model):  # an evaluation that holds far more than a training step of this model
        big = _touched(256)
        eval_peaks.append(samplers[-1].peek())
        del big
        return {"f1": 0.5}

    hooks.evaluate = heavy_eval
    opts = TrainOptions(epochs=2, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lambda s: None)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(samplers) == 1 and len(eval_peaks) == 2 and len(reps) == 2
    # epoch 2's period follows epoch 1's evaluation: its peak is its training's
    assert all(r["peak_memory_bytes"] < min(eval_peaks) - 200 * MIB for r in reps), (reps, eval_peaks)
