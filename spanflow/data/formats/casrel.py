"""Relation data: CasRel JSON (strings located in the text) and JSONL with character offsets."""
from __future__ import annotations

import functools
import logging
import os
import re

from spanflow.data.examples import ReExample, is_offset
from spanflow.data.formats.common import (SURROGATE, check_unicode, jq_lines, list_item_line, parse_json, read_lines,
                                         stripped_span)
from spanflow.data.formats.jsonl import parse_record
from spanflow.errors import DataError, quote

log = logging.getLogger("spanflow")


def _whole_first(text: str, s: str, fold: bool = False) -> list[int]:
    """Start offsets of `s` in `text` (overlapping ones too; `fold`: case-blind, the offsets still
    the text's, where lowering would shift them: "İ" lowers to two characters), the whole-word
    ones if any."""
    pattern = re.compile(f"(?=({re.escape(s)}))", re.IGNORECASE if fold else 0)
    found = [m.start() for m in pattern.finditer(text) if m.end(1) - m.start(1) == len(s)]
    whole = [i for i in found if (i == 0 or not text[i - 1].isalnum()) and
             (i + len(s) == len(text) or not text[i + len(s)].isalnum())]
    return whole or found


def _occurrences(text: str, s: str) -> list[int]:
    """Start offsets of `s` in `text`, whole-word matches first, then any, then case-blind."""
    if not s:
        return []
    return _whole_first(text, s) or _whole_first(text, s, fold=True)


def locate(text: str, subj: str, obj: str):
    """Character spans of subject and object: the closest pair of occurrences that do not overlap,
    the exact strings' before their case-blind ones ("Texas Rangers ... in Texas", "Bacon explosion
    ... bacon"); else the closest pair that are not the same span ("Bacon sandwich" / "Bacon"
    where "Bacon" stands nowhere else)."""
    if not subj or not obj:
        return None
    tiers = [(_occurrences(text, subj), _occurrences(text, obj)),
             (_whole_first(text, subj, fold=True), _whole_first(text, obj, fold=True))]
    pairs = [[(abs(a - b), a, b) for a in ss for b in os_ if (a, len(subj)) != (b, len(obj))] for ss, os_ in tiers]
    apart = [[p for p in ps if p[1] + len(subj) <= p[2] or p[2] + len(obj) <= p[1]] for ps in pairs]
    for found in (*apart, *pairs):
        if found:
            _, a, b = min(found)
            return (a, a + len(subj)), (b, b + len(obj))
    return None


def read_casrel_json(path: str | os.PathLike) -> list[ReExample]:
    """[{"text", "triple_list": [[subject, relation, object], ...]}] with strings located in the text."""
    path = os.fspath(path)
    raw = "\n".join(line for _, line in read_lines(path))
    if not raw.strip():
        raise DataError("file is empty", path=path)
    data = parse_json(raw, path)
    if not isinstance(data, list):
        raise DataError("expected a JSON list of {\"text\", \"triple_list\"} records", path=path)
    if not data:
        raise DataError("is an empty list: no records found", path=path)
    out, total, twice, trimmed = [], 0, 0, []
    unplaced: dict[bool, list] = {False: [], True: []}  # same span? -> (record number, triple)
    at = functools.partial(list_item_line, raw)  # the line record k starts on, for a message
    for k, rec in enumerate(data, 1):  # numbered from 1, as the lines of the other formats
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f'record {k} (of the list, from 1) has no string "text"', path=path, line=at(k))
        check_unicode(rec["text"], path, at(k) if SURROGATE.search(rec["text"]) else None,
                      f'record {k} (of the list, from 1): "text"')
        ex = ReExample(rec["text"])
        if "triple_list" not in rec:
            _other_key(rec, k, path, at)
        if not isinstance(rec.get("triple_list") or [], list):
            raise DataError(f'record {k} (of the list, from 1): "triple_list" is not a list of triples', path=path,
                            line=at(k))
        for t in rec.get("triple_list") or []:  # null or absent: a text without triples
            if not (isinstance(t, (list, tuple)) and len(t) == 3 and all(isinstance(x, str) for x in t)):
                raise DataError(f"record {k} (of the list, from 1): triple {quote(t)} is not "
                                "[subject, relation, object]", path=path, line=at(k))
            if not t[1].strip():
                raise DataError(f"record {k} (of the list, from 1): triple {quote(t)} has no relation name",
                                path=path, line=at(k))
            total += 1
            if any(x and not x.strip() for x in (t[0], t[2])):  # as JSONL offsets of white space are
                raise DataError(f"record {k} (of the list, from 1): triple {quote(t)} has a subject or object of "
                                "white space alone", path=path, line=at(k))
            if t[0] != t[0].strip() or t[2] != t[2].strip():  # an annotator's selection that took a space
                trimmed.append((k, list(t)))
                t = [t[0].strip(), t[1], t[2].strip()]
            spans = locate(ex.text, t[0], t[2])
            if spans is None:
                ex.unlocated.append((t[0], t[1], t[2]))
                found = bool(_occurrences(ex.text, t[0]) and _occurrences(ex.text, t[2]))
                unplaced[found].append((k, t))
            elif (spans[0], t[1], spans[1]) not in ex.triples:
                ex.triples.append((spans[0], t[1], spans[1]))
            else:
                twice += 1
        out.append(ex)
    _said_twice(path, twice, total)
    _said_trimmed(path, trimmed, total, "record")
    if unplaced[False] or unplaced[True]:
        log.warning("%s: %d of %d triples cannot be placed in their text%s%s; they count as gold in scoring, "
                    "and training leaves them out", path, len(unplaced[False]) + len(unplaced[True]), total,
                    _unplaced(unplaced[False], "name a subject or object not found in the text"),
                    _unplaced(unplaced[True], "have a subject and object that are the same span of the text"))
    return out


OTHER_KEYS = ("relations", "triples", "spo_list", "relation_list", "relation_mentions")  # read as no triples


def _other_key(rec: dict, k: int, path: str, at) -> None:
    """A DataError for a record whose triples are under another key than "triple_list" (read
    silently as a text with none): JSONL relations written as one list, another corpus's key, or
    any key holding a list of triple-like items (a misspelt "triplets")."""
    key = next((key for key in OTHER_KEYS if isinstance(rec.get(key), list) and rec[key]), None)
    key = key or next((key for key, v in rec.items() if _triple_like(v)), None)
    if key is None:
        return
    hint = f'; JSONL relations ({{"text", "relations"}}) are one object a line: {jq_lines(path)}' \
        if key == "relations" else ""
    raise DataError(f'record {k} (of the list, from 1) has "{key}" and no "triple_list": CasRel JSON\'s triples are '
                    f'[subject, relation, object] lists under "triple_list"{hint}', path=path, line=at(k))


def _triple_like(value) -> bool:
    """A non-empty list whose first item looks like a triple: three strings, or an object with a
    subject and an object."""
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(first, (list, tuple)):
        return len(first) == 3 and all(isinstance(x, str) for x in first)
    return isinstance(first, dict) and any(k in first for k in ("subject", "head", "sub")) and \
        any(k in first for k in ("object", "tail", "obj"))


def _unplaced(triples: list, why: str) -> str:
    """One cause of the triples left out of training, with examples (record numbers from 1)."""
    if not triples:
        return ""
    shown = "; ".join(f"record {k}: {t!r}" for k, t in triples[:3])
    return f"; {len(triples)} {why} (e.g. {shown})"


def read_re_jsonl(path: str | os.PathLike) -> list[ReExample]:
    """{"text", "relations": [{"head": [s, e], "type": r, "tail": [s, e]}]} per line."""
    path = os.fspath(path)
    out, total, twice, same, trimmed = [], 0, 0, [], []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        rec = parse_record(line, path, lineno)
        ex = ReExample(rec["text"])
        if "relations" not in rec:
            _other_relations_key(rec, path, lineno)
        relations = rec.get("relations", [])
        if not isinstance(relations, list):
            raise DataError('"relations" must be a list', path=path, line=lineno)
        for r in relations:
            t = _relation(r, ex.text, path, lineno)
            total += 1
            edged = (_trim(ex.text, t[0], path, lineno), t[1], _trim(ex.text, t[2], path, lineno))
            if edged != t:
                trimmed.append((lineno, (ex.text[slice(*t[0])], t[1], ex.text[slice(*t[2])])))
                t = edged
            if t[0] == t[2]:  # no cascade tags one span as both: gold for scoring, as in CasRel JSON
                named = (ex.text[slice(*t[0])], t[1], ex.text[slice(*t[2])])
                same.append((lineno, named))
                ex.unlocated.append(named)
            elif t not in ex.triples:  # a triple given twice is one, as in CasRel JSON
                ex.triples.append(t)
            else:
                twice += 1
        out.append(ex)
    if not out:
        raise DataError("file is empty: no records found", path=path)
    _said_twice(path, twice, total)
    _said_trimmed(path, trimmed, total, "line")
    if same:
        log.warning("%s: %d of %d relations have a head and tail that are the same span (e.g. %s); they count as "
                    "gold in scoring, and training leaves them out", path, len(same), total,
                    "; ".join(f"line {k}: {t!r}" for k, t in same[:3]))
    return out


def _other_relations_key(rec: dict, path: str, lineno: int) -> None:
    """A DataError for a JSONL record whose relations are under another key than "relations" (read
    silently as a text with none): another corpus's key, or any key holding relation-like items."""
    key = next((key for key in OTHER_KEYS if isinstance(rec.get(key), list) and rec[key]), None)
    key = key or next((key for key, v in rec.items() if _triple_like(v)), None)
    if key is not None:
        raise DataError(f'the record has "{key}" and no "relations": JSONL relations are {{"head": [s, e], "type": '
                        f'r, "tail": [s, e]}} objects under "relations" (a text without any leaves the key out)',
                        path=path, line=lineno)


def _trim(text: str, span: tuple[int, int], path: str, lineno: int) -> tuple[int, int]:
    """`span` without the white space at its edges; a DataError where it holds nothing else."""
    a, b = stripped_span(text, *span)
    if a == b:
        raise DataError(f"span {list(span)} holds white space alone", path=path, line=lineno)
    return a, b


def _said_trimmed(path: str, trimmed: list, total: int, where: str) -> None:
    """Warn of subjects and objects read without the white space at their edges: gold that holds
    it would never match a prediction (the model's spans start and end on words), so it scored
    as a miss; NER's JSONL reader trims entities so."""
    if trimmed:
        log.warning("%s: %d of %d triples have a subject or object with white space at its edge, read without it "
                    "(e.g. %s)", path, len(trimmed), total, "; ".join(f"{where} {k}: {t!r}" for k, t in trimmed[:3]))


def _said_twice(path: str, twice: int, total: int) -> None:
    """Warn of triples repeated within a text: kept once, so training and scoring count them once."""
    if twice:
        log.warning("%s: %d of %d triples repeat another of the same text; each is kept once", path, twice, total)


def _relation(r, text: str, path: str, lineno: int):
    """((s, e), type, (s, e)) from {"head": [s, e], "type": str, "tail": [s, e]}, checked."""
    if not isinstance(r, dict) or not all(k in r for k in ("head", "type", "tail")):
        raise DataError(f'relation {quote(r)} needs "head": [s, e], "type" and "tail": [s, e]', path=path,
                        line=lineno)
    spans = []
    for key in ("head", "tail"):
        v = r[key]
        if not (isinstance(v, list) and len(v) == 2 and all(is_offset(x) for x in v)):
            raise DataError(f'"{key}" must be [start, end] with integer offsets, got {quote(v)}', path=path,
                            line=lineno)
        if 0 <= v[1] <= v[0] <= len(text):
            raise DataError(f'"{key}" span {v} is {"empty" if v[0] == v[1] else "reversed"}: [start, end] with start '
                            'below end', path=path, line=lineno)
        if not 0 <= v[0] < v[1] <= len(text):
            raise DataError(f'"{key}" span {v} is out of range for a text of {len(text)} characters', path=path,
                            line=lineno)
        spans.append((v[0], v[1]))
    if not isinstance(r["type"], str) or not r["type"].strip():
        raise DataError(f'"type" must be a non-empty string, got {quote(r["type"])}', path=path, line=lineno)
    return spans[0], r["type"], spans[1]


def vocab_path(path: str) -> str:
    """Where the rel2id.json of the data at `path` would be: beside it."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), "rel2id.json")


def read_relations_vocab(path: str) -> list[str] | None:
    """The relation list from a rel2id.json beside the data ([id2rel, rel2id] or {rel: id})."""
    f = vocab_path(path)
    if not os.path.exists(f):
        return None
    data = parse_json("\n".join(line for _, line in read_lines(f)), f)
    rel2id = data[1] if isinstance(data, list) and len(data) == 2 else data
    if not (isinstance(rel2id, dict) and all(is_offset(v) for v in rel2id.values())):
        raise DataError('expected {"relation": id, ...} or [id2rel, rel2id]', path=f)
    return [r for r, _ in sorted(rel2id.items(), key=lambda kv: kv[1])]
