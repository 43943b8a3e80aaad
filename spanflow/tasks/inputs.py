"""What the Python API's predict and encode take, checked where it enters: a wrong type is one
ConfigError naming the text at fault, never a TypeError from inside the tokenizer, and a bare
string is one text, not an iterable of characters."""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator

from spanflow.data.formats.common import SURROGATE
from spanflow.errors import ConfigError, quote


def check_text(text, i: int) -> str:
    """`text`, the `i`-th (from 0) of its input, if it is a string a tokenizer takes."""
    if not isinstance(text, str):
        raise ConfigError(f"text {i} is {type(text).__name__} {quote(text, 60)}, not a string")
    m = SURROGATE.search(text)
    if m:
        raise ConfigError(f"text {i} is not valid Unicode: a lone surrogate {m.group()!a} at character {m.start()}")
    return text


def _iterable(texts, what: str) -> Iterable:
    if texts is None or isinstance(texts, (bytes, bytearray, dict)) or not isinstance(texts, Iterable):
        raise ConfigError(f"{what} takes a list of strings, got {type(texts).__name__}")
    if isinstance(texts, (set, frozenset)):  # results come back in input order, which a set has not
        raise ConfigError(f"{what} takes a list of strings, got a {type(texts).__name__}, which has no order; pass a "
                          "list")
    return texts


def text_list(texts, what: str = "predict") -> tuple[list[str], bool]:
    """(the texts as a checked list, whether `texts` was one string: the caller then returns that
    text's result alone, as sentence-transformers' encode and transformers' pipelines do)."""
    if isinstance(texts, str):
        return [check_text(texts, 0)], True
    return [check_text(t, i) for i, t in enumerate(_iterable(texts, what))], False


def text_stream(texts, what: str = "predict_stream") -> Iterator[str]:
    """The texts of an iterable, each checked as it is read (a stream is never held whole)."""
    if isinstance(texts, str):
        raise ConfigError(f"{what} takes an iterable of texts, got one string; pass [text]")
    return (check_text(t, i) for i, t in enumerate(_iterable(texts, what)))


def check_max_tokens(max_tokens) -> int | None:
    """`max_tokens` if it is None or a positive whole number of tokens."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral)
                                   or max_tokens < 1):
        raise ConfigError(f"max_tokens must be a whole number of tokens >= 1 (or None), got {quote(max_tokens, 60)}")
    return None if max_tokens is None else int(max_tokens)  # numpy's integers: a plain int for what follows
