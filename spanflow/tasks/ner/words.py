"""The words a model labels: its training data's tokens, reproduced on plain text.

Labels sit on the first subword of each word, so the words decide where an entity may start
and end. A model trained on data that came as tokens (CoNLL, `.spacy`) learned one label per
input token; when those tokens are the whitespace-separated pieces of each text (CoNLL tokens
joined by single spaces), plain text split at whitespace gives the model the same words, and
a URL the tokenizer would cut at its punctuation stays one word. Other models label the
tokenizer's own words (a pre-tokenizer splits punctuation off, as text with no tokens needs).

Token data often splits punctuation off words (`Paris .`, CoNLL-2003) but keeps some attached
(`@user`, `#tag`, URLs, WNUT-17): the model learned which. `edge_rules` reads it off the training
tokens, per character and word edge: a punctuation mark that stands alone as a token more often
than it sits at that edge of a word is cut off there in plain text (`Paris.` -> `Paris` `.`);
one the data keeps attached stays (`@user`).
"""
from __future__ import annotations

from collections.abc import Callable

from spanflow.data.examples import NerExample
from spanflow.data.formats.tokens import NON_SPACE, cut_edges
from spanflow.errors import ModelDirError

TOKENIZER, WHITESPACE = "tokenizer", "whitespace"
KINDS = (TOKENIZER, WHITESPACE)
# CoNLL joins adjacent CJK tokens without a space: a few such texts in otherwise whitespace-tokenised
# data must not send a model back to subword words; character-level data (BMES) and spaCy's tokens
# (punctuation split off, 10-20% of whitespace tokens) fall far below this share
MATCH_SHARE = 0.99

MAX_WHOLE = 2000  # the most frequent training tokens kept whole: spanflow.json stays small


def whitespace_words(text: str, edges: dict | None = None) -> list[tuple[int, int]]:
    """(start, end) of each whitespace-separated token of `text`; with `edges` ({"start": chars,
    "end": chars, "whole": [tokens]}, see edge_rules) those punctuation marks are cut off a
    token's ends, one word each, except from a token the training data had whole (`Corp.`) and
    an abbreviation's last dot (`U.S.`, `e.g.`); a token of punctuation only stays whole."""
    spans = [m.span() for m in NON_SPACE.finditer(text)]
    if not edges or not (edges.get("start") or edges.get("end")):
        return spans
    start, end, whole = edges.get("start", ""), edges.get("end", ""), set(edges.get("whole") or ())
    return [w for s, e in spans
            for w in ([(s, e)] if text[s:e] in whole else cut_edges(text, s, e, start, end, abbreviations=True))]


def _is_mark(c: str) -> bool:
    return not c.isalnum() and not c.isspace()


def edge_rules(examples: list[NerExample]) -> dict:
    """The punctuation marks to cut off each end of a whitespace word: those the training tokens
    have standing alone more often than at that end of a word."""
    alone: dict[str, int] = {}
    at = {"start": {}, "end": {}}
    for e in examples:
        for a, b in e.words or ():
            t = e.text[a:b]
            if not any(c.isalnum() for c in t):
                for c in set(t):
                    alone[c] = alone.get(c, 0) + 1
                continue
            i, j = 0, len(t)
            while i < j and _is_mark(t[i]):
                at["start"][t[i]] = at["start"].get(t[i], 0) + 1
                i += 1
            if t.endswith(".") and "." in t[i:-1]:  # an abbreviation's dot (`U.S.`) stays in any case
                j -= 1
            while j > i and _is_mark(t[j - 1]):
                at["end"][t[j - 1]] = at["end"].get(t[j - 1], 0) + 1
                j -= 1
    cut = {edge: "".join(sorted(c for c, n in alone.items() if n > at[edge].get(c, 0))) for edge in at}
    whole: dict[str, int] = {}  # tokens that keep a mark these rules would cut (`Corp.`, `Inc.`), as trained
    for e in examples:
        for a, b in e.words or ():
            if len(cut_edges(e.text, a, b, cut["start"], cut["end"], abbreviations=True)) > 1:
                whole[e.text[a:b]] = whole.get(e.text[a:b], 0) + 1
    kept = sorted(whole, key=lambda t: (-whole[t], t))[:MAX_WHOLE]
    return {**cut, **({"whole": sorted(kept)} if kept else {})}


def words_of(examples: list[NerExample]) -> str:
    """How the words of a model trained on `examples` are made: WHITESPACE when every example
    came as tokens and (nearly) every whitespace token of the texts is exactly one of them,
    else TOKENIZER."""
    if not examples or any(e.words is None for e in examples):
        return TOKENIZER
    total = same = 0
    for e in examples:
        given = set(map(tuple, e.words))
        pieces = whitespace_words(e.text)
        total += len(pieces)
        same += sum(p in given for p in pieces)
    return WHITESPACE if total and same >= MATCH_SHARE * total else TOKENIZER


def valid_edges(edges) -> bool:
    """Whether `edges` is edge_rules' shape (as read back from a model directory)."""
    return (isinstance(edges, dict) and all(isinstance(edges.get(k, ""), str) for k in ("start", "end"))
            and isinstance(edges.get("whole", []), list) and all(isinstance(t, str) for t in edges.get("whole", []))
            and set(edges) <= {"start", "end", "whole"})


def splitter(kind: str, edges: dict | None = None) -> Callable[[str], list[tuple[int, int]]] | None:
    """The function that cuts plain text into a model's words; None: the tokenizer's words."""
    if kind != WHITESPACE:
        return None
    return (lambda text: whitespace_words(text, edges)) if edges else whitespace_words


def config_words(cfg: dict, path: str) -> str:
    """The "words" of a model's config; absent (a model saved before the key): TOKENIZER."""
    kind = cfg.get("words")
    if kind is None:
        return TOKENIZER
    if kind not in KINDS:
        raise ModelDirError(f"{path}: unknown words {str(kind)[:50]!r}; this spanflow knows {', '.join(KINDS)} "
                            "(a newer spanflow may have written it: upgrade to load this model)")
    return kind
