"""The one table of default token budgets (padded tokens per batch), by job and device kind.

On CPU a small encoder's throughput is flat over a wide range of budgets, and smaller batches
pad less; a GPU needs far larger batches to fill. docs/defaults.md has the measurements
behind each value.
"""
from __future__ import annotations

import torch

DEFAULT_BUDGETS = {
    "infer": {"cpu": 2048, "accelerator": 32768},  # predict, evaluate, embed
    "serve": {"cpu": 4096, "accelerator": 32768},  # the server's dynamic batches
    "train": {"cpu": 4096, "accelerator": 32768},  # the most padded tokens per training update
}


def default_budget(job: str, device: torch.device | str) -> int:
    """The default budget of `job` ("infer", "serve", "train") on `device`."""
    kind = "cpu" if torch.device(device).type == "cpu" else "accelerator"
    return DEFAULT_BUDGETS[job][kind]


def infer_tokens(device: torch.device | str) -> int:
    """Padded tokens per inference batch when the user sets none."""
    return default_budget("infer", device)


def describe_budget(job: str) -> str:
    """The default of `job` as help text: "2048 on CPU, 32768 on GPU"."""
    b = DEFAULT_BUDGETS[job]
    return f"{b['cpu']} on CPU, {b['accelerator']} on GPU"
