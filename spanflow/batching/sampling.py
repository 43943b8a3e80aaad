"""Entity-aware sampling: draw examples holding rare types more often, then hand the
drawn indices to the one token-budget batcher (so padding stays as low as ever)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np


def rarity_weights(kinds: list[Iterable[str]], strength: float, cap: float = 8.0) -> list[float]:
    """A weight per item: (count of the most common type / count of the item's rarest type)
    ** strength, capped; items without any type weigh 1. strength 0 gives all ones."""
    sets = [set(k) for k in kinds]
    counts = Counter(k for s in sets for k in s)
    if not counts or strength <= 0:
        return [1.0] * len(sets)
    top = max(counts.values())
    return [min(cap, max((top / counts[k]) ** strength for k in s)) if s else 1.0 for s in sets]


def epoch_indices(weights: list[float], *, seed: int, epoch: int) -> list[int]:
    """Item indices for one epoch, item i drawn about n * w_i / sum(w) times.

    The epoch keeps about as many items as the data has (a fixed budget per epoch). Each
    item appears floor(e) times plus once more with probability frac(e) (e its expected
    count): far less variance than drawing with replacement, and deterministic for
    (seed, epoch) so every DDP rank and a resumed run see the same epoch.
    """
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0:
        return []
    expected = w * (len(w) / w.sum())
    rng = np.random.default_rng([seed, epoch, 7])
    reps = np.floor(expected).astype(np.int64) + (rng.random(len(w)) < expected % 1.0)
    return np.repeat(np.arange(len(w)), reps).tolist()
