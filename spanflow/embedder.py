"""The embedding Python API: Embedder.load(dir) and encode(texts) -> np.ndarray."""
from __future__ import annotations

import base64
import copy
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.prefetch import chunked, prefetch
from spanflow.errors import ConfigError
from spanflow.batching.collate import SERVE_PAD_MULTIPLE, pad_rows
from spanflow.models.encoder import encoder_max_length, load_encoder
from spanflow.models.pooling import Pooling
from spanflow.models.st_dir import read_embedding_config
from spanflow.training.precision import default_infer_tokens, resolve_policy

log = logging.getLogger("spanflow")

EMBED_PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# the least mean cosine to fp32 a reduced precision must reach on the calibration sample
MIN_MEAN_COSINE = {"bf16": 0.999, "fp16": 0.999, "int8": 0.99}


class _Pooled(nn.Module):
    def __init__(self, encoder: nn.Module, pooling: Pooling):
        super().__init__()
        self.encoder, self.pooling = encoder, pooling

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        return self.pooling({"token_embeddings": h, "attention_mask": attention_mask})  # (B, H)


class Embedder:
    """A sentence embedder: encoder + pooling (+ normalisation), batched by token budget.

    Empty and whitespace-only texts are embedded as the model embeds an input of only its
    special tokens (what sentence-transformers returns too); they never fail.
    """

    def __init__(self, *, encoder: nn.Module, tokenizer, pooling: Pooling, max_length: int,
                 precision: str = "auto", device: str = "auto"):
        if precision not in EMBED_PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r}; expected one of {', '.join(EMBED_PRECISIONS)}")
        self.tokenizer, self.max_length, self.precision = tokenizer, max_length, precision
        self.policy = resolve_policy("fp32" if precision == "int8" else precision, device)
        if precision == "int8" and self.policy.device.type != "cpu":
            raise ConfigError("int8 dynamic quantization runs on CPU only; use --device cpu")
        self.model = _Pooled(encoder, pooling).eval().to(self.policy.device)
        self._fp32 = None  # the fp32 module, kept as calibration reference when self.model differs
        if precision == "int8":
            self._fp32 = self.model
            self.model = _quantize_int8(self.model)
        elif self.policy.amp_dtype is not None:
            self._fp32 = self.model
            self.model = _precast_linear(self.model, self.policy.amp_dtype)
        self._backend = self._fast_backend()
        self.truncated = 0  # texts cut at max_length so far
        self.oom_budget: int | None = None  # token budget lowered after an out-of-memory error

    @property
    def network(self) -> nn.Module:
        """The module whose `.encoder` reads the texts (inference.backend compiles it)."""
        return self.model

    @property
    def dim(self) -> int:
        return self.model.encoder.config.hidden_size

    @property
    def precision_name(self) -> str:
        return "int8" if self.precision == "int8" else self.policy.name

    @classmethod
    def load(cls, path: str, *, precision: str = "auto", device: str = "auto") -> "Embedder":
        """A sentence-transformers directory (modules.json, pooling, Normalize, max_seq_length)
        or a plain Hugging Face encoder directory (mean pooling)."""
        cfg = read_embedding_config(path)
        encoder, tokenizer = load_encoder(cfg["encoder_dir"])
        limit = encoder_max_length(encoder, tokenizer)
        max_length = min(cfg["max_seq_length"] or limit, limit)
        return cls(encoder=encoder, tokenizer=tokenizer, pooling=Pooling(mode=cfg["pooling"],
                   normalize=cfg["normalize"]), max_length=max_length, precision=precision, device=device)

    task = "embed"

    def set_window(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Truncate at `max_length` tokens (texts are embedded whole: no windows, no stride)."""
        if stride is not None:
            raise ConfigError("--stride applies to NER; an embedding model reads each text up to --max-length")
        if max_length is not None:
            self.set_max_length(min(max_length, encoder_max_length(self.model.encoder, self.tokenizer)))

    def units(self, texts: list[str]):
        """(token ids, lengths, None): the server's units."""
        ids, _ = self.tokenize(texts)
        return ids, [len(x) for x in ids], None

    def run_batch(self, units: list) -> list:
        emb = self._forward(self.model, units, list(range(len(units))), True, SERVE_PAD_MULTIPLE)
        return list(emb.cpu().numpy())  # float32 rows

    def assemble(self, texts: list[str], units: list, results: list, ctx) -> list:
        return results

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None,
                       on_batch: Callable | None = None) -> Iterator[np.ndarray]:
        """One embedding per text, in input order."""
        for part in self.encode_stream(texts, max_tokens=max_tokens, on_batch=on_batch):
            yield from part

    @staticmethod
    def output_record(text: str, vector) -> dict:
        return {"text": text, "embedding": [round(float(x), 7) for x in vector]}

    def evaluate(self, examples, **_) -> dict:
        raise ConfigError("an embedding model has no labelled evaluation here; use it through predict or serve")

    def set_max_length(self, n: int) -> None:
        """Truncate future inputs at `n` tokens (the encoder's limit still applies)."""
        self.max_length = n
        self._backend = self._fast_backend()

    def _fast_backend(self):
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(self.max_length)
        return backend

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids with special tokens, truncated at max_length; and how many were cut."""
        encs = self._backend.encode_batch(texts)
        return [e.ids for e in encs], sum(1 for e in encs if e.overflowing)

    def _forward(self, model: nn.Module, ids: list[list[int]], batch: list[int], autocast: bool,
                 pad_multiple: int = 1) -> torch.Tensor:
        # the pad multiple is for servers: fewer distinct shapes
        x, m = pad_rows([ids[i] for i in batch], self.tokenizer.pad_token_id or 0, pad_multiple, self.max_length)
        dev = self.policy.device
        with torch.inference_mode(), (self.policy.autocast() if autocast else _null()):
            return model(torch.from_numpy(x).to(dev, non_blocking=True),
                         torch.from_numpy(m).to(dev, non_blocking=True)).float()  # (B, H)

    def _embed_ids(self, ids: list[list[int]], max_tokens: int, model: nn.Module | None = None,
                   autocast: bool = True, on_batch: Callable | None = None) -> np.ndarray:
        """Embed token-id lists in token-budget batches (longest first).

        Out of memory on CUDA: the batch is split (the rest of the window re-cut at half
        that batch's size) and the lower budget is kept for the rest of the run.
        """
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        lengths = [len(t) for t in ids]
        budget = max(max_tokens, self.max_length)
        if self.oom_budget:
            budget = min(budget, self.oom_budget)
        batches = token_budget_batches(lengths, budget, shuffle=False)
        k = 0
        while k < len(batches):
            batch = batches[k]
            try:
                emb = self._forward(model or self.model, ids, batch, autocast)
            except torch.cuda.OutOfMemoryError:
                if len(batch) == 1:
                    raise
                padded = max(lengths[i] for i in batch) * len(batch)
                self.oom_budget = max(1, padded // 2)
                log.warning("out of memory on a batch of %d texts (%d padded tokens): splitting it; token "
                            "budget lowered to %d for the rest of the run", len(batch), padded, self.oom_budget)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                rest = [i for b in batches[k:] for i in b]
                recut = token_budget_batches([lengths[i] for i in rest], self.oom_budget, shuffle=False)
                batches = batches[:k] + [[rest[j] for j in b] for b in recut]
                continue
            out[batch] = emb.cpu().numpy()  # host sync: one per batch, the result is needed
            if on_batch:
                lens = [lengths[i] for i in batch]
                on_batch(len(batch), sum(lens), max(lens) * len(lens))
            k += 1
        return out

    def encode_stream(self, texts: Iterable[str], *, window: int = 8192, max_tokens: int | None = None,
                      on_batch: Callable | None = None) -> Iterator[np.ndarray]:
        """One (n, dim) float32 array per `window` texts, in input order; the next window is
        tokenized in a background thread while this one computes."""
        max_tokens = max_tokens or default_infer_tokens(self.policy.device)

        def prep(chunk):
            return self.tokenize(chunk)

        for ids, n_cut in prefetch(prep(c) for c in chunked(texts, window)):
            self.truncated += n_cut
            yield self._embed_ids(ids, max_tokens, on_batch=on_batch)

    def encode(self, texts: list[str], *, max_tokens: int | None = None) -> np.ndarray:
        """(len(texts), dim) float32 embeddings in input order."""
        parts = list(self.encode_stream(texts, max_tokens=max_tokens))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)

    def calibrate(self, texts: list[str], *, max_tokens: int = 4096) -> dict | None:
        """Cosine of this precision's embeddings to fp32 on `texts`; None when already fp32."""
        if self.precision_name == "fp32" or not texts:
            return None
        ids, _ = self.tokenize(texts)
        ref_model = self._fp32 or self.model
        ref = self._embed_ids(ids, max_tokens, model=ref_model, autocast=False)
        got = self._embed_ids(ids, max_tokens)
        cos = cosines(ref, got)
        return {"precision": self.precision_name, "n": len(texts), "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()), "threshold": MIN_MEAN_COSINE[self.precision_name]}

    def check_precision(self, texts: list[str], *, force: bool = False) -> dict | None:
        """Calibrate and refuse (ConfigError) a reduced precision whose mean cosine to fp32 is
        below its threshold, unless `force`."""
        cal = self.calibrate(texts)
        if cal and cal["mean_cosine"] < cal["threshold"] and not force:
            raise ConfigError(f"{cal['precision']} embeddings reach a mean cosine of {cal['mean_cosine']:.5f} "
                              f"to fp32 on {cal['n']} calibration texts, below {cal['threshold']}; "
                              "use a higher precision, or --force to accept")
        return cal


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def _quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantization of the Linear layers (weights int8, activations quantized per batch)."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:
        raise ConfigError("int8 needs torch.ao.quantization, which this torch build lacks") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice is for torch developers, not users
        return quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)


def _precast_linear(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy whose Linear weights are stored in the autocast dtype. Autocast would cast the
    same fp32 weights to the same values on every forward; done once, the outputs are
    bit-identical and small batches run faster (MiniLM bf16 on CPU: +14% texts/s at 16
    texts per batch, +5% at 256). LayerNorm and embeddings stay fp32, as autocast keeps them."""
    out = copy.deepcopy(model)
    for m in out.modules():
        if isinstance(m, nn.Linear):
            m.to(dtype)
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class EmbedTask:
    """Sentence embeddings from an encoder directory: the `embed` entry of the task registry.
    A directory without spanflow.json is loaded as this task."""

    name, summary, route, request_field, trains = "embed", "sentence embeddings", "/v1/embeddings", "input", False
    agreement_name, precision_gate = "mean cosine", MIN_MEAN_COSINE["bf16"]

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return float(cosines(np.stack(ref), np.stack(got)).mean()) if ref else 1.0

    def add_train_args(self, p) -> None:
        pass

    def train_from_args(self, a, options) -> str:
        raise ConfigError("embedding models are not trained by spanflow; serve or run an encoder directory")

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> Embedder:
        return Embedder.load(path, precision=precision, device=device)

    def read_labelled(self, path: str, **_) -> list:
        raise ConfigError("an embedding model has no labelled evaluation here")

    def workload(self, model: str, data: str, *, mode: str, policy, precision: str, sample: int,
                 field: str = "text", column: int | None = None, **_):
        """Inference only; quality(L) is the mean cosine to the embeddings at the model's full length."""
        import functools

        from spanflow.data.records import sample_texts
        from spanflow.tasks.registry import Workload

        if mode != "infer":
            raise ConfigError("embed is tuned for inference only (--mode infer)")
        texts = sample_texts(data, sample, field=field, column=column)
        if not texts:
            raise ConfigError(f"{data}: no usable records to tune on")
        emb = Embedder.load(model, precision=precision, device=str(policy.device))
        limit = emb.max_length

        def at_length(L):
            emb.set_max_length(min(L, limit))
            return emb

        @functools.lru_cache(maxsize=None)
        def ref():
            return at_length(limit).encode(texts)

        def quality(L):
            r = ref()
            return float(cosines(r, at_length(L).encode(texts)).mean())

        def collate(rows):
            x, m = pad_rows(rows, emb.tokenizer.pad_token_id or 0)
            return {"input_ids": torch.from_numpy(x), "attention_mask": torch.from_numpy(m)}

        return Workload(emb.model, lambda L: at_length(L).tokenize(texts)[0], collate, None, limit,
                        functools.lru_cache(maxsize=None)(quality))

    def request_params(self, model: Embedder, body: dict) -> dict:
        """OpenAI's embeddings options: `encoding_format` float|base64, `dimensions` (truncate, then
        renormalise), `user` (accepted, unused)."""
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ConfigError(f'"encoding_format" must be "float" or "base64", got {str(fmt)[:40]!r}')
        dims = body.get("dimensions")
        if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= model.dim):
            raise ConfigError(f'"dimensions" must be an integer from 1 to {model.dim} (the model\'s width), '
                              f"got {str(dims)[:40]}")
        return {"encoding_format": fmt, "dimensions": dims}

    def response(self, model: Embedder, name: str, texts: list[str], results: list, tokens: int,
                 params: dict) -> dict:
        """OpenAI's embeddings response shape: float rows stay numpy until the JSON encoder;
        base64 is the little-endian float32 bytes of each row, as OpenAI's clients decode it."""
        rows = np.stack(results) if results else np.zeros((0, model.dim), dtype=np.float32)
        if params.get("dimensions"):
            rows = rows[:, :params["dimensions"]]
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        if params.get("encoding_format") == "base64":
            out = [base64.b64encode(r.astype("<f4").tobytes()).decode("ascii") for r in rows]
        else:
            out = list(rows.astype(np.float32))
        return {"object": "list", "model": name,
                "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(out)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


TASK = EmbedTask()
