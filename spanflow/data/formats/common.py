"""Helpers shared by the readers: UTF-8 line reading with line numbers (strict for labelled
data, record by record for bulk input)."""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import unicodedata
from collections.abc import Iterator

from spanflow.errors import DataError

log = logging.getLogger("spanflow")

# a JSON string can still spell a lone surrogate (an escape such as \ud800): no character, so no tokenizer
# takes it and no UTF-8 output can hold it
SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(text: str, path: str, line: int | None, what: str = '"text"') -> None:
    """A DataError where a JSON text (`what` holds it) spells a lone surrogate (`"\\ud800"`), which
    no tokenizer takes."""
    m = SURROGATE.search(text)
    if m:
        raise DataError(f"{what} is not valid Unicode: a lone surrogate {m.group()!a} at character {m.start()}",
                        path=path, line=line)


STREAM = ("a pipe or device, not a file: its data can be read once, and an input is read more than once (checked, "
          "counted, then run); write it to a file first")


def refuse_stream(path: str) -> None:
    """A DataError for an input that exists but is no regular file: a pipe (`/dev/stdin` under a
    shell's `|`, `<(...)`) or a device, which the first of its reads would use up."""
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        raise DataError(f"is {STREAM}", path=path)


def check_exists(path: str) -> None:
    """A DataError for an input path that names nothing: not found, or a link to nothing."""
    if not os.path.exists(path):
        if os.path.islink(path):  # a loop of links, or a link to nothing: not "not found"
            raise DataError(f"is a link that leads to no file ({os.readlink(path)})", path=path)
        raise DataError("file not found", path=path)


def _numbered_raw(path: str) -> Iterator[tuple[int, bytes]]:
    check_exists(path)
    if os.path.isdir(path):
        raise DataError("is a directory, expected a file", path=path)
    refuse_stream(path)
    try:
        f = open(path, "rb")
    except OSError as e:  # no permission, say: the API's DataError, as the CLI's line says it
        raise DataError(f"cannot be read: {e.strerror}", path=path) from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                refuse_wide(raw, path)
                if b"\r" in raw.rstrip(b"\r\n") and not raw.endswith(b"\n"):  # the whole file is one line
                    raise DataError("its lines end in CR alone (old Mac style), so the whole file reads as one line; "
                                    f"convert them to \\n first: tr '\\r' '\\n' < {shlex.quote(path)} > NEW", path=path)
            yield lineno, raw


# the byte-order marks of the encodings a text file may be in that are not UTF-8
WIDE_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
             b"\xfe\xff": "UTF-16"}


# compressed files, by their magic bytes: read as text, every line is an error record about its bytes
# (bzip2's with its first block's magic: "BZh" alone can begin a line of text)
COMPRESSED = {b"\x1f\x8b": ("gzip", "gunzip -k"), b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"),
              b"\xfd7zXZ\x00": ("xz", "unxz -k"), b"PK\x03\x04": ("zip", "unzip"),
              **{b"BZh%d1AY&SY" % level: ("bzip2", "bunzip2 -k") for level in range(1, 10)}}
MAGIC_BYTES = 10  # the longest above: what a caller reads of a file's head


def refuse_wide(head: bytes, path: str, *, nuls: bool = False) -> None:
    """A DataError for text in UTF-16 or UTF-32, told by its byte-order mark (or, with `nuls`, by the
    NUL byte every character of Latin text has at one of its two positions, in at least 4 of 5 of
    them: a file known to be no binary format sniff reads):
    read as UTF-8 each line would come out garbled or as an error about its first byte. A
    compressed file (gzip, zstd, bzip2, xz, zip) is refused the same way, named."""
    packed = next((v for magic, v in COMPRESSED.items() if head.startswith(magic)), None)
    if packed is not None:
        raise DataError(f"is {packed[0]}-compressed; spanflow reads uncompressed text: decompress it first, e.g. "
                        f"{packed[1]} {path}", path=path)
    name = next((n for bom, n in WIDE_BOMS.items() if head.startswith(bom)), None)
    if name is not None:
        raise DataError(f"is {name} text (it starts with a {name} byte-order mark); spanflow reads UTF-8: "
                        f"convert it first, e.g. iconv -f {name} -t UTF-8", path=path)
    if nuls and len(head) >= 16 and max(head[0::2].count(0), head[1::2].count(0)) * 5 >= 2 * len(head):
        raise DataError("holds NUL bytes between its characters: UTF-16 or UTF-32 text without a byte-order mark? "
                        "spanflow reads UTF-8: convert it first, e.g. iconv -f UTF-16LE -t UTF-8", path=path)


def _decode(raw: bytes, lineno: int, path: str) -> str | DataError:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return DataError(f"invalid UTF-8 at byte {e.start} of the line", path=path, line=lineno)
    if lineno == 1 and line.startswith("\ufeff"):
        line = line[1:]  # a UTF-8 byte-order mark is not part of the data
    return line.rstrip("\r\n")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line_number, line_without_newline) of labelled data; invalid UTF-8 or a missing file
    is a DataError. A byte-order mark that begins a later line (files joined with `cat`) is
    dropped and said once the file is read."""
    path = os.fspath(path)
    marks = []
    for lineno, raw in _numbered_raw(path):
        line = _decode(raw, lineno, path)
        if isinstance(line, DataError):
            raise DataError(f"{line.reason}; {LATIN1_HINT} {shlex.quote(path)} > NEW", path=path, line=lineno)
        if line.startswith("\ufeff"):
            line = line[1:]
            marks.append(lineno)
        yield lineno, line
    if marks:
        log.warning("%s: %s inside the file dropped (a file joined after another keeps its own), on line %s%s",
                    path, "a byte-order mark" if len(marks) == 1 else f"{len(marks)} byte-order marks",
                    ", ".join(map(str, marks[:5])), " ..." if len(marks) > 5 else "")


# what an invalid UTF-8 line of labelled data suggests: most such files are in a Western 8-bit encoding
LATIN1_HINT = "is the file in another encoding, such as Windows-1252 (Latin-1)? Convert it: iconv -f WINDOWS-1252 -t UTF-8"


def read_lines_or_errors(path: str | os.PathLike) -> Iterator[tuple[int, str | DataError]]:
    """read_lines for bulk input: a line of invalid UTF-8 yields its DataError in place of the
    text and reading goes on (one stray byte costs one record, not the file). A missing file,
    or one in UTF-16 or UTF-32 (its byte-order mark), still raises."""
    path = os.fspath(path)
    for lineno, raw in _numbered_raw(path):
        yield lineno, _decode(raw, lineno, path)


# the one table of file extensions: every reader and writer asks kind_of()
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".spacy": "docbin", ".csv": "csv",
              ".tsv": "tsv", ".npy": "npy", ".conll": "conll", ".bio": "conll", ".bmes": "conll", ".txt": "text"}


def jq_lines(path: str, select: str = "", suffix: str = ".jsonl", each: str = ".[]") -> str:
    """The jq command that writes a JSON list's records one a line (`select`: a filter after
    `.[]`, such as `{text}`; `each="."`: a stream of indented objects), beside it with `suffix`:
    what messages about a JSON list offer."""
    out = os.path.splitext(path)[0] + suffix
    if os.path.abspath(out) == os.path.abspath(path):  # `> file` would empty the input before jq reads it
        out = os.path.splitext(path)[0] + ".lines" + suffix
    return f"jq -c '{each}{f' | {select}' if select else ''}' {shlex.quote(path)} > {shlex.quote(out)}"


def error_record(rec, path: str) -> str:
    """For a record a job wrote for an input it could not read ({"error": ...} and no text): what
    it is and the jq command that leaves such lines out; else ""."""
    if not isinstance(rec, dict) or not isinstance(rec.get("error"), str) or isinstance(rec.get("text"), str):
        return ""
    return ("; it is an error record, which predict and embed write for an input they could not read: leave "
            f"those lines out ({jq_lines(path, 'select(.error == null)', '.ok.jsonl', each='.')})")


def kind_of(path: str) -> str | None:
    """The kind of file its extension says (EXTENSIONS), or None for an extension not listed."""
    return EXTENSIONS.get(os.path.splitext(os.fspath(path))[1].lower())


def parse_json(text: str, path: str, line: int | None = None):
    """json.loads, with every way JSON can be unreadable (syntax, nesting too deep, an integer
    beyond Python's digit limit) a DataError naming the file and line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = "column" if e.msg.endswith(" at") else "at column"  # "Unterminated string starting at"
        raise DataError(f"invalid JSON: {e.msg} {where} {e.colno}", path=path,
                        line=e.lineno if line is None else line) from None
    except RecursionError:
        raise DataError("invalid JSON: nested too deeply", path=path, line=line) from None
    except ValueError as e:  # int() of more digits than sys.get_int_max_str_digits()
        raise DataError(f"invalid JSON: {str(e)[:120]}", path=path, line=line) from None


def stripped_span(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) moved in past the white space at the span's edges; empty (start == end)
    where the span holds white space alone."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def list_item_line(raw: str, k: int) -> int | None:
    """The line (from 1) on which item `k` (from 1) of the JSON list `raw`, parsed already, starts:
    where a message about one record of a pretty-printed list points. None where there is no such
    item. Only messages ask, so a file read whole is walked again only then."""
    dec, i = json.JSONDecoder(), raw.find("[") + 1
    if i == 0:
        return None
    for n in range(1, k + 1):
        while i < len(raw) and raw[i] in " \t\r\n,":  # white space, and the comma between items
            i += 1
        if i >= len(raw) or raw[i] == "]":
            return None
        if n == k:
            return raw.count("\n", 0, i) + 1
        try:
            i = dec.raw_decode(raw, i)[1]
        except ValueError:
            return None
    return None


def invisible(ch: str) -> bool:
    """An invisible format character (Unicode category Cf: U+FEFF, a zero-width space, a direction
    mark, a soft hyphen): no part of a word's edge, and nothing to read on its own."""
    return unicodedata.category(ch) == "Cf"


def is_hangul(ch: str) -> bool:
    """True for Hangul syllables and jamo: CJK to is_cjk, but Korean spaces its words."""
    o = ord(ch)
    return 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F


def unspaced(ch: str) -> bool:
    """True for a character of a script written without spaces between words (Chinese, Japanese)."""
    return is_cjk(ch) and not is_hangul(ch)


def ideograph(ch: str) -> bool:
    """A CJK ideograph, as BERT's tokenizer tells one (each is a word of its own there; kana and
    Hangul are not)."""
    o = ord(ch)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2CEAF or 0xF900 <= o <= 0xFAFF
            or 0x2F800 <= o <= 0x2FA1F)


def kana(ch: str) -> bool:
    """Japanese hiragana or katakana (full or half width)."""
    o = ord(ch)
    return 0x3040 <= o <= 0x30FF or 0xFF66 <= o <= 0xFF9F


def characters(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """(start, end) of each character of text[start:end] as a reader sees one: a code point with
    the marks after it (a variation selector is one), a skin tone or a joiner's sequence (`❤️`,
    `é` decomposed), or a flag (two regional indicators, `🇨🇳`)."""
    end = len(text) if end is None else end
    out, i = [], start
    while i < end:
        j = i + 1
        if _regional(text[i]) and j < end and _regional(text[j]):
            j += 1
        else:
            joined = False
            while j < end and (joined or unicodedata.category(text[j]) in ("Mn", "Me", "Cf")
                               or 0x1F3FB <= ord(text[j]) <= 0x1F3FF):
                joined = text[j] == "\u200d"  # a zero-width joiner takes the next code point into the character
                j += 1
        out.append((i, j))
        i = j
    return out


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def character_level(tokens: list[str]) -> bool:
    """Whether `tokens` are a character-level sentence's (one character per line, as in BMES data):
    each one character (see characters) and any of them Chinese, Japanese or Korean. CoNLL joins
    such a sentence without spaces."""
    return all(len(characters(t)) == 1 for t in tokens) and any(is_cjk(t[0]) for t in tokens)


def is_cjk(ch: str) -> bool:
    """True for CJK ideographs and the full-width punctuation used with them."""
    o = ord(ch)
    return (
        0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F
        or 0xF900 <= o <= 0xFAFF or 0x3000 <= o <= 0x303F or 0xFF00 <= o <= 0xFFEF
        or 0x3040 <= o <= 0x30FF or 0xAC00 <= o <= 0xD7AF
    )
