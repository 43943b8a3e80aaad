"""Arrow tables in and out of the bulk jobs: the one place Parquet and Arrow IPC files are
read and made (pyarrow is optional and imported only here, when a table is touched).

Input (read_table_records): a Parquet file (.parquet, .pq) is streamed by row group, a few
thousand rows at a time, and an Arrow IPC file or stream (.arrow, .feather, .ipc) by record
batch, so memory stays bounded for any file size. Only the text column, the id column and
the kept columns are read. Columns are named, never numbered: `--column 2021` is the column
called "2021". A row's id is the id column's value, else its row number, counted from 0.
Before any row is read, each of these is one ConfigError: a column the file lacks (listing
those it has), a text column that does not hold strings, a kept column named twice. A null
text is a RowError for that row (the job writes an error row and goes on); a part of the
file that cannot be decoded (a damaged page) is a DataError naming the file and its rows,
which stops the job.

Output (output_table): one row per input record, in input order, with the columns

    id          the --id-column's values in its own Arrow type; else int64 row numbers
                (table input) or the string ids of text/JSONL/CSV input (a JSONL "id"
                field, else the line number, from 1)
    <kept>      each --keep-columns column, in its own Arrow type (table input) or as
                strings (CSV cells; JSONL values, non-strings as JSON)
    <result>    the task's column, built by its model's arrow_results:
                  NER    entities: list<struct<start: int32, end: int32, label: string,
                                               text: string>>
                  RE     relations: list<struct<head_start: int32, head_end: int32,
                                                type: string, tail_start: int32,
                                                tail_end: int32, head_text: string,
                                                tail_text: string>>
                  embed  embedding: fixed_size_list<float32>[dim] (float16 with --dtype
                                    float16), what LanceDB and DuckDB ingest as vectors
                offsets are characters of the text, end exclusive
    error       string: null when the row is fine; else why the record could not be read,
                and the result is null

A JSONL output holds the same ids and kept values, as JSON can hold them (data.jsonvalues),
and says where an unreadable record is with "row" (table input) or "line" (error_fields).

Single-process jobs and the Ray actors both build their tables here, so their files are
the same. parquet_output writes row groups to a temporary file beside the output and
renames it into place when complete.
"""
from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from spanflow.atomic import atomic_path, writing
from spanflow.data.formats.common import SURROGATE
from spanflow.data.jsonvalues import json_value
from spanflow.errors import ConfigError, DataError, quote

if TYPE_CHECKING:
    import pyarrow as pa

PARQUET = (".parquet", ".pq")
IPC = (".arrow", ".feather", ".ipc")
BATCH_ROWS = 4096  # rows decoded at a time: bounds memory whatever a file's row groups hold


class TableRecord(NamedTuple):
    """One input row: its id, its text (or why there is none), the kept columns' values."""

    id: Any
    text: str | DataError
    kept: tuple


class RowError(DataError):
    """A table row that cannot be read; `row` counts from 0 (a table has rows, not lines)."""

    def __init__(self, message: str, *, path: str, row: int):
        super().__init__(f"row {row}: {message}", path=path)
        self.row = row


def error_fields(err: DataError) -> dict:
    """Where an unreadable record is and why, as a JSONL error record says it: {"row", "error"}
    for a table's row, {"line", "error"} otherwise."""
    where = {"row": err.row} if isinstance(err, RowError) else {"line": err.line}
    return where | {"error": err.reason}


def pyarrow():
    """The pyarrow module; a ConfigError naming the extra to install when it is missing."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401  (pa.parquet below)
    except ImportError:
        raise ConfigError("Parquet and Arrow files need pyarrow: pip install 'spanflow[parquet]'") from None
    return pa


def is_table(path: str) -> bool:
    """True for a Parquet (.parquet, .pq) or Arrow IPC (.arrow, .feather, .ipc) path, or an existing
    file of another name that opens as one (Parquet's or Arrow's magic bytes)."""
    return _table_kind(os.fspath(path)) is not None


def _is_parquet(path: str) -> bool:
    return _table_kind(path) == "parquet"


def _table_kind(path: str) -> str | None:
    """parquet, ipc or None: by the name's extension, else by a regular file's first and last
    bytes, both the format's marks (a table saved without its extension would otherwise be read
    as lines of text; a text that only starts like one stays text)."""
    ext = os.path.splitext(path)[1].lower()
    if ext in PARQUET + IPC:
        return "parquet" if ext in PARQUET else "ipc"
    try:
        if not os.path.isfile(path) or os.path.getsize(path) < 12:  # a pipe's bytes, read here, would be gone
            return None
        with open(path, "rb") as f:
            head = f.read(8)
            f.seek(-8, os.SEEK_END)
            tail = f.read(8)
    except OSError:
        return None
    if head.startswith(b"PAR1") and tail.endswith(b"PAR1"):
        return "parquet"
    if (head.startswith(b"ARROW1") and tail.endswith(b"ARROW1")) or (  # an IPC file; a stream, with its end mark
            head.startswith(b"\xff" * 4) and tail == b"\xff" * 4 + b"\0" * 4):
        return "ipc"
    return None


def one_line(e: BaseException) -> str:
    """`e` as one printable line: a damaged file's bytes can reach pyarrow's messages."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(e)).split())


@contextmanager
def _decoding(path: str, where: str) -> Iterator[None]:
    """What pyarrow cannot decode (a damaged page or message; its OSErrors carry no errno) as one
    DataError naming the file and `where`; a real I/O error (errno set) and running out of
    memory stay what they are."""
    pa = pyarrow()
    try:
        yield
    except MemoryError:
        raise
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        raise DataError(f"{where} cannot be read: {one_line(e)}", path=path) from None


@contextmanager
def _ipc(path: str) -> Iterator[Any]:
    """An Arrow IPC file reader (random access) or, failing that, a stream reader, on a memory
    map that is closed when the block ends."""
    pa = pyarrow()
    with pa.memory_map(path) as source:
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as e:
                raise DataError(f"not an Arrow IPC file or stream ({one_line(e)})", path=path) from None
        yield reader


def table_schema(path: str) -> pa.Schema:
    """The schema of the table at `path`, read from its footer or first message only."""
    pa = pyarrow()
    if not os.path.exists(path):
        raise DataError("file not found", path=path)
    if not _is_parquet(path):
        with _ipc(path) as reader:
            return reader.schema
    try:
        with pa.parquet.ParquetFile(path) as f:
            return f.schema_arrow
    except pa.ArrowInvalid as e:
        raise DataError(f"not a Parquet file ({one_line(e)})", path=path) from None
    except OSError as e:  # a footer pyarrow cannot decode (its OSErrors carry no errno): a traceback before
        if e.errno is not None:
            raise
        raise DataError(f"its footer (the schema and row groups) cannot be read: {one_line(e)}", path=path) from None


def table_rows(path: str) -> int:
    """The rows of the table at `path`, from its metadata where it has them (Parquet, IPC files)."""
    pa = pyarrow()
    with _decoding(path, "its row count"):
        if _is_parquet(path):
            with pa.parquet.ParquetFile(path) as f:
                return f.metadata.num_rows
        with _ipc(path) as reader:
            if hasattr(reader, "num_record_batches"):
                return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            return sum(b.num_rows for b in reader)


def column_name(schema, column: str | int, flag: str, path: str) -> str:
    """The column called `column`, checked to be in the file. An int (`--column 2021`, which the
    flag reads as a CSV index) is its name as digits: a table's columns are named, not numbered."""
    name = column if isinstance(column, str) else str(column)
    if name not in schema.names:
        raise ConfigError(f"{flag} {name}: {path} has no such column; it has {', '.join(schema.names)}")
    if schema.names.count(name) > 1:  # Arrow finds no one column of it: a KeyError deep in the read
        raise DataError(f"{flag} {name}: the file has {schema.names.count(name)} columns named {name!r}, and a "
                        "column is read by its name: rename all but one", path=path)
    return name


def is_text(t) -> bool:
    pa = pyarrow()
    if pa.types.is_dictionary(t):
        t = t.value_type
    is_view = getattr(pa.types, "is_string_view", None)  # pyarrow 16 and later
    return pa.types.is_string(t) or pa.types.is_large_string(t) or bool(is_view and is_view(t))


def holds_texts(t) -> bool:
    """A type a text column may have: strings, or Arrow's null type (a column with no value in
    it, as a writer types one that is all None: each row is an error row, as a null text is)."""
    return is_text(t) or pyarrow().types.is_null(t)


def _text_name(schema, column: str | int, path: str, flag: str = "--column") -> str:
    """The text column: in the file, and of strings (nulls are error rows, other types one error);
    `flag` the one that named it, as errors say."""
    name = column_name(schema, column, flag, path)
    t = schema.field(name).type
    if not holds_texts(t):
        raise ConfigError(f"{flag} {name}: the column {name!r} of {path} holds {t}, not strings")
    return name


_ID_TAKEN = "--keep-columns id: 'id' is the output's id column (use --id-column id)"


def check_unique(keep: Sequence[str]) -> None:
    """A column named twice in --keep-columns is a ConfigError."""
    for k, name in enumerate(keep):
        if name in keep[:k]:
            raise ConfigError(f"--keep-columns {name}: named twice")


def check_keep(keep: Sequence[str], taken: Iterable[str] = (), what: str = "column") -> None:
    """Refuse kept columns the output cannot hold: one named twice, `id` (the output's own id)
    or one of `taken`, the other names the output gives its own columns (`what`: column, or
    key for JSONL records)."""
    check_unique(keep)
    taken = set(taken)
    for name in keep:
        if name == "id":
            raise ConfigError(_ID_TAKEN)
        if name in taken:
            raise ConfigError(f"--keep-columns {name}: the output has a {what} of its own named {name!r}")


def read_table_records(path: str, *, column: str | int, id_column: str | None = None,
                       keep: Sequence[str] = (), flag: str = "--column") -> Iterator[TableRecord]:
    """TableRecords of the table at `path`, in order, streamed. The columns are checked here,
    before the first row is read (see the module's docstring): each fault is one ConfigError,
    the text column's named by `flag` (--field where that named it)."""
    check_unique(keep)
    schema = table_schema(path)
    text = _text_name(schema, column, path, flag)
    ident = column_name(schema, id_column, "--id-column", path) if id_column is not None else None
    kept = [column_name(schema, k, "--keep-columns", path) for k in keep]
    return _records(path, text, ident, kept)


def _records(path: str, text: str, ident: str | None, kept: list[str]) -> Iterator[TableRecord]:
    cols = list(dict.fromkeys([text] + ([ident] if ident else []) + kept))
    row = 0
    for b in _batches(path, cols):
        values, bad = {}, {}
        for c in cols:
            values[c], bad[c] = _pylist(b.column(c))
        for k in range(b.num_rows):
            value = (RowError(f"column {text!r} holds invalid UTF-8 at byte {bad[text][k]}", path=path, row=row)
                     if k in bad[text] else _text(values[text][k], row, text, path))
            yield TableRecord(values[ident][k] if ident else row, value, tuple(values[c][k] for c in kept))
            row += 1


def readable_strings(col):
    """(a column of strings as Arrow strings, a dictionary's decoded, null where a value is not
    UTF-8; {row: byte offset} of those values), so that making Python strings of it never fails."""
    pa = pyarrow()
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    texts = col.cast(pa.string())
    bad = invalid_utf8(texts)
    if bad:
        texts = pa.array([None if k in bad else v for k, v in enumerate(texts.cast(pa.large_binary()).to_pylist())],
                         pa.large_binary()).cast(pa.string())
    return texts, bad


def invalid_utf8(col) -> dict[int, int]:
    """{row: byte offset} of the values of a column of strings that are not valid UTF-8. A
    Parquet or Arrow string is bytes that a reader checks only when it makes a Python string of
    one (and then fails the whole column); here a column is checked whole first, in Arrow."""
    return {} if _valid_utf8(col) else _bad_rows(_raw(col))


def _valid_utf8(col) -> bool:
    """Every string's UTF-8 checked in Arrow, without making Python strings (a dictionary's: its values)."""
    pa = pyarrow()
    try:
        (col.dictionary if pa.types.is_dictionary(col.type) else col).validate(full=True)
    except pa.ArrowInvalid:  # some value is not UTF-8 (a damaged or foreign file): the caller finds which
        return False
    return True


def _raw(col) -> list:
    """The column's values as bytes (None where null)."""
    pa = pyarrow()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col.cast(pa.large_binary()).to_pylist()


def _bad_rows(raw: list) -> dict[int, int]:
    bad = {}
    for k, v in enumerate(raw):
        try:
            if v is not None:
                v.decode("utf-8")
        except UnicodeDecodeError as e:
            bad[k] = e.start
    return bad


def escaped_utf8(col):
    """`col` (an Arrow array) with every string in it, nested ones too, valid UTF-8: the bytes of
    one that is not are backslash-escaped (an id or kept column is carried, not refused)."""
    pa = pyarrow()
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([escaped_utf8(c) for c in col.chunks], type=col.type)
    try:
        col.validate(full=True)
        return col
    except pa.ArrowInvalid:
        return _escaped(col)


def _escaped(arr):
    pa = pyarrow()
    t = arr.type
    if pa.types.is_dictionary(t):
        return pa.DictionaryArray.from_arrays(arr.indices, _escaped(arr.dictionary))
    if is_text(t):
        return pa.array(_escape_bytes(_raw(arr)), type=t)
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays([_escaped(c) for c in arr.flatten()], fields=list(t), mask=mask)
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(arr.offsets, _escaped(arr.keys), _escaped(arr.items), type=t, mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return kind.from_arrays(arr.offsets, _escaped(arr.values), type=t, mask=mask)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size  # (flatten() would drop null rows' slots)
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        return pa.FixedSizeListArray.from_arrays(_escaped(values), type=t, mask=mask)
    return arr


def _pylist(col) -> tuple[list, dict[int, int]]:
    """(the values of a column, {row: byte offset} of its strings that are not valid UTF-8: those
    come backslash-escaped, and as the text they are the row's error)."""
    if not is_text(col.type):
        return escaped_utf8(col).to_pylist(), {}
    if _valid_utf8(col):
        return col.to_pylist(), {}
    raw = _raw(col)
    return _escape_bytes(raw), _bad_rows(raw)


def _escape_bytes(raw: list) -> list:
    """Strings of the values' bytes, those that are not UTF-8 backslash-escaped (None kept)."""
    return [None if v is None else v.decode("utf-8", "backslashreplace") for v in raw]


def table_ids(path: str, id_column: str | None = None) -> Iterator:
    """The ids read_table_records gives the rows, reading only the id column (and without one,
    only the metadata: the ids are the row numbers)."""
    if id_column is None:
        yield from range(table_rows(path))
        return
    name = column_name(table_schema(path), id_column, "--id-column", path)
    for b in _batches(path, [name]):
        yield from b.column(name).to_pylist()


def _batches(path: str, columns: list[str]) -> Iterator:
    """The file's record batches, only `columns`, a bounded number of rows at a time; a part
    that cannot be decoded is a DataError naming its rows."""
    yield from (_parquet_batches if _is_parquet(path) else _ipc_batches)(path, columns)


def _parquet_batches(path: str, columns: list[str]) -> Iterator:
    pa = pyarrow()
    # pre_buffer off and a read buffer: a column chunk is streamed, not read whole
    with _decoding(path, "its footer (the schema and row groups)"):
        f = pa.parquet.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    with f:
        first = 0
        for g in range(f.metadata.num_row_groups):
            n = f.metadata.row_group(g).num_rows
            with _decoding(path, f"rows {first}-{first + n - 1} (row group {g})"):
                yield from f.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=columns, use_threads=False)
            first += n


def _ipc_batches(path: str, columns: list[str]) -> Iterator:
    with _ipc(path) as reader:
        count = getattr(reader, "num_record_batches", None)
        batches = iter(reader) if count is None else (reader.get_batch(i) for i in range(count))
        first = 0
        for i in itertools.count():
            with _decoding(path, f"record batch {i} (rows from {first})"):
                b = next(batches, None)
            if b is None:
                return
            b = b.select(columns)
            for at in range(0, b.num_rows, BATCH_ROWS):
                yield b.slice(at, BATCH_ROWS)
            first += b.num_rows


def _text(value, row: int, column: str, path: str) -> str | DataError:
    if isinstance(value, str):
        return value
    what = "null" if value is None else f"a {type(value).__name__} value {quote(value, 80)}"
    return RowError(f"column {column!r} holds {what}, expected a string", path=path, row=row)


def carried_schema(path: str, *, id_column: str | None = None, keep: Sequence[str] = ()) -> pa.Schema:
    """The types of the output's `id` and kept columns for input `path` (see the module's
    docstring); a kept column named twice, or named `id` or `error`, is a ConfigError."""
    pa = pyarrow()
    check_keep(keep, ("error",))
    if not is_table(path):
        return pa.schema([("id", pa.string())] + [(k, pa.string()) for k in keep])
    schema = table_schema(path)
    ident = pa.int64() if id_column is None else schema.field(column_name(schema, id_column, "--id-column", path)).type
    return pa.schema([("id", ident)] + [(k, schema.field(column_name(schema, k, "--keep-columns", path)).type)
                                        for k in keep])


def column_array(values, type_):
    """An output column of `values` in `type_` (None: inferred); Python values of a JSONL input in
    a string column as their JSON text."""
    pa = pyarrow()
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if type_ is None or values.type == type_ else values.cast(type_)
    if type_ is not None and type_ == pa.string():  # JSONL's kept values: a number, object or list as its JSON
        values = [v if v is None or isinstance(v, str) else _json_text(json_value(v)) for v in values]
    return pa.array([_utf8(v) for v in values], type=type_)


def _json_text(value) -> str | None:
    """A value json_value made JSON-ready as its JSON text; None (a NaN's null) stays a null."""
    return None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False)


def _utf8(value):
    """`value` with each lone surrogate in its strings (a JSONL id or field of "\ud800", which
    Parquet's UTF-8 cannot hold) written as its escape, `\ud800`, as the JSONL output shows it."""
    if isinstance(value, str) and SURROGATE.search(value):  # (a kept JSON object arrives as its JSON text)
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def output_table(model, ids, texts: Sequence[str], results, errors: Sequence, kept: Mapping | None = None,
                 *, types: pa.Schema | None = None, **opts) -> pa.Table:
    """The output rows of one chunk (see the module's docstring for the columns).

    `ids`, `texts`, `results` and `errors` run in parallel, one item per record; an error (a
    DataError or its message) makes that row's result null whatever `results` holds there.
    `kept` maps each kept column's name to its values; `types` (carried_schema) fixes the
    types of `id` and the kept columns, so that every chunk of a job has one schema. `opts`
    go to the model's arrow_results (e.g. dtype="float16" for embeddings).
    """
    pa = pyarrow()
    kept = kept or {}
    errs = [None if e is None else _utf8(e if isinstance(e, str) else str(e)) for e in errors]
    res = [None if e is not None else r for r, e in zip(results, errs)]
    typ = (lambda name: types.field(name).type if types is not None and name in types.names else None)
    result = model.arrow_results(list(texts), res, **opts)
    check_keep(list(kept), ("error", *result.column_names))
    cols = {"id": column_array(ids, typ("id"))}
    cols.update({name: column_array(values, typ(name)) for name, values in kept.items()})
    cols.update({name: result.column(name) for name in result.column_names})
    cols["error"] = pa.array(errs, pa.string())
    return pa.table(cols)


def output_schema(model, types: pa.Schema, **opts) -> pa.Schema:
    """The schema output_table gives every chunk of a job; raises its ConfigError for a kept
    column whose name the output already uses, so a job can check before any work."""
    empty = {name: [] for name in types.names if name != "id"}
    return output_table(model, [], [], [], [], empty, types=types, **opts).schema


class ParquetOutput:
    """Row groups appended to an open Parquet file, one per write (see parquet_file)."""

    def __init__(self, f, what: str, path: str):
        self.f, self.what, self.path = f, what, path
        self.writer = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        """Append `table` as the next row group(s); its schema must be the first one's."""
        pa = pyarrow()
        with writing(self.what, self.path):
            if self.writer is None:
                self.writer = pa.parquet.ParquetWriter(self.f, table.schema)
            self.writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> None:
        """Write the footer and sync the file."""
        with writing(self.what, self.path):
            if self.writer is not None:
                self.writer.close()
            self.f.flush()
            os.fsync(self.f.fileno())

    def abandon(self) -> None:
        """Close the writer of a file that is to be discarded, while the file is still open: a
        writer left open writes its footer when it is collected, into a file closed by then."""
        if self.writer is not None:
            self.writer.close()


@contextmanager
def parquet_file(path: str, *, what: str, shown: str | None = None) -> Iterator[ParquetOutput]:
    """A ParquetOutput on the file at `path`, complete and synced when the block ends without
    error. The caller must write at least one table (possibly empty), or the file has no
    schema; a full or read-only disk is a WriteError naming `what` and `shown` (default `path`)."""
    with open(path, "wb") as f:
        out = ParquetOutput(f, what, shown or path)
        try:
            yield out
        except BaseException:
            out.abandon()
            raise
        out.close()


@contextmanager
def parquet_output(path: str, *, what: str, kind: str = "parquet",
                   shown: str | None = None) -> Iterator[ParquetOutput]:
    """parquet_file on a temporary file beside `path` (`.KIND-PID-XXXX.parquet`), renamed onto
    `path` when the block ends without error and removed otherwise: nothing is at `path` until
    the file is complete."""
    pyarrow()
    shown = shown or path
    with writing(what, shown), atomic_path(path, kind, ".parquet") as tmp:
        with parquet_file(tmp, what=what, shown=shown) as out:
            yield out
