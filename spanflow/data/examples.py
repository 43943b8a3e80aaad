"""The example types every format converts to: text plus character-offset spans."""
from __future__ import annotations

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
    """Return why `spans` do not fit `text` (out of range, empty, overlapping), or None."""
    for s, e, lab in spans:  # types first: sorting mixed types would raise
        if not (is_offset(s) and is_offset(e)):
            return f"span {quote((s, e, lab))} needs integer offsets"
        if not isinstance(lab, str) or not lab:
            return f"span {quote((s, e, lab))} needs a label that is a non-empty string"
    prev_end, prev = -1, None
    for s, e, lab in sorted(spans):
        if s < 0 or e > len(text) or s >= e:
            return f"span {quote((s, e, lab))} is out of range for a text of {len(text)} characters"
        if s < prev_end:
            return f"spans {prev!r} and {(s, e, lab)!r} overlap"
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
