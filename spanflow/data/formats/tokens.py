"""Word tokens for formats that need them (CoNLL columns, spaCy Docs), cut so that every
entity boundary is a token boundary: whitespace splits words, each CJK character is a
token, and span starts and ends split words too. No character is ever dropped."""
from __future__ import annotations

from spanflow.data.examples import Span
from spanflow.data.formats.common import is_cjk


def word_bounds(text: str, spans: list[Span]) -> list[tuple[int, int]]:
    """(start, end) of each non-space token of `text`."""
    cuts = {b for s, e, _ in spans for b in (s, e)}
    out, start = [], None
    for i, ch in enumerate(text):
        if ch.isspace():
            if start is not None:
                out.append((start, i))
            start = None
            continue
        if start is not None and (i in cuts or is_cjk(ch) or is_cjk(text[i - 1])):
            out.append((start, i))
            start = None
        if start is None:
            start = i
    if start is not None:
        out.append((start, len(text)))
    return out


def bio_tags(bounds: list[tuple[int, int]], spans: list[Span]) -> list[str]:
    """BIO tag of each token (bounds from word_bounds, so spans align with tokens)."""
    tags = ["O"] * len(bounds)
    for s, e, lab in spans:
        inside = [k for k, (a, b) in enumerate(bounds) if a >= s and b <= e]
        for n, k in enumerate(inside):
            tags[k] = ("I-" if n else "B-") + lab
    return tags
