"""Read pair data for embedding models: pairs, scored pairs and triplets from CSV, TSV or JSONL.

A file is one kind, found from its columns (or JSONL keys):
  2 columns                     -> pairs (anchor, positive)
  3 columns, numeric third      -> scored pairs (s1, s2, score); scores normalised to [0, 1]
  3 columns, non-numeric third  -> triplets (anchor, positive, negative)
A header row is skipped when it holds known names (sentence1,sentence2,score ...) or, for three
columns, when its third field is not a number while the next row's is.
"""
from __future__ import annotations

import csv
import io
import itertools
import logging
import math
import numbers
import os
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from spanflow.data.formats.common import (LATIN1_HINT, SURROGATE, check_unicode, jq_lines, kind_of, parse_json,
                                          read_lines)
from spanflow.data.formats.sniff import refuse_other, sniff
from spanflow.errors import ConfigError, DataError, as_path, counted, quote

log = logging.getLogger("spanflow")


@dataclass(frozen=True)
class Pair:
    """One training / evaluation example."""
    a: str                        # anchor / sentence 1
    b: str                        # positive / sentence 2
    score: float | None = None    # scored pairs: similarity, normalised to [0, 1] over the file
    negative: str | None = None   # triplets: a hard negative


SCORED = -1  # check_pairs' `least` for pairs that are evaluated: two


def check_pairs(pairs, what: str, least: int = 1) -> None:
    """A ConfigError naming the first item of `pairs` (a list of at least `least`) that is not a
    Pair of strings (a number or None for its score, a string or None for its negative)."""
    if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, (list, tuple)):
        raise ConfigError(f"{what} takes a list of Pair, got {type(pairs).__name__}")
    evaluated = least == SCORED
    if evaluated:  # a correlation over fewer than two pairs is undefined; a retrieval among one, certain
        least = 2
    for i, p in enumerate(pairs):
        if not isinstance(p, Pair):
            raise ConfigError(f"{what}[{i}] is {type(p).__name__} {quote(p, 60)}, not a Pair (read_pairs makes them, "
                              "or spanflow.Pair(a, b, score))")
        if not (isinstance(p.a, str) and isinstance(p.b, str) and (p.negative is None or isinstance(p.negative, str))
                and (p.score is None or (isinstance(p.score, numbers.Real) and not isinstance(p.score, bool)
                                         and _finite(p.score)))):
            raise ConfigError(f"{what}[{i}] ({quote(p, 80)}) needs strings for its texts and a finite number (or "
                              "None) for its score")
        blank = next((f for f, t in (("a", p.a), ("b", p.b), ("negative", p.negative)) if t is not None
                      and not t.strip()), None)
        if blank:  # as read_pairs refuses an empty field: a blank text trains on nothing but special tokens
            raise ConfigError(f"{what}[{i}].{blank} is {'empty' if not getattr(p, blank) else 'blank'}; every text "
                              "of a pair needs words")
        bad = next((m for t in (p.a, p.b, p.negative or "") for m in [SURROGATE.search(t)] if m), None)
        if bad:  # no tokenizer takes it: said here, not as a UnicodeEncodeError from inside one
            raise ConfigError(f"{what}[{i}] is not valid Unicode: a lone surrogate {bad.group()!a}")
    if len(pairs) < least:
        raise ConfigError(f"{what} holds {len(pairs)} pair{'s' * (len(pairs) != 1)}; it needs at least {least}")
    kinds = {}  # scored, with a negative, or neither: a mix would train and score as only one of them
    for i, p in enumerate(pairs):
        kinds.setdefault(_kind(p), i)
    if len(kinds) > 1:
        (first, i), (other, j) = list(kinds.items())[:2]
        raise ConfigError(f"{what} mixes {first} ({what}[{i}]) and {other} ({what}[{j}]): every pair is of one "
                          "kind: all scored, all with a negative, or all plain")
    if not evaluated:
        return
    scored = pairs[0].score is not None  # one kind, from here
    if scored and len({p.score for p in pairs}) == 1:  # no ranks to correlate
        raise ConfigError(f"{what}: every pair has the same score; a correlation (Spearman) needs scores that "
                          "vary (without the score column, the pairs are scored as retrieval: MRR@10)")
    if not scored and len({p.b for p in pairs}) < 2:
        raise ConfigError(f"{what}: every pair has the same answer; a retrieval needs at least 2 to rank")


def _kind(p: Pair) -> str:
    if p.score is not None:
        return "scored pairs with negatives" if p.negative is not None else "scored pairs"
    return "triplets" if p.negative is not None else "pairs without a score"


FIRST_NAMES = {"sentence1", "s1", "text1", "anchor", "query", "question"}
SECOND_NAMES = {"sentence2", "s2", "text2", "positive", "document", "passage", "answer", "response"}
SCORE_NAMES = {"score", "label", "similarity"}
NEGATIVE_NAMES = {"negative"}
THIRD_KEYS = ("score", "label", "similarity", "negative")  # a JSONL record's third field, tried in this order
# JSONL key pairs for the two texts, tried in this order on the first record
JSON_TEXT_KEYS = [("sentence1", "sentence2"), ("s1", "s2"), ("text1", "text2"),
                  ("anchor", "positive"), ("query", "positive")]
# what formats/sniff.py may find a pairs file to be (a wider table: with `columns`)
SNIFFED = {"pairs", "scored-pairs", "triplets", "pairs-jsonl", "table"}
TAKES = "embedding data is pairs, scored pairs or triplets in CSV, TSV or JSONL"


def read_pairs(path: str, *, columns: str | Sequence[str | int] | None = None,
               log_fn: Callable[[str], None] | None = None) -> list[Pair]:
    """Every pair in `path` (.csv, .tsv, .txt with tabs, .jsonl/.json one object a line).
    `columns` names the 2 or 3 columns to read, by index ("0,1,2", [0, 1, 2]) or by header name /
    JSONL key ("s1,s2,score", ["s1", "s2", "score"]). Any unreadable row is a DataError naming the
    file and line. `log_fn`, where given, is told in one line what was read: the kind, the columns
    or keys, whether a header row was skipped, and the scores' range."""
    path = as_path(path, "read_pairs")
    cols = _parse_columns(columns)
    if not os.path.exists(path):  # before its name's suffix is judged
        raise DataError("file not found", path=path)
    fmt = sniff(path)
    refuse_other(path, fmt, SNIFFED, TAKES + _separated(path, fmt))  # another task's data is named, not misread
    kind = kind_of(path)
    if kind in ("jsonl", "json"):
        pairs, fields, third = _read_jsonl(path, cols)
    elif kind in ("csv", "tsv", "text"):
        pairs, fields, third = _read_table(path, kind, cols)
    else:
        raise DataError("unsupported pairs file: expected .csv, .tsv, .txt, .jsonl or .json", path=path)
    if not pairs:
        raise DataError("no pairs", path=path)
    _warn_classes(path, pairs, third)
    if log_fn is not None:
        noun = {"scored pairs": "scored pair", "triplets": "triplet"}.get(_kind(pairs[0]), "pair")
        log_fn(f"read {path}: {counted(len(pairs), noun)} from {fields}{_range(pairs)}")
    return _normalise(pairs)


def _separated(path: str, fmt) -> str:
    """For a file read as plain text: the hint where its first line's fields are split by another
    separator (semicolons, bars) than CSV's or TSV's."""
    if fmt is None or fmt.name != "text":
        return ""
    lines = list(itertools.islice((t for _, t in read_lines(path) if t.strip()), 5))
    # fields: the same one or two separators on every line (prose has a semicolon here and there)
    if lines and any(len({t.count(sep) for t in lines}) == 1 and lines[0].count(sep) in (1, 2) for sep in ";|"):
        return _other_separator(path, lines[:1])
    return ""


def _range(pairs: list[Pair]) -> str:
    """How the scores are taken: their range, put on 0 to 1 (similarity)."""
    scores = [p.score for p in pairs if p.score is not None]
    if not scores:
        return ""
    lo, hi = min(scores), max(scores)
    if lo == hi:
        return f"; every score is {lo:g}, read as similarity 1"
    return f"; scores {lo:g} to {hi:g}, read as similarity 0 to 1"


def _warn_classes(path: str, pairs: list[Pair], third: str | None) -> None:
    """A warning where a third column or key named `label` read as similarity holds 0, 1 and 2
    only: NLI's classes, whose order (entailment 0, contradiction 2) is the reverse of a similarity's."""
    if (third or "").strip().lower() != "label" or {p.score for p in pairs} != {0, 1, 2}:
        return
    log.warning("%s: its label holds 0, 1 and 2 only, read as similarity (2 the most alike). If these are NLI "
                "classes (0 entailment, 1 neutral, 2 contradiction), contradictions count as the closest pairs (in "
                "training and in a score alike): "
                "keep the entailment pairs as anchor,positive (the contradictions as a third column named "
                "negative) instead", path)


def _parse_columns(columns: str | Sequence[str | int] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, (list, tuple)) and all(isinstance(c, (str, int)) and not isinstance(c, bool)
                                                  for c in columns):
        cols = [str(c).strip() for c in columns]
    elif isinstance(columns, str):
        cols = [c.strip() for c in columns.split(",")]
    else:
        cols = []
    if len(cols) not in (2, 3) or not all(cols):
        raise ConfigError(f"columns: expected 2 or 3 comma-separated names or indices, got {quote(columns)}",
                          field="columns")
    keys = [str(int(c)) if _index(c) else c for c in cols]  # "1" and "01" are one column
    twice = sorted({c for c in keys if keys.count(c) > 1})
    if twice:  # a pair of a text with itself teaches nothing; a text read as its own score fails late
        raise ConfigError(f"columns: {', '.join(twice)} named twice in {quote(columns)}: each column is "
                          "another field (first text, second text, then score or negative)", field="columns")
    return cols


def _index(col: str) -> bool:
    """Whether a --columns entry is a column index (ASCII digits: "²" is a digit to str.isdigit)."""
    return col.isascii() and col.isdigit()


def _number(value) -> float | None:
    """The finite float `value` stands for, else None (bools are not scores)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _normalise(pairs: list[Pair]) -> list[Pair]:
    scores = [p.score for p in pairs if p.score is not None]
    if not scores:
        return pairs
    lo, hi = min(scores), max(scores)
    span = hi / 2 - lo / 2  # halves: a range of -1e308 to 1e308 is no overflow
    return [replace(p, score=(p.score / 2 - lo / 2) / span if span else 1.0) for p in pairs]


def _text(value, path: str, line: int, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"empty {what}" if isinstance(value, str) or value is None
                        else f"{what} is not a string: {quote(value)}", path=path, line=line)
    check_unicode(value, path, line, what)
    return value


def _make(path: str, line: int, a, b, third, third_kind: str | None) -> Pair:
    a, b = _text(a, path, line, "first text"), _text(b, path, line, "second text")
    if third_kind == "score":
        score = _number(third)
        if score is None:
            raise DataError("score is missing" if third is None or (isinstance(third, str) and not third.strip())
                            else f"score is not a number: {quote(third)}", path=path, line=line)
        return Pair(a, b, score=score)
    if third_kind == "negative":
        return Pair(a, b, negative=_text(third, path, line, "negative"))
    return Pair(a, b)


# --- CSV / TSV -------------------------------------------------------------------------------

def _table_rows(path: str, kind: str) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields) for each non-blank record."""
    if not os.path.isfile(path):
        raise DataError("file not found" if not os.path.exists(path) else "is a directory, expected a file",
                        path=path)
    # TSV: quotes are text (STS-B has unbalanced ones); CSV: real quoting, embedded commas
    opts = {"delimiter": ",", "quoting": csv.QUOTE_MINIMAL} if kind == "csv" else \
        {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # decoded whole so the error names its own line
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise DataError(f"invalid UTF-8 at byte {e.start - line_start} of the line; {LATIN1_HINT} "
                        f"{shlex.quote(path)} > NEW", path=path, line=data.count(b"\n", 0, e.start) + 1) from None
    first = next((line for line in text.splitlines() if line.strip()), None)
    if kind == "text" and first is not None and "\t" not in first:
        raise DataError("a .txt pairs file must be tab-separated", path=path)
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), **opts)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(f"unreadable CSV record: {e}", path=path, line=start) from None
        if any(field.strip() for field in row):
            yield start, row
        start = reader.line_num + 1


def _is_known_header(row: list[str]) -> bool:
    names = [f.strip().lower() for f in row]
    return (len(names) >= 2 and names[0] in FIRST_NAMES and names[1] in SECOND_NAMES
            and (len(names) == 2 or names[2] in SCORE_NAMES | NEGATIVE_NAMES))


def _named_order(row: list[str]) -> list[int] | None:
    """The columns of a header row of known names in any order (score,sentence1,sentence2), as
    first text, second text[, score or negative]; None where the row is not such a header."""
    names = [f.strip().lower() for f in row]
    if len(names) not in (2, 3):
        return None
    roles = [FIRST_NAMES, SECOND_NAMES, SCORE_NAMES | NEGATIVE_NAMES][:len(names)]
    order = [next((i for i, n in enumerate(names) if n in role), None) for role in roles]
    return order if None not in order and len(set(order)) == len(names) else None


# what a column name looks like: short, no spaces, or a few capitalised words (Question Text; a
# text's words, the cat sat, are no name)
_NAME = re.compile(r"(?=.{1,32}$)(?:[A-Za-z_][A-Za-z0-9_.-]*|[A-Z][A-Za-z0-9_.-]*(?: [A-Z0-9][A-Za-z0-9_.-]*){1,3})")


# what a missing value is written as: a first row holding one is data, not a header
MISSING = {"n/a", "na", "nan", "null", "none", "-", "?", "--"}


def _unnamed_header(rows, fields) -> bool:
    """Whether the first row is a header of names this reader does not know: one of its `fields` is
    no number (nor empty, nor a missing value's mark) where the next row's is, and so are three
    quarters or more of the rest ("Similarity Score" over scores; a triplet's first negative over
    other texts, some of them years, is data)."""
    first, rest = rows[0][1], [r for _, r in rows[1:51]]
    for i in fields:
        head = first[i].strip() if i < len(first) else ""
        below = [r[i] for r in rest if i < len(r) and r[i].strip()]
        if (head and head.lower() not in MISSING and _number(head) is None and i < len(rest[0])
                and _number(rest[0][i]) is not None
                and 4 * sum(_number(v) is not None for v in below) >= 3 * len(below)):
            return True
    return False


def _looks_named(rows: list[list[str]]) -> bool:
    """A first row every field of which looks like a column name, where the next rows do not
    (pairs of single words are data): an unknown header, read as a pair unless said."""
    named = [all(_NAME.fullmatch(f.strip()) for f in r) for r in rows[:50]]
    return len(named) > 1 and named[0] and not any(named[1:])


def _read_table(path: str, kind: str, cols: list[str] | None) -> tuple[list[Pair], str, str | None]:
    """The pairs, which columns they were read from (as the first line of train embed says), and
    the third column's name where a header gives one."""
    rows = list(_table_rows(path, kind))
    if not rows:
        return [], "", None
    digits = [_index(c) for c in cols or []]
    if any(digits) and not all(digits):
        raise ConfigError("columns: use all indices or all names, not both", field="columns")
    by_name = cols is not None and not any(digits)
    idx = _column_indices(path, rows, cols, by_name)
    header = by_name or _is_known_header([rows[0][1][i] for i in idx if i < len(rows[0][1])])
    order = None if cols is not None or header else _named_order(rows[0][1])
    if order:  # known names in another order: each column read as its name says
        idx, header = order, True
    if not header and len(rows) > 1 and (cols is not None or len(idx) == 3):
        header = _unnamed_header(rows, range(len(rows[0][1])) if cols is not None else [2])
    picked = [[r[i] for i in idx if i < len(r)] for _, r in rows[:50]]
    if not header and _looks_named(picked):
        log.warning("%s: its first row (%s) looks like a header of names this reader does not know, and is read as "
                    "a pair; name the columns sentence1,sentence2[,score] or anchor,positive[,negative], or give "
                    "--columns by name, to skip it", path, ", ".join(picked[0]))
    data = rows[1:] if header else rows
    if not data:
        return [], "", None
    filled = data[0][1]
    if len(idx) == 3:  # the first data row with a third field decides its kind (an empty one is that row's error)
        filled = next((row for _, row in data if len(row) > idx[2] and row[idx[2]].strip()), filled)
    third_kind = _table_third_kind(rows[0][1], filled, idx, header)
    named = (len(idx) == 3 and header and len(rows[0][1]) > idx[2]
             and rows[0][1][idx[2]].strip().lower() in SCORE_NAMES | NEGATIVE_NAMES)
    if third_kind == "score" and not named:  # told from the first value, a year or a code among negatives:
        thirds = [row[idx[2]] for _, row in data if len(row) > idx[2] and row[idx[2]].strip()
                  and row[idx[2]].strip().lower() not in MISSING]  # a missing score's mark is no negative
        if 2 * sum(_number(v) is not None for v in thirds) < len(thirds):  # most text: triplets
            third_kind = "negative"
    if third_kind == "negative" and not (header and len(rows[0][1]) > idx[2]
                                         and rows[0][1][idx[2]].strip().lower() in NEGATIVE_NAMES):
        _check_negatives(path, data, idx[2])  # told from the first value: the rest may say otherwise
    width = len(rows[0][1])
    pairs = []
    for line, row in data:
        if cols is None and len(row) != width:
            raise DataError(f"record has {counted(len(row), 'column')}, the file's first has {width}{_spanning(row)}"
                            f"{_decimal_comma(row, width)}", path=path, line=line)
        if len(row) <= max(idx):
            raise DataError(f"missing column {max(idx)}: record has {counted(len(row), 'column')}{_spanning(row)}",
                            path=path, line=line)
        pairs.append(_make(path, line, row[idx[0]], row[idx[1]],
                           row[idx[2]] if len(idx) == 3 else None, third_kind))
    head = rows[0][1]
    if header:
        fields = f"its header's columns {','.join(head[i].strip() if i < len(head) else str(i) for i in idx)}"
    else:
        fields = f"columns {','.join(map(str, idx))} (counted from 0; no header row)"
    third = head[idx[2]].strip() if header and len(idx) == 3 and idx[2] < len(head) else None
    return pairs, fields, third


def _spanning(row: list[str]) -> str:
    """Why a record has too few columns where a field runs over lines: a quote never closed."""
    lines = max(field.rstrip("\n").count("\n") for field in row) + 1 if row else 1
    return (f" (a quoted field starts here and runs over {lines} lines: a quote never closed? In CSV a field that "
            'starts with " ends at the next lone "; write a quote inside one as "")') if lines > 1 else ""


def _decimal_comma(row: list[str], width: int) -> str:
    """A hint where a record has one column too many whose last two are digits: a score written
    with a decimal comma (3,8) and not quoted."""
    if len(row) != width + 1 or not (re.fullmatch(r"-?\d+", row[-2].strip()) and re.fullmatch(r"\d+", row[-1].strip())):
        return ""
    return (f" (its last two, {row[-2].strip()} and {row[-1].strip()}, look like a score with a decimal comma: "
            f"write {row[-2].strip()}.{row[-1].strip()})")


def _other_separator(path: str, first: list[str]) -> str:
    """A hint where a one-column first record is separated by something else than the reader's."""
    if len(first) != 1:
        return ""
    csv_named = os.path.splitext(path)[1].lower() == ".csv"
    # semicolons before commas: a European export separates by ";" and writes its scores 3,5
    seps = (("\t", "tabs"), (";", "semicolons"), ("|", "bars")) if csv_named else \
        ((";", "semicolons"), (",", "commas"), ("|", "bars"))
    # a separator that cuts the record into 2 or 3 fields, as a pairs file has (not a sentence's commas)
    found = [name for sep, name in seps if len(first[0].split(sep)) in (2, 3)]
    if not found:
        return ""
    kind = "comma-separated (.csv)" if csv_named else "tab-separated (.tsv or .txt)"
    fix = {"tabs": "name it .tsv", "commas": "name it .csv"}.get(found[0], "write it comma- or tab-separated")
    return f"; its fields look separated by {found[0]}, and a file named so is read as {kind}: {fix}"


def _column_indices(path: str, rows, cols: list[str] | None, by_name: bool) -> list[int]:
    line, first = rows[0]
    if cols is None:
        if len(first) not in (2, 3):
            comma = _decimal_comma(first, 3)  # a pair and an unquoted decimal-comma score: one field too many
            pick = ("; pick 2 or 3 of them with --columns (0,1,2 or header names)"
                    if len(first) > 3 and not comma else "")
            raise DataError(f"expected 2 or 3 columns, the first record has {len(first)}{comma}{pick}"
                            f"{_other_separator(path, first)}{_spanning(first)}", path=path, line=line)
        return list(range(len(first)))
    if not by_name:
        return [int(c) for c in cols]
    names = [f.strip() for f in first]
    missing = [c for c in cols if c not in names]
    if missing:
        raise DataError(f"missing column {quote(missing[0])} in the header {quote(names)}", path=path, line=line)
    return [names.index(c) for c in cols]


_DECIMAL_COMMA = re.compile(r"\s*[+-]?\d+,\d+\s*")


def _check_negatives(path: str, data, i: int) -> None:
    """A DataError where a third column read as negatives (its first value is no number) is three
    quarters numbers or more: a score column with a value that is none (a word, a decimal comma),
    which would train every pair as a triplet whose negative is a number. Hard negatives that are
    sometimes numbers (years, codes) stay triplets; a header naming the column `negative` says so."""
    thirds = [(line, row[i]) for line, row in data if len(row) > i and row[i].strip()]
    scores = sum(_number(v) is not None or bool(_DECIMAL_COMMA.fullmatch(v)) for _, v in thirds)
    if thirds and 4 * scores >= 3 * len(thirds):
        line, v = next((line, v) for line, v in thirds if _number(v) is None)
        comma = bool(_DECIMAL_COMMA.fullmatch(v))
        raise DataError(f"score is not a number: {quote(v)}"
                        + (" (a decimal comma: write scores with a point, 3.8)" if comma else "")
                        + f"; {scores} of the file's {len(thirds)} third fields read as scores, so it holds scored "
                          "pairs, not triplets (for triplets, name the third column negative in a header row)",
                        path=path, line=line)


def _table_third_kind(first: list[str], data0: list[str], idx: list[int], header: bool) -> str | None:
    if len(idx) == 2:
        return None
    if header and len(first) > idx[2]:
        name = first[idx[2]].strip().lower()
        if name in SCORE_NAMES:
            return "score"
        if name in NEGATIVE_NAMES:
            return "negative"
    # the first data row decides; a later non-numeric score is then an error
    return "score" if len(data0) > idx[2] and _number(data0[idx[2]]) is not None else "negative"


# --- JSONL -----------------------------------------------------------------------------------

def _read_jsonl(path: str, cols: list[str] | None) -> tuple[list[Pair], str, str | None]:
    """The pairs, the keys they were read from, and the third key."""
    if cols is not None and any(_index(c) for c in cols):
        raise ConfigError(f"columns: {path} is JSONL, whose columns are its keys, not indices", field="columns")
    keys: list[str] | None = cols
    third_kind: str | None = None
    pairs = []
    for line, text in read_lines(path):
        if not text.strip():
            continue
        if not pairs and text.lstrip("\ufeff \t").startswith("["):  # a JSON list, pretty-printed or on one line
            raise DataError(f"is one JSON list; pair files are JSONL, one object a line (convert it with "
                            f"{jq_lines(path)})", path=path, line=line)
        rec = parse_json(text, path, line)
        if not isinstance(rec, dict):
            raise DataError(f"expected a JSON object, got {type(rec).__name__}", path=path, line=line)
        if not pairs:
            keys = keys or _json_keys(rec, path, line)
            third_kind = _json_third_kind(rec, keys)
            first = line
        elif cols is None:  # the first record set the keys: another third one here would be dropped
            extra = next((k for k in THIRD_KEYS if k in rec and k not in keys), None)
            if extra:
                raise DataError(f"record has a {quote(extra)} key that the first record (line {first}) lacks: give "
                                "every record the same keys, or pick them with --columns", path=path, line=line)
        missing = [k for k in keys if k not in rec]
        if missing:
            raise DataError(f"record has no {quote(missing[0])} key", path=path, line=line)
        pairs.append(_make(path, line, rec[keys[0]], rec[keys[1]],
                           rec[keys[2]] if len(keys) == 3 else None, third_kind))
    return pairs, f"the keys {','.join(keys or [])}", keys[2] if keys and len(keys) == 3 else None


def _json_keys(rec: dict, path: str, line: int) -> list[str]:
    for a, b in JSON_TEXT_KEYS:
        if a in rec and b in rec:
            thirds = [k for k in THIRD_KEYS if k in rec]
            if len(thirds) > 1:  # a pair is scored or has a negative: reading one would drop the other unsaid
                raise DataError(f"record has both {' and '.join(map(quote, thirds))}: a pair has one third field "
                                f"(a score or a negative); pick the keys with --columns (e.g. {a},{b},{thirds[0]})",
                                path=path, line=line)
            unread = [k for k, v in rec.items() if k not in (a, b, *thirds) and isinstance(v, (str, int, float, list))
                      and not isinstance(v, bool) and k.lower() not in ("id", "_id", "idx", "guid")]
            if unread and not thirds:  # a third field under another name (hard_negative, sim) dropped unsaid
                log.warning("%s:%d: the key(s) %s are not read: a pair's third field is read as %s (--columns "
                            "names another, e.g. --columns %s,%s,%s)", path, line, ", ".join(map(quote, unread)),
                            "/".join(THIRD_KEYS), a, b, unread[0])
            return [a, b] + thirds
    texts = [k for k, v in rec.items() if isinstance(v, str)]
    pick = f"; or name yours with --columns (e.g. {','.join(texts[:2])})" if len(texts) >= 2 else ""
    raise DataError(f"expected keys sentence1/sentence2[/score], s1/s2, text1/text2, anchor/positive"
                    f"[/negative] or query/positive[/negative]; got {quote(sorted(rec))}{pick}", path=path, line=line)


def _json_third_kind(rec: dict, keys: list[str]) -> str | None:
    if len(keys) == 2:
        return None
    if keys[2] in SCORE_NAMES:
        return "score"
    if keys[2] in NEGATIVE_NAMES:
        return "negative"
    return "score" if _number(rec.get(keys[2])) is not None else "negative"


def _finite(x) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False
