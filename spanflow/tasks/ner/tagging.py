"""Batched token tagging over any number of texts, returning character spans in input order."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from spanflow.batching.align import encode_texts, merge_windows, own_tokens, windows_for
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import collate
from spanflow.batching.prefetch import chunked, prepared
from spanflow.models.linear import full_batches
from spanflow.data.examples import Span, words_problem
from spanflow.errors import ConfigError
from spanflow.tasks.ner.bio import decode_spans
from spanflow.runtime.policy import Policy

SPECIAL_TOKENS = ("cls", "sep", "pad")  # what a window is built and padded with: its tokenizer must name them


def tag_texts(model: nn.Module, tokenizer, texts: Iterable[str], *, id2label: list[str], max_length: int,
              stride: int, max_tokens: int, policy: Policy, chunk_size: int = 8192,
              on_batch: Callable[[int, int, int], None] | None = None,
              words: Iterable | None = None, lines: bool = False,
              split: Callable[[str], list] | None = None, cut_punctuation: bool = True) -> Iterator[list[Span]]:
    """Yield each text's spans, in input order, streaming `chunk_size` texts at a time.

    `words` (parallel to `texts`; an item may be None) gives a text's own tokens as char
    offsets: spans then start and end on those tokens (see batching.align.encode_texts).
    `split` cuts a text with no given words into the model's words (tasks.ner.words.splitter);
    None: the tokenizer's words, cut also at ideographs, and at punctuation with `cut_punctuation`
    (see batching.align.encode_texts).
    `lines`: no window crosses a line break (see batching.align.windows_for).

    Within a chunk windows are sorted by length and cut into token-budget batches; the
    next chunk is tokenized in a background thread while this one computes.
    `on_batch(n_texts_done, real_tokens, padded_tokens)` lets callers drive a progress bar.
    """
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id

    def prepare(pairs: list[tuple[str, object]]):
        chunk = [t for t, _ in pairs]
        encs = encode_texts(tokenizer, chunk, text_words(pairs, split), cut_punctuation=cut_punctuation)
        wins = windows_for(encs, max_length=max_length, stride=stride, cls_id=cls_id, sep_id=sep_id, lines=lines)
        batches = token_budget_batches([len(w) for w in wins], max_tokens, shuffle=False)
        return chunk, encs, wins, batches, own_tokens(wins)

    model.eval()
    pairs = paired(texts, words)
    for chunk, encs, wins, batches, own in prepared(chunked(pairs, chunk_size), prepare):
        preds: list[list[int] | None] = [None] * len(wins)
        with full_batches(max_tokens, max_length):  # the short batches: few distinct products (models/linear.py)
            for b in batches:
                bw = [wins[i] for i in b]
                for i, p in zip(b, tag_windows(model, bw, [word_starts(encs, w) for w in bw], pad_id, policy)):
                    preds[i] = p
                if on_batch:  # real: each token of a text once (overlapping windows repeat some), as tune counts
                    lens = [len(w) for w in bw]
                    on_batch(0, sum(own[i] for i in b), max(lens) * len(lens))
        per_text: list[list[tuple[int, int, list[int]]]] = [[] for _ in chunk]
        for w, p in zip(wins, preds):
            per_text[w.example].append((w.start, w.end, p))
        for i, enc in enumerate(encs):
            merged = merge_windows(len(enc.ids), per_text[i]) if enc.ids else []
            yield decode_spans(enc, merged, id2label)
        if on_batch:
            on_batch(len(chunk), 0, 0)


_END = object()


def paired(texts: Iterable[str], words: Iterable | None) -> Iterator[tuple[str, list | None]]:
    """(text, its words) in order. `words` holds one item per text (None: the model's own words),
    each (start, end) offsets of the text's tokens, in order; each is checked against its text as
    it is read, and a `words` shorter or longer than the texts is a ConfigError."""
    if words is None:
        return ((t, None) for t in texts)
    if isinstance(words, (str, bytes, dict)) or not isinstance(words, Iterable):
        raise ConfigError("words takes one list of (start, end) offsets (or None) per text, got "
                          f"{type(words).__name__}")
    return _paired(texts, iter(words))


def _paired(texts: Iterable[str], words: Iterator) -> Iterator[tuple[str, list | None]]:
    n = 0
    for n, text in enumerate(texts, 1):
        w = next(words, _END)
        if w is _END:
            raise ConfigError(f"words ran out after {n - 1} items: one per text (None: the model's own words)")
        yield text, check_words(w, text, n - 1)
    if next(words, _END) is not _END:
        raise ConfigError(f"words has more items than the {n} texts: one per text")


def check_words(words, text: str, i: int) -> list | None:
    """`words`, the given tokens of text `i`, as a list if they are (start, end) offsets into it,
    in order (a generator of them is read once, here)."""
    if words is None:
        return None
    words = list(words) if isinstance(words, Iterable) and not isinstance(words, (str, bytes, dict)) else words
    problem = words_problem(words, text)
    if problem:
        raise ConfigError(f"text {i}: {problem}")
    return words


def text_words(pairs, split: Callable[[str], list] | None) -> list:
    """Each (text, words) pair's words: the given ones, else `split(text)` (None without a split)."""
    return [w if w is not None or split is None else split(t) for t, w in pairs]


def word_starts(encs, window) -> list[bool]:
    """Which content tokens of a window start a word (the positions labels are read at)."""
    return encs[window.example].first[window.start:window.end]


def tag_windows(model: nn.Module, windows: list, starts: list[list[bool]], pad_id: int,
                policy: Policy, pad_multiple: int = 1, limit: int | None = None) -> list[list[int]]:
    """Label ids of each window's content tokens: one forward, then the head's decoding
    (argmax, or Viterbi over word starts for a CRF head). One host sync per batch.
    `pad_multiple`/`limit`: see batching.collate.round_up."""
    t = collate(windows, pad_id, pad_multiple, limit)
    with torch.inference_mode():
        with policy.autocast():
            logits = model(t["input_ids"].to(policy.device), t["attention_mask"].to(policy.device))
        decode = getattr(getattr(model, "head", None), "decode", None)
        if decode is None:  # argmax: the word starts are only read when decoding spans
            ids = logits.argmax(-1)
        else:
            first = torch.zeros(t["input_ids"].shape, dtype=torch.bool)
            for r, f in enumerate(starts):
                if f:
                    first[r, 1:1 + len(f)] = torch.tensor(f)
            ids = decode(logits, first)
        ids = ids.cpu().tolist()
    return [row[1:len(w) - 1] for row, w in zip(ids, windows)]  # drop [CLS]/[SEP]
