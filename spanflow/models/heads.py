"""Task heads. A head reads `features["token_embeddings"]` (B, T, H) and is testable alone."""
from __future__ import annotations

import torch
from torch import nn


class TokenClassificationHead(nn.Module):
    """Dropout + linear layer from token states to per-token label logits."""

    def __init__(self, *, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(hidden_size, num_labels)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        x = features["token_embeddings"]  # (B, T, H)
        return self.proj(self.dropout(x))  # (B, T, C)


class EncoderWithHead(nn.Module):
    """An encoder and a head joined by the features dict; returns the head's output."""

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        features = {"token_embeddings": out.last_hidden_state, "attention_mask": attention_mask}
        return self.head(features)
