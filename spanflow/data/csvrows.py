"""CSV/TSV records as rows of cells, each record that cannot be read a DataError in its place:
invalid UTF-8 in a cell, or a quote never closed, after which the lines are read again one by
one so that it costs one record, not the rest of the file."""
from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterator

from spanflow.data.formats.common import MAGIC_BYTES, refuse_stream, refuse_wide
from spanflow.errors import DataError

# a quoted field may hold a long document (csv's own limit is 128 Ki characters); one past this is taken for
# a quote never closed, and its lines are read again one by one
FIELD_LIMIT = 16 << 20
csv.field_size_limit(max(csv.field_size_limit(), FIELD_LIMIT))  # once, for every reader of the process


# errors="surrogateescape" turns each invalid byte into one of these lone surrogates, which
# valid UTF-8 can never produce: the file reads on, and the rows that held one are known
_ESCAPED = re.compile("[\udc80-\udcff]")


def csv_rows(path: str, delimiter: str) -> Iterator[tuple[int, list[str] | DataError]]:
    """(line, row or DataError) of each CSV/TSV record, `line` the record's last line. A quote that
    is never closed would take every line after it into one field (to the file's end, or until
    the field outgrows FIELD_LIMIT): that record is an error naming the line it opened on, and the
    lines after that one are read again as records of their own."""
    if not os.path.exists(path):
        raise DataError("file not found", path=path)
    refuse_stream(path)
    with open(path, "rb") as raw:
        refuse_wide(raw.read(MAGIC_BYTES), path)  # UTF-16 would read as rows of NULs
        raw.seek(0)
        # utf-8-sig: a byte-order mark is no part of the first cell (a header's name)
        f = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        replay: list[str] = []  # lines to read again, after a record that could not be closed
        first = 1  # the line the next record starts on
        while True:
            taken: list[str] = []  # the lines the reader has taken since the last record
            ended = [False]
            reader = csv.reader(_lines(replay, f, taken, ended), delimiter=delimiter)
            replay = []
            for row, error in _csv_reads(reader):
                # a row that came after the file's end: the reader asks past the last line only from
                # inside a quoted field
                unclosed = error is None and ended[0]
                if unclosed:
                    error = "unexpected end of data"
                if error is not None and (len(taken) > 1 or unclosed):  # to the end, or past the limit
                    yield first, DataError(f"unreadable CSV record: a quoted field opened on this line is never "
                                           f"closed ({error}); the lines after it are read on their own",
                                           path=path, line=first)
                    replay, first = taken[1:], first + 1
                    break
                line = first + len(taken) - 1
                if error is not None:
                    yield line, DataError(f"unreadable CSV record: {error}", path=path, line=line)
                else:
                    bad = _invalid_utf8(row)
                    yield line, DataError(bad, path=path, line=line) if bad else row
                first += len(taken)
                taken.clear()
            else:
                return


def _lines(replay: list[str], f, taken: list[str], ended: list[bool]) -> Iterator[str]:
    """The lines to read again, then the file's; each also appended to `taken`, and `ended` set once
    the file has no more."""
    for line in replay:
        taken.append(line)
        yield line
    for line in f:
        taken.append(line)
        yield line
    ended[0] = True


def _csv_reads(reader) -> Iterator[tuple[list[str] | None, str | None]]:
    """(row, None) or (None, csv's error) for each record of `reader`."""
    while True:
        try:
            yield next(reader), None
        except StopIteration:
            return
        except csv.Error as e:
            yield None, str(e)


def _invalid_utf8(row: list[str]) -> str | None:
    """Where the first invalid UTF-8 byte of a row is, or None when the row is clean."""
    for i, cell in enumerate(row):
        m = _ESCAPED.search(cell)
        if m:
            at = len(cell[:m.start()].encode("utf-8", "surrogateescape"))
            return f"invalid UTF-8 at byte {at} of column {i}"
    return None
