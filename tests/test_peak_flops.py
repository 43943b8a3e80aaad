"""The CPU peak behind every MFU figure: the best matmul rate this machine has shown, kept
across runs, and measured before a training's clock starts."""
from __future__ import annotations

import json
import time

import pytest
import torch

from spanflow.monitor import device as D
from spanflow.monitor.report import Meter


@pytest.fixture
def rates(monkeypatch, tmp_path):
    """Each peak_flops call measures the next of `rates` (FLOP/s); a fresh cache and lru_cache."""
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path))
    todo: list[float] = []
    monkeypatch.setattr(D, "_matmul_rate", lambda dtype_name: todo.pop(0))
    D._cpu_peak.cache_clear()
    yield todo
    D._cpu_peak.cache_clear()


def peak(dtype: str = "bf16") -> float:
    D._cpu_peak.cache_clear()  # a new process, as far as the peak goes
    return D.peak_flops("cpu", "cpu", dtype)[0]


def test_the_peak_is_the_best_rate_seen_on_this_machine_across_runs(rates, tmp_path):
    rates += [2.0e12, 0.8e12, 2.4e12]
    assert peak() == 2.0e12
    assert peak() == 2.0e12  # a run on a busy machine measured 0.8: the peak stays
    assert peak() == 2.4e12  # a faster measurement raises it
    [saved] = [json.loads(p.read_text()) for p in (tmp_path / "peaks").glob("*.json")]
    assert saved["flops"] == 2.4e12
    assert f"{torch.get_num_threads()} threads" in saved["key"] and saved["key"].endswith("bf16")


def test_each_precision_has_its_own_peak_and_fp16_measures_fp32(rates, tmp_path):
    rates += [2.0e12, 0.3e12, 0.2e12]
    assert peak("bf16") == 2.0e12
    assert peak("fp32") == 0.3e12
    assert peak("fp16") == 0.3e12  # measured as fp32 (0.2 now): fp32's record stands
    assert len(list((tmp_path / "peaks").glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"flops": 1e13}', "KEYED"])
def test_a_damaged_record_is_measured_again(rates, tmp_path, damage):
    rates += [1.0e12]
    assert peak() == 1.0e12
    [path] = (tmp_path / "peaks").glob("*.json")
    key = json.loads(path.read_text())["key"]
    bad = {"{not json": "{not json", "[1, 2]": "[1, 2]", '{"flops": 1e13}': '{"flops": 1e13}',
           "KEYED": json.dumps({"key": key, "flops": float("inf")})}[damage]
    path.write_text(bad)  # no key, another key, not a dict, an infinite rate: none of them is a peak
    rates += [0.9e12]
    assert peak() == 0.9e12
    assert json.loads(path.read_text())["flops"] == 0.9e12


def test_an_unwritable_cache_costs_only_the_memory_of_earlier_runs(rates, tmp_path, monkeypatch, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("SPANFLOW_CACHE", str(blocked))  # the cache "directory" is a file
    rates += [0.9e12, 0.8e12]
    assert peak() == 0.9e12
    assert peak() == 0.8e12
    said = [r.getMessage() for r in caplog.records if r.name == "spanflow"]
    assert len(said) == 2 and "could not record this CPU's matmul peak" in said[0] and str(blocked) in said[0]


def test_the_meter_measures_the_peak_before_its_clock_starts(rates, monkeypatch):
    measured_at = []

    def rate(dtype_name):
        measured_at.append(time.perf_counter())
        return 1.0e12

    monkeypatch.setattr(D, "_matmul_rate", rate)
    meter = Meter(torch.device("cpu"), "fp32", flops_per_token=1.0)
    assert len(measured_at) == 1 and meter.started > measured_at[0]
    meter.add_tokens(10, 10)
    meter.report()
    assert len(measured_at) == 1  # the report reuses it
    meter.close()


def test_mfu_is_over_the_peak_of_every_device_the_tokens_ran_on(rates, monkeypatch):
    rates += [1.0e12]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank a machine: none shares another's cores
    meter = Meter(torch.device("cpu"), "bf16", flops_per_token=3.0)
    for devices in (1, 2):
        meter.add_tokens(5000, 6000)  # tokens summed over the ranks, as the training loop sums them
        r = meter.report(devices=devices)
        assert r["mfu"] * r["wall_s"] * 1.0e12 * devices == pytest.approx(3.0 * 6000)
    meter.close()


@pytest.mark.parametrize("threads,share", [(4, 1.0), (8, 0.5), (16, 0.5)])
def test_ranks_that_share_a_machines_cores_share_its_peak(rates, monkeypatch, threads, share):
    """Each rank measures the peak with the machine to itself: 2 ranks of 8 threads each on 8 cores
    (OMP_NUM_THREADS=8 under torchrun) counted twice the machine's peak, and MFU read half."""
    import os

    rates += [1.0e12]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # every rank may run on all of them
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    meter = Meter(torch.device("cpu"), "bf16", flops_per_token=3.0)
    meter.add_tokens(5000, 6000)
    r = meter.report(devices=2)
    assert r["peak_flops"] == pytest.approx(2 * 1.0e12 * share)
    assert r["mfu"] * r["wall_s"] * r["peak_flops"] == pytest.approx(3.0 * 6000)
    meter.close()


def test_ranks_pinned_to_cores_of_their_own_keep_their_own_peaks(rates, monkeypatch):
    """Ranks bound to separate cores (--cpu-bind, taskset) each measured their own cores' peak: the
    sum is the job's, and sharing it out again read MFU N times too high."""
    import os

    rates += [1.0e12]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)  # half of 8
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    meter = Meter(torch.device("cpu"), "bf16", flops_per_token=3.0)
    meter.add_tokens(5000, 6000)
    assert meter.report(devices=2)["peak_flops"] == pytest.approx(2 * 1.0e12)
    meter.close()


def test_the_real_measurement_is_a_positive_rate():
    assert D._matmul_rate("fp32") > 1e9
    key = D._peak_key("bf16")
    assert key.endswith("bf16") and f"{torch.get_num_threads()} threads" in key and "torch " in key


def test_another_thread_count_is_measured_again_in_the_same_process(rates, monkeypatch):
    rates += [2.0e12, 1.0e12, 3.0e12]
    threads = [8]
    monkeypatch.setattr(D.torch, "get_num_threads", lambda: threads[0])
    assert D.peak_flops("cpu", "cpu", "bf16")[0] == 2.0e12
    assert D.peak_flops("cpu", "cpu", "bf16")[0] == 2.0e12  # measured once per process and thread count
    threads[0] = 1
    assert D.peak_flops("cpu", "cpu", "bf16")[0] == 1.0e12  # its own key: not the 8 threads' peak
    assert rates == [3.0e12]
