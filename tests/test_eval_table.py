"""The evaluate tables keep their columns aligned whatever the length of the label or relation names."""
from __future__ import annotations

import re

from spanflow.tasks.metrics import format_table, span_prf
from spanflow.tasks.re.metrics import re_metrics
from spanflow.tasks.re.model import ReModel

LONG = "administrativeCountyOfTheFederalState"  # longer than any fixed first column


def _column_ends(lines: list[str]) -> list[list[int]]:
    """Where each of the four right-aligned columns ends, line by line."""
    return [[m.end() for m in re.finditer(r"\S+", line)][-4:] for line in lines]


def test_the_re_table_aligns_long_relation_names():
    gold = [{("Alan Bean", "birthPlace", "Wheeler"), ("Aarhus", LONG, "Jutland")}, {("Oslo", "country", "Norway")}]
    pred = [{("Alan Bean", "birthPlace", "Wheeler")}, {("Oslo", "country", "Norway"), ("Oslo", LONG, "Viken")}]
    lines = ReModel.format_metrics(re_metrics(gold, pred)).splitlines()
    table, partial = lines[:-1], lines[-1]
    assert table[0].split() == ["relation", "precision", "recall", "f1", "support"]
    assert {line.split()[0] for line in table[1:-1]} == {"birthPlace", "country", LONG}
    assert table[-1].split()[0] == "overall"
    ends = _column_ends(table)
    assert all(e == ends[0] for e in ends), "\n".join(table)
    starts = {line.index(line.split()[1]) for line in table}  # the first number starts after the widest name
    assert min(starts) > len(LONG)
    assert partial.startswith("partial (last-word) match")


def test_the_ner_table_aligns_long_labels():
    gold = [[(0, 5, "person"), (10, 14, LONG)]]
    pred = [[(0, 5, "person"), (10, 14, "person")]]
    table = format_table(span_prf(gold, pred)).splitlines()
    assert table[0].split()[0] == "label" and table[-1].split()[0] == "overall"
    ends = _column_ends(table)
    assert all(e == ends[0] for e in ends), "\n".join(table)


def test_evaluates_span_check_runs_a_chunk_at_a_time_and_counts_the_same(monkeypatch):
    """The check tokenized the whole labelled file at once (1.7 of 2.4 GB for 200k examples)."""
    from spanflow.data.examples import NerExample
    from spanflow.models.encoder import build_tiny
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.ner import model as ner_model

    examples = [NerExample(f"Parisian {i} went home", [(0, 5, "LOC")]) for i in range(5)]
    enc, tok = build_tiny([e.text for e in examples], hidden=16, embedding=16, bigram_buckets=101, max_length=64)
    m = NerModel(encoder=enc, tokenizer=tok, labels=["LOC"], limit=32, policy=resolve_policy("fp32", "cpu"))
    whole = m._off_words(examples)
    assert whole.startswith("5 of the data's 5 gold entities do not start and end on the words the model tags")
    calls = []
    real = m._encode
    monkeypatch.setattr(m, "_encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(ner_model, "CHECK_CHUNK", 2)
    assert m._off_words(examples) == whole and len(calls) == 3
