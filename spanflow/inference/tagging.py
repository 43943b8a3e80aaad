"""Batched token tagging over any number of texts, returning character spans in input order."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from spanflow.batching.align import decode_spans, encode_texts, merge_windows, windows_for
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import collate
from spanflow.batching.prefetch import chunked, prefetch
from spanflow.data.examples import Span
from spanflow.training.precision import Policy


def tag_texts(model: nn.Module, tokenizer, texts: Iterable[str], *, id2label: list[str], max_length: int,
              stride: int, max_tokens: int, policy: Policy, chunk_size: int = 8192,
              on_batch: Callable[[int, int, int], None] | None = None) -> Iterator[list[Span]]:
    """Yield each text's spans, in input order, streaming `chunk_size` texts at a time.

    Within a chunk windows are sorted by length and cut into token-budget batches; the
    next chunk is tokenized in a background thread while this one computes.
    `on_batch(n_texts_done, real_tokens, padded_tokens)` lets callers drive a progress bar.
    """
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id

    def prepare(chunk: list[str]):
        encs = encode_texts(tokenizer, chunk)
        wins = windows_for(encs, max_length=max_length, stride=stride, cls_id=cls_id, sep_id=sep_id)
        batches = token_budget_batches([len(w) for w in wins], max_tokens, shuffle=False)
        return chunk, encs, wins, batches

    head = getattr(model, "head", None)
    decode = getattr(head, "decode", None)
    model.eval()
    for chunk, encs, wins, batches in prefetch(prepare(c) for c in chunked(texts, chunk_size)):
        preds: list[list[int] | None] = [None] * len(wins)
        with torch.inference_mode():
            for b in batches:
                t = collate([wins[i] for i in b], pad_id)
                with policy.autocast():
                    logits = model(t["input_ids"].to(policy.device), t["attention_mask"].to(policy.device))
                if decode is None:
                    ids = logits.argmax(-1)
                else:
                    ids = decode(logits, _first_mask(encs, [wins[i] for i in b], logits.shape[1]).to(logits.device))
                ids = ids.cpu().tolist()  # host sync: one per batch, needed to decode
                for r, i in enumerate(b):
                    preds[i] = ids[r][1:len(wins[i]) - 1]  # drop [CLS]/[SEP]
                if on_batch:
                    lens = [len(wins[i]) for i in b]
                    on_batch(0, sum(lens), max(lens) * len(lens))
        per_text: list[list[tuple[int, int, list[int]]]] = [[] for _ in chunk]
        for w, p in zip(wins, preds):
            per_text[w.example].append((w.start, w.end, p))
        for i, enc in enumerate(encs):
            merged = merge_windows(len(enc.ids), per_text[i]) if enc.ids else []
            yield decode_spans(enc, merged, id2label)
        if on_batch:
            on_batch(len(chunk), 0, 0)


def _first_mask(encs, windows, width: int) -> torch.Tensor:
    """(B, T) bool: the word-initial tokens of each window (its special tokens excluded)."""
    first = torch.zeros((len(windows), width), dtype=torch.bool)
    for r, w in enumerate(windows):
        f = encs[w.example].first[w.start:w.end]
        if f:
            first[r, 1:1 + len(f)] = torch.tensor(f)
    return first
