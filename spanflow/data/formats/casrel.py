"""Relation data: CasRel JSON (strings located in the text) and JSONL with character offsets."""
from __future__ import annotations

import json
import logging
import os

from spanflow.data.examples import ReExample
from spanflow.data.formats.common import read_lines
from spanflow.data.formats.jsonl import parse_record
from spanflow.errors import DataError

log = logging.getLogger("spanflow")


def _occurrences(text: str, s: str) -> list[int]:
    """Start offsets of `s` in `text`, whole-word matches first, then any, then case-blind."""
    if not s:
        return []
    found, i = [], text.find(s)
    while i >= 0:
        found.append(i)
        i = text.find(s, i + 1)
    whole = [i for i in found if (i == 0 or not text[i - 1].isalnum()) and
             (i + len(s) == len(text) or not text[i + len(s)].isalnum())]
    if whole or found:
        return whole or found
    low, ls = text.lower(), s.lower()
    i = low.find(ls)
    while i >= 0:
        found.append(i)
        i = low.find(ls, i + 1)
    return found


def locate(text: str, subj: str, obj: str):
    """Character spans of subject and object, choosing the closest pair of occurrences."""
    ss, os_ = _occurrences(text, subj), _occurrences(text, obj)
    if not ss or not os_:
        return None
    # subject and object may overlap ("Bacon sandwich" / "Bacon"), but not be the same span
    best = min(((abs(a - b), a, b) for a in ss for b in os_ if (a, len(subj)) != (b, len(obj))), default=None)
    if best is None:
        return None
    _, a, b = best
    return (a, a + len(subj)), (b, b + len(obj))


def read_casrel_json(path: str | os.PathLike) -> list[ReExample]:
    """[{"text", "triple_list": [[subject, relation, object], ...]}] with strings located in the text."""
    path = os.fspath(path)
    raw = "\n".join(line for _, line in read_lines(path))
    if not raw.strip():
        raise DataError("file is empty", path=path)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON: {e.msg}", path=path, line=e.lineno) from None
    if not isinstance(data, list):
        raise DataError("expected a JSON list of {\"text\", \"triple_list\"} records", path=path)
    out, missing, total = [], [], 0
    for k, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f'record {k} has no string "text"', path=path)
        ex = ReExample(rec["text"])
        for t in rec.get("triple_list", []):
            if not (isinstance(t, (list, tuple)) and len(t) == 3 and all(isinstance(x, str) for x in t)):
                raise DataError(f"record {k}: triple {t!r} is not [subject, relation, object]", path=path)
            total += 1
            spans = locate(ex.text, t[0], t[2])
            if spans is None:
                ex.unlocated.append((t[0], t[1], t[2]))
                missing.append((k, t))
            elif (spans[0], t[1], spans[1]) not in ex.triples:
                ex.triples.append((spans[0], t[1], spans[1]))
        out.append(ex)
    if missing:
        shown = "; ".join(f"record {k}: {t!r}" for k, t in missing[:3])
        log.warning("%s: %d of %d triples name a subject or object not found in the text; they are kept as "
                    "gold for evaluation but not trained on (e.g. %s)", path, len(missing), total, shown)
    return out


def read_re_jsonl(path: str | os.PathLike) -> list[ReExample]:
    """{"text", "relations": [{"head": [s, e], "type": r, "tail": [s, e]}]} per line."""
    path = os.fspath(path)
    out = []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        rec = parse_record(line, path, lineno)
        ex = ReExample(rec["text"])
        for r in rec.get("relations", []):
            try:
                h, typ, t = tuple(r["head"]), r["type"], tuple(r["tail"])
            except (KeyError, TypeError):
                raise DataError(f'relation {r!r} needs "head": [s, e], "type" and "tail": [s, e]', path=path,
                                line=lineno) from None
            for s, e in (h, t):
                if not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(ex.text)):
                    raise DataError(f"span {[s, e]} is out of range for a text of {len(ex.text)} characters",
                                    path=path, line=lineno)
            ex.triples.append((h, str(typ), t))
        out.append(ex)
    if not out:
        raise DataError("file is empty: no records found", path=path)
    return out


def read_relations_vocab(path: str) -> list[str] | None:
    """The relation list from a rel2id.json beside the data ([id2rel, rel2id] or {rel: id})."""
    f = os.path.join(os.path.dirname(os.path.abspath(path)), "rel2id.json")
    if not os.path.exists(f):
        return None
    with open(f, encoding="utf-8") as fh:
        data = json.load(fh)
    rel2id = data[1] if isinstance(data, list) else data
    return [r for r, _ in sorted(rel2id.items(), key=lambda kv: int(kv[1]))]
