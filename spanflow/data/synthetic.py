"""A synthetic NER data set for the demo and the tests: templated sentences, several
entity types, lengths from a few words to a few dozen. Deterministic for a seed."""
from __future__ import annotations

import csv
import json
import os
import random

from spanflow.atomic import atomic_open, writing
from spanflow.data.examples import NerExample
from spanflow.errors import ConfigError

_VOCAB = {
    "PER": ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Linus Torvalds", "Marie Curie", "Ken Thompson",
            "Barbara Liskov", "Donald Knuth", "Katherine Johnson", "Tim Berners-Lee", "Radia Perlman",
            "Edsger Dijkstra", "Frances Allen", "John McCarthy", "Margaret Hamilton", "Niklaus Wirth"],
    "ORG": ["Acme Corp", "Globex", "Initech", "Umbrella Labs", "Stark Industries", "Wayne Enterprises",
            "Hooli", "Pied Piper", "Cyberdyne Systems", "Soylent Inc", "Tyrell Corporation", "Vandelay Imports"],
    "LOC": ["Paris", "Berlin", "New York", "Tokyo", "Lagos", "Buenos Aires", "Oslo", "Cape Town", "Mumbai",
            "Toronto", "Lisbon", "Seoul", "Nairobi", "Lima", "Prague"],
    "DATE": ["Monday", "last week", "March 3", "2019", "next year", "the summer of 2021", "June 12",
             "yesterday", "early 2024", "December"],
    "PRODUCT": ["Falcon 9", "Model S", "PlayStation 5", "iPhone 15", "Kindle", "Walkman", "ThinkPad X1",
                "Pixel 8", "Switch OLED", "Galaxy Tab"],
}

_TEMPLATES = [
    "{PER} joined {ORG} in {LOC} {DATE} .",
    "{ORG} announced the {PRODUCT} at an event in {LOC} .",
    "On {DATE} , {PER} flew from {LOC} to {LOC} .",
    "{PER} said the {PRODUCT} from {ORG} was late .",
    "Shares of {ORG} rose after {PER} praised the {PRODUCT} .",
    "{PER} met {PER} in {LOC} on {DATE} to talk about {ORG} .",
    "The {PRODUCT} ships in {LOC} {DATE} .",
    "{ORG} opened an office in {LOC} .",
    "I bought a {PRODUCT} {DATE} and it broke .",
    "{PER} works for {ORG} .",
]

_FILLERS = [
    "according to people familiar with the matter", "which surprised many analysts", "as expected",
    "despite the weather", "after a long delay", "while the market was closed", "for the second time",
    "and nobody was surprised", "in a short statement", "with little fanfare",
]


def _sentence(rng: random.Random) -> NerExample:
    text, spans = "", []
    for part in rng.choice(_TEMPLATES).split():
        if text:
            text += " "
        if part.startswith("{") and part.endswith("}"):
            label = part[1:-1]
            value = rng.choice(_VOCAB[label])
            spans.append((len(text), len(text) + len(value), label))
            text += value
        else:
            text += part
    return NerExample(text, spans)


def synthetic_ner(n: int, *, seed: int = 0, max_clauses: int = 3) -> list[NerExample]:
    """`n` examples of 1..max_clauses templated clauses, optionally with filler phrases."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text, spans = "", []
        for _ in range(rng.randint(1, max_clauses)):
            ex = _sentence(rng)
            if rng.random() < 0.4:
                ex.text = ex.text[:-2] + " , " + rng.choice(_FILLERS) + " ."
            base = len(text) + (1 if text else 0)
            text = (text + " " if text else "") + ex.text
            spans += [(s + base, e + base, lab) for s, e, lab in ex.spans]
        out.append(NerExample(text, spans))
    return out


_RE_TEMPLATES = [
    ("{PER} works for {ORG} .", [(0, "works_for", 1)]),
    ("{ORG} is based in {LOC} .", [(0, "based_in", 1)]),
    ("{PER} was born in {LOC} and works for {ORG} .", [(0, "born_in", 1), (0, "works_for", 2)]),
    ("{ORG} makes the {PRODUCT} .", [(0, "makes", 1)]),
    ("{PER} , who founded {ORG} , lives in {LOC} .", [(0, "founded", 1), (0, "lives_in", 2)]),
    ("{ORG} , based in {LOC} , makes the {PRODUCT} .", [(0, "based_in", 1), (0, "makes", 2)]),
]


def synthetic_re(n: int, *, seed: int = 0, max_clauses: int = 2):
    """`n` ReExamples built from templated clauses with known subject-relation-object triples."""
    from spanflow.data.examples import ReExample

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text, triples = "", []
        for _ in range(rng.randint(1, max_clauses)):
            template, rels = rng.choice(_RE_TEMPLATES)
            spans = []
            for part in template.split():
                if text:
                    text += " "
                if part.startswith("{") and part.endswith("}"):
                    value = rng.choice(_VOCAB[part[1:-1]])
                    spans.append((len(text), len(text) + len(value)))
                    text += value
                else:
                    text += part
            triples += [(spans[a], rel, spans[b]) for a, rel, b in rels]
        out.append(ReExample(text, triples))
    return out


# one fact (a person, a company, a place) told four ways: sentences of one fact are paraphrases
_FACT_TEMPLATES = [
    "{PER} works for {ORG} in {LOC} .",
    "{ORG} employs {PER} at its office in {LOC} .",
    "In {LOC} , {PER} is on the staff of {ORG} .",
    "{PER} , who lives in {LOC} , has a job at {ORG} .",
]
_FACT_SLOTS = ("PER", "ORG", "LOC")


def _fact(rng: random.Random) -> dict[str, str]:
    return {slot: rng.choice(_VOCAB[slot]) for slot in _FACT_SLOTS}


def _changed(rng: random.Random, fact: dict[str, str], keep: int) -> dict[str, str]:
    """`fact` with all but `keep` of its slots given another value."""
    other = dict(fact)
    for slot in rng.sample(_FACT_SLOTS, len(_FACT_SLOTS) - keep):
        other[slot] = rng.choice([v for v in _VOCAB[slot] if v != fact[slot]])
    return other


def _two_ways(rng: random.Random, a: dict[str, str], b: dict[str, str]) -> tuple[str, str]:
    t1, t2 = rng.sample(_FACT_TEMPLATES, 2)
    return t1.format(**a), t2.format(**b)


def synthetic_pairs(n: int, *, seed: int = 0) -> list[tuple[str, str, float]]:
    """`n` scored pairs (s1, s2, score 0..5): two sentences worded differently, scored by how
    many of person, company and place they share (5: the same fact)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fact, keep = _fact(rng), rng.randint(0, len(_FACT_SLOTS))
        s1, s2 = _two_ways(rng, fact, _changed(rng, fact, keep))
        out.append((s1, s2, round(5 * keep / len(_FACT_SLOTS), 2)))
    return out


def synthetic_triplets(n: int, *, seed: int = 0) -> list[tuple[str, str, str]]:
    """`n` triplets (anchor, positive, negative): a fact, the same fact worded another way, and
    that wording with one of person, company or place changed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fact = _fact(rng)
        t1, t2 = rng.sample(_FACT_TEMPLATES, 2)
        out.append((t1.format(**fact), t2.format(**fact), t2.format(**_changed(rng, fact, 2))))
    return out


def _casrel_record(ex) -> dict | None:
    """The CasRel JSON record of a ReExample, or None when a subject or object string occurs in
    its text so that reading the record back would locate another occurrence."""
    from spanflow.data.formats.casrel import locate

    triples = []
    for (s, o), rel in ((t[::2], t[1]) for t in ex.triples):
        subj, obj = ex.text[s[0]:s[1]], ex.text[o[0]:o[1]]
        if locate(ex.text, subj, obj) != (s, o):
            return None
        triples.append([subj, rel, obj])
    return {"text": ex.text, "triple_list": triples}


def synthetic_casrel(n: int, *, seed: int = 0) -> list[dict]:
    """`n` CasRel JSON records ({"text", "triple_list"}) that read back to the examples they came from."""
    records = [r for r in map(_casrel_record, synthetic_re(2 * n, seed=seed)) if r is not None]
    return records[:n]


def _write_rows(path: str, rows, delimiter: str, header: tuple[str, ...]) -> None:
    with atomic_open(path) as f:
        w = csv.writer(f, delimiter=delimiter, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def _write_json(path: str, records: list[dict], *, lines: bool) -> None:
    with atomic_open(path) as f:
        rows = [json.dumps(r, ensure_ascii=False) for r in records]
        # a JSON list is written one record a line too, so that it reads like the JSONL files
        f.write("\n".join(rows) + "\n" if lines else "[\n" + ",\n".join(rows) + "\n]\n")


def write_demo_data(out_dir: str, *, train_size: int = 1500, seed: int = 0) -> list[str]:
    """Write the demo's synthetic data as the files the documentation's examples read; return
    their names. Train files hold `train_size` records and dev files a fifth of that (at least
    100), the sizes `spanflow demo` trains on; texts.txt holds 20 unlabelled texts to run on (12 of the NER
    data's kind, 8 of the relation data's)."""
    if train_size < 1:
        raise ConfigError(f"--train-size must be >= 1, got {train_size}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--write-data {out_dir} is a file; give a directory")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot write to --write-data {out_dir}: {e.strerror or e}") from None
    dev_size = max(100, train_size // 5)
    names = []
    with writing("the demo data", out_dir):
        for write in (_ner_files, _re_files, _pair_files):
            names += write(out_dir, train_size, dev_size, seed)
    return names


def _ner_files(out_dir: str, train_size: int, dev_size: int, seed: int) -> list[str]:
    from spanflow.data.io import write_ner

    write_ner(synthetic_ner(train_size, seed=seed), os.path.join(out_dir, "train.conll"))
    write_ner(synthetic_ner(dev_size, seed=seed + 1), os.path.join(out_dir, "dev.conll"))
    # texts for every task's model: sentences of the NER data's kind and of the relation data's
    texts = [e.text for e in synthetic_ner(12, seed=seed + 2)] + [e.text for e in synthetic_re(8, seed=seed + 2)]
    _write_lines(os.path.join(out_dir, "texts.txt"), texts)
    return ["train.conll", "dev.conll", "texts.txt"]


def _re_files(out_dir: str, train_size: int, dev_size: int, seed: int) -> list[str]:
    _write_json(os.path.join(out_dir, "train_triples.json"), synthetic_casrel(train_size, seed=seed), lines=False)
    _write_json(os.path.join(out_dir, "dev_triples.json"), synthetic_casrel(dev_size, seed=seed + 1), lines=False)
    return ["train_triples.json", "dev_triples.json"]


def _pair_files(out_dir: str, train_size: int, dev_size: int, seed: int) -> list[str]:
    """Scored pairs (CSV), pairs (JSONL) and triplets (TSV), each with a header row or named keys."""
    scored = ("s1", "s2", "score")
    _write_rows(os.path.join(out_dir, "pairs.csv"), synthetic_pairs(train_size, seed=seed), ",", scored)
    _write_rows(os.path.join(out_dir, "dev_pairs.csv"), synthetic_pairs(dev_size, seed=seed + 1), ",", scored)
    triplets = synthetic_triplets(train_size + dev_size, seed=seed + 3)
    qa = [{"anchor": a, "positive": b} for a, b, _ in triplets]
    _write_json(os.path.join(out_dir, "qa_train.jsonl"), qa[:train_size], lines=True)
    _write_json(os.path.join(out_dir, "qa_dev.jsonl"), qa[train_size:], lines=True)
    _write_rows(os.path.join(out_dir, "triplets.tsv"), triplets[:train_size], "\t", ("anchor", "positive", "negative"))
    return ["pairs.csv", "dev_pairs.csv", "qa_train.jsonl", "qa_dev.jsonl", "triplets.tsv"]


def _write_lines(path: str, texts: list[str]) -> None:
    with atomic_open(path) as f:
        f.writelines(t + "\n" for t in texts)
