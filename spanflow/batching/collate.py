"""Pad a batch of windows to its longest member; tensors built once on the host."""
from __future__ import annotations

import numpy as np
import torch

from spanflow.batching.align import IGNORE, Window


# the server rounds padded lengths up to this: it meets every (batch, length) shape, and on a
# CPU each new one costs a kernel build and a cache entry kept for the life of the process
# (bench/results/load_test.md has the memory this saves)
SERVE_PAD_MULTIPLE = 8


def collate(windows: list[Window], pad_id: int, pad_multiple: int = 1,
            limit: int | None = None) -> dict[str, torch.Tensor]:
    """input_ids / attention_mask (B, T) and labels (B, T) when the windows carry labels.
    T is the longest window, rounded up to `pad_multiple` (at most `limit`)."""
    ids, mask = pad_rows([w.input_ids for w in windows], pad_id, pad_multiple, limit)
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if windows[0].labels is not None:
        labels, _ = pad_rows([w.labels for w in windows], IGNORE, pad_multiple, limit)  # same T
        out["labels"] = torch.from_numpy(labels)
    return out


def pad_rows(rows: list[list[int]], pad_id: int, pad_multiple: int = 1,
             limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) int64 rows padded with `pad_id`, and their 0/1 mask; T is the longest row
    rounded up to `pad_multiple` (at most `limit`).

    Built in numpy: collation runs in the prefetch thread, and a parallel torch op there (a
    fill of over 32k elements) starts a second OpenMP team, which slows every op of the
    compute thread on a CPU for as long as the prefetch thread lives.
    """
    T = round_up(max(len(r) for r in rows), pad_multiple, limit)
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for k, r in enumerate(rows):
        ids[k, :len(r)] = r
        mask[k, :len(r)] = 1
    return ids, mask


def round_up(n: int, multiple: int, limit: int | None = None) -> int:
    """`n` rounded up to a multiple, never past `limit` (nor below n). A server sees every
    (batch, length) shape; each new one costs a kernel build on a CPU and a cache entry
    for the life of the process, and rounding lengths up to 8 cuts their number 8-fold."""
    if multiple <= 1:
        return n
    up = -(-n // multiple) * multiple
    return max(n, min(up, limit) if limit else up)
