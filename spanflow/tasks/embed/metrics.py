"""Embedding quality: correlation of cosine similarity with gold scores, and retrieval ranks."""
from __future__ import annotations

import numpy as np

QUERY_BLOCK = 1024  # queries scored at once: bounds the (queries x corpus) matrix held in memory


def _pair_arrays(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in length: {x.size} and {y.size}")
    if x.size < 2:
        raise ValueError(f"a correlation needs at least 2 values, got {x.size}")
    return x, y


def rank_average(x) -> np.ndarray:
    """1-based ranks of `x`, tied values sharing the average of the ranks they span."""
    _, inverse, counts = np.unique(np.asarray(x, dtype=np.float64), return_inverse=True,
                                        return_counts=True)
    ends = np.cumsum(counts)  # the last rank each distinct value spans
    return (ends - (counts - 1) / 2.0)[inverse.ravel()]


def pearson(x, y) -> float:
    """Pearson correlation; nan when either side is constant."""
    x, y = _pair_arrays(x, y)
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denom) if denom > 0 else float("nan")


def spearman(x, y) -> float:
    """Spearman rank correlation (Pearson of average ranks); nan when either side is constant or
    holds a NaN (which a sort would rank as the largest value: a model with NaN rows would
    still score)."""
    x, y = _pair_arrays(x, y)
    if np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    return pearson(rank_average(x), rank_average(y))


def _unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"expected a 2-d array of embeddings, got shape {m.shape}")
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


def unit_rows(m: np.ndarray) -> np.ndarray:
    """`m`'s rows scaled to unit length, in float32 (an all-zero row stays zero)."""
    return _unit(m).astype(np.float32)


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of every row of `a` with every row of `b` (a 1-d side is one row, and its axis is
    dropped from the result), in float32."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape[-1:] != b.shape[-1:]:
        raise ValueError(f"a and b differ in width: shapes {a.shape} and {b.shape}")
    m = (_unit(np.atleast_2d(a)) @ _unit(np.atleast_2d(b)).T).astype(np.float32)
    m = m[:, 0] if b.ndim == 1 else m
    return m[0] if a.ndim == 1 else m


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays."""
    a, b = _unit(a), _unit(b)
    if a.shape != b.shape:
        raise ValueError(f"a and b differ in shape: {a.shape} and {b.shape}")
    return (a * b).sum(axis=1)


def similarity_metrics(a: np.ndarray, b: np.ndarray, scores) -> dict:
    """Row-wise cosine of `a` and `b` against gold `scores`: {"spearman", "pearson", "n"}."""
    cos = cosines(a, b)
    return {"spearman": spearman(cos, scores), "pearson": pearson(cos, scores), "n": int(cos.size)}


def positive_ranks(queries: np.ndarray, corpus: np.ndarray, positive: list[int],
                   skip: list[int] | None = None) -> np.ndarray:
    """1-based rank of each query's positive among all corpus rows by cosine; a row tied with
    the positive counts as ahead of it when it comes first in the corpus (a stable sort).
    `skip[i]`: a corpus row that is no candidate for query i (-1: none)."""
    q, c = _unit(queries), _unit(corpus)
    pos = np.asarray(positive, dtype=np.int64)
    off = np.full(pos.size, -1, dtype=np.int64) if skip is None else np.asarray(skip, dtype=np.int64)
    if q.shape[0] != pos.size:
        raise ValueError(f"{q.shape[0]} queries but {pos.size} positives")
    if q.shape[1] != c.shape[1]:
        raise ValueError(f"queries have dimension {q.shape[1]}, the corpus {c.shape[1]}")
    if pos.size and (pos.min() < 0 or pos.max() >= c.shape[0]):
        raise ValueError(f"a positive index is outside the corpus of {c.shape[0]} rows")
    ranks = np.empty(pos.size, dtype=np.int64)
    cols = np.arange(c.shape[0])
    for s in range(0, pos.size, QUERY_BLOCK):
        sims = q[s:s + QUERY_BLOCK] @ c.T
        p = pos[s:s + QUERY_BLOCK]
        target = sims[np.arange(p.size), p][:, None]
        ahead = (sims > target) | ((sims == target) & (cols[None, :] < p[:, None]))
        ahead &= cols[None, :] != off[s:s + QUERY_BLOCK, None]
        ranks[s:s + QUERY_BLOCK] = 1 + ahead.sum(axis=1)
    return ranks


def retrieval_metrics(queries: np.ndarray, corpus: np.ndarray, positive: list[int] | list[list[int]],
                      skip: list[int] | None = None) -> dict:
    """Each query's relevant rows of the corpus, every corpus row a candidate but `skip[i]` (a row
    query i is not ranked against, -1: none): `positive[i]` is one row or a list of rows (an anchor
    with several right answers). {"mrr@10" (the first relevant row's), "ndcg@10", "recall@1",
    "recall@10" (the share of the query's relevant rows in its first k), "n" (queries)}, as
    information-retrieval evaluators define them."""
    relevant = [sorted({int(r) for r in p}) if isinstance(p, (list, tuple, set, frozenset, np.ndarray)) else [int(p)]
                for p in positive]
    queries = np.asarray(queries)
    if len(queries) != len(relevant):
        raise ValueError(f"{len(queries)} queries but {len(relevant)} positives")
    if not relevant:
        raise ValueError("no queries")
    if any(not r for r in relevant):
        raise ValueError("a query without a relevant row")
    n = len(relevant)
    if not (np.isfinite(queries).all() and np.isfinite(np.asarray(corpus)).all()):
        # NaN compares false with everything: every rank would be 1, a broken model scored perfect
        return {"mrr@10": float("nan"), "ndcg@10": float("nan"), "recall@1": float("nan"),
                "recall@10": float("nan"), "n": n}
    owner = np.repeat(np.arange(n), [len(r) for r in relevant])
    ranks = positive_ranks(queries[owner], corpus, [r for rows in relevant for r in rows],
                           None if skip is None else np.asarray(skip, dtype=np.int64)[owner])
    first = np.full(n, np.inf)
    np.minimum.at(first, owner, ranks)
    counts = np.array([len(r) for r in relevant], dtype=np.float64)
    gains = np.zeros(n)
    np.add.at(gains, owner, np.where(ranks <= 10, 1.0 / np.log2(ranks + 1), 0.0))
    ideal = np.array([(1.0 / np.log2(np.arange(2, min(k, 10) + 2))).sum() for k in counts.astype(int)])

    def recall(k: int) -> float:
        hits = np.zeros(n)
        np.add.at(hits, owner, (ranks <= k).astype(np.float64))
        return float((hits / counts).mean())

    return {"mrr@10": float(np.where(first <= 10, 1.0 / first, 0.0).mean()),
            "ndcg@10": float((gains / ideal).mean()), "recall@1": recall(1), "recall@10": recall(10), "n": n}
