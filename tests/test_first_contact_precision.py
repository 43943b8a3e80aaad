"""--precision auto sized so that its verdict means something (a least sample, a check again on a much
larger input, no pass when fp32 finds nothing), and the Python API's load(precision="auto") picking
what the CLI picks."""
import json

import pytest

from spanflow.runtime import policy
from spanflow.runtime.cache import cache_path
from spanflow.runtime.files import Verdict, write_verdict
from spanflow.runtime.precision import GROWTH, MIN_SAMPLE, SAMPLE, auto_precision


class FakeTask:
    """Predicts each text's words as its items (or nothing); agreement is fixed."""

    name, agreement_name, precision_gate = "fake", "entity F1", 0.9

    def __init__(self, score=1.0, finds=True):
        self.score, self.finds, self.runs = score, finds, []

    def load(self, path, *, device, precision):
        return self

    def predict_stream(self, texts):
        self.runs.append(len(texts))
        return iter([t.split() if self.finds else [] for t in texts])

    def agreement(self, ref, got):
        return self.score


@pytest.fixture
def bf16_device(monkeypatch, tmp_path):
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)


def _check(path, task, texts):
    return auto_precision(task, str(path), device="cpu", texts=texts, log=lambda s: None)


def test_a_small_input_is_topped_up_and_a_much_larger_one_checks_again(bf16_device, tmp_path):
    task = FakeTask()
    precision, why = _check(tmp_path, task, ["John visited Paris.", "", "Mary met Bob."])
    assert precision == "bf16" and task.runs == [MIN_SAMPLE, MIN_SAMPLE]  # fp32, then bf16, on the least sample
    assert f"on 2 input texts and {MIN_SAMPLE - 2} built-in sentences (the input has fewer than {MIN_SAMPLE})" in why
    larger = [f"text number {i}" for i in range(1500)]
    task.runs.clear()
    assert "(an earlier run's check)" in _check(tmp_path, task, larger[:2 * GROWTH])[1] and task.runs == []  # within GROWTH
    precision, why = _check(tmp_path, task, larger)
    assert task.runs == [SAMPLE, SAMPLE] and f"on {SAMPLE} input texts" in why and "(an earlier run's check)" not in why
    task.runs.clear()
    assert "(an earlier run's check)" in _check(tmp_path, task, larger)[1] and task.runs == []  # a full sample stands


def test_nothing_found_in_fp32_is_no_pass(bf16_device, tmp_path):
    task = FakeTask(score=1.0, finds=False)  # a relation model that predicts nothing: agreement would be 1.0
    precision, why = _check(tmp_path, task, [f"text {i}" for i in range(MIN_SAMPLE)])
    assert precision == "fp32"
    assert why == (f"auto: the bf16 check had nothing to compare: the model found nothing in fp32 on {MIN_SAMPLE} "
                   "input texts; fp32 kept")
    again = _check(tmp_path, task, ["one text"])
    assert again[0] == "fp32" and "nothing to compare" in again[1] and "(an earlier run's check)" in again[1]
    [cached] = (tmp_path / "cache" / "verdicts").rglob("*.json")
    assert json.loads(cached.read_text())["compared"] == 0 and not json.loads(cached.read_text())["passed"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """An untrained tiny model of each task, saved."""
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.models.encoder import start_encoder
    from spanflow.tasks.embed.st_dir import write_embedding_dir
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.re.model import ReModel

    d = tmp_path_factory.mktemp("models")
    texts = [e.text for e in synthetic_ner(30, seed=1)]
    enc, tok, limit = start_encoder("tiny", texts, max_length=64, seed=0)
    NerModel(encoder=enc, tokenizer=tok, labels=["PER"], limit=limit).save(str(d / "ner"))
    ReModel(encoder=enc, tokenizer=tok, relations=["born_in"], limit=limit).save(str(d / "re"))
    write_embedding_dir(str(d / "embed"), encoder=enc, tokenizer=tok, pooling="mean", normalize=False, max_length=64)
    return d


@pytest.mark.parametrize("name", ["ner", "re", "embed"])
@pytest.mark.parametrize("passed", [True, False])
def test_the_api_load_auto_picks_what_the_cli_picks(bf16_device, model_dirs, name, passed):
    from spanflow.runtime.policy import pick_device
    from spanflow.tasks.registry import get

    task, path = get(name), str(model_dirs / name)
    cached = cache_path("verdicts", model=path, device=pick_device("cpu"), task=name, mode="infer", precision="bf16")
    write_verdict(cached, Verdict(precision="bf16", measure=task.agreement_name, score=1.0 if passed else 0.5,
                                  gate=task.precision_gate, n=64, passed=passed, source="sample", inputs=0,
                                  compared=64))
    from spanflow.tasks.embed.model import Embedder
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.re.model import ReModel

    cls = {"ner": NerModel, "re": ReModel, "embed": Embedder}[name]
    cli = auto_precision(task, path, device="cpu", texts=None)[0]
    assert cli == ("bf16" if passed else "fp32") and cls.load(path, device="cpu").policy.name == cli
    assert cls.load(path, device="cpu", precision="fp32").policy.name == "fp32"  # asked: no check
