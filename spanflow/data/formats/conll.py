"""CoNLL-style column files: token + tag per line, blank (or whitespace-only) line between sentences."""
from __future__ import annotations

import logging
import os

from spanflow.data.examples import NerExample
from spanflow.data.formats.common import character_level, characters, is_cjk, read_lines, unspaced
from spanflow.data.formats.tokens import bio_tags, word_bounds
from spanflow.data.schemes import SCHEMES, decode_tags, detect_scheme, split_tag
from spanflow.errors import DataError, counted, quote

log = logging.getLogger("spanflow")

_ALLOWED = {"bio": "BI", "iob1": "BI", "bioes": "BIESLU", "bmes": "BMES"}


def _sentences(path: str):
    """Yield lists of (line_number, token, tag)."""
    sent: list[tuple[int, str, str]] = []
    ncols, ncols_line, first = None, None, ""
    for lineno, line in read_lines(path):
        if not line.strip():
            if sent:
                yield sent
            sent = []
            continue
        if "\r" in line:  # lines end in CR alone: the file would read as one line of merged columns
            raise DataError("a carriage return (\\r) inside a line: the file's lines end in CR alone (old Mac "
                            "style)? Convert them to \\n line endings, e.g. tr '\\r' '\\n'", path=path, line=lineno)
        line = line.rstrip(" \t")  # a tab or space after the last column ends it, as a newline does
        # columns are apart by tabs or ASCII spaces: a token of other white space (U+3000, the
        # ideographic space of Chinese corpora) is a token
        # columns padded with spaces around their tabs (`Grace \tB-PER`) lose them, or they would end
        # up inside the text and its spans; a token that is only spaces (spaCy's for a double space) stays
        cols = [c.strip(" ") or c for c in line.split("\t")] if "\t" in line else [c for c in line.split(" ") if c]
        if cols and cols[0] == "-DOCSTART-":  # a document's start ends a sentence, with or without blank lines
            if sent:
                yield sent
            sent = []
            continue
        if not cols or not cols[0]:  # the line starts with its tab: a tag and no token
            raise DataError(f"no token before the tag, got {quote(line)}",
                            path=path, line=lineno)
        if len(cols) < 2:
            other = any(c.isspace() and c not in " \t" for c in line)
            raise DataError(f"expected a token and a tag separated by a tab or space, got {quote(line)}"
                            + (" (other white space, such as U+3000 or U+00A0, is part of a token)" if other else ""),
                            path=path, line=lineno)
        if ncols is None:
            ncols, ncols_line, first = len(cols), lineno, line
        elif len(cols) != ncols:
            if first.startswith("#") or line.startswith("#"):
                at, other = (ncols_line, lineno) if first.startswith("#") else (lineno, ncols_line)
                raise DataError(f"a line that starts with '#' and has other columns than line {other}: a comment? "
                                "CoNLL data here is token and tag lines only: leave comments out, e.g. "
                                "grep -v '^# '", path=path, line=at)
            empty = next((k for k, c in enumerate(cols) if not c), None)  # two tabs in a row
            raise DataError(f"expected {ncols} columns as on line {ncols_line}, got {len(cols)}"
                            + (f" (column {empty + 1} is empty: two tabs in a row?)" if empty is not None else ""),
                            path=path, line=lineno)
        sent.append((lineno, cols[0], cols[-1].strip()))
    if sent:
        yield sent


def join_tokens(tokens: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """Join tokens into text: spaces between words, none between Chinese or Japanese characters
    (Korean spaces its words: word tokens of Hangul are joined with spaces).

    A sentence of single characters that holds any CJK character is a character-level
    sentence (one char per line, as in BMES data) and is joined without spaces, so
    '1 9 6 6 年' reads back as '1966年'.
    """
    char_level = character_level(tokens)
    parts, offsets, pos = [], [], 0
    for i, tok in enumerate(tokens):
        if i and not char_level and not (unspaced(tokens[i - 1][-1]) and unspaced(tok[0])):
            parts.append(" ")
            pos += 1
        offsets.append((pos, pos + len(tok)))
        parts.append(tok)
        pos += len(tok)
    return "".join(parts), offsets


def read_conll(path: str | os.PathLike, *, scheme: str | None = None, strict: bool = False,
               log_fn=None) -> list[NerExample]:
    """Read a CoNLL column file into NerExamples with character-offset spans.

    `scheme` is one of bio, iob1, bioes, bmes (detected from the file when None). An inside
    tag that opens no entity is read as an entity start and reported as a warning (the
    IOB1 repair), as is an entity with no E- tag in BIOES or BMES (read as ending at its last
    tag); with `strict=True` either is an error instead, as is a file read as IOB1 with no B- tag
    at all (BIO that lost its B- tags reads the same: `scheme="iob1"` says which). `log_fn`: told
    what was read, the scheme too.
    """
    path = os.fspath(path)
    sentences = list(_sentences(path))
    if not sentences:
        marks = any(line.strip() for _, line in read_lines(path))  # -DOCSTART- lines are all it has
        raise DataError("holds no sentences, only -DOCSTART- lines" if marks else "file is empty: no sentences found",
                        path=path)
    for sent in sentences:
        for lineno, _, tag in sent:
            if split_tag(tag)[0] == "?":
                raise DataError(f"unknown tag {quote(tag)}; expected O or a B-/I-/E-/S-/M- prefixed label",
                                path=path, line=lineno)
    detected = detect_scheme([[t for _, _, t in s] for s in sentences])
    asked = bool(scheme)
    scheme = _asked_scheme(scheme, detected, path) if scheme else detected
    allowed = _ALLOWED[scheme] + "O"
    if strict and not asked and scheme == "iob1" and not any(split_tag(t)[0] == "B" for s in sentences for *_, t in s):
        # entities that all open with I-: IOB1, or BIO that lost its B- tags; --strict guesses neither
        first = next(n for s in sentences for n, _, t in s if split_tag(t)[0] == "I")
        raise DataError("every entity opens with an I- tag and no B- tag is in the file: read as IOB1 that is a "
                        "guess, which --strict does not make; give --scheme iob1 if the file is IOB1, else its "
                        "entities need their B- tags", path=path, line=first)
    examples, repaired, unclosed = [], [], []
    for sent in sentences:
        for lineno, _, tag in sent:
            if split_tag(tag)[0] not in allowed:
                raise DataError(f"tag {quote(tag)} is not valid in the {scheme.upper()} scheme"
                                + (_suggest(scheme, detected) if asked else _told_by(sentences, scheme)),
                                path=path, line=lineno)
        tokens = [tok for _, tok, _ in sent]
        spans, repairs = decode_tags([tag for _, _, tag in sent], scheme)
        if repairs:
            if strict:
                raise _refused(sent[repairs[0].index], path, repairs[0].unclosed)
            repaired += [sent[r.index][0] for r in repairs if not r.unclosed]
            unclosed += [sent[r.index][0] for r in repairs if r.unclosed]
        text, offsets = join_tokens(tokens)
        char_spans = [(offsets[a][0], offsets[b - 1][1], lab) for a, b, lab in spans]
        for (a, _, lab), (s, e, _) in zip(spans, char_spans):
            if not text[s:e].strip():  # tokens of spaces alone: no model or format reads it back as an entity
                raise DataError(f"entity {quote(lab)} is a token of white space alone ({quote(text[s:e])}): tag it O",
                                path=path, line=sent[a][0])
        examples.append(NerExample(text, char_spans, words=offsets))
    if log_fn is not None:
        log_fn(f"read {path}: {counted(len(examples), 'sentence')}, "
               f"{counted(sum(len(e.spans) for e in examples), 'entity', 'entities')}; tags {scheme.upper()} "
               f"({'as --scheme says' if asked else 'detected'})")
    if repaired:
        log.warning("%s: %d inside tag(s) with no opening tag were read as entity starts (lines %s)",
                    path, len(repaired), _lines(repaired))
    if unclosed:
        log.warning("%s: %d entities have no closing E- (or L-) tag and were read as ending at their last tag "
                    "(lines %s)%s",
                    path, len(unclosed), _lines(unclosed), "" if asked or _closes(sentences) else
                    _told_by(sentences, scheme))
    return examples


def _lines(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers[:5]) + (" ..." if len(numbers) > 5 else "")


def _asked_scheme(scheme: str, detected: str, path: str) -> str:
    name = scheme.lower()
    if name not in SCHEMES:
        raise DataError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)} (this file's tags "
                        f"are {detected.upper()}, which is found when the scheme is left out)", path=path)
    return name


def _told_by(sentences, scheme: str) -> str:
    """Which line made the file read as `scheme` (its first tag of that scheme's own), for an
    error about a tag of another scheme in the same file."""
    own = {"bmes": "M", "bioes": "ESLU"}.get(scheme, "")
    for sent in sentences:
        for lineno, _, tag in sent:
            if split_tag(tag)[0] in own:
                return (f" (the file reads as {scheme.upper()} from line {lineno}'s {quote(tag)}: one file holds one "
                        "scheme; --scheme names it)")
    return ""


def _closes(sentences) -> bool:
    """Whether any entity of the file ends on an E- (or L-) tag: a BIOES file whose entities
    lack a few; none at all is a file of another scheme read as BIOES for an S- tag or two."""
    return any(split_tag(tag)[0] in "EL" for sent in sentences for _, _, tag in sent)


def _suggest(asked: str, detected: str) -> str:
    if detected == asked:
        return ""
    return f" (asked); this file's tags are {detected.upper()}: use --scheme {detected}, or leave --scheme out"


def _refused(entry: tuple[int, str, str], path: str, unclosed: bool = False) -> DataError:
    """Strict reading's error for an inside tag that opens no entity, or an entity with no E- tag."""
    lineno, _, tag = entry
    if unclosed:
        return DataError(f"the {split_tag(tag)[1]} entity that ends at tag {quote(tag)} has no closing E- (or L-) "
                         "tag: strict reading (--strict) refuses it (without --strict it is read as ending here, and "
                         "reported)",
                         path=path, line=lineno)
    return DataError(f"tag {quote(tag)} follows no B-{split_tag(tag)[1]} tag: strict reading (--strict) refuses an "
                     "inside tag that opens no entity (without --strict it is read as the entity's start, and "
                     "reported)", path=path, line=lineno)


def conll_token_bounds(text: str, spans, words: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """How a text is cut into CoNLL tokens: the tokens it was read from (`words`), else single
    characters for unspaced CJK text (as BMES data is), so read_conll joins them back, else
    tokens/word_bounds's (split at entity bounds in either case)."""
    if not words and any(is_cjk(c) for c in text) and not any(c.isspace() for c in text):
        # a character of several code points (an emoji and its selector) is one token, as it is read
        # back, unless an entity bound falls inside it
        bounds = {b for s, e, _ in spans for b in (s, e)}
        out = []
        for a, b in characters(text):
            cuts = [a, *sorted(x for x in bounds if a < x < b), b]
            out += list(zip(cuts, cuts[1:]))
        return out
    return word_bounds(text, spans, words)


def conll_tokens(text: str, spans, words: list[tuple[int, int]] | None = None) -> list[str]:
    return [text[s:e] for s, e in conll_token_bounds(text, spans, words)]


_BREAKS = ("\t", "\n", "\r")  # what ends a CoNLL column or line as read back


def unwritable(text: str, spans, words: list[tuple[int, int]] | None = None) -> str | None:
    """Why a text cannot be written as CoNLL and read back as it is, or None: a tag or token
    holding a tab or line break (it would read as more columns or lines), a token that is the
    `-DOCSTART-` mark (read_conll skips that line, and ends the sentence there)."""
    for label in sorted({sp[2] for sp in spans}):
        if any(b in label for b in _BREAKS):
            return f"its label {label!r} holds a tab or line break, which would end the tag's column"
        if label != label.strip():
            return f"its label {label!r} begins or ends with white space, which the tag's column loses"
    for s, e in conll_token_bounds(text, spans, words):
        token = text[s:e]
        if any(b in token for b in _BREAKS):
            return f"its token {token!r} holds a tab or line break, which would end the token's column"
        if token == "-DOCSTART-":
            return "its token -DOCSTART- would read back as a document mark: skipped, and the text cut in two there"
    return None


def write_conll_sentence(f, text: str, spans, words: list[tuple[int, int]] | None = None) -> None:
    """One sentence as `token<TAB>BIO-tag` lines and a blank line. CoNLL keeps tokens, not
    the whitespace between them: texts read back are joined as read_conll joins them."""
    bounds = conll_token_bounds(text, spans, words)
    for (s, e), tag in zip(bounds, bio_tags(bounds, spans)):
        f.write(f"{text[s:e]}\t{tag}\n")
    f.write("\n")
