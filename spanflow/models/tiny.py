"""`tiny`: a small from-scratch encoder that learns from a few thousand sentences.

Token embeddings plus hashed bigram embeddings (each token with its left and with its
right neighbour) feed a bidirectional LSTM. On small data this beats a from-scratch
transformer of the same size by a wide margin (docs/recipes.md, "tiny"): it needs no
position embeddings to learn, and the bigrams give a character-level language such as
Chinese the word-like units its tokens lack.

It is a Hugging Face `PreTrainedModel` registered under model type `spanflow_tiny`, so
model directories save and load it like any other encoder (safetensors, config.json).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

_MIX = 1_000_003  # odd multiplier that spreads (left, right) id pairs over the buckets


class TinyConfig(PretrainedConfig):
    model_type = "spanflow_tiny"

    def __init__(self, vocab_size: int = 4000, embedding_size: int = 128, hidden_size: int = 256,
                 num_hidden_layers: int = 1, bigram_buckets: int = 100_003, dropout: float = 0.5,
                 max_position_embeddings: int = 512, pad_token_id: int = 0, **kwargs):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size, self.embedding_size, self.hidden_size = vocab_size, embedding_size, hidden_size
        self.num_hidden_layers, self.bigram_buckets, self.dropout = num_hidden_layers, bigram_buckets, dropout
        # no positions are embedded; this only bounds the windows the batcher cuts
        self.max_position_embeddings = max_position_embeddings


class TinyModel(PreTrainedModel):
    """Token + bigram embeddings -> BiLSTM; returns `last_hidden_state` (B, T, hidden_size)."""

    config_class = TinyConfig
    base_model_prefix = "tiny"
    supports_gradient_checkpointing = True

    def __init__(self, config: TinyConfig):
        super().__init__(config)
        e, h = config.embedding_size, config.hidden_size
        self.embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.bigrams = nn.Embedding(config.bigram_buckets, e) if config.bigram_buckets else None
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(e, h // 2, num_layers=config.num_hidden_layers, bidirectional=True, batch_first=True,
                            dropout=config.dropout if config.num_hidden_layers > 1 else 0.0)
        self.gradient_checkpointing = False  # set by the library's checkpointing switch
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if module is self.bigrams:  # bigrams start silent and grow where they help (faster, higher dev F1)
            nn.init.zeros_(module.weight)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings

    def _bigram_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        left = nn.functional.pad(ids, (1, 0))[:, :-1]  # (B, T): the token before each token
        right = nn.functional.pad(ids, (0, 1))[:, 1:]  # (B, T): the token after
        n = self.config.bigram_buckets
        return (ids * _MIX + left) % n, (right * _MIX + ids + 1) % n

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        x = self.embeddings(input_ids)  # (B, T, E)
        if self.bigrams is not None:
            a, b = self._bigram_ids(input_ids)
            x = x + self.bigrams(a) + self.bigrams(b)
        x = self.dropout(x)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(1).cpu()  # host sync: packing needs the lengths on the host
        if self.gradient_checkpointing and self.training:
            y = self._gradient_checkpointing_func(self._recur, x, lengths)
        else:
            y = self._recur(x, lengths)
        return BaseModelOutput(last_hidden_state=self.dropout(y))  # (B, T, H)

    def _recur(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The BiLSTM over the real tokens of each row; padding stays zero. (B, T, E) -> (B, T, H)"""
        # CPU bf16 LSTM kernels are slower than fp32 and build a new primitive for every shape, so
        # on CPU the recurrence stays fp32 under autocast (the rest of the model is small)
        cpu = x.device.type == "cpu"
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            packed = nn.utils.rnn.pack_padded_sequence(x.float() if cpu else x, lengths, batch_first=True,
                                                       enforce_sorted=False)
            y, _ = self.lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0]


AutoConfig.register(TinyConfig.model_type, TinyConfig)
AutoModel.register(TinyConfig, TinyModel)
