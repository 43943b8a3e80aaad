"""Builders and stand-ins shared by tests: a small transformer, a padded batch, a gate that holds a batch in
the model thread, a count of the operators a call runs."""
from __future__ import annotations

import asyncio
import threading

import torch


def tiny_bert(texts: list[str], *, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0):
    """(a from-scratch BertModel, a WordPiece tokenizer fitted to `texts`)."""
    from transformers import BertConfig, BertModel

    from spanflow.models.encoder import train_wordpiece

    tok = train_wordpiece(texts, 600)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=hidden * 4, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                     attn_implementation="sdpa")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return BertModel(cfg, add_pooling_layer=False), tok


def padded_batch(tok, texts: list[str]) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask of `texts`, padded to the longest, from any of spanflow's
    tokenizers (`tiny`'s has no padding of its own: collation pads)."""
    rows = tok(list(texts))["input_ids"]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return {"input_ids": ids, "attention_mask": mask}


class Gate:
    """Holds a run_batch stub in the model thread until the test releases it: the test knows
    a batch is running, and what waits behind it, without timing anything."""

    def __init__(self):
        self.entered, self.released = threading.Event(), threading.Event()

    def hold(self) -> None:  # in the model thread
        self.entered.set()
        assert self.released.wait(timeout=60), "the test never released the model"

    async def running(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 60), "no batch reached the model"

    def run(self, coro):
        """run(coro), releasing the model however it ends: a failing test must not hold the one
        model thread of the process for the tests after it."""
        try:
            return asyncio.run(coro)
        finally:
            self.released.set()


def count_ops(fn, *ops) -> int:
    """How many times `fn()` runs any of the aten operators `ops` (torch.ops.aten.slice_backward.default, ...)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func in ops
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n
