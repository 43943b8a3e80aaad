"""Stream (id, text) records from text lines, JSONL (a field) or CSV/TSV (a column).

A record that cannot be read yields a DataError in place of its text, so bulk jobs can
write an error record and go on: every input record gives one output record.
"""
from __future__ import annotations

import csv
import io
import itertools
import os
import re
from collections.abc import Iterator

from spanflow.data.formats.common import kind_of, parse_json, read_lines_or_errors
from spanflow.errors import DataError


def input_kind(path: str) -> str:
    """How texts are read from `path`: jsonl (a field), csv/tsv (a column), else text lines."""
    kind = kind_of(path)
    return kind if kind in ("jsonl", "csv", "tsv") else "text"


# errors="surrogateescape" turns each invalid byte into one of these lone surrogates, which
# valid UTF-8 can never produce: the file reads on, and the rows that held one are known
_ESCAPED = re.compile("[\udc80-\udcff]")
# a JSON string can still spell a lone surrogate (an escape such as \ud800): no character, so no tokenizer
# takes it and no UTF-8 output can hold it
_SURROGATE = re.compile("[\ud800-\udfff]")


def _invalid_utf8(row: list[str]) -> str | None:
    """Where the first invalid UTF-8 byte of a row is, or None when the row is clean."""
    for i, cell in enumerate(row):
        m = _ESCAPED.search(cell)
        if m:
            at = len(cell[:m.start()].encode("utf-8", "surrogateescape"))
            return f"invalid UTF-8 at byte {at} of column {i}"
    return None


def _json_record(line: str, path: str, lineno: int, field: str) -> tuple[str, str | DataError]:
    """(id, the `field` string) of one JSONL line, or (line number, why there is none); a
    blank line is the empty text."""
    try:
        rec = parse_json(line, path, lineno) if line.strip() else {field: ""}
    except DataError as e:
        return str(lineno), e
    if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
        return str(lineno), DataError(f'expected an object with a string "{field}" field', path=path, line=lineno)
    m = _SURROGATE.search(rec[field])
    if m:
        return str(lineno), DataError(f'"{field}" holds a lone surrogate {m.group()!a} at character '
                                      f"{m.start()}, not a character", path=path, line=lineno)
    return str(rec.get("id", lineno)), rec[field]


def _csv_rows(path: str, delimiter: str) -> Iterator[tuple[int, list[str] | DataError]]:
    if not os.path.exists(path):
        raise DataError("file not found", path=path)
    with open(path, "rb") as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
        reader = csv.reader(f, delimiter=delimiter)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield reader.line_num, DataError(f"unreadable CSV record: {e}", path=path, line=reader.line_num)
                continue
            bad = _invalid_utf8(row)
            yield reader.line_num, DataError(bad, path=path, line=reader.line_num) if bad else row


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
    for lineno, line in read_lines_or_errors(path):
        if skip_header and lineno == 1:
            continue
        if kind == "text" or isinstance(line, DataError):
            yield str(lineno), line
            continue
        yield _json_record(line, path, lineno, field)


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
