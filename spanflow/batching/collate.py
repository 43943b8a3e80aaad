"""Pad a batch of windows to its longest member; tensors built once on the host."""
from __future__ import annotations

import torch

from spanflow.batching.align import IGNORE, Window


def collate(windows: list[Window], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids / attention_mask (B, T) and labels (B, T) when the windows carry labels."""
    T = max(len(w) for w in windows)
    B = len(windows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    has_labels = windows[0].labels is not None
    labels = torch.full((B, T), IGNORE, dtype=torch.long) if has_labels else None
    for r, w in enumerate(windows):
        n = len(w)
        ids[r, :n] = torch.tensor(w.input_ids)
        mask[r, :n] = 1
        if has_labels:
            labels[r, :n] = torch.tensor(w.labels)
    out = {"input_ids": ids, "attention_mask": mask}
    if has_labels:
        out["labels"] = labels
    return out
