"""Labelled data: format detection (content first, formats/sniff.py, then formats/common.EXTENSIONS),
read_ner, write_ner and read_re. Texts to predict or embed are read by data/records.py."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable

from spanflow.atomic import atomic_open, writing
from spanflow.data.examples import NerExample, ReExample, check_examples
from spanflow.data.formats.common import kind_of, read_lines
from spanflow.data.formats.conll import read_conll
from spanflow.data.formats.jsonl import read_jsonl
from spanflow.data.formats.sniff import refuse_other, sniff
from spanflow.errors import DataError, as_path, counted

NER_FORMATS = ("conll", "jsonl", "docbin")
# how the readers pick a format: what --format's help says, wherever a command takes one
STRICT_HELP = ("reject inside tags with no opening tag, and BIOES/BMES entities with no closing E- tag, instead of "
               "repairing them; a file with no B- tag at all is not guessed to be IOB1 (--scheme iob1 says so)")
FORMAT_HELP = ("NER data format [detected from the content; where it leaves doubt, the extension (.jsonl/.json "
               "JSONL, .spacy DocBin, .conll/.bio/.bmes CoNLL), else the first line]")
# what each reader takes, by the name sniff gives, and the format it is read as
NER_SNIFFED = {"conll": "conll", "ner-jsonl": "jsonl", "texts-jsonl": "jsonl", "docbin": "docbin"}
RE_SNIFFED = {"casrel": "casrel", "re-jsonl": "jsonl", "texts-jsonl": "jsonl"}
NER_TAKES = ('NER data is CoNLL columns (a token and its tag per line), JSONL spans ({"text", "entities"}) '
             "or a spaCy .spacy file")
RE_TAKES = 'relation data is CasRel JSON ([{"text", "triple_list"}, ...]) or JSONL relations ({"text", "relations"})'


def _format_of(path: str, fmt: str | None, sniffed: dict[str, str], takes: str, fallback) -> str:
    """The format to read `path` as: `fmt` when given, else what its content shows (sniff), else
    `fallback(path)`. A DataError when the content is surely another task's data, or another of
    this reader's formats than the `fmt` asked."""
    found = sniff(path)
    refuse_other(path, found, set(sniffed), takes)
    seen = sniffed.get(found.name) if found else None
    if fmt is None:
        return seen or fallback(path)
    if seen not in (None, fmt) and fmt in sniffed.values():
        raise DataError(f"format {fmt!r} was asked (--format; convert's --from), but this is {found.what}: leave "
                        f"it out, or ask for {seen!r}", path=path)
    return fmt


def detect_format(path: str) -> str:
    """By content (formats/sniff.py), else by extension (.jsonl/.json -> jsonl, .spacy -> docbin,
    .conll/.bio/.bmes -> conll), else by the first non-blank line."""
    found = sniff(path)
    return NER_SNIFFED.get(found.name if found else "") or _by_name(path)


def refuse_tag_flags(paths: list[str | None], fmt: str | None, *, scheme: str | None, strict: bool) -> None:
    """--scheme and --strict read CoNLL tags: a ConfigError where none of `paths` is CoNLL (spans and
    DocBins have no tags), as a flag that does nothing hides a slip. A missing file is left to its reader."""
    if not (scheme or strict):
        return
    found = [(p, fmt or (detect_format(p) if os.path.isfile(p) else None)) for p in paths if p]
    if not found or any(f in ("conll", None) for _, f in found):
        return
    from spanflow.errors import ConfigError

    path, f = found[0]
    raise ConfigError(f"--{'scheme' if scheme else 'strict'} reads CoNLL tags; {path} is {f} (spans, no tags): "
                      "leave it out")


def _by_name(path: str) -> str:
    kind = kind_of(path)
    if kind in ("jsonl", "json"):
        return "jsonl"
    if kind in ("docbin", "conll"):  # a .conll file whose first token is "{" is still CoNLL
        return kind
    for _, line in read_lines(path):
        if line.strip():
            return "jsonl" if line.lstrip().startswith("{") else "conll"
    raise DataError("file is empty", path=path)


def read_ner(path: str | os.PathLike, *, fmt: str | None = None, scheme: str | None = None,
             strict: bool = False, log_fn=None) -> list[NerExample]:
    """Read labelled NER data from CoNLL columns, JSONL or a spaCy DocBin (detected unless `fmt` is
    given); `log_fn`: told what was read (a CoNLL file's tag scheme too)."""
    path = as_path(path, "read_ner")
    fmt = _format_of(path, fmt, NER_SNIFFED, NER_TAKES, _by_name)
    if fmt == "conll":
        return read_conll(path, scheme=scheme, strict=strict, log_fn=log_fn)
    if fmt == "jsonl":
        examples = read_jsonl(path)
    elif fmt == "docbin":
        from spanflow.data.formats.docbin import read_docbin

        examples = read_docbin(path)
    else:
        raise DataError(f"unknown format {fmt!r}; expected one of {', '.join(NER_FORMATS)}", path=path)
    if log_fn is not None:
        log_fn(f"read {path}: {counted(len(examples), 'text')}, "
               f"{counted(sum(len(e.spans) for e in examples), 'entity', 'entities')} "
               f"({'JSONL' if fmt == 'jsonl' else 'a spaCy DocBin'})")
    return examples


def output_format(path: str) -> str:
    """The format a written file takes from its extension: .jsonl, .spacy, else CoNLL."""
    kind = kind_of(path)
    return {"jsonl": "jsonl", "json": "jsonl", "docbin": "docbin"}.get(kind, "conll")


# names of files NER data is never written as: without a format given, a name that says one of
# them is a slip (convert wrote tab-separated CoNLL into x.parquet), not a CoNLL file's name
# an output named as another kind of file, with its article: writing CoNLL into it would mislead
_OTHER_KINDS = {".csv": "a CSV", ".npy": "a NumPy", ".parquet": "a Parquet", ".pq": "a Parquet", ".arrow": "an Arrow",
                ".feather": "an Arrow", ".ipc": "an Arrow", ".gz": "a gzip-compressed", ".bz2": "a bzip2-compressed",
                ".xz": "an xz-compressed", ".zst": "a zstd-compressed", ".zip": "a zip", ".xlsx": "an Excel",
                ".xls": "an Excel"}


def ner_output_format(path: str, fmt: str | None) -> str:
    """The format NER data is written to `path` in: `fmt` where given, else its extension's
    (output_format); a ConfigError where no format is given and the name says another kind of
    file, or is `-` (no file: convert writes to a named file)."""
    from spanflow.errors import ConfigError

    if path == "-":
        raise ConfigError("- names standard output, which NER data is not written to: name an output file (.conll, "
                          ".jsonl or .spacy)")
    other = None if fmt else _OTHER_KINDS.get(os.path.splitext(path)[1].lower())
    if other:
        raise ConfigError(f"{path} names {other} file; NER data is written as CoNLL (.conll), JSONL (.jsonl) or a "
                          "spaCy DocBin (.spacy): name the file so, or give the format (--to; Python: fmt=)")
    return fmt or output_format(path)


def check_output_file(path: str) -> None:
    """A DataError for an output path that names a directory (the file could not replace it); a
    ConfigError for an empty one or a device, pipe or socket (atomic.check_output_path)."""
    from spanflow.atomic import check_output_path

    check_output_path(path)
    if os.path.isdir(path):
        raise DataError("is a directory; give the name of a file to write", path=path)


def write_ner(examples: list[NerExample], path: str | os.PathLike, *, fmt: str | None = None) -> None:
    """Write NER examples as CoNLL (BIO), JSONL or a spaCy DocBin; atomic (temp file + rename). A
    full disk or a file system that refuses the write: a WriteError naming `path`."""
    path = as_path(path, "write_ner")
    check_output_file(path)
    check_examples(examples, NerExample, "examples")  # a span past its text would be written as another
    fmt = ner_output_format(path, fmt)
    if fmt == "docbin":
        from spanflow.data.formats.docbin import examples_to_docbin

        with writing("the data", path):
            examples_to_docbin(examples, path)
        return
    if fmt not in ("conll", "jsonl"):
        raise DataError(f"unknown format {fmt!r}; expected one of {', '.join(NER_FORMATS)}", path=path)
    from spanflow.data.formats.conll import conll_token_bounds, write_conll_sentence
    from spanflow.data.formats.jsonl import write_jsonl_record

    if fmt == "conll":  # a sentence of no lines is none: reading the file back would not find it
        check_conll_writable(examples, path)
        kept = [e for e in examples if conll_token_bounds(e.text, e.spans, e.words)]
        if examples and not kept:  # an empty file, which no reader takes back
            raise DataError(f"none of the {len(examples)} texts has a token: CoNLL has no line for an empty or "
                            "whitespace-only text; write JSONL to keep them", path=path)
        if len(kept) < len(examples):
            logging.getLogger("spanflow").warning("%s: %d empty or whitespace-only text(s) have no line in CoNLL: "
                                                  "left out", path, len(examples) - len(kept))
        examples = kept

    with writing("the data", path), atomic_open(path) as f:
        for ex in examples:
            if fmt == "conll":
                write_conll_sentence(f, ex.text, ex.spans, ex.words)
            else:
                write_jsonl_record(f, ex.text, ex.spans)


def check_conll_writable(examples: list[NerExample], path: str,
                         lines: Callable[[], list[int] | None] | None = None) -> None:
    """A DataError naming the first text (counted from 1) that CoNLL cannot hold as it is, before
    a line is written; `path`: the file it is told of (convert names its input, whose texts they are),
    `lines()`: the line each text is on in it (a JSONL input's: the error names its line; read only then)."""
    from spanflow.data.formats.conll import unwritable

    for i, ex in enumerate(examples, 1):
        why = unwritable(ex.text, ex.spans, ex.words)
        if why:
            at = lines() if lines else None
            which = "the text" if at else f"text {i} (counted from 1)"
            raise DataError(f"{which} cannot be written as CoNLL: {why}; write JSONL or a .spacy DocBin, which keep it",
                            path=path, line=at[i - 1] if at else None)


def record_lines(path: str) -> list[int] | None:
    """The line (from 1) of each record of a JSONL file of NER data, as read_ner reads them (a blank
    line is none); None for other formats, whose texts are not one a line."""
    if detect_format(path) != "jsonl":
        return None
    return [n for n, line in read_lines(path) if line.strip()]


def read_re(path: str | os.PathLike, *, fmt: str | None = None) -> list[ReExample]:
    """Read relation data: CasRel JSON or JSONL with character offsets, told apart by content,
    else by extension (.json: CasRel)."""
    from spanflow.data.formats.casrel import read_casrel_json, read_re_jsonl

    path = as_path(path, "read_re")
    if not os.path.exists(path):
        raise DataError("file not found", path=path)
    fmt = _format_of(path, fmt, RE_SNIFFED, RE_TAKES, lambda p: "casrel" if kind_of(p) == "json" else "jsonl")
    if fmt == "casrel":
        return read_casrel_json(path)
    if fmt == "jsonl":
        return read_re_jsonl(path)
    raise DataError(f"unknown relation format {fmt!r}; expected casrel or jsonl", path=path)
