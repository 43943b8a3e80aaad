"""CasRel head (Wei et al., ACL 2020): subject start/end taggers, then object start/end
taggers per relation, conditioned on a subject by adding its representation to every token."""
from __future__ import annotations

import torch
from torch import nn

from spanflow.models.linear import Linear


class CasRelHead(nn.Module):
    """Reads token states (B, T, H); the object stage takes any number of subjects at once."""

    def __init__(self, *, hidden_size: int, num_relations: int):
        super().__init__()
        self.num_relations = num_relations
        self.sub = Linear(hidden_size, 2)
        self.obj = Linear(hidden_size, 2 * num_relations)

    def subjects(self, h: torch.Tensor) -> torch.Tensor:
        return self.sub(h)  # (B, T, 2) start/end logits

    def objects(self, h: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Object logits (N, T, R, 2) for N subjects given by (batch row, start token, end token)."""
        hs = h[rows]  # (N, T, H): a gather, not a copy of the encoder input
        v = (h[rows, starts] + h[rows, ends]) / 2  # (N, H): mean of the subject's start and end states
        N, T, _ = hs.shape
        return self.obj(hs + v[:, None, :]).view(N, T, self.num_relations, 2)


class CasRelModel(nn.Module):
    """Encoder + CasRel head; forward gives the encoder's token states."""

    def __init__(self, encoder: nn.Module, head: CasRelHead):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)


def next_true(x: torch.Tensor) -> torch.Tensor:
    """For a bool tensor (..., T): the index of the nearest True at or after each position, T if none."""
    T = x.shape[-1]
    idx = torch.arange(T, device=x.device).expand_as(x)
    marked = torch.where(x, idx, torch.full_like(idx, T))
    return marked.flip(-1).cummin(-1).values.flip(-1)


def extract(model: CasRelModel, input_ids: torch.Tensor, content_mask: torch.Tensor, attention_mask: torch.Tensor,
            threshold: float = 0.5) -> tuple[torch.Tensor, ...]:
    """Batched cascade decoding: one encoder pass, all subjects of all rows in one object pass.

    Returns (row, subj_start, subj_end, relation, obj_start, obj_end), each (M,), token indices.
    A start is paired with the nearest end at or after it.
    """
    h = model(input_ids, attention_mask)  # (B, T, H)
    T = h.shape[1]
    keep = content_mask.bool()
    p = torch.sigmoid(model.head.subjects(h).float())  # (B, T, 2)
    starts, ends = (p[..., 0] > threshold) & keep, (p[..., 1] > threshold) & keep
    nxt = next_true(ends)  # (B, T)
    rows, s = (starts & (nxt < T)).nonzero(as_tuple=True)  # (N,)
    e = nxt[rows, s]
    if rows.numel() == 0:
        empty = rows.new_zeros(0)
        return (empty,) * 6
    q = torch.sigmoid(model.head.objects(h, rows, s, e).float())  # (N, T, R, 2)
    okeep = keep[rows][:, None, :]  # (N, 1, T)
    o_start = (q[..., 0].transpose(1, 2) > threshold) & okeep  # (N, R, T)
    o_end = (q[..., 1].transpose(1, 2) > threshold) & okeep
    onxt = next_true(o_end)  # (N, R, T)
    n, r, os_ = (o_start & (onxt < T)).nonzero(as_tuple=True)  # (M,)
    return rows[n], s[n], e[n], r, os_, onxt[n, r, os_]
