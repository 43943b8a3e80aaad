"""The Ray Data stages that run a task's model: tokenization (CPU tasks) and the model (actors),
and the job's tally of what the actors did.

A task model that can take its inputs tokenized offers `pretokenizer()` (a picklable callable,
texts -> named Arrow columns of token data, made without the weights) and
`predict_tokens(columns, max_tokens=, on_batch=)`, whose results stand without the texts (its
arrow_results is given empty strings); for GPU actors (job.RayJob.tokenize_apart) the
tokenizing stage then runs on CPU tasks of its own, apart from the model actors, and the texts
go no further. Any other model, and any model on CPU actors, tokenizes inside its actor,
through its predict_stream. Either way each model call takes one chunk of rows, sorts
it by length and cuts token-budget batches, as the single-process job does with that chunk,
and the results come back in the chunk's order.

An unreadable record runs through the model as the empty text, as in the single-process jobs
(so batches are the same), and output_table writes it as an error row.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spanflow.inference.heap import GrowthTrim
from spanflow.ray.source import ERROR, ID, KEEP, ROW, TEXT, TOKENS
from spanflow.runtime.threads import on_model_thread

if TYPE_CHECKING:
    import pyarrow as pa

    from spanflow.runtime.resolve import Asked


def tokenize(batch, *, pre):
    """The tokenizing stage: `batch` with the columns `pre` makes (TOKENS + name) in place of its texts."""
    for name, values in pre(batch[TEXT].fill_null("").to_pylist()).items():
        batch = batch.append_column(TOKENS + name, values)
    return batch.drop_columns([TEXT])


@dataclass(frozen=True)
class StageSpec:
    """What every model actor needs: the model, the runtime asked, the output's id/kept types."""

    task: str  # the registry name of the model's task
    model: str  # a model directory every node can read
    asked: Asked  # resolved on each actor's own device; its token budget already a number or None
    types: pa.Schema  # the output's id and kept columns
    threads: int = 1  # torch threads of the actor
    sample: list[str] = field(default_factory=list)  # input texts --precision auto checks on
    max_length: int | None = None
    stride: int | None = None
    opts: dict[str, Any] = field(default_factory=dict)  # for the task's arrow_results (dtype=...)
    tally: Any = None  # the job's Tally actor (a Ray actor handle), told each chunk's figures


class ModelStage:
    """One actor: loads the model once, then turns each chunk into output rows (output_table)."""

    def __init__(self, spec: StageSpec):
        from spanflow.errors import SpanflowError

        self.spec, self.failed, self.warned = spec, None, False
        # in a Ray worker glibc's heap keeps some of what each chunk freed, more than the same
        # calls keep in one process (docs/ray.md): an actor would grow with its input
        self.trim = GrowthTrim()
        if spec.tally is not None:  # the job's list of its actors, to end them if it fails
            import ray

            here = ray.get_runtime_context()
            ray.get(spec.tally.joined.remote(here.get_actor_id(), here.current_actor))
        try:
            on_model_thread(self._load, spec)  # loaded, checked and run on one thread: one OpenMP team
        except (SpanflowError, OSError) as e:
            # raised from a Ray actor's constructor, an error reaches the driver as text only
            # (ActorDiedError); raised from its first call, as itself (job.worker_error)
            self.failed = e

    def _load(self, spec: StageSpec) -> None:
        self.model, self.max_tokens = load_model(spec.task, spec.model, spec.asked, threads=spec.threads,
                                                 sample=spec.sample, max_length=spec.max_length, stride=spec.stride)

    def __call__(self, batch):
        if self.failed is not None:
            raise self.failed
        return on_model_thread(self._chunk, batch)

    def _chunk(self, batch):
        from spanflow.data.tables import output_table

        figures = {"rows": batch.num_rows, "errors": batch.num_rows - batch[ERROR].null_count,
                   "real_tokens": 0, "padded_tokens": 0, "truncated": 0, "max_tokens": self.max_tokens}

        def on_batch(_texts: int, real: int, padded: int) -> None:
            figures["real_tokens"] += real
            figures["padded_tokens"] += padded

        cut = getattr(self.model, "truncated", 0)
        tokens = {c[len(TOKENS):]: batch[c] for c in batch.column_names if c.startswith(TOKENS)}
        if tokens:
            texts = [""] * batch.num_rows
            results = self.model.predict_tokens(tokens, max_tokens=self.max_tokens, on_batch=on_batch)
        else:
            texts = batch[TEXT].fill_null("").to_pylist()
            results = list(self.model.predict_stream(texts, max_tokens=self.max_tokens, on_batch=on_batch))
        figures["truncated"] = getattr(self.model, "truncated", 0) - cut
        kept = {c[len(KEEP):]: batch[c] for c in batch.column_names if c.startswith(KEEP)}
        out = output_table(self.model, batch[ID], texts, results, batch[ERROR].to_pylist(), kept,
                           types=self.spec.types, **self.spec.opts)
        if self.spec.tally is not None and batch.num_rows:
            import ray

            # waited for: the figures are in before the chunk's rows go on, so the tally is whole
            # when the job ends; keyed by the chunk's first row, so a chunk run again counts once
            ray.get(self.spec.tally.add.remote(batch[ROW][0].as_py(), figures))
        said = cut_warning(out.nbytes, batch.num_rows)
        if said and not self.warned:
            self.warned = True
            print(f"warning: {said}", flush=True)
        # one record batch: Ray's Parquet write task hands a block's batches to pyarrow's
        # write_dataset on threads without keeping their order, so a table in pieces (the
        # kept columns come chunked as the input's blocks were) could be written out of order
        out = out.combine_chunks()
        self.trim()
        return out


def block_limit() -> float | None:
    """Bytes of a task's output at which Ray Data cuts it into blocks (1.5 times its target block
    size, as its output buffer does); None where it does not."""
    import ray.data

    limit = ray.data.DataContext.get_current().target_max_block_size
    return 1.5 * limit if limit else None


def cut_warning(nbytes: int, rows: int) -> str | None:
    """What to say where Ray Data would cut a chunk's output of `nbytes` into blocks, which its
    Parquet writer may write in any order (a chunk's rows keep their ids); None where it would not."""
    limit = block_limit()
    if not limit or nbytes < limit:
        return None
    return (f"a chunk of {rows} rows gives {nbytes / 2**20:.0f} MiB of output, over the {limit / 2**20:.0f} MiB "
            "Ray Data keeps in one block: it cuts it, and its Parquet writer may write the pieces of a file out "
            "of order (every row keeps its id); a smaller --chunk-size (embed) keeps the order")


def load_model(task: str, model: str, asked: Asked, *, threads: int | None, sample: list[str],
               max_length: int | None, stride: int | None):
    """(model, token budget) of an actor: the runtime resolved on its own device, checked on `sample`
    (none: built-in sentences), the windows set, `threads` torch threads (None: as they are). Run
    it on the model's thread (on_model_thread)."""
    import torch

    from spanflow.runtime.loads import Loads
    from spanflow.runtime.resolve import resolve_runtime
    from spanflow.tasks.registry import get

    if threads is not None:
        torch.set_num_threads(max(1, threads))
    t = get(task)
    loads = Loads(t, model)
    rt = resolve_runtime(t, model, asked, texts=sample, loads=loads, name=f"actor pid {os.getpid()}")
    loaded = loads.take(rt)
    loaded.set_max_length(max_length, stride)
    check = getattr(loaded, "check_precision", None)
    if asked.precision != "auto" and rt.quantize is None and callable(check):
        # a reduced precision asked by name is held to its gate on the input's sample, as
        # the single-process job holds it (auto's choice and int8 were checked just now)
        check(sample, force=asked.force)
    return loaded, rt.max_tokens


class Tally:
    """A Ray actor (no resources) holding each chunk's figures (rows, error rows, real and
    padded tokens, texts cut at the max length) and the job's model actors."""

    def __init__(self):
        self.chunks: dict[int, dict] = {}
        self.actors: dict[str, Any] = {}

    def add(self, first_row: int, figures: dict) -> None:
        self.chunks[first_row] = figures

    def joined(self, actor_id: str, actor) -> None:
        self.actors[actor_id] = actor  # a restarted actor joins again, under its same id

    def members(self) -> list:
        return list(self.actors.values())

    def total(self) -> dict:
        """The chunks' figures summed; `max_tokens` the budget the actors ran (a list where they
        resolved different ones: GPUs of different memory), None before any chunk."""
        keys = ("rows", "errors", "real_tokens", "padded_tokens", "truncated")
        budgets = sorted({c["max_tokens"] for c in self.chunks.values() if c.get("max_tokens") is not None})
        return ({k: sum(c[k] for c in self.chunks.values()) for k in keys} | {"chunks": len(self.chunks)}
                | {"max_tokens": budgets[0] if len(budgets) == 1 else budgets or None})


def measured_budget(task: str, model: str, asked: Asked, sample: list[str], measure=None) -> int | None:
    """`--max-tokens auto` settled once for a job: the runtime resolved as an actor resolves it
    (run where a model actor would run, with its resources), measuring on the driver's sample
    of the input; the token budget every actor is then given."""
    from spanflow.runtime.resolve import resolve_runtime
    from spanflow.tasks.registry import get
    from spanflow.tuning.auto import quick_profile

    # measured on the sample itself, as predict and embed measure on theirs (`data` only names it)
    rt = resolve_runtime(get(task), model, asked, texts=sample, data="the job's input", field="text",
                         measure=functools.partial(measure or quick_profile, texts=sample),
                         name="the job's token budget")
    return rt.max_tokens
