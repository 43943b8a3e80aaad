"""Pad a batch of windows to its longest member; tensors built once on the host."""
from __future__ import annotations

import numpy as np
import torch

from spanflow.batching.align import IGNORE, Window


def collate(windows: list[Window], pad_id: int, pad_multiple: int = 1,
            limit: int | None = None) -> dict[str, torch.Tensor]:
    """input_ids / attention_mask (B, T) and labels (B, T) when the windows carry labels.
    T is the longest window, rounded up to `pad_multiple` (at most `limit`).

    Built in numpy: collation runs in the prefetch thread, and a parallel torch op there (a
    fill of over 32k elements) starts a second OpenMP team, which slows every op of the
    compute thread on a CPU for as long as the prefetch thread lives.
    """
    T = round_up(max(len(w) for w in windows), pad_multiple, limit)
    B = len(windows)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    has_labels = windows[0].labels is not None
    labels = np.full((B, T), IGNORE, dtype=np.int64) if has_labels else None
    for r, w in enumerate(windows):
        n = len(w)
        ids[r, :n] = w.input_ids
        mask[r, :n] = 1
        if has_labels:
            labels[r, :n] = w.labels
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if has_labels:
        out["labels"] = torch.from_numpy(labels)
    return out


def round_up(n: int, multiple: int, limit: int | None = None) -> int:
    """`n` rounded up to a multiple, never past `limit` (nor below n). A server sees every
    (batch, length) shape; each new one costs a kernel build on a CPU and a cache entry
    for the life of the process, and rounding lengths up to 8 cuts their number 8-fold."""
    if multiple <= 1:
        return n
    up = -(-n // multiple) * multiple
    return max(n, min(up, limit) if limit else up)
