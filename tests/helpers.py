"""Builders shared by tests that need a small transformer (sentence encoders, layer-wise rules)."""
from __future__ import annotations

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
