"""The training report's clock: a period's wall time (and its tokens/s and MFU) leaves out the
evaluations inside it, including the one that ends the epoch before it, and that epoch's
checkpoint; so do its GPU utilisation samples."""
import itertools
import json
import time
from types import SimpleNamespace

import pytest
import torch

from test_distributed import setup_task

from spanflow.monitor import report
from spanflow.monitor.device import GpuUtilSampler
from spanflow.training.loop import train_loop
from spanflow.training.options import TrainOptions

EVAL_S = 1000.0  # what each evaluation costs on the patched clock
TICK = 1e-3  # what each reading moves the patched clock on: no test here reads the machine's time


def _patched_clock(monkeypatch) -> list[float]:
    """time.perf_counter replaced by a clock that moves TICK a reading, plus what a test adds to the
    returned offset[0]: every time these tests assert on is that clock's."""
    offset, reads = [0.0], itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(reads) * TICK + offset[0])
    return offset


def test_evaluation_time_is_not_training_time(tmp_path, monkeypatch):
    nm, windows, hooks = setup_task()
    samplers: list = []
    monkeypatch.setattr(report, "GpuUtilSampler", lambda device: samplers.append(GpuUtilSampler(device)) or samplers[-1])
    paused: list[bool] = []
    offset = _patched_clock(monkeypatch)

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


def _slowed(monkeypatch, target, name: str, calls: list | None = None) -> None:
    """Patch the clock, and `target.name` to take EVAL_S of it (`calls`: the clock at each call)."""
    offset = _patched_clock(monkeypatch)
    fn = getattr(target, name)

    def slow(*a, **k):
        if calls is not None:
            calls.append(offset[0])
        offset[0] += EVAL_S
        return fn(*a, **k)

    monkeypatch.setattr(target, name, slow)


def test_the_epochs_checkpoint_is_not_the_next_epochs_time(tmp_path, monkeypatch):
    from spanflow.training import loop

    nm, windows, hooks = setup_task()
    saves: list[float] = []
    _slowed(monkeypatch, loop, "save_checkpoint", saves)  # as if writing a checkpoint took EVAL_S
    opts = TrainOptions(epochs=3, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lambda s: None)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(saves) == 3 and len(reps) == 3
    assert all(0 < r["wall_s"] < EVAL_S / 10 for r in reps), [r["wall_s"] for r in reps]


def test_a_checkpoint_inside_the_period_is_its_save_share_and_the_split_is_of_the_wall_time(tmp_path, monkeypatch):
    from spanflow.training import loop

    nm, windows, hooks = setup_task()
    lines: list[str] = []
    _slowed(monkeypatch, loop, "save_checkpoint")  # writing a checkpoint takes EVAL_S on the patched clock
    opts = TrainOptions(epochs=1, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0, save_every=2)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lines.append)
    rep = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")][0]
    inside = rep["steps"] // 2  # the --save-every checkpoints in the period (the epoch's own is outside it)
    assert rep["wall_s"] > inside * EVAL_S
    assert rep["save_frac"] == pytest.approx(inside * EVAL_S / rep["wall_s"], rel=1e-3)
    shares = ("data_wait_frac", "compute_frac", "optimizer_frac", "save_frac", "other_frac")
    assert sum(rep[k] for k in shares) == pytest.approx(1) and all(rep[k] >= 0 for k in shares)
    assert rep["compute_frac"] < 0.01  # of the wall time, which the saves took nearly all of
    line = next(x for x in lines if x.startswith("epoch 1"))
    assert f"save {rep['save_frac']:.0%}" in line


def test_a_best_models_save_is_not_the_next_periods_time(tmp_path, monkeypatch):
    from spanflow.training import loop

    nm, windows, hooks = setup_task()
    hooks.evaluate = lambda model: {"f1": 0.5}  # the first evaluation's model is the best: saved
    _slowed(monkeypatch, loop, "_save")
    opts = TrainOptions(epochs=2, lr=1e-3, max_tokens=200, patience=0, log_every=0, seed=0)
    summary = train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path),
                         log=lambda s: None)
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert all(0 < r["wall_s"] < EVAL_S / 10 for r in reps), [r["wall_s"] for r in reps]
    # the closing time line's parts, on the patched clock (each save jumps it by EVAL_S): the save is
    # counted as saving, and the parts fit in the loop's time; no speed is measured here
    seconds = summary["seconds"]
    assert seconds["saving"] >= EVAL_S and seconds["loop"] >= seconds["saving"] + seconds["evaluation"]


def test_the_split_of_a_period_with_time_outside_its_phases(monkeypatch):
    _patched_clock(monkeypatch)
    m = report.Meter(torch.device("cpu"), "fp32")
    m.started = time.perf_counter() - 10.0  # a 10 s period, on the patched clock
    m.add_time("data_wait", 1.0)
    m.add_time("compute", 6.0)
    m.add_time("optimizer", 1.0)
    rep = m.report()
    assert rep["compute_frac"] == pytest.approx(0.6, rel=1e-2) and rep["other_frac"] == pytest.approx(0.2, abs=0.01)
    assert "time: data 10% compute 60% optim 10% other 20%" in report.format_report({**rep, "steps": 1})
    m.close()


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
        shown = float(line.split("MFU ")[1].split("%")[0])  # two significant digits below 1%
        assert shown == pytest.approx(rep["mfu"] * 100, rel=0.05) and "% of the measured matmul peak" in line
        assert "GPU util" not in line and rep["gpu_util"] is None  # nothing sampled: nothing shown


def test_the_epoch_line_names_a_datasheet_peak_and_gpu_utilisation():
    rep = {"epoch": 1, "step": 10, "wall_s": 12.4, "loss": 0.25, "real_tokens_per_s": 900.0,
           "padded_tokens_per_s": 1000.0, "padding_efficiency": 0.9, "data_wait_frac": 0.01, "compute_frac": 0.9,
           "optimizer_frac": 0.09, "peak_memory_bytes": 2**30, "mfu": 0.42, "mfu_basis": "datasheet", "gpu_util": 87.0}
    line = report.format_report(rep)
    assert line.startswith("epoch 1 step 10 (12 s training) | loss 0.2500 | 900 real tok/s")
    assert "MFU 42.0% of the datasheet peak | GPU util 87%" in line
    assert report.format_report({**rep, "wall_s": 1.34}).startswith("epoch 1 step 10 (1.3 s training)")  # tenths
    assert report.format_report({**rep, "wall_s": 0.043}).startswith("epoch 1 step 10 (0.043 s training)")  # was 0.0


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


def test_step_lines_count_to_max_steps_and_say_the_time_spent_and_left(tmp_path):
    nm, windows, hooks = setup_task()
    lines: list[str] = []
    opts = TrainOptions(epochs=3, lr=1e-3, max_tokens=200, patience=0, log_every=1, seed=0, max_steps=3)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path), log=lines.append)
    steps = [x for x in lines if x.startswith("step ")]
    assert [x.split()[1] for x in steps] == ["1/3", "2/3", "3/3"]  # the run ends at --max-steps, not the plan's end
    assert all(" elapsed" in x for x in steps)
    assert " left" in steps[0] and " left" not in steps[-1]  # the last step has none left
    # the same command with --resume trains on to the plan's end: its lines count to that, not to 3
    lines.clear()
    train_loop(nm.module, windows, hooks, opts=TrainOptions(**{**opts.to_dict(), "resume": True}), policy=nm.policy,
               out_dir=str(tmp_path), log=lines.append)
    steps = [x.split()[1] for x in lines if x.startswith("step ")]
    last = int(steps[-1].split("/")[0])
    assert steps[0] == f"4/{last}" and last > 3 and all(x.endswith(f"/{last}") for x in steps)


def test_a_run_ends_saying_where_its_time_went(tmp_path):
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.ner import train_ner

    data = synthetic_ner(30, seed=1, max_clauses=1)
    lines: list[str] = []
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
              options=TrainOptions(epochs=2, max_tokens=512, max_length=64, log_every=0, patience=0))
    (line,) = [x for x in lines if x.startswith("time: ")]
    assert " in all: training steps " in line and ", dev evaluation " in line, line
    total = float(line.split("time: ")[1].split(" s")[0])
    trained = sum(json.loads(x)["wall_s"] for x in open(tmp_path / "train_report.jsonl"))
    steps = float(line.split("training steps ")[1].split(" s")[0])
    assert steps == pytest.approx(trained, rel=0.1, abs=0.1) and total > steps  # the periods are the steps' time


def test_a_tiny_models_mfu_is_of_the_fp32_peak_on_a_cpu_and_says_so():
    nm, _, _ = setup_task()
    cpu = torch.device("cpu")
    assert report.mfu_precision(nm.module, cpu, "bf16") == "fp32"  # its recurrence runs fp32 under autocast
    assert report.mfu_precision(nm.module, torch.device("cuda"), "bf16") == "bf16"
    assert report.mfu_precision(torch.nn.Linear(2, 2), cpu, "bf16") == "bf16"  # no say of its own: the run's
    rep = {"epoch": 1, "step": 10, "wall_s": 2.0, "real_tokens_per_s": 900.0, "padded_tokens_per_s": 1000.0,
           "padding_efficiency": 0.9, "data_wait_frac": 0.0, "compute_frac": 0.9, "optimizer_frac": 0.1,
           "peak_memory_bytes": 2**20, "mfu": 0.026, "mfu_basis": "measured_matmul", "precision": "bf16"}
    assert "MFU 2.6% of the measured fp32 matmul peak" in report.format_report({**rep, "mfu_precision": "fp32"})
    assert "MFU 2.6% of the measured matmul peak" in report.format_report({**rep, "mfu_precision": "bf16"})
    assert "MFU 0.065% of" in report.format_report({**rep, "mfu": 0.00065})  # below 1%: two digits, not 0.0%


def test_the_time_line_counts_the_starting_models_dev_score_as_evaluation():
    from spanflow.training.fit import time_line

    line = time_line(10.0, {"loop": 6.0, "evaluation": 1.0, "saving": 0.5}, scoring=2.0)
    assert line == ("time: 10 s in all: training steps 4.5 s, dev evaluation 3.0 s, saving 0.50 s, "
                    "start-up and the rest 2.0 s")


def test_a_duration_is_written_one_way_and_its_form_follows_the_figure_as_rounded():
    from spanflow.monitor.report import clock_time

    assert [clock_time(x) for x in (0.04, 0.999, 4.24, 9.96, 12.4, 59.6, 185, 3725)] == [
        "0.04 s", "1.0 s", "4.2 s", "10 s", "12 s", "1m 00s", "3m 05s", "1h 02m"]


def test_a_run_without_dev_names_no_evaluation_in_its_time_line():
    from spanflow.training.fit import time_line

    line = time_line(10.0, {"loop": 8.0, "evaluation": 0.0, "saving": 1.0}, scoring=1e-6, evaluated=False)
    assert line.startswith("time: 10 s in all: training steps 7.0 s, saving 1.0 s, ") and "evaluation" not in line


def _seconds(said: str) -> float:
    """A duration as clock_time writes it (0.04 s, 12 s, 3m 05s) in seconds."""
    if said.endswith(" s"):
        return float(said[:-2])
    m, s = said.split("m ")
    return int(m) * 60 + int(s.rstrip("s"))


def test_a_commands_time_line_counts_from_the_commands_start(tmp_path):
    """Under a command (cli.main), the closing time line counts what it did before training (reading
    the data, measuring a budget): here the command's start is set EVAL_S before training's."""
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.monitor import clock
    from spanflow.tasks.ner import train_ner

    data = synthetic_ner(16, seed=1, max_clauses=1)
    opts = TrainOptions(epochs=1, max_tokens=256, max_length=32, log_every=0, seed=0, device="cpu")
    lines: list[str] = []
    with clock.command():
        token = clock._began.set((clock.current() - EVAL_S,))
        train_ner(data, None, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lines.append)
        clock._began.reset(token)
    (line,) = [x for x in lines if x.startswith("time: ")]
    assert _seconds(line.split("time: ")[1].split(" in all")[0]) >= EVAL_S
    assert _seconds(line.split("start-up and the rest ")[1]) >= EVAL_S


def test_a_jobs_memory_peak_is_its_largest_ranks(monkeypatch):
    """Tokens are summed over ranks and memory is the largest rank's: rank 0's alone read as the
    job's understated whichever rank held more (here rank 1, GiB above it)."""
    from spanflow.training import loop
    from spanflow.training.distributed import Dist

    monkeypatch.setattr(loop, "all_sum", lambda values, d: [2 * v for v in values])  # two ranks alike
    monkeypatch.setattr(loop, "gather", lambda obj, d: [obj, obj + 2**30])  # rank 1 holds 1 GiB more
    meter = report.Meter(torch.device("cpu"), "fp32")
    try:
        meter.add_tokens(10, 12)
        own = max(meter.held_peak, meter._peak())
        rep = loop._close_period(meter, Dist(rank=0, world=2))
    finally:
        meter.close()
    assert rep["peak_memory_bytes"] >= own + 2**30 and rep["padding_efficiency"] == 10 / 12


def test_the_processs_command_counts_from_the_processs_start(monkeypatch):
    """spanflow's own process (cli.main as its entry) counts from the process's start, its imports
    included; here the process is made 1000 s old, on no real clock."""
    from spanflow.monitor import clock

    monkeypatch.setattr(clock, "_age", lambda: EVAL_S)
    monkeypatch.delenv(clock.ENV, raising=False)
    with clock.command(process=True):
        assert clock.current() <= time.perf_counter() - EVAL_S
    with clock.command():  # main() called by a program: from the call
        assert clock.current() > time.perf_counter() - EVAL_S


def test_the_demo_says_the_time_its_training_line_says(tmp_path, capsys):
    """`spanflow demo` ends with how long it took, counted from where the training's time line
    counts (the process's start, its imports included), not from its own later start: the two
    lines of one run said 19 s and 16 s. Here the command began EVAL_S before, on no real clock."""
    from spanflow.cli.demo import demo
    from spanflow.monitor import clock

    with clock.command():
        token = clock._began.set((clock.current() - EVAL_S,))
        demo(str(tmp_path / "d"), train_size=60, epochs=1)
        clock._began.reset(token)
    out = capsys.readouterr().out
    said = out.split("demo done in ")[1].split(":")[0]
    (line,) = [x for x in out.splitlines() if x.startswith("time: ")]
    total = line.split("time: ")[1].split(" in all")[0]
    assert _seconds(said) >= _seconds(total) >= EVAL_S
