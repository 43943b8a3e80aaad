"""A spanflow model as a stage of a Ray Data pipeline of one's own: `Dataset.map_batches(Predictor, ...)`.

`spanflow predict/embed --ray` runs a whole job (read, chunks, model, Parquet files); this is the
model stage alone, for a pipeline that reads and writes as it pleases. Each actor loads the model
once, on one thread of its own (runtime/threads.py), and adds the task's result column(s) and
`error` to every batch, keeping the batch's own columns.
"""
from __future__ import annotations

import inspect
from typing import Any

from spanflow.errors import ConfigError, as_path
from spanflow.inference.heap import GrowthTrim
from spanflow.ray.stages import load_model
from spanflow.runtime.resolve import Asked
from spanflow.runtime.threads import on_model_thread

STRINGS = ("string", "large_string", "null")  # Arrow types a text column may have (null: all missing)


class Predictor:
    """Runs a spanflow model directory (NER, relations, or an encoder: embeddings) over the text
    `column` of each batch and returns the batch with the task's columns (`entities`, `relations`
    or `embedding`, as in predict's Parquet output) and `error` (null, or why the row's text could
    not be run: a null text) added. A batch may be a pyarrow Table, a pandas DataFrame or a dict
    of arrays; the result is a pyarrow Table. For Ray Data::

        ds.map_batches(Predictor, fn_constructor_kwargs={"model": "/models/ner", "column": "body"},
                       batch_format="pyarrow", batch_size=8192, concurrency=2, num_gpus=1)

    `device`, `precision` (auto: checked on built-in sentences on the actor's device), `max_tokens`
    (padded tokens per model batch; None: the device's default), `max_length`, `stride` and `dtype`
    (embeddings: float32 or float16) mean what predict's and embed's flags do; `threads`: torch
    threads of the actor (None: torch's default in the worker, which Ray sets to its CPUs)."""

    def __init__(self, model: str, *, column: str = "text", device: str = "auto", precision: str = "auto",
                 max_tokens: int | None = None, max_length: int | None = None, stride: int | None = None,
                 dtype: str | None = None, threads: int | None = None):
        from spanflow.tasks.registry import task_of_dir

        model = as_path(model, "Predictor")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"threads must be a whole number >= 1 or None, got {threads!r:.60}", field="threads")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise ConfigError(f"max_tokens must be a whole number of tokens or None, got {max_tokens!r:.60}",
                              field="max_tokens")
        if not isinstance(column, str) or not column:
            raise ConfigError(f"column names the batch's text column, got {column!r:.60}", field="column")
        self.column, self.trim = column, GrowthTrim()
        task = task_of_dir(model).name
        self.model, self.max_tokens = on_model_thread(
            load_model, task, model, Asked(device=device, precision=precision, max_tokens=max_tokens),
            threads=threads, sample=[], max_length=max_length, stride=stride)
        takes = inspect.signature(self.model.arrow_results).parameters
        if dtype is not None and "dtype" not in takes:
            raise ConfigError(f"dtype is for embeddings; a model of task {task!r} has no vectors to store",
                              field="dtype")
        self.opts = {} if dtype is None else {"dtype": dtype}
        self.adds = [*self.model.arrow_results([], [], **self.opts).column_names, "error"]

    def __call__(self, batch: Any):
        table = _as_table(batch)
        taken = [c for c in self.adds if c in table.column_names]
        if taken:
            raise ConfigError(f"the batch already has a column {taken[0]!r}, which this model's results take: "
                              "rename or drop it first (Dataset.rename_columns, drop_columns)")
        texts = _texts(table, self.column)
        errors = [None if t is not None else f"column {self.column!r} holds null, expected a string" for t in texts]
        results = on_model_thread(self._run, [t or "" for t in texts])  # a null runs as "": batches as predict's
        out = self.model.arrow_results([t or "" for t in texts], [None if e else r for r, e in zip(results, errors)],
                                       **self.opts)
        for name in out.column_names:
            table = table.append_column(name, out.column(name))
        self.trim()
        import pyarrow as pa

        return table.append_column("error", pa.array(errors, pa.string()))

    def _run(self, texts: list[str]) -> list:
        return list(self.model.predict_stream(texts, max_tokens=self.max_tokens))


def _as_table(batch: Any):
    """A pyarrow Table of a Ray Data batch (a Table, a pandas DataFrame or a dict of arrays)."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas, not imported for a check
        return pa.Table.from_pandas(batch, preserve_index=False)
    if isinstance(batch, dict):
        return pa.table({k: _array(v, k) for k, v in batch.items()})
    raise ConfigError(f"a batch is a pyarrow Table, a pandas DataFrame or a dict of arrays, got {type(batch).__name__}")


def _array(values: Any, name: str):
    import pyarrow as pa

    try:
        if getattr(values, "ndim", 1) > 1:  # a column of fixed-size vectors: one list a row
            return pa.array(list(values))
        return pa.array(values, from_pandas=True)
    except UnicodeEncodeError as e:  # a lone surrogate: no Arrow string holds it
        raise ConfigError(f"column {name!r} holds a string that is not valid Unicode (a lone surrogate at character "
                          f"{e.start}); Arrow strings are UTF-8") from None


def _texts(table, column: str) -> list[str | None]:
    import pyarrow as pa

    if column not in table.column_names:
        raise ConfigError(f"the batch has no column {column!r} (column= names its texts); it has "
                          f"{', '.join(map(repr, table.column_names))}", field="column")
    col = table.column(column)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if str(col.type) not in STRINGS:
        raise ConfigError(f"column {column!r} holds {col.type}, not strings", field="column")
    return col.to_pylist()
