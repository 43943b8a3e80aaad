"""JSONL: one {"text": ..., "entities": [[start, end, label], ...]} object per line."""
from __future__ import annotations

import json
import logging
import os

from spanflow.data.examples import NerExample, check_spans, tag_labels
from spanflow.data.formats.common import check_unicode, error_record, jq_lines, parse_json, read_lines, stripped_span
from spanflow.errors import DataError, quote

log = logging.getLogger("spanflow")


def _span(item, path: str, lineno: int):
    if isinstance(item, dict):
        try:
            return (item["start"], item["end"], item["label"])
        except KeyError as e:
            raise DataError(f"entity object lacks {e.args[0]!r}", path=path, line=lineno) from None
    if isinstance(item, (list, tuple)) and len(item) == 3:
        return tuple(item)
    raise DataError(f"entity {quote(item)} is neither [start, end, label] nor an object", path=path, line=lineno)


def _check_quoted(text: str, raw: list, spans: list, path: str, lineno: int) -> None:
    """An entity object's own "text" (as predict writes it) against the text its offsets cut:
    a mismatch means offsets counted in other units (bytes, UTF-16) or from another text."""
    for item, (start, end, _) in zip(raw, spans):
        quoted = item.get("text") if isinstance(item, dict) else None
        if isinstance(quoted, str) and text[start:end] != quoted:
            at = text.find(quoted)
            where = f"; {quote(quoted)} is first at [{at}, {at + len(quoted)}]" if at >= 0 else ""
            why = ("a space at its edge" if text[start:end].strip() == quoted.strip() else
                   "offsets count characters (code points) of the record's text, not bytes or UTF-16 units")
            raise DataError(f"entity [{start}, {end}] holds {quote(text[start:end])} but its \"text\" says "
                            f"{quote(quoted)}{where}: {why}", path=path, line=lineno)


def parse_record(line: str, path: str, lineno: int) -> dict:
    """Parse one JSON object line, or raise a DataError naming the line."""
    if line.strip() in ("{", "["):  # JSON written across lines (json.dump(..., indent=2)), not one object a line
        jq = jq_lines(path, each=".[]" if line.strip() == "[" else ".")
        raise DataError("JSONL holds one whole JSON object a line, and this line opens one that goes on over the "
                        f"next lines (indented JSON?); write each record on one line: {jq}", path=path, line=lineno)
    rec = parse_json(line, path, lineno)
    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
        raise DataError(f'expected an object with a string "text" field{error_record(rec, path)}', path=path,
                        line=lineno)
    check_unicode(rec["text"], path, lineno)
    return rec


def read_jsonl(path: str | os.PathLike) -> list[NerExample]:
    """Read NER examples; spans out of range or overlapping are DataErrors naming the line."""
    path = os.fspath(path)
    examples, keyed, elsewhere, first = [], False, {}, {}  # first: the line each label is first on
    trimmed: list[tuple[int, str]] = []  # (line, entity) of the entities read without white space at an edge
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        rec = parse_record(line, path, lineno)
        keyed = keyed or "entities" in rec or "spans" in rec
        if not keyed:
            elsewhere.update((k, lineno) for k, v in rec.items() if k not in elsewhere and _span_like(v))
        raw = rec.get("entities", rec.get("spans", []))
        if not isinstance(raw, list):
            raise DataError('"entities" must be a list', path=path, line=lineno)
        spans = [_span(item, path, lineno) for item in raw]
        problem = check_spans(rec["text"], spans)
        if problem:
            raise DataError(problem, path=path, line=lineno)
        _check_quoted(rec["text"], raw, spans, path, lineno)
        spans = _trimmed(rec["text"], spans, lineno, trimmed, path)
        examples.append(NerExample(rec["text"], sorted(spans)))
        for *_, lab in spans:
            first.setdefault(lab, lineno)
    if not examples:
        raise DataError("file is empty: no records found", path=path)
    if trimmed:
        log.warning("%s: %d entit%s white space at an edge, read without it (e.g. %s): no word starts or ends "
                    "with a space, so the model could never tag it with one", path, len(trimmed),
                    "y has" if len(trimmed) == 1 else "ies have", "; ".join(f"line {k}: {t!r}" for k, t in trimmed[:3]))
    tagged = tag_labels(first)
    if tagged:
        raise DataError(tagged[1], path=path, line=first[tagged[0]])
    if not keyed and elsewhere:  # read on, every text would be one without entities
        key, lineno = next(iter(elsewhere.items()))
        raise DataError(f'no record has "entities" (or "spans"), but {key!r} holds spans: spanflow reads each '
                        f'text\'s entities from "entities": [[start, end, label], ...]; rename the key (a doccano '
                        'export\'s "label" is such a list)', path=path, line=lineno)
    return examples


def _trimmed(text: str, spans: list, lineno: int, said: list, path: str) -> list:
    """`spans` without the white space at their edges (an annotator's selection that took the space
    before a word), each such entity added to `said` (one of white space alone was refused: check_spans)."""
    out = []
    for s, e, lab in spans:
        a, b = stripped_span(text, s, e)
        if (a, b) != (s, e):
            said.append((lineno, text[s:e]))
        out.append((a, b, lab))
    return out


def _span_like(value) -> bool:
    """A list whose first item looks like a span: [start, end, label, ...] or {"start", "end", ...}."""
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(first, (list, tuple)):
        return len(first) >= 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in first[:2])
    return isinstance(first, dict) and any(k in first for k in ("start", "start_offset"))


def write_jsonl_record(f, text: str, spans, **extra) -> None:
    """Write one NER record in the format read_jsonl reads."""
    rec = {"text": text, "entities": [[s, e, lab] for s, e, lab in spans], **extra}
    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
