"""The `embed` entry of the task registry: what the CLI, the server and tune ask of embeddings."""
from __future__ import annotations

import base64

import numpy as np
import torch

from spanflow.batching.collate import pad_rows
from spanflow.errors import ConfigError
from spanflow.runtime.budget import describe_budget
from spanflow.runtime.policy import QUANTIZATIONS
from spanflow.tasks.embed.metrics import cosines
from spanflow.tasks.embed.model import MIN_MEAN_COSINE, Embedder
from spanflow.tasks.embed.request import read_options
from spanflow.tasks.registry import Workload, check_model_for
from spanflow.training.outcome import closing, say_once


TINY_ONLY = ("its encoder is spanflow's own `tiny`: spanflow's commands run it, sentence-transformers and "
             "transformers do not load it; train from a Hugging Face encoder for a model they load")


class EmbedTask:
    """Sentence embeddings from an encoder directory: the `embed` entry of the task registry.
    A directory without spanflow.json is loaded as this task."""

    name, summary, route, request_field, trains = "embed", "sentence embeddings", "/v1/embeddings", "input", True
    agreement_name, precision_gate = "mean cosine", MIN_MEAN_COSINE["bf16"]
    dev_metric = "Spearman on scored pairs, MRR@10 on pairs or triplets"  # what --patience counts evaluations without a gain in

    @property
    def train_budget_note(self) -> str:
        """What train --help says ahead of the default --max-tokens: the ranking loss sizes its update in pairs."""
        return f"the ranking loss: its --pairs-per-step update's micro-batches, at most {describe_budget('train')}; " \
               "CoSENT and AnglE: "
    bulk_command = "embed"
    data_help = "pairs, scored pairs or triplets in CSV, TSV or JSONL"
    quantizations = QUANTIZATIONS  # --quantize int8; its gate is Embedder.check_precision
    tune_modes = ("infer", "train")  # infer first: most users of an embedding model only run it

    @property
    def train_defaults(self) -> dict:
        """What --help says an unset --epochs, --lr, ... gets, by the loss (each kind of data's own
        under --loss auto)."""
        from spanflow.tasks.embed.train import DEFAULTS, RANKING_DEFAULTS

        return {"CoSENT or AnglE (scored pairs)": DEFAULTS, "ranking (pairs or triplets)": RANKING_DEFAULTS}

    @staticmethod
    def export_instead(path: str) -> str:
        """What `spanflow export` says of an embedding model: it is another library's format already,
        unless its encoder is spanflow's own `tiny`, which no other library loads."""
        from spanflow.models.tiny import is_tiny_dir

        if is_tiny_dir(path):
            return TINY_ONLY
        return ("it is a Hugging Face encoder (or sentence-transformers) directory already, which those libraries "
                "load as it is")

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return float(cosines(np.stack(ref), np.stack(got)).mean()) if ref else 1.0

    def add_train_args(self, p) -> None:
        p.add_argument("--columns", default=None,
                       help="the columns or JSONL keys of s1, s2 and score, e.g. 0,1,2 or sentence1,sentence2,score, "
                            "of --train and --dev alike [detected in each]")
        p.add_argument("--loss", default="auto", choices=("auto", "cosent", "angle", "ranking"),
                       help="auto: cosent for scored pairs, ranking (in-batch negatives) for pairs and triplets "
                            "[%(default)s]")
        p.add_argument("--symmetric", action="store_true",
                       help="ranking: each positive must also pick its anchor among the anchors")
        p.add_argument("--matryoshka-dims", default=None,
                       help="also train the embeddings cut to these sizes, e.g. 384,256,128,64 (for the "
                            "server's 'dimensions') [none]")
        p.add_argument("--pairs-per-step", type=int, default=None,
                       help="ranking: pairs per optimizer update, the pool of in-batch negatives; a gradient cache "
                            "holds memory to one micro-batch of at most --max-tokens [256, fewer for a small data "
                            "set]")

    def train_from_args(self, a, options) -> str:
        from spanflow.tasks.embed.pairs import SCORED, check_pairs, read_pairs
        from spanflow.tasks.embed.train import EmbedTraining, parse_dims, train_embedder

        check_model_for(a.model, self.name, start=True)  # before the data is read and any model loads
        config = EmbedTraining(loss=a.loss, symmetric=a.symmetric, matryoshka_dims=parse_dims(a.matryoshka_dims),
                               pairs_per_step=a.pairs_per_step)
        train = read_pairs(a.train, columns=a.columns, log_fn=say_once)  # what was read, before it trains
        check_pairs(train, a.train, 2)  # named by their files here (the API names them train and dev)
        dev = read_pairs(a.dev, columns=a.columns, log_fn=say_once) if a.dev else None
        if dev is not None:
            check_pairs(dev, a.dev, SCORED)
        model = train_embedder(train, dev, model=a.model, out_dir=a.out, options=options, config=config)
        # fit() said where the model is
        from spanflow.models.encoder import is_tiny

        layout = TINY_ONLY if is_tiny(model.module.encoder) else "a sentence-transformers directory"
        return closing(a.out, f"embeddings of {model.dim} dimensions ({layout})",
                       "spanflow embed --model {model} --input texts.txt --output vectors.npy")

    def load(self, path: str, *, device: str = "auto", precision: str = "auto",
             quantize: str | None = None) -> Embedder:
        return Embedder.load(path, precision=precision, quantize=quantize, device=device)

    def read_labelled(self, path: str, columns: str | None = None, **_) -> list:
        """Scored pairs or pairs (tasks/embed/pairs.py) for evaluate, as many as it needs (checked
        here, before a model loads, and named by the file); `columns` as training's --columns."""
        from spanflow.tasks.embed.pairs import SCORED, check_pairs, read_pairs

        pairs = read_pairs(path, columns=columns)
        check_pairs(pairs, path, SCORED)
        return pairs

    def workload(self, model: str, data: str, *, mode: str, policy, precision: str, sample: int,
                 field: str = "text", column: int | None = None, quantize: str | None = None, seed: int = 0,
                 texts: list[str] | None = None, **_):
        """Inference: quality(L) is the mean cosine to the embeddings at the model's full length.
        Training: a pairs file's items and the loss its kind trains with (training's defaults)."""
        check_model_for(model, self.name, start=mode == "train")
        if mode == "train":
            return _train_workload(model, data, policy=policy, sample=sample, seed=seed)
        import functools

        from spanflow.data.formats.sniff import refuse_labelled_input
        from spanflow.data.records import sample_texts

        if texts is None:
            refuse_labelled_input(data)  # CoNLL columns or CasRel JSON are no texts to embed, as `embed` says
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
                        functools.lru_cache(maxsize=None)(quality),
                        quality_means=f"mean cosine to the sample's embeddings at the model's max length ({limit})")

    request_options = ("encoding_format", "dimensions", "user")  # OpenAI's; any other field is refused

    def request_schema(self) -> dict:
        """The JSON schema properties of the options above (the server's /openapi.json)."""
        from spanflow.tasks.embed.request import EmbedOptions

        props = EmbedOptions.model_json_schema()["properties"]
        return {k: props[k] for k in self.request_options}

    def response_schema(self) -> dict:
        """The JSON schema of `response`: OpenAI's embeddings list."""
        row = {"anyOf": [{"type": "array", "items": {"type": "number"}},
                         {"type": "string", "description": "base64 of little-endian float32"}]}
        item = {"type": "object", "required": ["object", "index", "embedding"],
                "properties": {"object": {"const": "embedding"}, "index": {"type": "integer"}, "embedding": row}}
        usage = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                 "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}
        return {"type": "object", "required": ["object", "model", "data", "usage"],
                "properties": {"object": {"const": "list"}, "model": {"type": "string"},
                               "data": {"type": "array", "items": item}, "usage": usage}}

    def request_params(self, model: Embedder, body: dict) -> dict:
        """OpenAI's embeddings options: `encoding_format` float|base64, `dimensions` (truncate, then
        renormalise), `user` (accepted, unused); the schema is tasks/embed/request.py."""
        return read_options(body, model.dim)

    def response(self, model: Embedder, name: str, texts: list[str], results: list, tokens: int,
                 params: dict) -> dict:
        """OpenAI's embeddings response shape: float rows stay numpy until the JSON encoder;
        base64 is the little-endian float32 bytes of each row, as OpenAI's clients decode it."""
        rows = np.stack(results) if results else np.zeros((0, model.dim), dtype=np.float32)
        if params.get("dimensions") and params["dimensions"] < rows.shape[1]:  # the full width is the row as is
            rows = rows[:, :params["dimensions"]]
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        if params.get("encoding_format") == "base64":
            out = [base64.b64encode(r.astype("<f4").tobytes()).decode("ascii") for r in rows]
        else:
            out = list(rows.astype(np.float32))
        return {"object": "list", "model": name,
                "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(out)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _train_workload(model: str, data: str, *, policy, sample: int, seed: int) -> Workload:
    """Training's items at each max length and its loss on one batch (a ranking loss's negatives
    are then the batch's: tune measures speed and memory, not the update size)."""
    from spanflow.tasks.embed.cached import side_inputs
    from spanflow.tasks.embed.losses import LOSSES
    from spanflow.tasks.embed.pairs import read_pairs
    from spanflow.tasks.embed.train import EmbedTraining, PairItem, choose_loss, items_of, make_collate, \
        start_embedder
    from spanflow.training.options import TrainOptions

    pairs = read_pairs(data)[:sample]
    name = choose_loss(pairs, EmbedTraining())
    texts = [t for p in pairs for t in (p.a, p.b, p.negative) if t is not None]
    emb = start_embedder(model, texts, TrainOptions(seed=seed), policy)
    items, _ = items_of(emb, pairs, scored=name != "ranking")
    k = len(items[0].sides)

    def at_length(L: int) -> list[PairItem]:
        return [PairItem(tuple(s[:L] for s in it.sides), it.score) for it in items]

    def loss_fn(module, batch: dict) -> torch.Tensor:
        e = module(*side_inputs(batch)).float()
        return LOSSES[name](e, {**batch, "n_pairs": e.shape[0] // k})

    # the longest training input: the directory's max_seq_length when it has one, else the encoder's limit
    return Workload(emb.module, at_length, make_collate(emb.tokenizer.pad_token_id or 0), loss_fn, emb.max_length)


TASK = EmbedTask()
