"""Stream (id, text) records from text lines, JSONL (a field) or CSV/TSV (a column).

A record that cannot be read yields a DataError in place of its text, so bulk jobs can
write an error record and go on: every input record gives one output record.
"""
from __future__ import annotations

import csv
import io
import itertools
import os
from collections.abc import Iterator

from spanflow.data.formats.common import kind_of, parse_json, read_lines
from spanflow.errors import DataError


def input_kind(path: str) -> str:
    """How texts are read from `path`: jsonl (a field), csv/tsv (a column), else text lines."""
    kind = kind_of(path)
    return kind if kind in ("jsonl", "csv", "tsv") else "text"


def _csv_rows(path: str, delimiter: str) -> Iterator[tuple[int, list[str] | DataError]]:
    if not os.path.exists(path):
        raise DataError("file not found", path=path)
    with open(path, "rb") as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        reader = csv.reader(f, delimiter=delimiter)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise DataError(f"invalid UTF-8 near byte {e.start}", path=path, line=reader.line_num + 1) from None
            except csv.Error as e:
                yield reader.line_num, DataError(f"unreadable CSV record: {e}", path=path, line=reader.line_num)
                continue
            yield reader.line_num, row


def read_records(path: str, *, field: str = "text", column: int | None = None,
                 skip_header: bool = False) -> Iterator[tuple[str, str | DataError]]:
    """Yield (id, text-or-DataError). ids: a JSONL "id" field when present, else the line number."""
    kind = input_kind(path)
    if kind in ("csv", "tsv"):
        col = 0 if column is None else column
        for k, (lineno, row) in enumerate(_csv_rows(path, "\t" if kind == "tsv" else ",")):
            if skip_header and k == 0:
                continue
            if isinstance(row, DataError):
                yield str(lineno), row
            elif col >= len(row):
                yield str(lineno), DataError(f"record has {len(row)} columns, --column {col} asked", path=path,
                                             line=lineno)
            else:
                yield str(lineno), row[col]
        return
    for lineno, line in read_lines(path):
        if skip_header and lineno == 1:
            continue
        if kind == "text":
            yield str(lineno), line
            continue
        try:
            rec = parse_json(line, path, lineno) if line.strip() else {field: ""}
        except DataError as e:
            yield str(lineno), e
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
            yield str(lineno), DataError(f'expected an object with a string "{field}" field', path=path,
                                         line=lineno)
            continue
        yield str(rec.get("id", lineno)), rec[field]


def read_texts(path: str, *, field: str = "text", column: int | None = None, skip_header: bool = False,
               errors: str = "raise") -> Iterator[str | DataError]:
    """The texts of read_records, one item per record in input order (an empty line yields "").
    A record that cannot be read raises, or with `errors="record"` yields its DataError in its
    place, so a bulk job can write an error record and go on."""
    for _, item in read_records(path, field=field, column=column, skip_header=skip_header):
        if isinstance(item, DataError) and errors != "record":
            raise item
        yield item


def sample_texts(path: str, n: int, *, field: str = "text", column: int | None = None,
                 skip_header: bool = False) -> list[str]:
    """Up to `n` non-empty texts from the first 2n records (precision checks, tuning samples)."""
    recs = itertools.islice(read_records(path, field=field, column=column, skip_header=skip_header), 2 * n)
    return [t for _, t in recs if isinstance(t, str) and t.strip()][:n]
