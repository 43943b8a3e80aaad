"""Word tokens for formats that need them (CoNLL columns, spaCy Docs), cut so that every
entity boundary is a token boundary. Examples read from tokens keep them; a text without
tokens is cut the same way whatever its labels: whitespace splits words, each Chinese or
Japanese character is a token (Korean spaces its words: whitespace splits them), and sentence
punctuation at a word's ends stands alone (`fun.` and `Berg.` alike, so that where a token
ends never tells where an entity does). No character is ever dropped."""
from __future__ import annotations

import bisect
import re
from collections.abc import Container

from spanflow.data.examples import Span
from spanflow.data.formats.common import unspaced

# marks cut off a word's ends (`Paris.`, `(Paris)`, `"Paris"`); those often part of a token
# (`@user`, `#tag`, `$5`, `e-mail`, `a/b`, `'s`, `rock'n'roll`) stay, as does the last dot of
# an abbreviation (`U.S.`, `e.g.`)
EDGE_MARKS = frozenset('.,;:!?()[]{}"«»“”…')
NON_SPACE = re.compile(r"\S+")  # \S is what str.isspace() is not, as str.split() splits


def cut_edges(text: str, s: int, e: int, start: Container[str], end: Container[str], *,
              abbreviations: bool = False) -> list[tuple[int, int]]:
    """The word text[s:e] with the marks in `start` cut off its start and those in `end` off its
    end, one token each, around its core (a word without a letter or digit stays whole); with
    `abbreviations`, a last dot whose word holds another dot stays (`U.S.`, `e.g.`)."""
    if not any(c.isalnum() for c in text[s:e]):
        return [(s, e)]
    head, tail = [], []
    while text[s] in start and not text[s].isalnum():
        head.append((s, s + 1))
        s += 1
    while (text[e - 1] in end and not text[e - 1].isalnum()
           and not (abbreviations and text[e - 1] == "." and "." in text[s:e - 1])):
        e -= 1
        tail.append((e, e + 1))
    return head + [(s, e)] + tail[::-1]


def _cut_marks(text: str, s: int, e: int) -> list[tuple[int, int]]:
    return cut_edges(text, s, e, EDGE_MARKS, EDGE_MARKS, abbreviations=True)


def plain_words(text: str) -> list[tuple[int, int]]:
    """(start, end) of each token of a text that came without tokens."""
    out = []
    for m in NON_SPACE.finditer(text):
        s, e = m.span()
        run = s
        for i in range(s, e):
            if unspaced(text[i]):
                if run < i:
                    out += _cut_marks(text, run, i)
                out.append((i, i + 1))
                run = i + 1
        if run < e:
            out += _cut_marks(text, run, e)
    return out


def _covers(text: str, words: list[tuple[int, int]]) -> bool:
    """Whether `words`, in order and apart, hold every character of `text` but whitespace."""
    pos = 0
    for a, b in words:
        if a < pos or b <= a or not text[pos:a].isspace() and pos < a:
            return False
        pos = b
    return pos <= len(text) and (pos == len(text) or text[pos:].isspace())


def word_bounds(text: str, spans: list[Span], words: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """(start, end) of each non-space token of `text`: `words` (the tokens it was read from) or
    plain_words, cut again where an entity starts or ends inside one."""
    cuts = sorted({b for s, e, _ in spans for b in (s, e)})
    if words and not _covers(text, words):  # tokens that leave characters out would lose them
        words = None
    out = []
    for a, b in (words or plain_words(text)):
        points = [a, *cuts[bisect.bisect_right(cuts, a):bisect.bisect_left(cuts, b)], b]
        out += list(zip(points, points[1:]))
    return out


def bio_tags(bounds: list[tuple[int, int]], spans: list[Span]) -> list[str]:
    """BIO tag of each token (bounds from word_bounds, so spans align with tokens)."""
    tags = ["O"] * len(bounds)
    starts = [a for a, _ in bounds]
    ordered = all(a <= b for a, b in zip(starts, starts[1:]))
    for s, e, lab in spans:
        # bisected to the tokens starting within the span (in text order): a scan of every token per
        # span was quadratic in a long document
        lo, hi = (bisect.bisect_left(starts, s), bisect.bisect_right(starts, e)) if ordered else (0, len(bounds))
        inside = [k for k in range(lo, hi) if bounds[k][0] >= s and bounds[k][1] <= e]
        for n, k in enumerate(inside):
            tags[k] = ("I-" if n else "B-") + lab
    return tags
