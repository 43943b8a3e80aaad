"""A spanflow model as a stage of a Ray Data pipeline of one's own: `Dataset.map_batches(Predictor, ...)`.

`spanflow predict/embed --ray` runs a whole job (read, chunks, model, Parquet files); this is the
model stage alone, for a pipeline that reads and writes as it pleases. Each actor loads the model
once, on one thread of its own (runtime/threads.py), and adds the task's result column(s) and
`error` to every batch, in the batch's own format, its columns untouched.
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from spanflow.errors import ConfigError, as_path


class Predictor:
    """Runs a spanflow model directory (NER, relations, or an encoder: embeddings) over the text
    `column` of each batch and returns the batch with the task's columns (`entities`, `relations`
    or `embedding`, as in predict's Parquet output) and `error` added: null, or why the row's text
    could not be run (a null, a string that is not valid UTF-8 or Unicode), its result then null.
    A batch is a pyarrow Table (or RecordBatch), a pandas DataFrame or a dict of numpy arrays (Ray
    Data's batch formats), and comes back in the same format. For Ray Data::

        ds.map_batches(Predictor, fn_constructor_kwargs={"model": "/models/ner", "column": "body"},
                       batch_format="pyarrow", batch_size=8192,
                       compute=ray.data.ActorPoolStrategy(size=2), num_gpus=1)

    `model`: a directory every node reads at that path. `device`, `precision` (auto, or one asked
    by name: checked on built-in sentences on the actor's device), `max_tokens` (padded tokens per
    model batch; None: the device's default), `max_length`, `stride`, `dtype` (embeddings: float32
    or float16) and `normalize` (embeddings: unit-length vectors) mean what predict's and embed's
    flags do; `threads`: torch threads of the actor (None: torch's default in the worker, which Ray
    sets to its CPUs)."""

    def __init__(self, model: str, *, column: str = "text", device: str = "auto", precision: str = "auto",
                 max_tokens: int | None = None, max_length: int | None = None, stride: int | None = None,
                 dtype: str | None = None, normalize: bool = False, threads: int | None = None):
        import inspect

        from spanflow.inference.heap import GrowthTrim
        from spanflow.ray.stages import load_model
        from spanflow.runtime.precision import builtin_sample
        from spanflow.runtime.resolve import Asked
        from spanflow.runtime.threads import on_model_thread
        from spanflow.tasks.registry import task_of_dir

        model = as_path(model, "Predictor")
        # checked here, named as the keywords they are, before an actor spends seconds loading the model
        for name, v, least in (("max_tokens", max_tokens, 1), ("threads", threads, 1), ("max_length", max_length, 8),
                               ("stride", stride, 0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least):
                raise ConfigError(f"{name} must be a whole number >= {least} or None, got {v!r:.60}", field=name)
        if dtype not in (None, "float32", "float16"):
            raise ConfigError(f"dtype must be 'float32' or 'float16' (embeddings) or None, got {dtype!r:.60}",
                              field="dtype")
        if not isinstance(normalize, (bool, np.bool_)):
            raise ConfigError(f"normalize must be True or False, got {normalize!r:.60}", field="normalize")
        if not isinstance(column, str) or not column:
            raise ConfigError(f"column names the batch's text column, got {column!r:.60}", field="column")
        self.column, self.trim, self.on_model_thread = column, GrowthTrim(), on_model_thread
        task = task_of_dir(model).name
        asked = Asked(device=device, precision=precision, max_tokens=None if max_tokens is None else int(max_tokens))
        self.model, self.max_tokens = on_model_thread(  # a precision asked by name: held to its gate on these
            load_model, task, model, asked, threads=None if threads is None else int(threads), sample=builtin_sample(),
            max_length=max_length, stride=stride)
        self.opts = {**({} if dtype is None else {"dtype": dtype}), **({"normalize": True} if normalize else {})}
        takes = inspect.signature(self.model.arrow_results).parameters
        extra = next((k for k in self.opts if k not in takes), None)
        if extra:
            raise ConfigError(f"{extra} is for embeddings; a model of task {task!r} has no vectors to store",
                              field=extra)
        self.adds = [*self.model.arrow_results([], [], **self.opts).column_names, "error"]

    def __call__(self, batch: Any) -> Any:
        """The batch (a pandas DataFrame or a dict of arrays, as Ray hands it) with this model's result
        columns and an `error` column added, in the batch's own kind."""
        kind = _kind(batch)
        taken = [c for c in self.adds if c in _columns(batch, kind)]
        if taken:
            raise ConfigError(f"the batch already has a column {taken[0]!r}, which this model's results take: "
                              "rename or drop it first (Dataset.rename_columns, drop_columns)")
        texts, errors = _texts(batch, kind, self.column)
        run = ["" if e else t for t, e in zip(texts, errors)]  # a row that cannot run runs as "": batches as predict's
        results = self.on_model_thread(lambda: list(self.model.predict_stream(run, max_tokens=self.max_tokens)))
        out = self.model.arrow_results(run, [None if e else r for r, e in zip(results, errors)], **self.opts)
        self.trim()
        return _joined(batch, kind, out, errors)


def _kind(batch: Any) -> str:
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return "arrow"
    if isinstance(batch, pa.RecordBatch):
        return "record_batch"
    if hasattr(batch, "to_dict") and hasattr(batch, "columns") and hasattr(batch, "index"):  # pandas, not imported
        return "pandas"
    if isinstance(batch, dict):
        return "numpy"
    raise ConfigError(f"a batch is a pyarrow Table, a pandas DataFrame or a dict of arrays, got {type(batch).__name__}")


def _columns(batch: Any, kind: str) -> list[str]:
    return list(batch.column_names if kind in ("arrow", "record_batch") else batch.columns if kind == "pandas"
                else batch.keys())


def _texts(batch: Any, kind: str, column: str) -> tuple[list[str | None], list[str | None]]:
    """(each row's text, None where it cannot run; each row's error, None where it can)."""
    if column not in _columns(batch, kind):
        raise ConfigError(f"the batch has no column {column!r} (column= names its texts); it has "
                          f"{', '.join(map(repr, _columns(batch, kind)))}", field="column")
    if kind in ("arrow", "record_batch"):
        return _arrow_texts(batch.column(column), column)
    values = batch[column]
    dtype = getattr(values, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "O") not in "OU" and not (
            dtype.kind == "f" and bool(np.isnan(np.asarray(values, dtype=float)).all())):  # all missing: error rows
        raise ConfigError(f"column {column!r} holds {dtype}, not strings", field="column")  # int64, bytes: no texts
    values = values.tolist() if hasattr(values, "tolist") else list(values)  # a dict of lists, too
    texts: list[str | None] = []
    errors: list[str | None] = []
    for v in values:
        if v is None or (isinstance(v, float) and v != v) or type(v).__name__ == "NAType":  # pandas' missing
            texts.append(None)
            errors.append(f"column {column!r} holds null, expected a string")
        elif not isinstance(v, str):  # one value of a column of objects: its row's error, as a record's in a file
            texts.append(None)
            errors.append(f"column {column!r} holds {type(v).__name__} {v!r:.40}, expected a string")
        else:
            bad = _surrogate(v)
            texts.append(None if bad is not None else v)
            errors.append(None if bad is None else f"column {column!r} holds a string that is not valid Unicode (a "
                                                   f"lone surrogate at character {bad})")
    return texts, errors


def _surrogate(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _arrow_texts(col, column: str) -> tuple[list[str | None], list[str | None]]:
    import pyarrow as pa

    from spanflow.data.tables import holds_texts, readable_strings

    kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type  # a categorical column's values
    if not holds_texts(kind):  # strings of any layout (views too, as the CLI takes), or all null
        raise ConfigError(f"column {column!r} holds {kind}, not strings", field="column")
    arr, bad = readable_strings(col)
    texts = arr.to_pylist()
    errors = [f"column {column!r} holds invalid UTF-8 at byte {bad[k]}" if k in bad
              else f"column {column!r} holds null, expected a string" if t is None else None
              for k, t in enumerate(texts)]
    return texts, errors


def _joined(batch: Any, kind: str, out, errors: list[str | None]):
    """`batch` with the result columns of `out` (an Arrow table) and `error` added, in its own format."""
    import pyarrow as pa

    if kind in ("arrow", "record_batch"):
        table = batch if kind == "arrow" else pa.Table.from_batches([batch])
        for name in out.column_names:
            table = table.append_column(name, out.column(name))
        # one record batch: a table in pieces (Ray hands over a batch's blocks as they came) would
        # reach Ray's Parquet writer, which writes a table's batches in any order, as pieces
        return table.append_column("error", pa.array(errors, pa.string())).combine_chunks()
    added = {name: _numpy(out.column(name)) for name in out.column_names}
    added["error"] = _objects(errors)
    if kind == "pandas":
        frame = batch.copy(deep=False)
        for name, values in added.items():
            frame[name] = list(values)
        return frame
    return {**batch, **added}


def _numpy(col):
    """An Arrow result column as numpy: vectors of one size as a 2-D array (an error row's all NaN,
    so that every batch's column has one type), else one Python object a row (a list, None)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_fixed_size_list(col.type):
        arr = col.combine_chunks()
        dtype = arr.type.value_type.to_pandas_dtype()
        out = np.full((len(arr), arr.type.list_size), np.nan, dtype=dtype)
        rows = np.flatnonzero(arr.is_valid().to_numpy(zero_copy_only=False))
        out[rows] = arr.filter(arr.is_valid()).flatten().to_numpy(zero_copy_only=False).reshape(len(rows), -1)
        return out
    return _objects(col.to_pylist())


def _objects(values: list):
    import numpy as np

    out = np.empty(len(values), dtype=object)  # np.array would make a 2-D array of equal-length lists
    out[:] = values
    return out
