"""A BERT encoder in plain PyTorch, for inference and training on Hugging Face BERT directories.

Loading an encoder through transformers imports its whole modelling stack (torch.distributed
tensors, dynamo, the loss zoo) before the first text is read; for a short job that import is
most of the run. BERT is a few matrix products, so the encoders spanflow reads most (BERT,
MiniLM and the sentence-transformers built on them) run from this module: the same weights,
the same names, the same outputs within float rounding (tests/test_bert_native.py).
Anything it does not cover exactly is left to transformers (`supports`).
"""
from __future__ import annotations

import math
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from spanflow.models.dropout import Dropout, dropout
from spanflow.models.linear import Linear, low_precision, rounded_rows, tracing
from spanflow.models.files import WEIGHTS, Config, json_object, write_encoder


def supports(cfg: dict) -> bool:
    """Whether this module reproduces the encoder that config.json describes."""
    return (cfg.get("model_type") == "bert" and cfg.get("hidden_act", "gelu") == "gelu"
            and cfg.get("position_embedding_type", "absolute") == "absolute"
            and not cfg.get("is_decoder") and not cfg.get("add_cross_attention")
            and cfg.get("hidden_size", 0) % max(cfg.get("num_attention_heads", 1), 1) == 0)


class Embeddings(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.p = c.num_attention_heads, c.attention_probs_dropout_prob
        self.query = Linear(c.hidden_size, c.hidden_size)
        self.key = Linear(c.hidden_size, c.hidden_size)
        self.value = Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, bt: tuple[int, int]) -> torch.Tensor:
        (b, t), h = bt, x.shape[-1]
        m = b * t

        def split(y):  # the batch's rows, as (B, heads, T, head size)
            return y[:m].view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.training and x.device.type == "cpu":
            y = _train_attention(q, k, v, mask, self.p)
        elif x.device.type == "cuda":
            y = _sdpa_without_cudnn(q, k, v, mask, self.p if self.training else 0.0)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p if self.training else 0.0)
        if x.shape[0] == m:
            return y.transpose(1, 2).reshape(m, h)
        out = y.new_empty((x.shape[0], h))  # back into the rounded rows, the extra ones zero
        out[m:].zero_()
        out[:m].view(b, t, self.heads, h // self.heads).copy_(y.transpose(1, 2))
        return out


def _train_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     p: float) -> torch.Tensor:
    """Attention written out, for training on the CPU. There scaled_dot_product_attention takes
    its fused kernel only without dropout, and that kernel's backward is several times slower than
    these products; with dropout it draws its mask with torch's serial dropout (models/dropout.py)."""
    s = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    if mask is not None:  # the dtype's lowest, not -inf: a row with no key left stays finite
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    probs = torch.softmax(s, -1, dtype=torch.float32).to(v.dtype)  # in fp32 under autocast, as SDPA's
    return dropout(probs, p, True) @ v


def _sdpa_without_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                        p: float) -> torch.Tensor:
    """scaled_dot_product_attention with every backend but cuDNN's. cuDNN builds an execution
    graph for each new shape, on the host, forward and backward apart; batches sized by a token
    budget come in many shapes, so on a GPU a training step spent most of its time building them
    (bench/results/device_step_profile.md). The memory-efficient kernel takes the padding mask.
    Under torch.compile the choice is traced into the graph, where dynamo can trace it."""
    if tracing() and not _dynamo_traces_sdpa_kernel():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # no graph break per layer
    with sdpa_kernel(_NOT_CUDNN):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def _dynamo_traces_sdpa_kernel() -> bool:
    """Whether this torch's dynamo traces `sdpa_kernel` (older ones break the graph at it). Asked
    only while compiling, when dynamo is imported already: importing it costs a short job its start."""
    from torch._dynamo import variables

    return hasattr(variables, "SDPAKernelVariable")


_NOT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class DenseNorm(nn.Module):
    """dense -> dropout -> LayerNorm(+ residual): BERT's attention and layer outputs."""

    def __init__(self, c: Config, d_in: int):
        super().__init__()
        self.dense = Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c, c.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, bt: tuple[int, int]) -> torch.Tensor:
        return self.output(self.self(x, mask, bt), x)


class Intermediate(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.dense = Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c, c.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, bt: tuple[int, int]) -> torch.Tensor:
        a = self.attention(x, mask, bt)
        return self.output(self.intermediate(a), a)


class Stack(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))


class NativeBert(nn.Module):
    """BertModel without its pooler: `forward(input_ids, attention_mask).last_hidden_state`.

    It also trains (dropout as BertModel places it, gradient checkpointing on request), and
    training runs it: transformers' BertModel reads its attention mask back on the host in
    every forward (to see whether any key is padded), a device sync per micro-batch."""

    supports_gradient_checkpointing = True

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Stack(config)
        self.gradient_checkpointing = False
        # the directory's pooler, which no spanflow task runs, written back on save so that
        # transformers' BertModel loads the directory whole (it reports a missing pooler as
        # newly initialised weights)
        self.kept: dict[str, torch.Tensor] = {}
        self._ckpt_kwargs: dict = {}

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer's activations in backward instead of keeping them."""
        self.gradient_checkpointing, self._ckpt_kwargs = True, dict(gradient_checkpointing_kwargs or {})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        from torch.utils.checkpoint import checkpoint

        x = self.embeddings(input_ids)
        (b, t, h), m = x.shape, x.shape[0] * x.shape[1]
        # a boolean mask lets scaled_dot_product_attention skip padded keys
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        # the layers run on the batch's B * T token rows, one row per token; for a CPU
        # low-precision product, rounded up to one of a few row counts (models/linear.py)
        low = low_precision(x, self.encoder.layer[0].attention.self.query.weight) if self.encoder.layer else None
        rows = rounded_rows(m) if low is not None and m else m
        x = residual_stream(x, low)
        flat = x.reshape(m, h) if rows == m else F.pad(x.reshape(m, h), (0, 0, 0, rows - m))
        recompute = self.gradient_checkpointing and self.training
        for layer in self.encoder.layer:
            flat = checkpoint(layer, flat, mask, (b, t), **{"use_reentrant": False, **self._ckpt_kwargs}) \
                if recompute else layer(flat, mask, (b, t))
        return SimpleNamespace(last_hidden_state=flat[:m].view(b, t, h))

    def save_pretrained(self, path: str, **_) -> None:
        """config.json and model.safetensors, readable by transformers' BertModel as well."""
        write_encoder(path, self)


def residual_stream(x: torch.Tensor, low: torch.dtype | None) -> torch.Tensor:
    """The layers' input in the CPU products' low precision, where there is one: autocast would
    keep the residual stream in fp32 (its layer norms return fp32), and every product cast it
    again, forward and backward. In bf16 the products take it as it is and the adds and layer
    norms move half the bytes; layer norm still sums in fp32 (bench/results/step_levers_residual.md)."""
    return x if low is None else x.to(low)


BERT_DEFAULTS = {"type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
                 "attention_probs_dropout_prob": 0.1, "pad_token_id": 0, "max_position_embeddings": 512}


def load_native(path: str) -> NativeBert | None:
    """The directory's encoder as NativeBert, or None when this module does not cover it
    (another architecture, sharded weights, names it does not know)."""
    from safetensors.torch import load_file

    cfg = json_object(os.path.join(path, "config.json"))
    if cfg is None or not supports(cfg) or not os.path.exists(os.path.join(path, WEIGHTS)):
        return None
    config = Config(**{**BERT_DEFAULTS, **cfg})
    model = NativeBert(config)  # on the CPU: building on "meta" would import torch._dynamo, slower than the init
    state = load_file(os.path.join(path, WEIGHTS))
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    kept = {k: v for k, v in state.items() if k.startswith("pooler.")}
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and not k.endswith("position_ids")}
    if set(state) != set(model.state_dict()):
        return None
    model.kept = kept
    # weights load as fp32: the precision policy decides the compute precision
    model.load_state_dict({k: v.float() for k, v in state.items()}, assign=True)
    return model.eval()
