"""Embedder: an encoder with pooling; load(dir), encode(texts) -> np.ndarray, the server's units."""
from __future__ import annotations

import copy
import itertools
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from spanflow.batching.align import check_window, encode_prefixes
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import SERVE_PAD_MULTIPLE, pad_rows
from spanflow.batching.prefetch import chunked, prepared
from spanflow.errors import ConfigError, as_path
from spanflow.models.encoder import encoder_max_length, keeps_rng, load_encoder
from spanflow.models.linear import Linear, full_batches
from spanflow.runtime.budget import infer_tokens
from spanflow.runtime.policy import INT8_MIN_COSINE, check_quantize, resolve_policy, twin_precision
from spanflow.runtime.precision import load_auto
from spanflow.tasks.embed.metrics import cosine_matrix, cosines, unit_rows
from spanflow.tasks.embed.pooling import Pooling
from spanflow.tasks.embed.st_dir import read_embedding_config
from spanflow.tasks.inputs import check_max_tokens, text_list, text_stream
from spanflow.tasks.registry import get as get_task
from spanflow.training.distributed import Dist, shard_gather

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("spanflow")

# the least mean cosine to fp32 a reduced precision or a quantization must reach on the calibration sample
MIN_MEAN_COSINE = {"bf16": 0.999, "fp16": 0.999, "int8": INT8_MIN_COSINE}


class _Pooled(nn.Module):
    def __init__(self, encoder: nn.Module, pooling: Pooling):
        super().__init__()
        self.encoder, self.pooling = encoder, pooling

    def forward(self, input_ids, attention_mask):
        if isinstance(input_ids, tuple):  # parts padded apart (training's pairs): their rows in order
            return torch.cat([self(i, m) for i, m in zip(input_ids, attention_mask)])
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        return self.pooling({"token_embeddings": h, "attention_mask": attention_mask})  # (B, H)


def distinct_positives(texts: list[str]) -> tuple[list[int], list[int]]:
    """The corpus rows of the distinct positive texts (first occurrences), and each pair's row in
    them: a text listed twice is one candidate, not a twin ranked ahead of its own positive."""
    rows, at, positive = [], {}, []
    for i, t in enumerate(texts):
        if t not in at:
            at[t] = len(rows)
            rows.append(i)
        positive.append(at[t])
    return rows, positive


def anchors_answers(anchors: list[str], positive: list[int]) -> tuple[list[int], list[list[int]]]:
    """The pairs of each distinct anchor text as one query (its first pair's row) with the
    rows of all its positives: an anchor's other right answers are no misses."""
    at: dict[str, int] = {}
    queries, relevant = [], []
    for i, (t, p) in enumerate(zip(anchors, positive)):
        if t not in at:
            at[t] = len(queries)
            queries.append(i)
            relevant.append([])
        if p not in relevant[at[t]]:
            relevant[at[t]].append(p)
    return queries, relevant


class Embedder:
    """A sentence embedder: encoder + pooling (+ normalisation), batched by token budget.

    Empty and whitespace-only texts are embedded as the model embeds an input of only its
    special tokens (what sentence-transformers returns too); they never fail.
    """

    def __init__(self, *, encoder: nn.Module, tokenizer, pooling: Pooling, max_length: int | None = None,
                 precision: str = "auto", quantize: str | None = None, device: str = "auto", lowercase: bool = False):
        self.tokenizer, self.quantize = tokenizer, quantize
        self.lowercase = lowercase  # sentence-transformers' do_lower_case: texts lowercased before the tokenizer
        self.limit = encoder_max_length(encoder, tokenizer)  # the longest input the encoder takes
        self.max_length = min(max_length or self.limit, self.limit)  # None: the encoder's limit
        self.policy = resolve_policy("fp32" if quantize else precision, device)
        check_quantize(quantize, precision, self.policy.device)
        self.module = _Pooled(encoder, pooling).eval().to(self.policy.device)
        self._fp32 = None  # the fp32 module, kept as calibration reference when self.module differs
        if quantize:
            self._fp32 = self.module
            self.module = _quantize_int8(self.module)
        elif self.policy.amp_dtype is not None:
            self._fp32 = self.module
            self.module = _precast_linear(self.module, self.policy.amp_dtype)
        self._backend = self._fast_backend()
        self.truncated = 0  # texts cut at max_length so far
        self.oom_budget: int | None = None  # token budget lowered after an out-of-memory error

    @property
    def dim(self) -> int:
        """The embedding's width (the encoder's hidden size)."""
        return self.module.encoder.config.hidden_size

    @property
    def precision_name(self) -> str:
        """What the embeddings are computed in: the precision, or the quantization ("int8")."""
        return self.quantize or self.policy.name

    @classmethod
    @keeps_rng
    def load(cls, path: str, *, precision: str = "auto", quantize: str | None = None,
             device: str = "auto") -> "Embedder":
        """A sentence-transformers directory (modules.json, pooling, Normalize, max_seq_length)
        or a plain Hugging Face encoder directory (mean pooling). precision "auto" (without a
        quantization) picks what `--precision auto` picks (runtime.precision.load_auto)."""
        path = as_path(path, "Embedder.load")
        if precision == "auto" and quantize is None:
            return load_auto(get_task(cls.task), path, device=device)
        cfg = read_embedding_config(path)
        encoder, tokenizer = load_encoder(cfg["encoder_dir"])
        return cls(encoder=encoder, tokenizer=tokenizer, pooling=Pooling(mode=cfg["pooling"],
                   normalize=cfg["normalize"]), max_length=cfg["max_seq_length"], precision=precision,
                   quantize=quantize, device=device, lowercase=cfg["lowercase"])

    def with_precision(self, precision: str, quantize: str | None = None) -> "Embedder":
        """This model in another precision or quantization, made from its fp32 weights in
        memory (no second read of the directory); the fp32 weights are shared, not copied."""
        twin_precision(precision)
        fp32 = self._fp32 or self.module
        return Embedder(encoder=fp32.encoder, tokenizer=self.tokenizer, pooling=fp32.pooling,
                        max_length=self.max_length, precision=precision, quantize=quantize,
                        device=str(self.policy.device), lowercase=self.lowercase)

    task = "embed"

    def set_max_length(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Truncate future inputs at `max_length` tokens (a ConfigError above the encoder's limit, as
        for NER: the model reads no further whatever is asked; texts are embedded whole: no windows,
        no stride)."""
        if stride is not None:
            raise ConfigError("--stride applies to NER; an embedding model reads each text up to --max-length")
        if max_length is not None:
            check_window(max_length, 0, self.limit)
            self.max_length = max_length
            self._backend = self._fast_backend()

    def units(self, texts: list[str]) -> tuple[list, list[int], None]:
        """(token ids, lengths, None): the server's units."""
        ids, _ = self.tokenize(texts)
        return ids, [len(x) for x in ids], None

    def run_batch(self, units: list) -> list:
        """The embedding of each of the server's units (token ids), in one batch."""
        emb = self._forward(self.module, units, list(range(len(units))), True, SERVE_PAD_MULTIPLE)
        return list(emb.cpu().numpy())  # float32 rows

    def assemble(self, texts: list[str], units: list, results: list, ctx) -> list:
        """Each text's embedding: a unit is a whole text, so its result as it is."""
        return results

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None,
                       on_batch: Callable | None = None, chunk_size: int = 8192) -> Iterator[np.ndarray]:
        """One embedding per text, in input order, `chunk_size` texts at a time."""
        for part in self._encode_stream(text_stream(texts), chunk_size, max_tokens, on_batch):
            yield from part

    @staticmethod
    def output_record(text: str, vector: np.ndarray) -> dict:
        """The JSONL record of one text: the text and its embedding (7 decimals)."""
        return {"text": text, "embedding": [round(float(x), 7) for x in vector]}

    def arrow_results(self, texts: list[str], results: list, *, dtype: str = "float32", normalize: bool = False,
                      **_) -> pa.Table:
        """The `embedding` column of a Parquet/Arrow output: fixed_size_list<float32>[dim]
        (float16 for dtype="float16"), the values of `results` cast as the .npy output casts
        them (`normalize`: made unit-length first, as `embed --normalize` makes them); null where
        the result is None."""
        import pyarrow as pa

        if dtype not in ("float32", "float16"):
            raise ConfigError(f"--dtype must be float32 or float16, got {dtype!r}")
        ok = [r is not None for r in results]
        rows = np.zeros((len(ok), self.dim), dtype=dtype)  # (n, dim)
        have = [k for k, r in enumerate(results) if r is not None]
        if have:  # one stacked copy and one cast, not one per row
            stacked = np.stack([np.asarray(results[k]) for k in have])
            rows[have] = (unit_rows(stacked) if _flag(normalize, "normalize") else stacked).astype(dtype, copy=False)
        valid = None if all(ok) else pa.array(ok).buffers()[1]  # a bitmap: 1 where the row has a vector
        vectors = pa.Array.from_buffers(pa.list_(pa.from_numpy_dtype(rows.dtype), self.dim), len(ok), [valid],
                                        children=[pa.array(rows.reshape(-1))])
        return pa.table({"embedding": vectors})

    def evaluate(self, examples: list, *, max_tokens: int | None = None, dist: Dist = Dist(),
                 check_spans: bool = True) -> dict:
        """Scored pairs (tasks.embed.pairs.Pair with a score): Spearman and Pearson of the pairs'
        cosine against the scores; pairs without scores: retrieval of each `b` among all of them,
        and for triplets also "triplet_accuracy", the share of anchors closer to their positive than
        to their negative. "f1" is the figure training keeps the best model by (Spearman, or MRR@10).
        `check_spans`: the task interface's (pairs have no spans to check)."""
        from spanflow.tasks.embed.metrics import retrieval_metrics, similarity_metrics
        from spanflow.tasks.embed.pairs import SCORED, check_pairs

        check_pairs(examples, "examples", SCORED)

        sides = 3 if examples[0].negative is not None else 2  # triplets: their negatives too

        def every_side(part: list) -> list:  # one pass over all sides: one sort, one set of batches
            texts = [e.a for e in part] + [e.b for e in part] + ([e.negative for e in part] if sides == 3 else [])
            rows = self.encode(texts, max_tokens=max_tokens)
            return list(zip(*(rows[i * len(part):(i + 1) * len(part)] for i in range(sides))))

        vectors = shard_gather(examples, every_side, dist)  # under torchrun each rank embeds its share
        a, b = np.stack([x[0] for x in vectors]), np.stack([x[1] for x in vectors])
        if all(e.score is not None for e in examples):
            m = similarity_metrics(a, b, [e.score for e in examples])
            return {"f1": m["spearman"], **m, "pairs": len(examples)}
        rows, positive = distinct_positives([e.b for e in examples])
        queries, relevant = anchors_answers([e.a for e in examples], positive)
        # a query's own text among the answers ((x, y) beside (y, x)) is no candidate, as in training's loss
        row_of = {examples[r].b: k for k, r in enumerate(rows)}
        own = [row_of.get(examples[q].a, -1) for q in queries]
        skip = [-1 if k in rel else k for k, rel in zip(own, relevant)]
        m = retrieval_metrics(a[queries], b[rows], relevant, skip)
        m["pairs"] = len(examples)
        if sides == 3:  # sentence-transformers' TripletEvaluator: each anchor closer to its positive than its negative
            m["triplet_accuracy"] = float(np.mean(cosines(a, b) > cosines(a, np.stack([x[2] for x in vectors]))))
        if len(rows) <= 10:  # every answer is among the first 10
            m["warnings"] = [f"only {len(rows)} distinct answers to rank: recall@10 is 1 whatever the model "
                             "(evaluate on more pairs)"]
        return {"f1": m["mrr@10"], **m}

    @staticmethod
    def format_metrics(m: dict) -> str:
        """The evaluate lines: correlation for scored pairs, retrieval figures for pairs."""
        keys = [k for k in ("spearman", "pearson", "mrr@10", "ndcg@10", "recall@1", "recall@10", "triplet_accuracy")
                if k in m]
        n, noun = m.get("n", 0), "triplets" if "triplet_accuracy" in m else "pairs"
        on = (f"on {n} {noun}" if "pairs" not in m or m["pairs"] == n
              else f"on {m['pairs']} {noun}: {n} distinct anchors, each with all of its answers")
        width = max(map(len, keys), default=0)
        return "\n".join(f"{k:<{width}}  {m[k]:.4f}" for k in keys) + "\n" + on

    def save(self, path: str) -> None:
        """A sentence-transformers directory with this model's encoder, pooling and max length."""
        from spanflow.tasks.embed.st_dir import write_embedding_dir

        fp32 = self._fp32 or self.module
        write_embedding_dir(path, encoder=fp32.encoder, tokenizer=self.tokenizer, pooling=fp32.pooling.mode,
                            normalize=fp32.pooling.normalize, max_length=self.max_length, lowercase=self.lowercase)

    def _fast_backend(self):
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(self.max_length)
        return backend

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids with special tokens, truncated at max_length; and how many were cut."""
        # do_lower_case: Python's lower(), as sentence-transformers lowers the text (a Greek final sigma included)
        encs = encode_cut(self._backend, texts, self.max_length, self.lowercase)
        return [e.ids for e in encs], sum(1 for e in encs if e.overflowing)

    def pretokenizer(self) -> "TokenIds":
        """This model's tokenization without its weights (picklable): a bulk job's CPU stage
        runs it apart from the model, and predict_tokens takes what it makes."""
        return TokenIds(self._backend, lowercase=self.lowercase)

    def predict_tokens(self, columns: dict, *, max_tokens: int | None = None,
                       on_batch: Callable | None = None) -> np.ndarray:
        """(n, dim) embeddings of the rows of `columns` (Arrow columns as pretokenizer made them),
        in order: what predict_stream gives for the texts they came from, in one chunk. The
        texts cut at max_length are added to `truncated`."""
        import pyarrow.compute as pc

        ids = columns["input_ids"]
        ids = ids.combine_chunks() if hasattr(ids, "combine_chunks") else ids
        at, values = ids.offsets.to_numpy(), ids.values.to_numpy()  # a slice's offsets index its whole values
        rows = [values[at[k]:at[k + 1]] for k in range(len(ids))]  # views, no copy
        if "truncated" in columns:
            self.truncated += pc.sum(columns["truncated"]).as_py() or 0
        return self._embed_ids(rows, max_tokens or infer_tokens(self.policy.device), on_batch=on_batch)

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
        with full_batches(budget, self.max_length):  # the short batches: few distinct products (models/linear.py)
            k = 0
            while k < len(batches):
                batch = batches[k]
                try:
                    emb = self._forward(model or self.module, ids, batch, autocast)
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

    def encode_stream(self, texts: Iterable[str], *, chunk_size: int = 8192, max_tokens: int | None = None,
                      on_batch: Callable | None = None, normalize: bool = False) -> Iterator[np.ndarray]:
        """One (n, dim) float32 array per `chunk_size` texts, in input order; the next chunk is
        tokenized in a background thread while this one computes. `normalize`: unit-length rows
        (for inner-product search) whatever the model's own Normalize module says."""
        parts = self._encode_stream(text_stream(texts, "encode_stream"), chunk_size, max_tokens, on_batch)
        return (unit_rows(p) for p in parts) if _flag(normalize, "normalize") else parts

    def _encode_stream(self, texts: Iterable[str], chunk_size: int, max_tokens: int | None,
                       on_batch: Callable | None) -> Iterator[np.ndarray]:
        max_tokens = check_max_tokens(max_tokens) or infer_tokens(self.policy.device)

        for ids, n_cut in prepared(chunked(texts, chunk_size), self.tokenize):
            self.truncated += n_cut
            yield self._embed_ids(ids, max_tokens, on_batch=on_batch)

    def encode(self, texts: list[str] | str, *, max_tokens: int | None = None, normalize: bool = False) -> np.ndarray:
        """(len(texts), dim) float32 embeddings in input order; one string: its (dim,) embedding.
        `normalize`: unit-length rows, as sentence-transformers' `normalize_embeddings`."""
        texts, one = text_list(texts, "encode")
        parts = list(self._encode_stream(texts, 8192, max_tokens, None))
        out = np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)
        out = unit_rows(out) if _flag(normalize, "normalize") else out
        return out[0] if one else out

    @staticmethod
    def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Cosine similarity of every row of `a` with every row of `b`: an (len(a), len(b)) float32
        matrix (one vector on either side: a vector of its similarities); a ConfigError for arrays
        that are not vectors or rows of one width."""
        try:
            return cosine_matrix(a, b)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"similarity: {e}") from None

    def calibrate(self, texts: list[str], *, max_tokens: int | None = None, what: str = "calibrate") -> dict | None:
        """Cosine of this precision's embeddings to fp32 on `texts`; None when already fp32, and
        for no texts (nothing is measured: an empty input's job has nothing to check). `what`: the
        call a text that is not one is told of."""
        texts = text_list(texts, what)[0]  # checked as every text entry point checks them
        if self.precision_name == "fp32" or not texts:
            return None
        max_tokens = max_tokens or infer_tokens(self.policy.device)
        ids, _ = self.tokenize(texts)
        ref_model = self._fp32 or self.module
        ref = self._embed_ids(ids, max_tokens, model=ref_model, autocast=False)
        got = self._embed_ids(ids, max_tokens)
        cos = cosines(ref, got)
        return {"precision": self.precision_name, "n": len(texts), "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()), "threshold": MIN_MEAN_COSINE[self.precision_name]}

    def check_precision(self, texts: list[str], *, force: bool = False) -> dict | None:
        """Calibrate and refuse (ConfigError) a reduced precision whose mean cosine to fp32 is
        below its threshold, unless `force`; the calibration, or None where there was nothing to
        measure (fp32, or no texts)."""
        cal = self.calibrate(texts, what="check_precision")
        if cal and not cal["mean_cosine"] >= cal["threshold"] and not force:  # a nan mean fails too
            raise ConfigError(f"{cal['precision']} embeddings reach a mean cosine of {cal['mean_cosine']:.5f} "
                              f"to fp32 on {cal['n']} calibration texts, below {cal['threshold']}; "
                              "use a higher precision, or --force to accept (Python: force=True)")
        return cal


def _flag(value, name: str) -> bool:
    """`value` where it is a bool; a ConfigError otherwise (normalize="no" would have normalised)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} takes True or False, got {value!r:.40}")
    return bool(value)


def _quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantization of the Linear layers (weights int8, activations quantized per batch)."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:
        raise ConfigError("int8 needs torch.ao.quantization, which this torch build lacks") from None
    if not any(isinstance(m, nn.Linear) for m in model.encoder.modules()):  # the tiny encoder: a recurrence
        raise ConfigError(f"--quantize int8 quantizes an encoder's linear layers, and this model's encoder "
                          f"({type(model.encoder).__name__}) has none: it would run unchanged; leave --quantize out")
    out = _copy_linear(model)
    for m in out.modules():
        if type(m) is Linear:  # the quantizer matches the exact class
            m.__class__ = nn.Linear
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice is for torch developers, not users
        return quantize_dynamic(out, {nn.Linear}, dtype=torch.qint8, inplace=True)  # `out` is a copy already


def _precast_linear(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy whose Linear weights are stored in the autocast dtype. Autocast would cast the
    same fp32 weights to the same values on every forward; done once, the outputs are
    bit-identical and small batches, where those casts weigh most, run faster. LayerNorm and
    embeddings stay fp32, as autocast keeps them."""
    out = _copy_linear(model)
    for m in out.modules():
        if isinstance(m, nn.Linear):
            m.to(dtype)
    return out


def _copy_linear(model: nn.Module) -> nn.Module:
    """A copy of `model` whose Linear layers are its own, to be cast or quantized; every other
    weight (embedding tables, LayerNorm) is the fp32 model's own tensor, shared, not copied."""
    linear = {id(p) for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    shared = {id(p): p for p in model.parameters() if id(p) not in linear}  # deepcopy's memo reuses them
    return copy.deepcopy(model, shared)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def encode_cut(backend, texts: list[str], max_length: int, lowercase: bool = False) -> list:
    """backend.encode_batch (its truncation at `max_length`) of each text read only so far as its
    first `max_length` tokens need (batching.align.encode_prefixes). `lowercase`: Python's lower()
    first."""
    return encode_prefixes(texts, max_length,
                           lambda ts: backend.encode_batch([t.lower() for t in ts] if lowercase else ts),
                           lambda e: bool(e.overflowing))


class TokenIds:
    """texts -> {"input_ids": list<int32> token ids with special tokens, cut at the model's max
    length; "truncated": bool, whether a text was cut}, as Arrow arrays."""

    def __init__(self, backend, lowercase: bool = False):
        self.backend = backend  # a tokenizers.Tokenizer with the model's truncation; pickles as its JSON
        self.lowercase = lowercase  # the model's do_lower_case, as Embedder.tokenize applies it

    def __call__(self, texts: list[str]) -> dict:
        import pyarrow as pa

        encs = encode_cut(self.backend, texts, self.backend.truncation["max_length"], self.lowercase)
        ids = [e.ids for e in encs]
        at = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, ids), dtype=np.int32, count=len(ids)), out=at[1:])
        values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(at[-1]))
        return {"input_ids": pa.ListArray.from_arrays(pa.array(at), pa.array(values)),
                "truncated": pa.array([bool(e.overflowing) for e in encs], pa.bool_())}
