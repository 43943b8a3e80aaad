"""A linear-chain CRF over BIO tags: batched negative log-likelihood and Viterbi decoding,
both on the device, over the word-initial positions of each window."""
from __future__ import annotations

import torch
from torch import nn

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
    device), else the most kept positions in a row (read from `keep`: a host sync on a GPU).
    """
    counts = keep.sum(1)
    n = width if width is not None else max(1, int(counts.max()))
    index = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :n]
    gather_index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    mask = torch.arange(n, device=x.device)[None, :] < counts[:, None]
    return x.gather(1, gather_index), index, mask


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

    def nll(self, em: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood per row. em (B, N, C) float, tags (B, N), mask (B, N) left-aligned."""
        B, N, C = em.shape
        trans = self._trans()
        lengths = mask.sum(1)
        tags = torch.where(mask, tags, torch.zeros_like(tags))
        gold = self.start[tags[:, 0]] + (em.gather(2, tags.unsqueeze(-1)).squeeze(-1) * mask).sum(1)
        if N > 1:
            gold = gold + (trans[tags[:, :-1], tags[:, 1:]] * mask[:, 1:]).sum(1)
        last = tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        gold = gold + self.end[last]
        # the steps' columns taken once: a slice per step would have its gradient zero-fill
        # the whole (B, N, C) emissions at every step of the backward pass
        ems, cols = em.unbind(1), mask.unsqueeze(2).unbind(1)
        alpha = self.start + ems[0]  # (B, C)
        for t in range(1, N):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + trans, dim=1) + ems[t]
            alpha = torch.where(cols[t], nxt, alpha)
        log_z = torch.logsumexp(alpha + self.end, dim=1)
        return (log_z - gold) * (lengths > 0)

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
