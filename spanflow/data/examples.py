"""The example types every format converts to: text plus character-offset spans."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from spanflow.errors import quote

Span = tuple[int, int, str]  # (start, end, label); end exclusive, character offsets


@dataclass
class NerExample:
    """One text with its entity spans as (start, end, label) character offsets.

    `words` holds the (start, end) offsets of the input's own tokens when the text came as
    tokens (CoNLL, DocBin): the model then labels and decodes whole input tokens, so a
    predicted entity never starts or ends inside one. None: the tokenizer's words.
    """

    text: str
    spans: list[Span] = field(default_factory=list)
    words: list[tuple[int, int]] | None = field(default=None, compare=False)

    def entities(self) -> list[tuple[str, str]]:
        """The (surface text, label) of each span, for display and checks."""
        return [(self.text[s:e], lab) for s, e, lab in self.spans]


def join_examples(examples: list[NerExample], sep: str = " ") -> NerExample:
    """One example of several texts joined by `sep`, their spans and words shifted along."""
    text, spans, words, has_words = "", [], [], any(e.words is not None for e in examples)
    for e in examples:
        if text:
            text += sep
        spans += [(s + len(text), t + len(text), lab) for s, t, lab in e.spans]
        words += [(a + len(text), b + len(text)) for a, b in (e.words or [])]
        text += e.text
    return NerExample(text, spans, words=words if has_words else None)


def is_offset(x) -> bool:
    """An int and not a bool: JSON true/false are not offsets."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_spans(text: str, spans: list[Span]) -> str | None:
    """Return why `spans` do not fit `text` (out of range, empty, overlapping, white space alone), or None."""
    for s, e, lab in spans:  # types first: sorting mixed types would raise
        if not (is_offset(s) and is_offset(e)):
            return f"span {quote((s, e, lab))} needs integer offsets"
        if not isinstance(lab, str) or not lab:
            return f"span {quote((s, e, lab))} needs a label that is a non-empty string"
    prev_end, prev = -1, None
    for s, e, lab in sorted(spans):
        if s < 0 or e > len(text):
            return f"span {quote((s, e, lab))} is out of range for a text of {len(text)} characters"
        if s >= e:
            how = "empty" if s == e else "reversed"
            return f"span {quote((s, e, lab))} is {how}: its end must come after its start"
        if prev is not None and (s, e) == prev[:2]:
            return f"span {quote((s, e, lab))} is listed twice" if lab == prev[2] else \
                f"spans {prev!r} and {(s, e, lab)!r} cover the same text: an entity has one type"
        if s < prev_end:
            return f"spans {prev!r} and {(s, e, lab)!r} overlap"
        if not text[s:e].strip():  # no file keeps it: JSONL's reader refuses it, CoNLL has no token to tag
            return f"span {quote((s, e, lab))} holds white space alone ({quote(text[s:e])}): no entity"
        prev_end, prev = e, (s, e, lab)
    return None


CharSpan = tuple[int, int]
Triple = tuple[CharSpan, str, CharSpan]  # ((subj_start, subj_end), relation, (obj_start, obj_end))


@dataclass
class ReExample:
    """One text with relation triples between character spans.

    `unlocated` keeps (subject, relation, object) strings of gold triples whose text could
    not be found in `text`: they cannot be trained on, but they still count as gold in
    evaluation, so nothing disappears silently.
    """

    text: str
    triples: list[Triple] = field(default_factory=list)
    unlocated: list[tuple[str, str, str]] = field(default_factory=list)

    def string_triples(self) -> set[tuple[str, str, str]]:
        """(subject text, relation, object text) for every gold triple, located or not."""
        t = self.text
        return {(t[s[0]:s[1]], r, t[o[0]:o[1]]) for s, r, o in self.triples} | set(self.unlocated)


def _triple_problem(text: str, triple) -> str | None:
    """Why `triple` is not ((start, end), relation, (start, end)) within `text`, or None."""
    try:
        (s, e), rel, (os_, oe) = triple
    except (TypeError, ValueError):
        return f"triple {quote(triple)} is not ((start, end), relation, (start, end))"
    if not isinstance(rel, str) or not rel.strip():
        return f"triple {quote(triple)} needs a relation name (a string with some text)"
    for a, b in ((s, e), (os_, oe)):
        if not (is_offset(a) and is_offset(b) and 0 <= a < b <= len(text)):
            return f"triple {quote(triple)} has a span out of range for a text of {len(text)} characters"
        if not text[a:b].strip():  # as the relation readers refuse it: no word to start or end on
            return f"triple {quote(triple)} has a span of white space alone ({quote(text[a:b])})"
    return None


def words_problem(words, text: str) -> str | None:
    """Why `words` are not (start, end) offsets of tokens of `text`, in order, or None."""
    end = 0
    for w in words if isinstance(words, (list, tuple)) else [None]:
        if not (isinstance(w, (tuple, list)) and len(w) == 2 and all(map(is_offset, w))
                and end <= w[0] < w[1] <= len(text)):
            return (f"its words {quote(words, 80)} are not (start, end) offsets of its tokens in order, within its "
                    f"{len(text)} characters")
        end = w[1]
    return None


def example_problem(ex) -> str | None:
    """Why a NerExample or ReExample built in code does not hold together (a text that is not a
    string, a span out of its range, overlapping or unlabelled spans), or None: what the
    readers check in a file, checked on examples that came from elsewhere."""
    if not isinstance(ex.text, str):
        return f"its text is {type(ex.text).__name__}, not a string"
    name, items, shape = (("triples", ex.triples, "((start, end), relation, (start, end))")
                          if isinstance(ex, ReExample) else ("spans", ex.spans, "(start, end, label)"))
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, (tuple, list)) and len(x) == 3 for x in items):
        return f"its {name} {quote(items, 80)} are not a list of {shape}"
    if isinstance(ex, ReExample):
        return next((p for p in (_triple_problem(ex.text, t) for t in ex.triples) if p), None)
    problem = check_spans(ex.text, ex.spans)
    if problem is None and ex.words is not None:
        return words_problem(ex.words, ex.text)
    return problem


# BIO, BIOES and BILOU tags: a type behind a position prefix, in any case, after - or _
_TAG = re.compile(r"^([BIESLU])[-_](.+)$", re.IGNORECASE)


def tag_labels(labels) -> tuple[str, str] | None:
    """(the label, why) where span `labels`, in the order met, are tags rather than entity types:
    "O" (no entity), or one type behind two position prefixes ("B-PER" and "I-PER"), which would
    train as two types; None where they are types."""
    seen: dict[str, str] = {}
    for lab in labels:
        if lab in ("O", "o"):  # as a CoNLL tag reads either
            return lab, ('a span labelled "O" marks no entity: leave such spans out (a span is one whole entity, '
                         '[start, end, TYPE]; a type of yours named "O" needs another name)')
        tag = _TAG.match(lab)
        if tag is None:
            continue
        kind = tag.group(2)
        other = seen.setdefault(kind, lab)
        if other != lab:
            return lab, (f"labels {other!r} and {lab!r} are tags, not entity types: give each entity one span over "
                         f"all its tokens, labelled with its type ({kind!r}); spanflow convert turns a CoNLL file "
                         "of tags into such JSONL")
    return None


def check_examples(examples, kind: type, what: str, *, empty: str | None = None) -> None:
    """A ConfigError naming the first item of `examples` (a list) that is not a `kind` whose spans
    fit its text; `what` names the argument ("train", "dev", "examples"). `empty`: why an empty
    list is refused (None: it is taken)."""
    from spanflow.errors import ConfigError

    if isinstance(examples, (str, bytes, dict)) or not isinstance(examples, (list, tuple)):
        raise ConfigError(f"{what} takes a list of {kind.__name__}, got {type(examples).__name__}")
    if empty is not None and not examples:
        raise ConfigError(f"{what} is an empty list: {empty}")
    for i, ex in enumerate(examples):
        if not isinstance(ex, kind):
            raise ConfigError(f"{what}[{i}] is {type(ex).__name__} {quote(ex, 60)}, not a {kind.__name__}")
        problem = example_problem(ex)
        if problem:
            raise ConfigError(f"{what}[{i}]: {problem}")
    if kind is NerExample:
        tagged = tag_labels(dict.fromkeys(lab for ex in examples for *_, lab in ex.spans))
        if tagged:  # named by the first item that holds the label, as the other refusals name theirs
            i = next(i for i, ex in enumerate(examples) if any(lab == tagged[0] for *_, lab in ex.spans))
            raise ConfigError(f"{what}[{i}]: {tagged[1]}")
