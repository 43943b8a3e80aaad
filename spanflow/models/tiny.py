"""`tiny`: a small from-scratch encoder that learns from a few thousand sentences.

Token embeddings plus hashed bigram embeddings (each token with its left and with its
right neighbour) feed a bidirectional LSTM. On small data this beats a from-scratch
transformer of the same size by a wide margin (docs/recipes.md, "tiny"): it needs no
position embeddings to learn, and the bigrams give a character-level language such as
Chinese the word-like units its tokens lack.

It is plain PyTorch, so a job on a `tiny` model starts without importing transformers. Its
directory is config.json (model type `spanflow_tiny`) and model.safetensors, saved and read
by this module (`save_pretrained`, `load_tiny`).
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from spanflow.models.dropout import Dropout
from spanflow.models.files import WEIGHTS, Config, json_object, write_encoder

MODEL_TYPE = "spanflow_tiny"
_MIX = 1_000_003  # odd multiplier that spreads (left, right) id pairs over the buckets


def tiny_config(*, vocab_size: int = 4000, embedding_size: int = 128, hidden_size: int = 256,
                num_hidden_layers: int = 1, bigram_buckets: int = 100_003, dropout: float = 0.5,
                max_position_embeddings: int = 512, pad_token_id: int = 0, **extra) -> Config:
    """The encoder's settings; `max_position_embeddings` embeds nothing, it only bounds the
    windows the batcher cuts. `extra`: other keys of a saved config.json, kept as they are."""
    return Config(**{**extra, "model_type": MODEL_TYPE, "vocab_size": vocab_size, "embedding_size": embedding_size,
                     "hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
                     "bigram_buckets": bigram_buckets, "dropout": dropout,
                     "max_position_embeddings": max_position_embeddings, "pad_token_id": pad_token_id})


class TinyModel(nn.Module):
    """Token + bigram embeddings -> BiLSTM; returns `last_hidden_state` (B, T, hidden_size)."""

    supports_gradient_checkpointing = True

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        e, h = config.embedding_size, config.hidden_size
        self.embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.bigrams = nn.Embedding(config.bigram_buckets, e) if config.bigram_buckets else None
        self.dropout = Dropout(config.dropout)
        self.lstm = nn.LSTM(e, h // 2, num_layers=config.num_hidden_layers, bidirectional=True, batch_first=True,
                            dropout=config.dropout if config.num_hidden_layers > 1 else 0.0)
        self.gradient_checkpointing = False
        nn.init.normal_(self.embeddings.weight, std=1.0)
        if self.bigrams is not None:  # bigrams start silent and grow where they help (faster, higher dev F1)
            nn.init.zeros_(self.bigrams.weight)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute the recurrence in backward instead of keeping its activations."""
        self._ckpt_kwargs = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}
        self.gradient_checkpointing = True

    def _bigram_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        left = nn.functional.pad(ids, (1, 0))[:, :-1]  # (B, T): the token before each token
        right = nn.functional.pad(ids, (0, 1))[:, 1:]  # (B, T): the token after
        n = self.config.bigram_buckets
        return (ids * _MIX + left) % n, (right * _MIX + ids + 1) % n

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_) -> SimpleNamespace:
        x = self.embeddings(input_ids)  # (B, T, E)
        if self.bigrams is not None:
            a, b = self._bigram_ids(input_ids)
            x = x + self.bigrams(a) + self.bigrams(b)
        x = self.dropout(x)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(1).cpu()  # host sync: packing (and the CPU's row reversal) reads them there
        if self.gradient_checkpointing and self.training:
            y = checkpoint(self._recur, x, lengths, **self._ckpt_kwargs)
        else:
            y = self._recur(x, lengths)
        return SimpleNamespace(last_hidden_state=self.dropout(y))  # (B, T, H)

    @staticmethod
    def matmul_precision(device_type: str, precision: str) -> str:
        """The precision most of this model's matmul work runs in under `precision`'s autocast: the
        recurrence's, fp32 on a CPU (`_recur`). An MFU is taken against that precision's peak."""
        return "fp32" if device_type == "cpu" else precision

    def _recur(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The BiLSTM over the real tokens of each row; padding stays zero. (B, T, E) -> (B, T, H)"""
        if x.device.type == "cpu":
            # the recurrence stays fp32 under autocast: in bf16 it ran faster on a CPU with native
            # bf16, but whole runs were not clearly better in time to accuracy (docs/defaults.md)
            with torch.autocast("cpu", enabled=False):
                return self._recur_padded(x.float(), lengths)
        return self._recur_packed(x, lengths)

    def _recur_packed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`_recur` as nn.LSTM runs it on packed rows (cuDNN's fused kernel on a GPU)."""
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, _ = self.lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0]

    def _recur_padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`_recur` without packing, for the CPU: each direction runs over the padded rows, the
        backward one on every row reversed within its length, so no real token sees padding
        before it. A packed LSTM's backward on the CPU slices its input once per time step, and
        each slice's gradient is a zero-filled copy of the whole input: training time grew with
        the square of the length. The same weights and the same outputs (tests/test_tiny.py)."""
        b, t = x.shape[:2]
        steps = torch.arange(t)
        real = steps < lengths[:, None]  # (B, T)
        back = torch.where(real, lengths[:, None] - 1 - steps, steps)  # each row reversed in place
        lstm, layers = self.lstm, self.lstm.num_layers
        for k in range(layers):
            h0 = x.new_zeros(1, b, lstm.hidden_size)
            ways = []
            for suffix, order in (("", None), ("_reverse", back)):
                weights = [getattr(lstm, f"{name}_l{k}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih",
                                                                              "bias_hh")]
                inp = x if order is None else x.gather(1, order[:, :, None].expand(-1, -1, x.shape[2]))
                y = torch.lstm(inp, (h0, h0), weights, True, 1, 0.0, self.training, False, True)[0]
                ways.append(y if order is None else y.gather(1, order[:, :, None].expand(-1, -1, y.shape[2])))
            x = torch.cat(ways, -1)
            if k < layers - 1 and lstm.dropout:  # as nn.LSTM: dropout between layers, not after the last
                x = nn.functional.dropout(x, lstm.dropout, self.training)
        return x * real[:, :, None]

    def save_pretrained(self, path: str, **_) -> None:
        """config.json and model.safetensors (what `load_tiny` reads)."""
        write_encoder(path, self)


def is_tiny_dir(path: str) -> bool:
    """Whether an encoder directory holds a `tiny` encoder."""
    return (json_object(os.path.join(path, "config.json")) or {}).get("model_type") == MODEL_TYPE


def load_tiny(path: str) -> TinyModel:
    """The `tiny` encoder of a directory, in fp32 (the precision policy decides the compute)."""
    from safetensors.torch import load_file

    cfg = json_object(os.path.join(path, "config.json")) or {}
    model = TinyModel(tiny_config(**{k: v for k, v in cfg.items() if k != "model_type"}))
    state = load_file(os.path.join(path, WEIGHTS))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()
