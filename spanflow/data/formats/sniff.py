"""What a data file holds, told from its first bytes rather than its name: the readers ask
`sniff` before reading, so that data for another task (CasRel JSON given to `train ner`, a
CoNLL file given to a relation model) is named as what it is, with the commands that read
it, instead of failing deep in the wrong parser.

`sniff` answers only when the head of the file leaves no doubt; otherwise it returns None
and the reader's own line-by-line errors apply.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import zlib
from dataclasses import dataclass

from spanflow.data.formats.common import is_cjk, jq_lines, refuse_wide, unspaced
from spanflow.data.schemes import split_tag
from spanflow.errors import DataError

HEAD_BYTES = 64 * 1024
LIST_BYTES = 8 * 1024 * 1024  # a JSON list whose first record's keys lie past HEAD_BYTES (a long first text)
SAMPLE_LINES = 50

# what each kind of data is for, named in messages
USES = {
    "ner": "NER data ('spanflow train ner'; evaluate with a NER model)",
    "re": "relation data ('spanflow train re'; evaluate with a relation model)",
    "embed": "embedding pairs ('spanflow train embed'; evaluate with an embedding model)",
    "texts": "texts to run a model on ('spanflow predict' or 'spanflow embed' --input)",
}


@dataclass(frozen=True)
class Format:
    """A kind of file: its name, how a message describes it, and what it is for (a USES key, or
    the words themselves)."""

    name: str
    what: str
    use: str


FORMATS = {f.name: f for f in [
    Format("conll", "CoNLL columns (a token and its tag per line)", "ner"),
    Format("ner-jsonl", 'JSONL spans (one {"text", "entities"} object a line)', "ner"),
    Format("docbin", "a spaCy DocBin", "ner"),
    Format("casrel", 'CasRel JSON (a list of {"text", "triple_list"} records)', "re"),
    Format("re-jsonl", 'JSONL relations (one {"text", "relations"} object a line)', "re"),
    Format("casrel-lines", 'CasRel records one a line (JSONL with "triple_list")',
           "relation data, which spanflow reads as CasRel JSON: one JSON list of these records"),
    Format("json-spans", 'a JSON list of {"text", "entities"} records',
           "NER spans, which spanflow reads as JSONL: one object a line, not a list"),
    Format("scored-pairs", "scored pairs (sentence, sentence, score)", "embed"),
    Format("pairs", "pairs (two texts a row)", "embed"),
    Format("triplets", "triplets (anchor, positive, negative)", "embed"),
    Format("pairs-jsonl", 'JSONL pairs ({"sentence1", "sentence2"}, {"anchor", "positive"} ...)', "embed"),
    Format("table", "a table", "embed"),
    Format("texts-jsonl", 'JSONL texts (one {"text"} object a line, nothing labelled)', "texts"),
    Format("text", "plain text lines", "texts"),
    Format("parquet", "a Parquet table", "texts"),
    Format("arrow", "an Arrow IPC file", "texts"),
]}

PAIR_KEYS = [("sentence1", "sentence2"), ("s1", "s2"), ("text1", "text2"), ("anchor", "positive"),
             ("query", "positive")]
_ZLIB = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")  # a DocBin is zlib-compressed msgpack
_KEY = re.compile(r'"((?:[^"\\]|\\.){1,40})"\s*:')


def _head(path: str, size: int = HEAD_BYTES) -> bytes | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None  # the reader reports it, naming what it was doing


def _binary(head: bytes) -> bool:
    """Whether `head` holds control bytes no text has (compressed data is full of them; a Latin-1
    text that opens with `x^` has none): more than 1 in 100 below 0x20, tab and line breaks aside."""
    controls = sum(1 for b in head if b < 0x20 and b not in (9, 10, 12, 13))
    return controls > len(head) // 100


def _inflates(head: bytes) -> bool:
    try:
        zlib.decompressobj().decompress(head[:4096])
    except zlib.error:
        return False
    return True


def sniff(path: str | os.PathLike) -> Format | None:
    """The format of the file at `path` from its first 64 KiB, or None when unsure (or unreadable);
    a DataError for text in UTF-16 or UTF-32, which no reader takes (common.refuse_wide)."""
    head = _head(os.fspath(path))
    if not head:
        return None
    if head.startswith(b"PAR1"):
        return FORMATS["parquet"]
    if head.startswith((b"ARROW1", b"\xff\xff\xff\xff")):
        return FORMATS["arrow"]
    if head.startswith(_ZLIB) and (_inflates(head) or _binary(head)):  # a damaged DocBin is still no text
        return FORMATS["docbin"]
    refuse_wide(head, os.fspath(path), nuls=True)  # no binary format above: NULs mean wide text
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    lines = text.splitlines()
    if len(head) == HEAD_BYTES and len(lines) > 1:
        lines = lines[:-1]  # cut off mid-line
    lines = [line for line in lines if line.strip()][:SAMPLE_LINES]
    if not lines:
        return None
    start = lines[0].lstrip()
    if start.startswith("["):
        found = _json_list(text)
        if found is None and len(head) == HEAD_BYTES:  # the first record's keys may come after its long text
            more = _head(os.fspath(path), LIST_BYTES)
            found = _json_list(more.decode("utf-8", errors="replace")) if more else None
        return found
    if start.startswith("{"):
        return _jsonl(lines)
    return _columns(lines)


def _json_list(text: str) -> Format | None:
    keys = set(_KEY.findall(text))
    if "triple_list" in keys:
        return FORMATS["casrel"]
    if "text" in keys and keys & {"entities", "spans"}:
        return FORMATS["json-spans"]
    return None


def _jsonl(lines: list[str]) -> Format | None:
    keys: set[str] = set()
    for line in lines[:20]:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            keys |= set(rec)
    if not keys:
        return None
    if "triple_list" in keys:
        return FORMATS["casrel-lines"]
    spans, relations = bool(keys & {"entities", "spans"}), "relations" in keys
    if spans != relations:
        return FORMATS["ner-jsonl" if spans else "re-jsonl"]
    if spans:
        return None  # both: joint data, for either reader to take
    if any(a in keys and b in keys for a, b in PAIR_KEYS):
        return FORMATS["pairs-jsonl"]
    return FORMATS["texts-jsonl"] if "text" in keys else None


def _tagged(line: str) -> bool:
    """A CoNLL line: a token, maybe more columns, and a tag (O, B-X, I-X, ...) last."""
    line = line.rstrip()  # as the reader: a tab after the last column ends it
    cols = line.split("\t") if "\t" in line else line.split()
    return cols[0] == "-DOCSTART-" or (len(cols) >= 2 and split_tag(cols[-1].strip())[0] != "?")


def _columns(lines: list[str]) -> Format | None:
    tagged = sum(_tagged(line) for line in lines)
    if tagged >= 0.9 * len(lines):
        return FORMATS["conll"]
    if tagged > 0.1 * len(lines):
        return None
    table = _table(lines)
    if table is not None:
        return table
    if all("\t" in line for line in lines) or all("," in line for line in lines):
        return None  # columns (of tokens, short cells, or rows missing a cell): not for a guess
    if len(lines) >= 2 and sum(map(_sentence, lines)) >= 0.6 * len(lines):
        return FORMATS["text"]
    return None


def _sentence(line: str) -> bool:
    """A line that reads as a sentence: three words or more, or, in a script written without spaces
    (Chinese, Japanese), three characters of it."""
    return len(line.split()) >= 3 or sum(map(unspaced, line)) >= 3


def _table(lines: list[str]) -> Format | None:
    """Rows of two or more columns of one width, split by tabs or commas, their first cells sentences
    (a row of another width here and there is the reader's to name, with its line)."""
    for delimiter, name in (("\t", "TSV"), (",", "CSV")):
        quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        lined = sum(delimiter in line for line in lines) >= 0.8 * len(lines)
        if not lined and delimiter == "\t":
            continue
        try:  # lines short of the delimiter: quoted CSV fields over several lines, if they parse strictly as such
            rows = list(csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter, quoting=quoting,
                                   strict=not lined))
        except csv.Error:
            if not lined:  # prose whose quotes run over lines ('"Come here\nnow," she said'): not a table
                continue
            return None
        if not lined and sum(len(r) >= 2 for r in rows) < 0.8 * len(rows):
            continue
        width = max(set(map(len, rows)), key=[len(r) for r in rows].count)
        if width < 2 or sum(len(r) == width for r in rows) < 0.8 * len(rows):
            return None
        if sum(_sentence(r[0]) for r in rows) < 0.5 * len(rows):
            return None
        return _table_kind(rows, width, name)
    return None


def _sentence(cell: str) -> bool:
    """A cell that holds a text, not one token (a CoNLL file's columns hold tokens)."""
    cell = cell.strip()
    return " " in cell or len(cell) >= 12 or (len(cell) >= 4 and any(map(is_cjk, cell)))


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _table_kind(rows: list[list[str]], width: int, name: str) -> Format:
    body = rows[1:] if len(rows) > 1 else rows  # a header row, when there is one, is not data
    if width == 2:
        kind = FORMATS["pairs"]
    elif width == 3 and sum(_number(r[2]) for r in body if len(r) == 3) >= 0.8 * len(body):
        kind = FORMATS["scored-pairs"]
    elif width == 3:
        kind = FORMATS["triplets"]
    else:
        return Format("table", f"a {name} table of {width} columns", "embed")
    return Format(kind.name, f"{kind.what} as {name}", kind.use)


def describe(fmt: Format) -> str:
    """'CasRel JSON (...), relation data (...)'."""
    return f"{fmt.what}, {USES.get(fmt.use, fmt.use)}"


def refuse_other(path: str | os.PathLike, fmt: Format | None, accepts: set[str], wanted: str) -> None:
    """A DataError when `fmt`, what sniff found the file at `path` to be, is none of the formats
    `accepts` names: what the file is, what it is for, and `wanted`, what the reader takes."""
    if fmt is not None and fmt.name == "json-spans" and "ner-jsonl" in accepts:  # the right data, one step away
        raise DataError(f"this is {fmt.what}; NER spans are read as JSONL, one record a line: "
                        f"{jq_lines(os.fspath(path))}", path=os.fspath(path))
    if fmt is not None and fmt.name not in accepts:
        raise DataError(f"this is {describe(fmt)}; {wanted}", path=os.fspath(path))


# labelled data whose lines are no texts: read as texts, each line would be a token, a piece of
# JSON or binary (JSONL records with a "text" field are texts, whatever else they hold)
NOT_TEXTS = {"conll", "casrel", "docbin", "json-spans"}
TEXTS_TAKE = "texts to run a model on are plain text lines, JSONL (--field), CSV/TSV (--column) or Parquet/Arrow"


def refuse_labelled_input(path: str | os.PathLike) -> None:
    """For the --input of predict and embed: a DataError when the file is labelled data that holds
    no texts line by line (CoNLL columns, CasRel JSON, a JSON list, a DocBin); for a JSON list, the
    command that writes its texts one a line."""
    fmt, path = sniff(path), os.fspath(path)
    hint = ""
    if fmt is not None and fmt.name in ("casrel", "json-spans"):
        hint = f" (its texts, one a line: {jq_lines(path, '{text}', '.texts.jsonl')})"
    refuse_other(path, fmt, set(FORMATS) - NOT_TEXTS, TEXTS_TAKE + hint)
