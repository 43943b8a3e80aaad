import pytest

from spanflow.tasks.metrics import span_prf


def test_exact_span_prf():
    gold = [[(0, 3, "PER"), (7, 11, "LOC")], [(0, 4, "ORG")]]
    pred = [[(0, 3, "PER"), (7, 10, "LOC")], [(0, 4, "ORG"), (5, 6, "PER")]]
    m = span_prf(gold, pred)
    assert m["precision"] == pytest.approx(2 / 4) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert m["support"] == 3
    assert m["per_label"]["ORG"]["f1"] == 1.0
    assert m["per_label"]["LOC"] == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "support": 1}
    assert m["per_label"]["PER"]["precision"] == 0.5
