"""Stream-time phases (monitor/spans.py) with events of a stream simulated in the test."""
import pytest
import torch

from spanflow.monitor import spans as spans_mod
from spanflow.monitor.report import Meter
from spanflow.monitor.spans import StreamSpans


class FakeStream:
    """A stream whose clock the test advances: an event records the clock when recorded."""

    def __init__(self):
        self.now_ms = 0.0
        self.waits = 0

    def event(self):
        stream = self

        class Event:
            def record(self):
                self.at = stream.now_ms

            def synchronize(self):
                stream.waits += 1

            def elapsed_time(self, other):
                return other.at - self.at

        return Event()


def test_spans_sum_stream_time_per_phase_and_wait_once_per_take():
    s = FakeStream()
    spans = StreamSpans(event=s.event)
    for _ in range(3):
        spans.begin()
        s.now_ms += 30  # forward and backward
        spans.end("compute")
        s.now_ms += 10  # optimizer
        spans.end("optimizer")
        s.now_ms += 500  # the host waits for data: the stream is idle, and no phase counts it
    got = spans.take()
    assert got == pytest.approx({"compute": 0.09, "optimizer": 0.03})
    assert s.waits == 1
    assert spans.take() == {}


def test_a_long_period_folds_old_spans_and_keeps_its_totals(monkeypatch):
    monkeypatch.setattr(spans_mod, "FOLD_AT", 4)
    s = FakeStream()
    spans = StreamSpans(event=s.event)
    for _ in range(10):
        spans.begin()
        s.now_ms += 2
        spans.end("compute")
    assert len(spans._pending) <= 5
    assert abs(spans.take()["compute"] - 0.02) < 1e-12


def test_meter_reports_the_streams_split_where_there_is_one():
    s = FakeStream()
    meter = Meter(torch.device("cpu"), "fp32")
    assert meter.spans is None  # the CPU's host clock is its own stream
    meter.spans = StreamSpans(event=s.event)
    meter.add_time("data_wait", 0.01)
    meter.add_time("compute", 0.001)  # what a host clock sees of asynchronous kernels: their launch
    meter.begin_step()
    s.now_ms += 80
    meter.end_phase("compute")
    s.now_ms += 10
    meter.end_phase("optimizer")
    rep = meter.report()
    assert abs(rep["compute_frac"] - 0.08 / 0.1) < 1e-9
    assert abs(rep["optimizer_frac"] - 0.01 / 0.1) < 1e-9
    meter.close()
