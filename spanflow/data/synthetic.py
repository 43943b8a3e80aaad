"""A synthetic NER data set for the demo and the tests: templated sentences, several
entity types, lengths from a few words to a few dozen. Deterministic for a seed."""
from __future__ import annotations

import random

from spanflow.data.examples import NerExample

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
