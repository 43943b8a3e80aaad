"""A linear-chain CRF over BIO tags: batched negative log-likelihood (its gradient in closed
form) and Viterbi decoding, both on the device, over the word-initial positions of each window."""
from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable

_FORBIDDEN = -1e4


def bio_transition_mask(id2label: list[str]) -> torch.Tensor:
    """(C, C) additive mask: 0 where `from -> to` is valid BIO, a large negative elsewhere.

    I-X may only follow B-X or I-X. A window may begin inside an entity (long texts are cut
    into overlapping windows), so no start constraint is imposed.
    """
    C = len(id2label)
    mask = torch.zeros(C, C)
    for j, to in enumerate(id2label):
        if to.startswith("I-"):
            for i, frm in enumerate(id2label):
                if frm[2:] != to[2:] or frm == "O":
                    mask[i, j] = _FORBIDDEN
    return mask


def compact(x: torch.Tensor, keep: torch.Tensor, width: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move the kept positions of each row to the front, in order.

    x (B, T, ...) and keep (B, T) bool -> (x (B, N, ...), index (B, N), mask (B, N)) where
    `index` maps back to T. N is `width` when given (the caller knows it without asking the
    device; below the most kept positions in a row it drops the rest), else the most kept
    positions in a row (read from `keep`: a host sync on a GPU).
    """
    counts = keep.sum(1)
    n = width if width is not None else max(1, int(counts.max()))
    index = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :n]
    gather_index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    mask = torch.arange(n, device=x.device)[None, :] < counts[:, None]
    return x.gather(1, gather_index), index, mask


def _log_product(v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """log(exp(v) @ weights) for v (B, C), each row shifted by its max so that none overflows.

    A tag more than about 700 nats below its row's best underflows to nothing in float64."""
    m = v.amax(1, keepdim=True)
    return ((v - m).exp_() @ weights).log_().add_(m)


class LogPartition(torch.autograd.Function):
    """log Z of a linear-chain CRF per row: (em (B, N, C), trans (C, C), start (C), end (C),
    mask (B, N) left-aligned) -> (B,). An empty row's value is meaningless and gets no gradient
    (CRF.nll zeroes its loss).

    Autograd through the recursion over the words would record a dozen operators a word and
    replay them backward. Here a step is a product with exp(trans - max(trans)) (a few
    operators where logsumexp over (B, C, C) takes a dozen), nothing is recorded, and the
    backward pass is the forward-backward algorithm: a second recursion for the scores of
    what follows each word, then every gradient as marginals in a few whole-tensor
    operators. On an accelerator the host issues each of those operators.

    The recursions run in float64: a product in float32 would underflow for a tag some 90
    nats below its row's best, where logsumexp stays exact, and a GPU would take it in TF32
    (training allows it), whose rounding would add up over the words. Autocast leaves float64
    alone. The tensors are (B, C) a step, so the width costs little."""

    @staticmethod
    def forward(ctx, em, trans, start, end, mask):
        em64, trans64 = em.double(), trans.double()
        shift = trans64.amax()
        steps = (em64 + shift).unbind(1)  # the product's exp(-shift) given back with each emission
        cols, weights = mask.unsqueeze(2).unbind(1), (trans64 - shift).exp()
        alpha = start.double() + em64[:, 0]
        alphas = [alpha]
        for t in range(1, em.shape[1]):  # a masked word (past the row's end) carries the row's scores on
            alpha = torch.where(cols[t], _log_product(alpha, weights).add_(steps[t]), alpha)
            alphas.append(alpha)
        log_z = torch.logsumexp(alpha + end.double(), 1)
        ctx.save_for_backward(em, trans, end, mask, torch.stack(alphas, 1), log_z)
        return log_z.to(em.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        em, trans, end, mask, alphas, log_z = ctx.saved_tensors
        em64, trans64, end64, g = em.double(), trans.double(), end.double(), g.double() * mask.any(1)
        shift = trans64.amax()
        steps = (em64 + shift).unbind(1)
        cols, weights = mask.unsqueeze(2).unbind(1), (trans64 - shift).exp().t()
        # beta_t: the scores of every way on from each tag at word t, its own emission left
        # out: the end scores at a row's last word (carried back from past it)
        beta = end64.expand(em.shape[0], -1)
        betas = [beta]
        for t in range(em.shape[1] - 1, 0, -1):
            beta = torch.where(cols[t], _log_product(steps[t] + beta, weights), beta)
            betas.append(beta)
        betas = torch.stack(betas[::-1], 1)
        w = g.unsqueeze(1) * mask  # (B, N): the upstream gradient at each word of its row
        lz = log_z[:, None, None]
        g_em = (alphas + betas - lz).exp_().mul_(w.unsqueeze(2))  # the words' tag marginals
        g_end = (alphas[:, -1] + end64 - lz[:, 0]).exp_().mul_(g.unsqueeze(1)).sum(0)
        # consecutive words' pair marginals (B, N - 1, C, C) in log space: each word's two sides
        # moved by the larger side's max in float64, so that the float32 sum of the (C, C) terms
        # adds numbers of a few nats; a pair past a row's end is left out before exp (the
        # emission there, at a slot without a label, is unbounded)
        after = em64[:, 1:] + betas[:, 1:]
        top = after.amax(2, keepdim=True)
        before, after = (alphas[:, :-1] - lz + top).float(), (after - top).float()
        pair = before.unsqueeze(3) + trans + after.unsqueeze(2)
        pair = torch.where(mask[:, 1:, None, None], pair, -torch.inf).exp_()
        g_trans = pair.mul_(w[:, 1:, None, None].float()).sum((0, 1))
        return g_em.to(em.dtype), g_trans.to(trans.dtype), g_em[:, 0].sum(0).to(trans.dtype), g_end.to(end.dtype), None


class CRF(nn.Module):
    """Transition scores [from, to] plus start and end scores."""

    def __init__(self, num_labels: int, transition_mask: torch.Tensor | None = None):
        super().__init__()
        self.transitions = nn.Parameter(torch.zeros(num_labels, num_labels))
        self.start = nn.Parameter(torch.zeros(num_labels))
        self.end = nn.Parameter(torch.zeros(num_labels))
        mask = transition_mask if transition_mask is not None else torch.zeros(num_labels, num_labels)
        self.register_buffer("transition_mask", mask, persistent=False)

    def _trans(self) -> torch.Tensor:
        return self.transitions + self.transition_mask

    def gold_score(self, em: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The score of each row's tag path. em (B, N, C) float, tags (B, N), mask (B, N) left-aligned."""
        trans = self._trans()
        tags = torch.where(mask, tags, torch.zeros_like(tags))
        gold = self.start[tags[:, 0]] + (em.gather(2, tags.unsqueeze(-1)).squeeze(-1) * mask).sum(1)
        if em.shape[1] > 1:
            gold = gold + (trans[tags[:, :-1], tags[:, 1:]] * mask[:, 1:]).sum(1)
        last = tags.gather(1, (mask.sum(1) - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        return gold + self.end[last]

    def nll(self, em: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood per row (0 for an empty row); arguments as gold_score's."""
        log_z = LogPartition.apply(em, self._trans(), self.start, self.end, mask)
        return (log_z - self.gold_score(em, tags, mask)) * mask.any(1)

    def viterbi(self, em: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Best tag sequence per row, (B, N); positions past a row's length repeat its last tag."""
        B, N, C = em.shape
        trans = self._trans()
        score = self.start + em[:, 0]
        identity = torch.arange(C, device=em.device).expand(B, C)
        back = []
        for t in range(1, N):
            best, idx = (score.unsqueeze(2) + trans).max(dim=1)  # (B, C): best previous tag per tag
            keep = mask[:, t:t + 1]
            score = torch.where(keep, best + em[:, t], score)
            back.append(torch.where(keep, idx, identity))
        tag = (score + self.end).argmax(1)
        path = [tag]
        for idx in reversed(back):
            tag = idx.gather(1, tag.unsqueeze(1)).squeeze(1)
            path.append(tag)
        return torch.stack(path[::-1], dim=1)
