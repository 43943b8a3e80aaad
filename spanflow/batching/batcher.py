"""The one token-budget batcher used by training, bulk inference and serving.

`max_tokens` bounds *padded* tokens: longest_in_batch * batch_size <= max_tokens.
"""
from __future__ import annotations

import numpy as np


def _cut(order: list[int], lengths, max_tokens: int, max_batch_size: int | None,
         min_efficiency: float = 0.0, min_tokens: int | None = None) -> list[list[int]]:
    """Greedy cut of a length-sorted index list into batches within the budget.

    With min_efficiency > 0, a batch holding at least `min_tokens` padded tokens (default a
    quarter of the budget) is also closed when the next item would drop its real/padded
    ratio below that value.
    """
    min_tokens = max_tokens // 4 if min_tokens is None else min_tokens
    batches, cur, longest, real = [], [], 0, 0
    for i in order:
        n = lengths[i]
        new_longest = max(longest, n)
        full = max_batch_size is not None and len(cur) >= max_batch_size
        loose = (min_efficiency and longest * len(cur) >= min_tokens
                 and real + n < min_efficiency * new_longest * (len(cur) + 1))
        if cur and (new_longest * (len(cur) + 1) > max_tokens or full or loose):
            batches.append(cur)
            cur, new_longest, real = [], n, 0
        cur.append(i)
        real += n
        longest = new_longest
    if cur:
        batches.append(cur)
    return batches


def token_budget_batches(lengths, max_tokens: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                         bucket_batches: int = 64, jitter: float = 2.0, world_size: int = 1,
                         max_batch_size: int | None = None, min_efficiency: float = 0.9,
                         min_tokens: int | None = None) -> list[list[int]]:
    """Cut example indices into batches of at most `max_tokens` padded tokens.

    shuffle=True (training): shuffle, split into buckets of about `bucket_batches`
    batches' worth of examples, sort each bucket by length, cut, then shuffle the batch
    order. Deterministic for (seed, epoch). The sort key is the length plus uniform noise
    in [0, jitter) tokens: without it, examples of equal length land in the same batch
    every epoch; a little noise varies them at a small cost in padding efficiency. With
    world_size > 1 batches are dealt in groups of `world_size` neighbours from the same
    sorted bucket (near-equal token counts per rank in a step), and the last group is
    padded with empty batches so every rank runs the same number of steps.
    shuffle=False (inference): one global sort, longest first, so memory peaks early;
    batches are also closed early when their padding efficiency would fall below
    `min_efficiency` (when the budget holds texts of very different lengths), once they
    hold `min_tokens` padded tokens (default: a quarter of the budget; lower it where
    compute cost follows padded tokens even in small batches, as on CPU).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return []
    if not shuffle:
        order = np.argsort(-lengths, kind="stable").tolist()
        return _cut(order, lengths, max_tokens, max_batch_size, min_efficiency, min_tokens)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    per_batch = max(1, max_tokens // max(1, int(lengths.mean())))
    bucket = max(per_batch * bucket_batches, 1)
    groups, leftovers = [], []
    for b0 in range(0, len(perm), bucket):
        chunk = perm[b0:b0 + bucket]
        key = lengths[chunk] + rng.uniform(0, jitter, size=len(chunk))
        chunk = chunk[np.argsort(key, kind="stable")].tolist()
        cut = _cut(chunk, lengths, max_tokens, max_batch_size)
        full = len(cut) - len(cut) % world_size
        groups += [cut[g:g + world_size] for g in range(0, full, world_size)]
        leftovers += cut[full:]
    # leftovers come from different buckets; sort them so each group stays balanced
    leftovers.sort(key=lambda b: max(lengths[b]) * len(b))
    for g in range(0, len(leftovers), world_size):
        grp = leftovers[g:g + world_size]
        groups.append(grp + [[] for _ in range(world_size - len(grp))])
    order = rng.permutation(len(groups))
    return [b for gi in order for b in groups[gi]]


def padding_efficiency(batches: list[list[int]], lengths) -> float:
    """Real tokens / padded tokens over the given batches (1.0 means no padding)."""
    real = sum(int(lengths[i]) for b in batches for i in b)
    padded = sum(max(int(lengths[i]) for i in b) * len(b) for b in batches if b)
    return real / padded if padded else 1.0
