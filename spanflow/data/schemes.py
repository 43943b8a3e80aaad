"""Tag schemes (BIO, IOB1, BIOES/BILOU, BMES) decoded into token-index spans."""
from __future__ import annotations

from dataclasses import dataclass

SCHEMES = ("bio", "iob1", "bioes", "bmes")


@dataclass
class Repair:
    """A tag sequence fix applied while decoding (reported, never silent)."""

    index: int
    message: str
    unclosed: bool = False  # an entity with no closing tag (BIOES, BMES), read as ending where it stops


def split_tag(tag: str) -> tuple[str, str | None]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', None). Accepts '-' or '_' separators, and a prefix or
    an outside tag in either case ('b-per', 'o')."""
    if tag in ("O", "o"):
        return "O", None
    for sep in ("-", "_"):
        if len(tag) > 2 and tag[1] == sep and tag[0].upper() in "BIESMLU":
            return tag[0].upper(), tag[2:]
    return "?", None


def detect_scheme(sentences: list[list[str]]) -> str:
    """Guess the scheme from the tags of a whole file, a list a sentence. IOB1 (CoNLL-2003's own
    files) starts entities with I- and keeps B- for an entity right after one of its type: a
    file whose every B-X follows an X tag, and whose I- tags open some entity, is IOB1."""
    prefixes = {split_tag(t)[0] for tags in sentences for t in tags}
    if "M" in prefixes:
        return "bmes"
    if prefixes & {"E", "S", "L", "U"}:
        return "bioes"
    if "I" not in prefixes:
        return "bio"
    opened = splitting = False  # an I- tag that opens an entity; a B- tag after another type
    for tags in sentences:
        before = None
        for tag in tags:
            p, lab = split_tag(tag)
            if p == "I" and before != lab:
                opened = True
            elif p == "B" and before != lab:
                splitting = True
            before = lab
    return "iob1" if opened and not splitting else "bio"


def decode_tags(tags: list[str], scheme: str) -> tuple[list[tuple[int, int, str]], list[Repair]]:
    """Turn per-token tags into (first_token, last_token_exclusive, label) spans.

    An inside tag (I-/M-/E-) with no open entity of the same label starts a new entity,
    the IOB1 reading; it is reported as a Repair unless the scheme is IOB1, where it is
    the normal way an entity starts. In BIOES and BMES an entity that stops without its E- tag
    (at an O, a B-, an S-, another label or the sentence's end) is read as ending at its last
    tag, and reported too (an `unclosed` Repair at that tag).
    """
    spans: list[tuple[int, int, str]] = []
    repairs: list[Repair] = []
    start, label = None, None
    closing = scheme in ("bioes", "bmes")

    def close(end: int, by_e: bool = False) -> None:
        nonlocal start, label
        if start is not None:
            spans.append((start, end, label))
            if closing and not by_e:
                repairs.append(Repair(end - 1, f"entity {label!r} ends without an E- tag", unclosed=True))
        start, label = None, None

    for i, tag in enumerate(tags):
        p, lab = split_tag(tag)
        p = {"L": "E", "U": "S"}.get(p, p)
        if p == "O":
            close(i)
        elif p == "B" and scheme == "iob1":
            close(i)
            start, label = i, lab
        elif p == "B":
            close(i)
            start, label = i, lab
        elif p == "S":
            close(i)
            spans.append((i, i + 1, lab))
        elif p in ("I", "M", "E"):
            if start is None or label != lab:
                close(i)
                if scheme != "iob1":
                    repairs.append(Repair(i, f"tag {tag!r} continues no open entity; read as its start"))
                start, label = i, lab
            if p == "E":
                close(i + 1, by_e=True)
        else:
            raise ValueError(f"tag {tag!r} is not valid in scheme {scheme}")
    close(len(tags))
    return spans, repairs
