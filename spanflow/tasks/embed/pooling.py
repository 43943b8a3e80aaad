"""Sentence pooling head: mean / cls / max / last-token over token states, optional L2 norm."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

POOLING_MODES = ("mean", "cls", "max", "lasttoken")


class Pooling(nn.Module):
    """Reads features["token_embeddings"] (B, T, H) and features["attention_mask"] (B, T)."""

    def __init__(self, *, mode: str = "mean", normalize: bool = False):
        super().__init__()
        if mode not in POOLING_MODES:
            raise ValueError(f"unknown pooling mode {mode!r}; expected one of {', '.join(POOLING_MODES)}")
        self.mode, self.normalize = mode, normalize

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        x = features["token_embeddings"].float()  # (B, T, H); pooled in fp32 whatever the autocast
        m = features["attention_mask"].to(x.dtype).unsqueeze(-1)  # (B, T, 1)
        if self.mode == "mean":
            out = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        elif self.mode == "cls":
            out = x[:, 0]
        elif self.mode == "max":
            out = x.masked_fill(m == 0, float("-inf")).max(1).values
        else:  # last real token of right-padded rows
            last = features["attention_mask"].sum(1).clamp(min=1) - 1  # (B,)
            out = x[torch.arange(x.shape[0], device=x.device), last]
        return F.normalize(out, dim=-1) if self.normalize else out  # (B, H)
