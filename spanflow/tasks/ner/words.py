"""The words a model labels: its training data's tokens, reproduced on plain text.

Labels sit on the first subword of each word, so the words decide where an entity may start
and end. A model trained on data that came as tokens (CoNLL, `.spacy`) learned one label per
input token; when those tokens are the whitespace-separated pieces of each text (CoNLL tokens
joined by single spaces), plain text split at whitespace gives the model the same words, and
a URL the tokenizer would cut at its punctuation stays one word. Other models label the
tokenizer's own words (a pre-tokenizer splits punctuation off, as text with no tokens needs).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from spanflow.data.examples import NerExample
from spanflow.errors import ModelDirError

TOKENIZER, WHITESPACE = "tokenizer", "whitespace"
KINDS = (TOKENIZER, WHITESPACE)
# CoNLL joins adjacent CJK tokens without a space: a few such texts in otherwise whitespace-tokenised
# data must not send a model back to subword words; character-level data (BMES) and spaCy's tokens
# (punctuation split off, 10-20% of whitespace tokens) fall far below this share
MATCH_SHARE = 0.99

_NON_SPACE = re.compile(r"\S+")  # \S is what str.isspace() is not, as str.split() splits


def whitespace_words(text: str) -> list[tuple[int, int]]:
    """(start, end) of each whitespace-separated token of `text`."""
    return [m.span() for m in _NON_SPACE.finditer(text)]


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


def splitter(kind: str) -> Callable[[str], list[tuple[int, int]]] | None:
    """The function that cuts plain text into a model's words; None: the tokenizer's words."""
    return whitespace_words if kind == WHITESPACE else None


def config_words(cfg: dict, path: str) -> str:
    """The "words" of a model's config; absent (a model saved before the key): TOKENIZER."""
    kind = cfg.get("words")
    if kind is None:
        return TOKENIZER
    if kind not in KINDS:
        raise ModelDirError(f"{path}: unknown words {str(kind)[:50]!r}; this spanflow knows {', '.join(KINDS)} "
                            "(a newer spanflow may have written it: upgrade to load this model)")
    return kind
