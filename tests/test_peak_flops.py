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
    D.peak_flops.cache_clear()
    yield todo
    D.peak_flops.cache_clear()


def peak(dtype: str = "bf16") -> float:
    D.peak_flops.cache_clear()  # a new process, as far as the peak goes
    return D.peak_flops("cpu", "cpu", dtype)[0]


def test_the_peak_is_the_best_rate_seen_on_this_machine_across_runs(rates, tmp_path):
    rates += [2.0e12, 0.8e12, 2.4e12]
    assert peak() == 2.0e12
    assert peak() == 2.0e12  # a run on a busy machine measured 0.8: the peak stays
    assert peak() == 2.4e12  # a faster measurement raises it
    saved = json.loads((tmp_path / "peaks.json").read_text())
    assert list(saved.values()) == [2.4e12]
    assert f"{torch.get_num_threads()} threads | bf16" in next(iter(saved))


def test_each_precision_has_its_own_peak(rates):
    rates += [2.0e12, 0.3e12]
    assert peak("bf16") == 2.0e12
    assert peak("fp32") == 0.3e12


def test_a_damaged_or_unwritable_cache_costs_only_the_memory_of_earlier_runs(rates, tmp_path, monkeypatch):
    (tmp_path / "peaks.json").write_text("{not json")
    rates += [1.0e12]
    assert peak() == 1.0e12
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("SPANFLOW_CACHE", str(blocked))  # the cache "directory" is a file
    rates += [0.9e12]
    assert peak() == 0.9e12


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


def test_the_real_measurement_is_a_positive_rate():
    assert D._matmul_rate("fp32") > 1e9
    assert D._cpu_model().strip()
