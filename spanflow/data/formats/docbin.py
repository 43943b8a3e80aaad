"""spaCy DocBin (.spacy) files: entities of each Doc as character spans, both ways.

Needs spaCy (`pip install 'spanflow[spacy]'`); nothing else in spanflow imports it.
"""
from __future__ import annotations

import logging
import os

from spanflow.atomic import atomic_path
from spanflow.data.examples import NerExample, check_spans, tag_labels
from spanflow.data.formats.tokens import word_bounds
from spanflow.errors import ConfigError, DataError

log = logging.getLogger("spanflow")


def _spacy():
    try:
        from spacy.tokens import Doc, DocBin
        from spacy.vocab import Vocab
    except ImportError:
        raise ConfigError("reading or writing .spacy files needs spaCy: pip install 'spanflow[spacy]'") from None
    return Doc, DocBin, Vocab


def read_docbin(path: str | os.PathLike) -> list[NerExample]:
    """Each Doc's text and its `doc.ents` as (start_char, end_char, label) spans."""
    path = os.fspath(path)
    Doc, DocBin, Vocab = _spacy()
    if not os.path.isfile(path):
        raise DataError("file not found", path=path)
    try:
        docs = list(DocBin().from_disk(path).get_docs(Vocab()))
    except Exception as e:  # zlib, msgpack or spaCy errors: the file is not a DocBin
        raise DataError(f"not a readable spaCy DocBin ({type(e).__name__}: {e})", path=path) from None
    out, first_doc, unset, groups = [], {}, [], {}
    for i, doc in enumerate(docs):
        spans = [(ent.start_char, ent.end_char, ent.label_) for ent in doc.ents]
        problem = check_spans(doc.text, spans)
        if problem:
            raise DataError(f"document {i + 1}: {problem}", path=path)
        for *_, lab in spans:
            first_doc.setdefault(lab, i + 1)  # documents counted from 1, as lines are
        unset += [i + 1] if any(t.ent_iob == 0 for t in doc) else []  # spaCy's "missing": not annotated
        for key, group in doc.spans.items():
            groups[key] = groups.get(key, 0) + len(group)
        out.append(NerExample(doc.text, spans, words=[(t.idx, t.idx + len(t)) for t in doc if not t.text.isspace()]))
    if not out:
        raise DataError("file holds no documents", path=path)
    tagged = tag_labels(first_doc)
    if tagged:
        raise DataError(f"document {first_doc[tagged[0]]}: {tagged[1]}", path=path)
    if not first_doc and any(groups.values()):
        held = ", ".join(f"{k!r} ({n})" for k, n in sorted(groups.items()))
        raise DataError(f"no document has entities in doc.ents; its spans are in span groups (doc.spans: {held}), "
                        "as a span categorizer's data: spanflow reads doc.ents", path=path)
    if unset:
        log.warning("%s: %d of %d documents have tokens with no entity annotation (spaCy's missing value; first: "
                    "document %d): read as outside any entity", path, len(unset), len(out), unset[0])
    return out


def _words_and_spaces(text: str, spans, tokens: list[tuple[int, int]] | None = None) -> tuple[list[str], list[bool]]:
    """Tokens (`tokens`, the ones the text was read from, else tokens.word_bounds's) whose
    concatenation (with one space where `spaces` says) is exactly `text`; whitespace other than
    one plain space becomes its own token, as spaCy does."""
    words, spaces, pos = [], [], 0
    for s, e in word_bounds(text, spans, tokens):
        gap = text[pos:s]
        if gap:
            if words and gap[0] == " ":
                spaces[-1], gap = True, gap[1:]
            if gap:
                words.append(gap)
                spaces.append(False)
        words.append(text[s:e])
        spaces.append(False)
        pos = e
    tail = text[pos:]
    if tail and words and tail[0] == " ":
        spaces[-1], tail = True, tail[1:]
    if tail:
        words.append(tail)
        spaces.append(False)
    return words, spaces


def examples_to_docbin(examples: list[NerExample], path: str | os.PathLike) -> None:
    """Write examples as a DocBin whose Docs have exactly these texts and entities (atomic)."""
    path = os.fspath(path)
    Doc, DocBin, Vocab = _spacy()
    vocab, db = Vocab(), DocBin()
    for i, ex in enumerate(examples):
        words, spaces = _words_and_spaces(ex.text, ex.spans, ex.words)
        doc = Doc(vocab, words=words, spaces=spaces)
        ents = [doc.char_span(s, e, label=lab) for s, e, lab in ex.spans]
        lost = next(((s, e, lab) for (s, e, lab), ent in zip(ex.spans, ents) if ent is None), None)
        if lost:  # tokens are cut at every span boundary: only a span with white space at an edge (the API's)
            raise DataError(f"text {i + 1}: entity [{lost[0]}, {lost[1]}, {lost[2]!r}] ({ex.text[lost[0]:lost[1]]!r}) "
                            "does not start and end on a spaCy token: white space at an edge has no token of its "
                            "own", path=path)
        doc.ents = ents
        db.add(doc)
    with atomic_path(path, suffix=".spacy") as tmp:
        db.to_disk(tmp)
