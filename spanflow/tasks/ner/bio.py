"""NER's tags on tokens: character spans -> BIO label ids on word-initial subwords, and back."""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from spanflow.batching.align import IGNORE, Encoded
from spanflow.data.examples import Span


def bio_labels(enc: Encoded, spans: list[Span], label2id: dict[str, int]) -> list[int]:
    """BIO label ids on word-initial tokens, IGNORE elsewhere; from character spans. Each span
    finds its tokens by bisection over the word-initial tokens' offsets (in text order): a long
    document's thousands of entities each scanning every token took minutes."""
    labels = [label2id["O"] if f else IGNORE for f in enc.first]
    at = [j for j, f in enumerate(enc.first) if f]
    starts, ends = [enc.offsets[j][0] for j in at], [enc.offsets[j][1] for j in at]
    ordered = all(a <= b for a, b in zip(starts, starts[1:])) and all(a <= b for a, b in zip(ends, ends[1:]))
    for s, e, lab in spans:
        # the word-initial tokens that overlap [s, e): those ending after s and starting before e
        lo, hi = (bisect_right(ends, s), bisect_left(starts, e)) if ordered else (0, len(at))
        opened = False
        for j in at[lo:hi]:
            ts, te = enc.offsets[j]
            if te <= s or ts >= e:
                continue
            labels[j] = label2id[("I-" if opened else "B-") + lab]
            opened = True
    return labels


def decode_spans(enc: Encoded, pred: list[int], id2label: list[str]) -> list[Span]:
    """Turn per-token BIO predictions (read at word-initial tokens) into character spans.

    A span runs from its B (or a stray I, read as a start) through the last subword of its
    last word, and never across a line break (an I after one starts a new span).
    Predictions at non-initial subwords are ignored.
    """
    spans: list[Span] = []
    n = len(enc.ids)
    cur = None  # [start_char, end_char, label]
    j = 0
    while j < n:
        if not enc.first[j]:
            j += 1
            continue
        k = j + 1
        while k < n and not enc.first[k]:
            k += 1  # tokens j..k-1 form one word
        tag = id2label[pred[j]]
        word_start, word_end = enc.starts[j], enc.ends[k - 1]
        if cur and enc.breaks and enc.breaks[j]:  # an entity ends at a line break
            spans.append(tuple(cur))
            cur = None
        if tag == "O":
            if cur:
                spans.append(tuple(cur))
            cur = None
        elif tag.startswith("I-") and cur and cur[2] == tag[2:]:
            cur[1] = word_end
        else:
            if cur:
                spans.append(tuple(cur))
            cur = [word_start, word_end, tag[2:]]
        j = k
    if cur:
        spans.append(tuple(cur))
    return spans
