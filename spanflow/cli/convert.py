"""`spanflow convert IN OUT`: NER data between CoNLL, JSONL and spaCy DocBin."""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_format_arg, add_scheme_arg
from spanflow.data.io import NER_FORMATS


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert NER data between CoNLL, JSONL and spaCy DocBin",
                       description="Convert NER data. The input's format is told from its content (--from "
                                   "overrides), the output's from its extension (.jsonl or .json JSONL, .spacy "
                                   "DocBin, else CoNLL; a name of another kind of file, such as .csv or .parquet, "
                                   "is refused; --to overrides). CoNLL is written as token<TAB>BIO.")
    p.add_argument("input", help="labelled NER data to read")
    p.add_argument("output", help="the file to write")
    add_format_arg(p, "--from", dest="src")
    p.add_argument("--to", dest="dst", choices=NER_FORMATS, default=None,
                   help="output format [by extension: .jsonl or .json JSONL, .spacy DocBin, else CoNLL]")
    add_scheme_arg(p, strict=True)


def run(a: argparse.Namespace) -> int:
    import functools
    import os
    import sys

    from spanflow.data.formats.sniff import refuse_other, sniff
    from spanflow.data.io import (
        NER_SNIFFED,
        NER_TAKES,
        check_conll_writable,
        check_output_file,
        record_lines,
        ner_output_format,
        read_ner,
        refuse_tag_flags,
        write_ner,
    )
    from spanflow.errors import ConfigError, DataError, counted

    check_output_file(a.output)  # before reading: the input may be large
    fmt = ner_output_format(a.output, a.dst)
    if os.path.exists(a.output) and os.path.exists(a.input) and os.path.samefile(a.output, a.input):
        raise ConfigError(f"{a.output} is the input: convert would write over what it reads; give the output "
                          "another name")
    # another task's data is named as what it is, and as what convert does not read
    refuse_other(a.input, sniff(a.input), set(NER_SNIFFED), "convert reads NER data only, and " + NER_TAKES)
    refuse_tag_flags([a.input], a.src, scheme=a.scheme, strict=a.strict)
    read: list[str] = []  # what was read (a CoNLL file's tag scheme), said with what was written
    examples = read_ner(a.input, fmt=a.src, scheme=a.scheme, strict=a.strict, log_fn=read.append)
    if fmt == "conll":
        # CoNLL stores tokens only: report texts whose spacing will not come back as it was
        from spanflow.data.formats.conll import conll_tokens, join_tokens

        # a JSONL input's texts are told by their lines, read again only where one is named
        lines = functools.cache(lambda: record_lines(a.input))
        check_conll_writable(examples, a.input, lines)  # numbered as the input's texts, before any is left out
        tokens = [conll_tokens(e.text, e.spans, e.words) for e in examples]
        empty = [i for i, t in enumerate(tokens) if not t]
        if empty and len(empty) == len(examples):  # the file would be empty, and no reader takes one
            raise DataError(f"none of its {len(examples)} texts has a token: CoNLL has no line for an empty or "
                            "whitespace-only text; convert to JSONL to keep them", path=a.input)
        if empty:  # a sentence of no lines is no sentence: those texts cannot be read back
            at = lines()
            shown = ", ".join(str(at[i] if at else i + 1) for i in empty[:5]) + (" ..." if len(empty) > 5 else "")
            where = f"lines {shown} of {a.input}" if at else f"texts {shown}, counted from 1"
            print(f"note: {len(empty)} text(s) are empty or only whitespace ({where}): CoNLL has no line for them, "
                  "so they are left out", file=sys.stderr)
            examples = [e for e, t in zip(examples, tokens) if t]
            tokens = [t for t in tokens if t]
        changed = sum(join_tokens(t)[0] != e.text for e, t in zip(examples, tokens))
        if changed:
            print(f"note: {changed} text(s) have spacing CoNLL cannot keep (tokens are kept, offsets shift)",
                  file=sys.stderr)
    if examples and not any(e.spans for e in examples):  # texts to be labelled, or the wrong file
        print(f"note: no text of {a.input} has an entity" + (": every tag written is O" if fmt == "conll" else ""),
              file=sys.stderr)
    write_ner(examples, a.output, fmt=fmt)
    entities = counted(sum(len(e.spans) for e in examples), "entity", "entities")
    for line in read:
        print(line)
    print(f"wrote {counted(len(examples), 'text')}, {entities} to {a.output} ({fmt})")
    return 0
