"""Where a Ray job's rows come from: Arrow blocks of (row, id, text, error, kept columns), in input order.

A Parquet input (a file, a directory of them, or a URI pyarrow opens, such as s3://bucket/dir)
is read by the cluster: read tasks of whole row groups (consecutive groups packed up to at
least one chunk's rows, across files), rows numbered after those of the groups and files
before them (files in name order), so ids and error rows are the ones the single-process job
gives. Any other input (Arrow IPC, text lines, JSONL, CSV/TSV) is read as the single-process
job reads it, by one streaming task pinned to the driver's node, where the file is: its
blocks flow on as they are made, so no more of the input is held than the stages ahead let
through. Either way the job then cuts the stream into chunks of the single-process job's
size (job.py), so each model call sees the rows a single-process chunk holds.

Inside the job a block's columns are ROW (the input row number, from 0), ID, TEXT (null for
an unreadable record), ERROR (why, or null), KEEP + name for each kept column and TOKENS +
name for what a tokenizing stage adds; the names cannot meet a user's column.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass

from spanflow.data.records import read_rows
from spanflow.data.tables import (PARQUET, RowError, carried_schema, column_array, column_name, escaped_utf8,
                                   holds_texts, is_table, one_line, pyarrow, readable_strings)
from spanflow.errors import ConfigError, DataError

ROW, ID, TEXT, ERROR = "__row", "__id", "__text", "__error"
KEEP, TOKENS = "__keep:", "__tokens:"
READ_ROWS = 4096  # rows decoded at a time by a read task
FOOTER_THREADS = 16  # footers read at once (object stores answer each in a round trip)


@dataclass(frozen=True)
class Source:
    """The input as the command names it."""

    path: str
    column: str | int | None = None  # the text column (tables, CSV/TSV); None: "text" for tables
    field: str = "text"  # JSONL
    skip_header: bool = False
    id_column: str | None = None
    keep: tuple[str, ...] = ()
    name: str | None = None  # what messages call the input (the path as given); None: `path`

    def for_workers(self) -> Source:
        """This input as the cluster's tasks open it: a path made absolute, its name kept."""
        if is_remote(self.path):
            return self
        return dataclasses.replace(self, path=os.path.abspath(self.path), name=self.name or self.path)

    @property
    def text_column(self) -> str | int:
        return self.field if self.column is None else self.column


@dataclass(frozen=True)
class Piece:
    """One Parquet row group: its file, its index, its rows, the input row number of its first
    row, and the row number of that first row within its file."""

    path: str
    group: int
    rows: int
    first: int
    in_file: int


def is_remote(path: str) -> bool:
    return "://" in path


def filesystem(path: str):
    """(pyarrow file system, path in it); a URI whose store cannot be reached is a DataError."""
    pyarrow()
    import pyarrow.fs as pafs

    if is_remote(path):
        with reaching(path):
            return store(path)
    return pafs.LocalFileSystem(), path


def store(uri: str):
    """(the object store's pyarrow file system, the path in it) that `uri` names."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(uri)


@contextmanager
def reaching(path: str) -> Iterator[None]:
    """An object store's failure to answer (no network, an unknown bucket, no credentials: pyarrow's
    OSError or ArrowException) as one DataError naming the URI, not a traceback."""
    pa = pyarrow()
    try:
        yield
    except (OSError, pa.ArrowException) as e:
        if not is_remote(path):
            raise
        raise DataError(f"cannot reach it ({one_line(e)[:300]})", path=path) from None


def file_info(fs, where: str, path: str):
    """`fs.get_file_info(where)`, `path` being what the command was given (see reaching)."""
    with reaching(path):
        return fs.get_file_info(where)


def is_parquet_input(path: str) -> bool:
    """A Parquet file or URI, or a directory (or prefix) of them: what the cluster reads itself."""
    if path.lower().endswith(PARQUET):
        return True
    if not is_remote(path) and is_table(path):
        return False
    fs, where = filesystem(path)
    return file_info(fs, where, path).type.name == "Directory"


def parquet_files(path: str, *, required: bool = True) -> tuple[object, list[str]]:
    """(file system, the Parquet files of `path` in name order); hidden and _-prefixed names
    skipped. Where `required`, a path that is not there, or holds none, is a DataError."""
    import pyarrow.fs as pafs

    fs, where = filesystem(path)
    info = file_info(fs, where, path)
    if info.type.name == "NotFound":
        if not required:
            return fs, []
        raise DataError("file not found", path=path)
    if info.type.name != "Directory":
        return fs, [where]
    with reaching(path):
        found = fs.get_file_info(pafs.FileSelector(where, recursive=True))
    files = sorted(f.path for f in found if f.type.name == "File" and f.path.lower().endswith(PARQUET)
                   and not any(p.startswith((".", "_")) for p in f.path[len(where):].split("/") if p))
    if not files and required:
        raise DataError("no .parquet files in this directory", path=path)
    return fs, files


def footers(fs, files: Sequence[str], shown=lambda f: f) -> list:
    """The files' Parquet metadata, read a few at a time (each one a round trip to a store); a
    file that is no Parquet file (empty, cut short, another format) is a DataError naming it."""
    pa = pyarrow()

    def one(f: str):
        with fs.open_input_file(f) as stream:
            try:
                return pa.parquet.ParquetFile(stream).metadata
            except (pa.ArrowException, OSError) as e:  # a damaged footer's OSError has no errno; a real one has
                if isinstance(e, OSError) and e.errno is not None:
                    raise
                raise DataError(f"not a Parquet file ({one_line(e)})", path=shown(f)) from None

    with ThreadPoolExecutor(max_workers=max(1, min(FOOTER_THREADS, len(files)))) as pool:
        return list(pool.map(one, files))


def plan_parquet(src: Source) -> tuple[list[Piece], object, int]:
    """(every row group, in input order; the types of the output's id and kept columns; rows in
    all). Every file's footer is read here, on the driver: a column a file lacks, or a text
    column of anything but strings, is a ConfigError before any work. The id and kept columns
    take one type over every file (read_groups casts to it): the widest of theirs (an all-null
    column's null, int32 under int64, dictionary-encoded strings as strings), or a ConfigError
    naming two files whose types no one type holds."""
    pa = pyarrow()
    fs, files = parquet_files(src.path)
    base = filesystem(src.path)[1]
    pieces, row, carried = [], 0, []
    for f, meta in zip(files, footers(fs, files, lambda f: _shown(src, f, base))):
        schema = meta.schema.to_arrow_schema()
        text, ident = _columns(schema, src, _shown(src, f, base))
        carried.append((_shown(src, f, base), pa.schema([("id", schema.field(ident).type if ident else pa.int64())]
                                                        + [(k, schema.field(k).type) for k in src.keep])))
        in_file = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            pieces.append(Piece(f, g, n, row, in_file))
            row, in_file = row + n, in_file + n
    return pieces, _one_type(carried, src), row


def _one_type(carried: list, src: Source):
    """The schema that holds every file's id and kept columns (see plan_parquet): a column's own
    type where every file has the same, else its types merged without loss (_merged), or a
    ConfigError naming the column and the file whose type no merge holds."""
    pa = pyarrow()
    fields = []
    for name in carried[0][1].names:
        since, first = carried[0]  # since: the file that last set the column's type
        t = first.field(name).type
        if all(s.field(name).type == t for _, s in carried):
            fields.append((name, t))
            continue
        t = _plain(t)
        for shown, s in carried[1:]:
            other = _plain(s.field(name).type)
            merged = _merged(t, other)
            if merged is None:
                flag, column = ("--id-column", src.id_column) if name == "id" else ("--keep-columns", name)
                raise ConfigError(f"{flag} {column}: the column holds {t} in {since} and {other} in {shown}; an "
                                  "output column takes one type (cast it in the files, or leave it out)")
            if merged != t:
                since, t = shown, merged
        fields.append((name, t))
    return pa.schema(fields)


def _plain(t):
    """A column type as the output holds it: dictionary-encoded values as the values, string views
    as strings (files of one data set differ in these as their writers chose)."""
    pa = pyarrow()
    if pa.types.is_dictionary(t):
        t = t.value_type
    view = getattr(pa.types, "is_string_view", None)  # pyarrow 16 and newer
    return pa.string() if view is not None and view(t) else t


def _merged(a, b):
    """The type that holds every value of `a` and of `b` exactly, or None: the same type; either
    beside an all-null column; the wider of two integers of one signedness; a string beside a
    large string. A float beside an integer, or a coarser time unit, could not hold them all."""
    pa = pyarrow()
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    for same in (pa.types.is_signed_integer, pa.types.is_unsigned_integer):
        if same(a) and same(b):
            return a if a.bit_width >= b.bit_width else b
    if {a, b} == {pa.string(), pa.large_string()}:
        return pa.large_string()
    return None


def pack(pieces: list[Piece], at_least: int) -> list[list[Piece]]:
    """Consecutive row groups packed into read tasks of at least `at_least` rows (the last may
    hold fewer): each row group is read once, by one task, and no task is a sliver of a chunk."""
    tasks, now, n = [], [], 0
    for p in pieces:
        now.append(p)
        n += p.rows
        if n >= at_least:
            tasks.append(now)
            now, n = [], 0
    return tasks + ([now] if now else [])


def _shown(src: Source, path: str, base: str) -> str:
    """The name messages give a file: the input as given when it is that file (`base`: the
    input's path in its file system)."""
    return (src.name or src.path) if path == base else path


def _columns(schema, src: Source, shown: str) -> tuple[str, str | None]:
    """(the text column, the id column or None), each checked as data.tables checks a table's."""
    text = column_name(schema, src.text_column, "--column", shown)
    if not holds_texts(schema.field(text).type):
        raise ConfigError(f"--column {text}: the column {text!r} of {shown} holds {schema.field(text).type}, "
                          "not strings")
    ident = column_name(schema, src.id_column, "--id-column", shown) if src.id_column is not None else None
    for k in src.keep:
        column_name(schema, k, "--keep-columns", shown)
    return text, ident


def read_task(batch, *, tasks: list[list[Piece]], src: Source, types=None) -> Iterator:
    """The blocks of the read tasks whose indices `batch` holds (column "task"): Ray's read stage.
    The file system is made once per task, and each file opened once for its row groups."""
    fs, base = filesystem(src.path)
    for k in batch["task"].to_pylist():
        for path, pieces in itertools.groupby(tasks[k], key=lambda p: p.path):
            yield from read_groups(fs, path, list(pieces), src, _shown(src, path, base), types)


def read_groups(fs, path: str, pieces: list[Piece], src: Source, shown: str, types=None) -> Iterator:
    """The blocks of some row groups of one file, READ_ROWS rows at a time; the id and kept columns
    cast to `types` (plan_parquet's), so every block of the job has one schema."""
    pa = pyarrow()
    with fs.open_input_file(path) as stream:
        f = pa.parquet.ParquetFile(stream)
        text, ident = _columns(f.schema_arrow, src, shown)
        cols = list(dict.fromkeys([text] + ([ident] if ident else []) + list(src.keep)))
        for p in pieces:
            at = 0
            with decoding(shown, f"rows {p.in_file}-{p.in_file + p.rows - 1} (row group {p.group})"):
                for b in f.iter_batches(batch_size=READ_ROWS, row_groups=[p.group], columns=cols, use_threads=False):
                    rows = pa.array(range(p.first + at, p.first + at + b.num_rows), pa.int64())
                    texts, errors = texts_and_errors(b.column(text), p.in_file + at, text, shown)
                    yield block(rows, _cast(escaped_utf8(b.column(ident)), types, "id") if ident else rows, texts,
                                errors, {k: _cast(escaped_utf8(b.column(k)), types, k) for k in src.keep})
                    at += b.num_rows


def _cast(col, types, name: str):
    return col if types is None or col.type == types.field(name).type else col.cast(types.field(name).type)


@contextmanager
def decoding(shown: str, where: str) -> Iterator[None]:
    """What pyarrow cannot decode (a damaged page; its OSErrors carry no errno) as one DataError
    naming the file and `where`, as data.tables says it; a real I/O error (errno set) stays one."""
    pa = pyarrow()
    try:
        yield
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        raise DataError(f"{where} cannot be read: {' '.join(str(e).split())}", path=shown) from None


def texts_and_errors(col, first: int, column: str, shown: str):
    """(the texts as pyarrow strings, null where missing; each row's error, null where none) of a
    column of strings; `first`: the file's row number of its first row. Error messages are made
    for the null rows only, as data.tables words them."""
    pa = pyarrow()
    import numpy as np

    texts, bad = readable_strings(col)  # a value not UTF-8: a null text with its error below
    if texts.null_count == 0:
        return texts, pa.nulls(len(texts), pa.string())
    errors = [None] * len(texts)
    for k in np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False)):
        why = (f"holds invalid UTF-8 at byte {bad[int(k)]}" if int(k) in bad else "holds null, expected a string")
        errors[k] = str(RowError(f"column {column!r} {why}", path=shown, row=first + int(k)))
    return texts, pa.array(errors, pa.string())


def block(rows, ids, texts, errors, kept: dict):
    """An Arrow block of the job's columns (see the module's docstring)."""
    pa = pyarrow()
    cols = {ROW: rows, ID: ids, TEXT: texts, ERROR: errors}
    cols.update({KEEP + k: v for k, v in kept.items()})
    return pa.table(cols)


def records(src: Source) -> Iterator:
    """The TableRecords (id, text or DataError, kept values) of an input the driver's node reads,
    as the single-process job reads it; a column the input lacks is a ConfigError, raised here.
    Read by the name it was given where that is the same file from here, so that error rows name
    it as the single-process job's do."""
    given = src.name if src.name and os.path.abspath(src.name) == src.path else src.path
    return read_rows(given, field=src.field, column=src.column, skip_header=src.skip_header,
                     id_column=src.id_column, keep=src.keep)


def check_records(src: Source) -> None:
    """The columns of an input the driver's node reads, checked (read_rows raises before the
    first record); nothing is left open."""
    with closing(records(src)):
        pass


def driver_types(src: Source):
    """The types of the output's id and kept columns for an input the driver's node reads."""
    return carried_schema(src.path, id_column=src.id_column, keep=src.keep)


def read_records(batch, *, src: Source, rows: int, types) -> Iterator:
    """The blocks of `rows` records of an input only the driver's node can open: Ray's read
    stage there (one task; `batch` is its one placeholder row)."""
    pa = pyarrow()
    it, row = records(src), 0
    with closing(it):
        while chunk := list(itertools.islice(it, rows)):
            n = len(chunk)
            texts = pa.array([r.text if isinstance(r.text, str) else None for r in chunk], pa.string())
            errors = pa.array([str(r.text) if isinstance(r.text, DataError) else None for r in chunk], pa.string())
            kept = {k: column_array([r.kept[j] for r in chunk], types.field(k).type) for j, k in enumerate(src.keep)}
            yield block(pa.array(range(row, row + n), pa.int64()), pa.array([r.id for r in chunk],
                        types.field("id").type), texts, errors, kept)
            row += n


def sample_texts(src: Source, pieces: list[Piece] | None, n: int) -> list[str]:
    """Up to `n` non-empty texts from the first 2n records, for the precision check (as
    data.records.sample_texts picks them); `pieces`: plan_parquet's, for Parquet input."""
    first: list = []
    if pieces is not None:
        fs, base = filesystem(src.path)
        for p in pieces:
            with closing(read_groups(fs, p.path, [p], src, _shown(src, p.path, base))) as blocks:
                for b in blocks:
                    first += b[TEXT].to_pylist()[:2 * n - len(first)]
                    if len(first) == 2 * n:
                        break
            if len(first) == 2 * n:
                break
    else:
        with closing(records(src)) as recs:
            first = [r.text for r in itertools.islice(recs, 2 * n)]
    return [t for t in first if isinstance(t, str) and t.strip()][:n]
