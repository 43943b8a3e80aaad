"""Stream (id, text) records from text lines, JSONL (a field), CSV/TSV (a column) or
Parquet/Arrow tables (a column; read in spanflow.data.tables).

A record that cannot be read yields a DataError in place of its text, so bulk jobs can
write an error record and go on: every input record gives one output record.
"""
from __future__ import annotations

import itertools
import json
import logging
import numbers
import os
from collections.abc import Iterator, Sequence

from spanflow.data.formats.common import (SURROGATE, check_exists, error_record, jq_lines, kind_of, parse_json,
                                         read_lines_or_errors)
from spanflow.data.csvrows import csv_rows
from spanflow.data.tables import TableRecord, check_unique, is_table, read_table_records
from spanflow.errors import ConfigError, DataError, as_path, counted, quote

log = logging.getLogger("spanflow")
_MIXED_SAID: set[str] = set()  # inputs whose mix of ids and line numbers was said (a job reads some twice)
_HEADER_SAID: set[str] = set()  # CSV/TSV inputs whose header-like first row was said
HEADER_WORDS = ("text", "texts", "sentence", "sentences", "document", "content")  # a first cell that names a column


def input_kind(path: str) -> str:
    """How texts are read from `path`: jsonl (a field), csv/tsv (a column), else text lines. A
    .json file of one object a line is JSONL; one JSON list is a DataError (no job reads a list
    whole: a bulk job streams its records)."""
    kind = kind_of(path)
    if kind == "json":
        return _json_kind(path)
    return kind if kind in ("jsonl", "csv", "tsv") else "text"


def text_place(path: str, field: str, column: int | str | None) -> tuple[str, int | str | None]:
    """(field, column) as the texts of `path` are read, one way for each way of saying it: a
    JSONL field or table column named by --column is that --field; a CSV/TSV's default column is 0;
    text lines read neither. A resumed job compares these, not the flags as typed."""
    if is_table(path):  # a column by name: digits too (--column 2021 names the column "2021")
        return (field if column is None else str(column)), None
    kind = input_kind(path) if os.path.exists(path) else "text"
    if kind == "jsonl":
        return (column if isinstance(column, str) else field), None
    if kind in ("csv", "tsv"):  # a field other than "text" names a header
        return "text", (column if column is not None else field if field != "text" else 0)
    return "text", None


def _json_kind(path: str) -> str:
    """jsonl for a .json file that opens with an object; a DataError for one that opens a list;
    text lines otherwise (as any other file, and a pipe, whose first bytes read here would be gone)."""
    if not os.path.isfile(path):
        return "text"
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    except OSError:
        return "text"  # the reader names what is wrong with the file
    if head.startswith("["):
        raise DataError(f"is one JSON list; predict and embed read JSONL, one object a line (convert it with "
                        f"{jq_lines(path)})", path=path)
    return "jsonl" if head.startswith("{") else "text"


def _id_text(value) -> str | None:
    """A JSONL id as the string an id holds: strings as they are, others as JSON."""
    return value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _json_record(line: str, path: str, lineno: int, field: str, id_column: str | None = None,
                 keep: Sequence[str] = (), ids: list[int] | None = None) -> TableRecord:
    """(id, the `field` string, kept fields) of one JSONL line, or (id, why there is none, kept
    fields); a blank line is the empty text. The id is the `id_column` field, which a record
    must then have (else it is an error record), or else its "id" field, else the line
    number; ids are strings (others as JSON); kept values are as JSON holds them, None where
    the record lacks the field. With `id_column`, a record whose id cannot be read has the id None, never
    a line number that could pass for an id."""
    unknown = None if id_column is not None else str(lineno)
    try:
        rec = parse_json(line, path, lineno) if line.strip() else {field: ""}
    except DataError as e:
        return TableRecord(unknown, e, (None,) * len(keep))
    if not isinstance(rec, dict):
        return TableRecord(unknown, DataError(f'expected an object with a string "{field}" field', path=path,
                                              line=lineno), (None,) * len(keep))
    rid = rec.get(id_column or "id")
    if ids is not None and id_column is None:  # counted: a mix of both is said (_line_records)
        ids[rid is None] += 1
    rid = unknown if rid is None else _id_text(rid)
    kept = tuple(rec.get(k) for k in keep)  # as JSON holds them: a JSONL output keeps them so (tables.py: Parquet's)
    if not isinstance(rec.get(field), str):
        why = error_record(rec, path) if field == "text" else ""
        return TableRecord(rid, DataError(f'expected an object with a string "{field}" field{why or _others(rec, field)}',
                                          path=path, line=lineno), kept)
    if rid is None:
        what = "is null" if id_column in rec else "is missing"
        return TableRecord(None, DataError(f'its id field "{id_column}" (--id-column) {what}', path=path,
                                           line=lineno), kept)
    m = SURROGATE.search(rec[field])
    if m:
        return TableRecord(rid, DataError(f'"{field}" holds a lone surrogate {m.group()!a} at character '
                                          f"{m.start()}, not a character", path=path, line=lineno), kept)
    return TableRecord(rid, rec[field], kept)


def _others(rec: dict, field: str) -> str:
    """What the record's `field` holds where it is no string, or the string fields it has instead
    of `field`, for a record that lacks it."""
    if field in rec:
        v = rec[field]
        shown = json.dumps(v, ensure_ascii=False)
        return "; it holds null" if v is None else \
            f"; it holds {_value_kind(v)}, {shown if len(shown) <= 40 else shown[:37] + '...'}"
    names = [k for k, v in rec.items() if isinstance(v, str)]
    if not names:
        return ""
    shown = ", ".join(f'"{k}"' for k in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"; it has {shown} (--field names the one to read)"


Column = int | str  # a 0-based CSV/TSV index, or a column name (a table's, a CSV/TSV header's)


def read_rows(path: str, *, field: str = "text", column: Column | None = None, skip_header: bool = False,
              id_column: str | None = None, keep: Sequence[str] = (), sample: bool = False,
              ids: bool = True) -> Iterator[TableRecord]:
    """Yield (id, text-or-DataError, kept values) for every record of `path`.

    Parquet/Arrow (tables.is_table): the `column` (else `field`) column, by name; ids from
    `id_column`, else the row number from 0. CSV/TSV: the `column` index or header name (else a
    `field` other than "text", as a header name; a name, or any `id_column`/`keep`, means the
    first row is the header and is skipped); ids
    from `id_column`, else the line number. JSONL: the `field` field (a `column` name is that
    field too); ids from the `id_column` field, else an "id" field, else the line number;
    kept values as JSON holds them. Text lines have no columns. `sample`: a read of a few texts
    (a precision check's, a budget's), which says nothing of the file's ids (the job's read does);
    nor does a read whose caller writes no `ids` (a JSONL output without --id-column, read_texts).

    Raised here, before the first record is read, each as one ConfigError: a column the file
    does not have (tables; CSV/TSV headers), a table's text column that is not strings, a kept
    column named twice, a column asked of text lines or a CSV index asked of JSONL. What
    differs from record to record is that record's DataError (the job writes an error record
    and goes on): a missing or null text, and with `id_column` a record without an id (a JSONL
    record without the field, a CSV row without the column); a kept field or cell that a
    record lacks is None.
    """
    check_unique(keep)
    if column is not None and (isinstance(column, bool) or not isinstance(column, (numbers.Integral, str))):
        raise ConfigError(f"column takes a column's index or name, got {type(column).__name__} {quote(column, 40)}",
                          field="column")
    column = int(column) if isinstance(column, numbers.Integral) else column  # numpy's too
    if is_table(path):
        return read_table_records(path, column=field if column is None else column, id_column=id_column,
                                  keep=keep, flag="--field" if column is None else "--column")
    kind = input_kind(path)
    if kind in ("csv", "tsv"):  # a field named (not the default) is a header name, as it is a table's column
        by_field = column is None and field != "text"
        return _csv_records(path, "\t" if kind == "tsv" else ",", field if by_field else column, skip_header,
                            id_column, keep, flag="--field" if by_field else "--column")
    if kind == "text" and (column is not None or id_column is not None or keep or field != "text"):
        flag = ("--column" if column is not None else "--id-column" if id_column is not None
                else "--keep-columns" if keep else f"--field {field}")  # a field asked of lines that have none
        raise ConfigError(f"{flag}: {path} is plain text lines, with no columns; use JSONL, CSV/TSV or Parquet")
    if isinstance(column, int):
        raise ConfigError(f"--column {column}: {path} is JSONL, whose records have fields, not numbered columns; "
                          "name the text's field (--field NAME)")
    return _line_records(path, kind, field if column is None else column, skip_header, id_column, keep,
                         sample or not ids)


def _value_kind(value) -> str:
    """A JSON value's kind as a message names it: a number, a boolean, an object, an array."""
    return ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "an object" if isinstance(value, dict) else "an array" if isinstance(value, list)
            else type(value).__name__)


def _line_records(path: str, kind: str, field: str, skip_header: bool, id_column: str | None,
                  keep: Sequence[str], sample: bool = False) -> Iterator[TableRecord]:
    ids = [0, 0]  # JSONL records with an "id" of their own, and numbered by their line
    for lineno, line in read_lines_or_errors(path):
        if skip_header and lineno == 1:
            continue
        if kind == "text" or isinstance(line, DataError):
            yield TableRecord(str(lineno), line, (None,) * len(keep))
            continue
        yield _json_record(line, path, lineno, field, id_column, keep, ids)
    if all(ids) and not sample and path not in _MIXED_SAID:
        _MIXED_SAID.add(path)
        log.warning("%s: %s an \"id\" and %d %s none, whose id is their line number: an id of one may equal a "
                    "line number of another; name the id field with --id-column (a record without it is then an "
                    "error record)", path, f"{counted(ids[0], 'record')} {'has' if ids[0] == 1 else 'have'}",
                    ids[1], "has" if ids[1] == 1 else "have")


def _header(path: str, delimiter: str) -> list[str]:
    for lineno, row in csv_rows(path, delimiter):
        if isinstance(row, DataError):
            raise ConfigError(f"{path}: its header row is unreadable ({row.reason})")
        return row
    raise ConfigError(f"{path} is empty: no header row to find columns by name in")


def check_header_column(path: str, name: str, flag: str) -> None:
    """A ConfigError naming `flag` where the CSV/TSV `path`'s header has no column `name`."""
    _index(_header(path, "\t" if input_kind(path) == "tsv" else ","), name, flag, path)


def _index(header: list[str] | None, column: Column, flag: str, path: str) -> int:
    if isinstance(column, int):
        return column
    if column not in header:
        raise ConfigError(f"{flag} {column}: {path} has no such column in its header; it has {', '.join(header)}")
    return header.index(column)


def _csv_records(path: str, delimiter: str, column: Column | None, skip_header: bool, id_column: str | None,
                 keep: Sequence[str], flag: str = "--column") -> Iterator[TableRecord]:
    named = isinstance(column, str) or id_column is not None or bool(keep)
    header = _header(path, delimiter) if named else None
    col = _index(header, 0 if column is None else column, flag, path)
    ident = None if id_column is None else _index(header, id_column, "--id-column", path)
    kept = [_index(header, k, "--keep-columns", path) for k in keep]
    if header is None and col > 0:  # a column the file's rows do not reach: each would be an error record
        first = next((row for _, row in csv_rows(path, delimiter) if not isinstance(row, DataError)), None)
        if first is not None and col >= len(first):
            raise ConfigError(f"--column {col}: the first row of {path} has {len(first)} columns, numbered from 0")
    asked = f"--column {col}" if not isinstance(column, str) else f"{flag} {column} (column {col})"
    return _csv_cells(path, delimiter, (asked, col), (id_column, ident), kept, skip_header or named)


def _say_header(path: str, col: int, cell: str) -> None:
    if path not in _HEADER_SAID:
        _HEADER_SAID.add(path)
        log.warning("%s: its first row reads %s in column %d, which looks like a header; it is read as a record "
                    "(--skip-header skips it, --column %s reads the column by that name)", path, quote(cell, 40), col,
                    cell.strip())


def _csv_cells(path: str, delimiter: str, text: tuple[str, int], ident: tuple[str | None, int | None],
               kept: list[int], skip_header: bool) -> Iterator[TableRecord]:
    """The records of the rows; `text`: the text column as asked, and its index; `ident`: the id
    column's (name, index), or (None, None)."""
    (asked, col), (name, at) = text, ident
    for k, (lineno, row) in enumerate(csv_rows(path, delimiter)):
        if skip_header and k == 0:
            continue
        if k == 0 and isinstance(row, list) and col < len(row) and row[col].strip().lower() in HEADER_WORDS:
            _say_header(path, col, row[col])
        if isinstance(row, DataError):
            yield TableRecord(str(lineno) if at is None else None, row, (None,) * len(kept))
            continue
        values = tuple(row[i] if i < len(row) else None for i in kept)
        if at is not None and at >= len(row):  # its id unknown: None, never a line number that could pass for one
            yield TableRecord(None, DataError(f"record has {counted(len(row), 'column')}, its id (--id-column {name}) "
                                                     f"is column {at}", path=path, line=lineno), values)
            continue
        rid = row[at] if at is not None else str(lineno)
        if col >= len(row):
            yield TableRecord(rid, DataError(f"record has {counted(len(row), 'column')}, {asked} asked", path=path,
                                             line=lineno), values)
        else:
            yield TableRecord(rid, row[col], values)


def read_records(path: str, *, field: str = "text", column: Column | None = None, skip_header: bool = False,
                 id_column: str | None = None, ids: bool = True) -> Iterator[tuple[str, str | DataError]]:
    """Yield (id, text-or-DataError) of read_rows, the id as a string (`ids`: read_rows's)."""
    for rid, text, _ in read_rows(path, field=field, column=column, skip_header=skip_header, id_column=id_column,
                                  ids=ids):
        yield str(rid), text


def read_texts(path: str, *, field: str | None = None, column: Column | None = None, skip_header: bool = False,
               errors: str = "raise") -> Iterator[str | DataError]:
    """The texts of read_records, one item per record in input order (an empty line yields "").
    `field`: a JSONL field (None: "text"), or on CSV/TSV its header's column, "text" too, as
    `predict --field` reads it (None: column 0). A record that cannot be read raises, or with
    `errors="record"` yields its DataError in its place, so a bulk job can write an error record
    and go on. The path (that it names a file), `errors` and a named CSV column are checked at
    the call, the records as they are read."""
    path = as_path(path, "read_texts")
    check_exists(path)
    if errors not in ("raise", "record"):
        raise ConfigError(f"read_texts: errors must be 'raise' or 'record', got {quote(errors, 40)}", field="errors")
    if field is not None and column is None and os.path.isfile(path) and input_kind(path) in ("csv", "tsv"):
        check_header_column(path, field, "field")
        field, column = None, field
    return _texts(read_records(path, field=field or "text", column=column, skip_header=skip_header, ids=False),
                  errors == "record")


def _texts(records: Iterator[tuple[str, str | DataError]], keep_errors: bool) -> Iterator[str | DataError]:
    for _, item in records:
        if isinstance(item, DataError) and not keep_errors:
            raise item
        yield item


def sample_texts(path: str, n: int, *, field: str = "text", column: Column | None = None,
                 skip_header: bool = False) -> list[str]:
    """Up to `n` non-empty texts from the first 2n records (precision checks, tuning samples)."""
    recs = itertools.islice(read_rows(path, field=field, column=column, skip_header=skip_header, sample=True), 2 * n)
    return [r.text for r in recs if isinstance(r.text, str) and r.text.strip()][:n]


# sniffed kinds of labelled data, which a task reads whole (formats/sniff.py)
LABELLED = ("conll", "ner-jsonl", "docbin", "casrel", "re-jsonl", "casrel-lines", "json-spans")


def unlabelled_sample(path: str, n: int, *, field: str = "text", column: Column | None = None,
                      infer: bool = False) -> list[str] | None:
    """sample_texts of `path` when it can hold only texts to run, no labels (a Parquet/Arrow
    table; for inference (`infer`), plain text lines, JSONL texts or CSV/TSV too, which tune measures speed
    on without a quality column; any file whose texts are named by a `field` or `column` given);
    None for any other file, which a task reads as its labelled data."""
    from spanflow.data.formats.sniff import sniff

    named = field != "text" or column is not None  # the user said where the texts are: no labels are read
    kind = sniff(path)
    if named and getattr(kind, "name", None) in LABELLED:  # its lines are tokens and tags, not texts
        flag = f"--column {column}" if column is not None else f"--field {field}"
        raise ConfigError(f"{flag} names the texts of a file of texts; {path} is {kind.what}, labelled data read "
                          "whole: drop it")
    name = getattr(kind, "name", None)
    # a .txt the sniffer cannot place (prose whose every line has a comma) is text lines, as predict reads it
    texts_kind = (name in ("text", "texts-jsonl") or kind_of(path) in ("csv", "tsv")
                  or (kind_of(path) == "text" and name not in LABELLED))
    if not (is_table(path) or named or (infer and texts_kind)):  # a CSV/TSV's column 0, as predict reads it
        return None
    recs = list(itertools.islice(read_rows(path, field=field, column=column, sample=True), 2 * n))
    texts = [r.text for r in recs if isinstance(r.text, str) and r.text.strip()][:n]
    if not texts:  # a sample of nothing measures nothing
        why = next((r.text for r in recs if isinstance(r.text, DataError)), None)
        raise ConfigError(f"{path}: no usable records to tune on" + (f"; the first error: {why}" if why else ""))
    return texts
