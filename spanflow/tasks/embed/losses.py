"""Training losses for sentence embeddings, each a function of the embeddings of one batch.

Every loss takes `emb` (rows: first sides, then second sides, then negatives when there are
any; see train.make_collate) and the batch, and returns the loss summed over its targets
(pairs for CoSENT/AnglE, anchors for ranking): the loop divides by the step's targets.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

COSENT_SCALE = 20.0  # CoSENT's (and AnglE's) temperature, from the papers
RANKING_SCALE = 20.0  # in-batch softmax temperature over cosines (1 / 0.05)

EmbeddingLoss = Callable[[torch.Tensor, dict], torch.Tensor]


def sides(emb: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(first, second, negatives or None) of a batch of n examples."""
    neg = emb[2 * n:3 * n] if emb.shape[0] >= 3 * n else None
    return emb[:n], emb[n:2 * n], neg


def _ranked_logsumexp(sim: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """log(1 + sum over i, j with y_i > y_j of exp(scale * (sim_j - sim_i))): every pair scored
    higher must be the more similar."""
    s = sim * scale
    diff = s[None, :] - s[:, None]  # diff[i, j] = s_j - s_i
    diff = diff.masked_fill(~(y[:, None] > y[None, :]), float("-inf"))
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), 0)


def cosent(emb: torch.Tensor, batch: dict, scale: float = COSENT_SCALE) -> torch.Tensor:
    """CoSENT (Su, 2022) on the cosines of scored pairs, times the pairs in the batch."""
    n = batch["scores"].shape[0]
    a, b, _ = sides(emb, n)
    return _ranked_logsumexp(F.cosine_similarity(a, b, dim=-1), batch["scores"], scale) * n


def angle_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """AnglE's (Li and Li, 2023) similarity: each embedding read as a complex vector (first half the
    real, second half the imaginary parts); the real and imaginary parts of sum(a * conj(b))
    summed and divided by |a| |b|, absolute value. 1 for a == b; it is not symmetric and can
    exceed 1 (up to sqrt 2), as in the paper's own formulation: only its order matters here."""
    ar, ai = a.chunk(2, dim=-1)
    br, bi = b.chunk(2, dim=-1)
    norms = (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)
    re = (ar * br + ai * bi).sum(-1) / norms
    im = (ai * br - ar * bi).sum(-1) / norms
    return (re + im).abs()


def angle(emb: torch.Tensor, batch: dict, scale: float = COSENT_SCALE) -> torch.Tensor:
    """AnglE: CoSENT's ranking of scored pairs on the cosine plus the same ranking on the angle
    similarity (the paper's cosine and angle objectives, weighted equally; its in-batch term is
    the ranking loss's job here)."""
    n = batch["scores"].shape[0]
    a, b, _ = sides(emb, n)
    y = batch["scores"]
    return (_ranked_logsumexp(F.cosine_similarity(a, b, dim=-1), y, scale)
            + _ranked_logsumexp(angle_similarity(a, b), y, scale)) * n


def ranking(emb: torch.Tensor, batch: dict, scale: float = RANKING_SCALE, symmetric: bool = False) -> torch.Tensor:
    """In-batch negatives (multiple negatives ranking): each anchor must pick its own positive
    among every positive and hard negative of the batch, summed over anchors. `symmetric` also
    makes each positive pick its anchor among the anchors, and averages the two directions."""
    n = batch["n_pairs"]
    a, p, neg = sides(emb, n)
    a, p = F.normalize(a, dim=-1), F.normalize(p, dim=-1)
    candidates = p if neg is None else torch.cat([p, F.normalize(neg, dim=-1)])
    target = torch.arange(n, device=emb.device)
    logits = a @ candidates.T * scale
    keys = batch.get("keys")
    if keys is not None:
        logits = logits.masked_fill(false_negatives(keys, n), float("-inf"))
    loss = F.cross_entropy(logits, target, reduction="sum")
    if symmetric:
        back = p @ a.T * scale
        if keys is not None:  # the anchors' side: the same rule with the sides swapped
            back = back.masked_fill(false_negatives(torch.cat([keys[n:2 * n], keys[:n]]), n), float("-inf"))
        loss = (loss + F.cross_entropy(back, target, reduction="sum")) / 2
    return loss


def false_negatives(keys: torch.Tensor, n: int) -> torch.Tensor:
    """(n, candidates) True where a candidate other than example i's positive is a right answer
    for i's anchor too: a text that is a positive of any example with i's anchor (a repeated
    pair, an anchor with several positives, a positive of several anchors), a positive
    that is the anchor's own text ((x, y) beside (y, x)), a hard negative that is a positive of
    i's anchor or the anchor itself. `keys` name each row's text, in side order. Counted as
    negatives they would teach the model to push a text away from itself."""
    ka, kp, kn = keys[:n], keys[n:2 * n], keys[2 * n:]
    # equality matrices and their products: no size known only on the device (no host sync, as
    # unique() would need), and at the batch sizes trained (a few hundred pairs) faster than
    # sorting or a lookup table
    anchor = (ka[:, None] == ka[None, :]).float()  # i's anchor is m's (i itself included)
    # positive j is a positive of some example m with i's anchor (m = i, m = j or a third one)
    same = (anchor @ (kp[:, None] == kp[None, :]).float() > 0) | (kp[None, :] == ka[:, None])
    same.fill_diagonal_(False)
    if not kn.numel():
        return same
    answers = anchor @ (kp[:, None] == kn[None, :]).float() > 0  # negative j is a positive of i's anchor
    return torch.cat([same, answers | (kn[None, :] == ka[:, None])], dim=1)


def matryoshka(loss: EmbeddingLoss, dims: list[int]) -> EmbeddingLoss:
    """`loss` averaged over the embeddings cut to each of `dims` (Kusupati et al., 2022), so a
    truncated vector (the server's `dimensions`) keeps its quality."""
    def cut(emb: torch.Tensor, batch: dict) -> torch.Tensor:
        return sum(loss(emb[:, :d], batch) for d in dims) / len(dims)
    return cut


LOSSES = {"cosent": cosent, "angle": angle, "ranking": ranking}
SCORED_LOSSES = ("cosent", "angle")
NAMES = {"cosent": "CoSENT loss", "angle": "AnglE loss", "ranking": "ranking loss with in-batch negatives"}  # the losses of scored pairs; ranking takes pairs and triplets
