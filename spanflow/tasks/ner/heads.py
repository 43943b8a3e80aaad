"""Task heads. A head reads `features["token_embeddings"]` (B, T, H) and is testable alone.

A tagging head that decodes other than by argmax (the CRF) offers `decode(logits, first)`:
label ids (B, T) read at the word-initial positions `first` (B, T) bool, given on the host.
"""
from __future__ import annotations

import torch
from torch import nn

from spanflow.errors import ConfigError
from spanflow.models.dropout import Dropout
from spanflow.models.linear import Linear
from spanflow.tasks.ner.crf import CRF, bio_transition_mask, compact

HEAD_TYPES = ("softmax", "crf")


class TokenClassificationHead(nn.Module):
    """Dropout + linear layer from token states to per-token label logits."""

    def __init__(self, *, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.proj = Linear(hidden_size, num_labels)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        x = features["token_embeddings"]  # (B, T, H)
        return self.proj(self.dropout(x))  # (B, T, C)


class CrfTaggingHead(nn.Module):
    """Linear emissions plus a BIO-constrained CRF over the word-initial tokens."""

    def __init__(self, *, hidden_size: int, id2label: list[str], dropout: float = 0.1):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.proj = Linear(hidden_size, len(id2label))
        self.crf = CRF(len(id2label), bio_transition_mask(id2label))

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.proj(self.dropout(features["token_embeddings"]))  # emissions (B, T, C)

    def nll(self, logits: torch.Tensor, labels: torch.Tensor, ignore: int, words: int | None = None) -> torch.Tensor:
        """Summed negative log-likelihood of the labels at positions not equal to `ignore`.

        `words`: the most labelled positions in a row, where the host knows it (the collation
        counts them); else the width T, as reading it from the labels would cost a device sync.
        """
        em, index, mask = compact(logits.float(), labels != ignore, width=words or labels.shape[1])
        return self.crf.nll(em, labels.gather(1, index), mask).sum()

    def decode(self, logits: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        width = max(1, int(first.sum(1).max()))  # read on the host, before the mask moves to the device
        em, index, mask = compact(logits.float(), first.to(logits.device), width)
        tags = torch.where(mask, self.crf.viterbi(em, mask), torch.zeros_like(index))
        return torch.zeros(first.shape, dtype=torch.long, device=logits.device).scatter_(1, index, tags)


def make_tagging_head(kind: str, *, hidden_size: int, id2label: list[str]) -> nn.Module:
    """A `softmax` or `crf` token-tagging head for these labels."""
    if kind == "crf":
        return CrfTaggingHead(hidden_size=hidden_size, id2label=id2label)
    if kind == "softmax":
        return TokenClassificationHead(hidden_size=hidden_size, num_labels=len(id2label))
    raise ConfigError(f"unknown head {kind!r}; choose one of {', '.join(HEAD_TYPES)}")


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
