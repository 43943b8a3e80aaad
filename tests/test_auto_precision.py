"""--precision auto for inference: a reduced precision is kept only where the task's agreement
with fp32 on the input reaches its gate; the verdict is cached and said."""
import json

import pytest

from spanflow.inference import auto_precision as ap
from spanflow.training.precision import Policy, cpu_has_bf16


class FakeTask:
    name, agreement_name, precision_gate = "fake", "agreement", 0.9

    def __init__(self, score):
        self.score, self.loads = score, []

    def load(self, path, *, device, precision):
        self.loads.append(precision)
        return self

    def predict_stream(self, texts):
        return iter(texts)

    def agreement(self, ref, got):
        return self.score


@pytest.fixture
def bf16_device(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ap, "resolve_policy", lambda *a, **k: Policy(torch.device("cpu"), torch.bfloat16, False))


def test_a_precision_that_agrees_is_kept_and_the_verdict_cached(bf16_device, tmp_path):
    said = []
    task = FakeTask(0.95)
    assert ap.auto_precision(str(tmp_path), task=task, device="cpu", texts=["a", "b"], log=said.append) == "bf16"
    assert task.loads == ["fp32", "bf16"] and "bf16 (agreement 0.9500 to fp32 on 2 input texts" in said[0]
    again = FakeTask(0.0)  # a cached verdict is not measured again
    assert ap.auto_precision(str(tmp_path), task=again, device="cpu", texts=["a"], log=said.append) == "bf16"
    assert again.loads == [] and "checked before" in said[1]


def test_a_precision_below_the_gate_falls_back_to_fp32_with_a_reason(bf16_device, tmp_path):
    said = []
    assert ap.auto_precision(str(tmp_path), task=FakeTask(0.5), device="cpu", texts=["a"], log=said.append) == "fp32"
    assert "below the gate 0.9" in said[0]
    sample = FakeTask(1.0)  # nothing to check on (serve): built-in sentences, and real input checks again later
    assert ap.auto_precision(str(tmp_path / "other"), task=sample, device="cpu", texts=[], log=said.append) == "bf16"
    assert "built-in sample texts" in said[1] and sample.loads == ["fp32", "bf16"]
    real = FakeTask(0.5)
    assert ap.auto_precision(str(tmp_path / "other"), task=real, device="cpu", texts=["a"], log=said.append) == "fp32"
    assert real.loads == ["fp32", "bf16"] and "on 1 input texts" in said[2]


@pytest.mark.skipif(not cpu_has_bf16(), reason="needs a CPU with native bf16")
def test_predict_auto_checks_bf16_on_its_input(tmp_path, monkeypatch, capsys):
    from spanflow.cli.main import main
    from spanflow.data.formats.jsonl import write_jsonl_record
    from spanflow.data.synthetic import synthetic_ner

    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    data = synthetic_ner(40, seed=41)
    with open(tmp_path / "t.jsonl", "w") as f:
        for e in data:
            write_jsonl_record(f, e.text, e.spans)
    assert main(["train", "ner", "--train", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "run"), "--epochs", "4",
                 "--max-tokens", "512", "--log-every", "0"]) == 0
    (tmp_path / "in.txt").write_text("\n".join(e.text for e in data) + "\n")
    capsys.readouterr()
    args = ["predict", "--model", str(tmp_path / "run" / "model"), "--input", str(tmp_path / "in.txt"), "--output",
            str(tmp_path / "o.jsonl")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "precision auto: " in err and "entity F1" in err
    verdicts = [json.loads(p.read_text()) for p in (tmp_path / "cache").rglob("*.json")]
    assert len(verdicts) == 1 and verdicts[0]["measure"] == "entity F1" and verdicts[0]["n"] == 40


def test_an_unreadable_cached_verdict_is_said_and_checked_again(bf16_device, tmp_path):
    said = []
    assert ap.auto_precision(str(tmp_path), task=FakeTask(0.95), device="cpu", texts=["a"], log=said.append) == "bf16"
    [cached] = list((tmp_path / "cache").rglob("*.json"))
    cached.write_text('{"precision": "bf1')  # truncated
    again = FakeTask(0.5)
    assert ap.auto_precision(str(tmp_path), task=again, device="cpu", texts=["a"], log=said.append) == "fp32"
    assert "is unreadable" in said[1] and again.loads == ["fp32", "bf16"]
