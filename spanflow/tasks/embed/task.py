"""The `embed` entry of the task registry: what the CLI, the server and tune ask of embeddings."""
from __future__ import annotations

import base64

import numpy as np
import torch

from spanflow.batching.collate import pad_rows
from spanflow.errors import ConfigError
from spanflow.runtime.policy import QUANTIZATIONS
from spanflow.tasks.embed.metrics import cosines
from spanflow.tasks.embed.model import MIN_MEAN_COSINE, Embedder
from spanflow.tasks.embed.request import read_options
from spanflow.tasks.registry import Workload


class EmbedTask:
    """Sentence embeddings from an encoder directory: the `embed` entry of the task registry.
    A directory without spanflow.json is loaded as this task."""

    name, summary, route, request_field, trains = "embed", "sentence embeddings", "/v1/embeddings", "input", True
    agreement_name, precision_gate = "mean cosine", MIN_MEAN_COSINE["bf16"]
    quantizations = QUANTIZATIONS  # --quantize int8; its gate is Embedder.check_precision
    tune_modes = ("infer",)  # training is not tuned yet: its pairs are not a tune workload

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return float(cosines(np.stack(ref), np.stack(got)).mean()) if ref else 1.0

    def add_train_args(self, p) -> None:
        p.add_argument("--columns", default=None,
                       help="the columns or JSONL keys of s1, s2 and score, e.g. 0,1,2 or sentence1,sentence2,score "
                            "(detected when omitted)")

    def train_from_args(self, a, options) -> str:
        from spanflow.tasks.embed.pairs import read_pairs
        from spanflow.tasks.embed.train import train_embedder

        train = read_pairs(a.train, columns=a.columns)
        dev = read_pairs(a.dev, columns=a.columns) if a.dev else None
        model = train_embedder(train, dev, model=a.model, out_dir=a.out, options=options)
        return f"model saved to {a.out}/model (a sentence-transformers directory, {model.dim} dimensions)"

    def load(self, path: str, *, device: str = "auto", precision: str = "auto",
             quantize: str | None = None) -> Embedder:
        return Embedder.load(path, precision=precision, quantize=quantize, device=device)

    def read_labelled(self, path: str, **_) -> list:
        """Scored pairs or pairs (tasks/embed/pairs.py) for evaluate."""
        from spanflow.tasks.embed.pairs import read_pairs

        return read_pairs(path)

    def workload(self, model: str, data: str, *, mode: str, policy, precision: str, sample: int,
                 field: str = "text", column: int | None = None, quantize: str | None = None, **_):
        """Inference only; quality(L) is the mean cosine to the embeddings at the model's full length."""
        import functools

        from spanflow.data.records import sample_texts

        if mode != "infer":
            raise ConfigError("embed is tuned for inference only (--mode infer)")
        texts = sample_texts(data, sample, field=field, column=column)
        if not texts:
            raise ConfigError(f"{data}: no usable records to tune on")
        emb = Embedder.load(model, precision=precision, quantize=quantize, device=str(policy.device))
        limit = emb.max_length

        def at_length(L):
            emb.set_max_length(L)
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

        return Workload(emb.module, lambda L: at_length(L).tokenize(texts)[0], collate, None, limit,
                        functools.lru_cache(maxsize=None)(quality))

    def request_params(self, model: Embedder, body: dict) -> dict:
        """OpenAI's embeddings options: `encoding_format` float|base64, `dimensions` (truncate, then
        renormalise), `user` (accepted, unused); the schema is tasks/embed/request.py."""
        return read_options(body, model.dim)

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
