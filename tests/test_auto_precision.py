"""--precision auto for inference: a reduced precision is kept only where the task's agreement
with fp32 on the input reaches its gate; the verdict is cached and said."""
import json

import pytest

from spanflow.runtime import policy
from spanflow.runtime.loads import Loads
from spanflow.runtime.policy import cpu_has_bf16
from spanflow.runtime.precision import MIN_SAMPLE, auto_precision


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
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)  # the candidate on CPU is then bf16


def check(path, task, texts, said):
    return auto_precision(task, str(path), device="cpu", texts=texts, log=said.append)


def test_a_precision_that_agrees_is_kept_and_the_verdict_cached(bf16_device, tmp_path):
    said = []
    task = FakeTask(0.95)
    texts = [f"text {i}" for i in range(MIN_SAMPLE)]
    precision, why = check(tmp_path, task, texts, said)
    assert precision == "bf16" and task.loads == ["fp32", "bf16"]
    assert why == f"auto: agreement 0.9500 to fp32 on {MIN_SAMPLE} input texts, gate 0.9"
    again = FakeTask(0.0)  # a cached verdict is not measured again
    precision, why = check(tmp_path, again, texts[:3], said)
    assert precision == "bf16" and again.loads == [] and not said
    assert why == f"auto: agreement 0.9500 to fp32 on {MIN_SAMPLE} input texts (an earlier run's check), gate 0.9"
    [cached] = (tmp_path / "cache" / "verdicts").glob("*.json")
    assert json.loads(cached.read_text()) == {"precision": "bf16", "measure": "agreement", "score": 0.95, "gate": 0.9,
                                              "n": MIN_SAMPLE, "passed": True, "source": "input",
                                              "inputs": MIN_SAMPLE, "compared": MIN_SAMPLE}


def test_a_precision_below_the_gate_falls_back_to_fp32_with_a_reason(bf16_device, tmp_path):
    said = []
    precision, why = check(tmp_path, FakeTask(0.5), ["a"], said)
    assert precision == "fp32" and "bf16 reached agreement 0.5000" in why and "below the gate 0.9" in why
    sample = FakeTask(1.0)  # nothing to check on (serve): built-in sentences, and real input checks again later
    precision, why = check(tmp_path / "other", sample, [], said)
    assert precision == "bf16" and "built-in sample texts" in why and sample.loads == ["fp32", "bf16"]
    real = FakeTask(0.5)
    precision, why = check(tmp_path / "other", real, ["a"], said)
    assert precision == "fp32" and real.loads == ["fp32", "bf16"]
    assert f"on 1 input text and {MIN_SAMPLE - 1} built-in sentences (the input has fewer than {MIN_SAMPLE})" in why


def test_the_checked_models_are_the_ones_the_command_then_runs(bf16_device, tmp_path):
    task = FakeTask(0.95)
    loads = Loads(task, str(tmp_path))
    assert auto_precision(task, str(tmp_path), device="cpu", texts=["a"], loads=loads)[0] == "bf16"
    assert loads.get("cpu", "bf16") is task and task.loads == ["fp32", "bf16"]  # taken, not loaded again
    assert loads.loaded == 2


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
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("runtime: ")]
    assert "(auto: " in line and "entity F1" in line and "on 40 input texts and 24 built-in sentences" in line
    verdicts = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "verdicts").rglob("*.json")]
    assert len(verdicts) == 1 and verdicts[0]["measure"] == "entity F1"
    assert (verdicts[0]["n"], verdicts[0]["inputs"]) == (MIN_SAMPLE, 40)


def test_a_cache_that_cannot_be_written_is_a_warning_not_the_end_of_the_command(bf16_device, tmp_path,
                                                                                   monkeypatch, caplog):
    (tmp_path / "blocked").write_text("a file where the cache's directory would be")
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "blocked"))
    assert check(tmp_path, FakeTask(0.95), ["a"], [])[0] == "bf16"  # the verdict holds for this run
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"could not cache the precision verdict at {tmp_path / 'blocked'}")


def test_an_unreadable_cached_verdict_is_said_and_checked_again(bf16_device, tmp_path):
    said = []
    assert check(tmp_path, FakeTask(0.95), ["a"], said)[0] == "bf16"
    [cached] = list((tmp_path / "cache" / "verdicts").rglob("*.json"))
    cached.write_text('{"precision": "bf1')  # truncated
    again = FakeTask(0.5)
    assert check(tmp_path, again, ["a"], said)[0] == "fp32"
    assert "is unreadable" in said[0] and str(cached) in said[0] and again.loads == ["fp32", "bf16"]


@pytest.mark.parametrize("change, problem", [
    (lambda v: v.pop("score"), "'score' is missing"),
    (lambda v: v.update(n=-3), "'n' must be a non-negative integer, got -3"),
    (lambda v: v.update(source="elsewhere"), "'source'"),
])
def test_an_incomplete_cached_verdict_names_its_field_and_is_checked_again(bf16_device, tmp_path, change, problem):
    said = []
    assert check(tmp_path, FakeTask(0.95), ["a"], said)[0] == "bf16"
    [cached] = list((tmp_path / "cache" / "verdicts").rglob("*.json"))
    verdict = json.loads(cached.read_text())
    change(verdict)
    cached.write_text(json.dumps(verdict))
    again = FakeTask(0.5)
    assert check(tmp_path, again, ["a"], said)[0] == "fp32"
    assert len(said) == 1 and f"{cached} is incomplete ({problem}" in said[0] and "checking again" in said[0]
    assert again.loads == ["fp32", "bf16"]


def test_the_verdict_says_how_few_found_items_a_score_rests_on(bf16_device, tmp_path):
    """An RE check scored 'triple F1 1.0000 on 40 input texts' where fp32 had found 2 triples."""
    task = FakeTask(1.0)
    task.predict_stream = lambda texts: iter([[("s", "r", "o")] if i < 2 else [] for i, _ in enumerate(texts)])
    texts = [f"text {i}" for i in range(MIN_SAMPLE)]
    precision, why = check(tmp_path, task, texts, [])
    assert precision == "bf16" and why == f"auto: agreement 1.0000 to fp32 on {MIN_SAMPLE} input texts, where fp32 " \
                                          "found 2, gate 0.9"
