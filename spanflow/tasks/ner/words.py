"""The words a model labels: its training data's tokens, reproduced on plain text.

Labels sit on the first subword of each word, so the words decide where an entity may start
and end. A model trained on data that came as tokens (CoNLL, `.spacy`) learned one label per
input token; when those tokens are the whitespace-separated pieces of each text (CoNLL tokens
joined by single spaces), plain text split at whitespace gives the model the same words, and
a URL the tokenizer would cut at its punctuation stays one word. Other models label the
tokenizer's own words (a pre-tokenizer splits punctuation off, as text with no tokens needs).

CoNLL joins a character-level sentence of Chinese or Japanese (one character per token, as BMES
data has) without spaces: where the training tokens are such characters, a whitespace word of
plain text holding a Chinese or Japanese character is cut into its characters (`"chars"`), so that
mixed data (English word tokens beside Chinese characters) still gets the words it was trained on.

Token data often splits punctuation off words (`Paris .`, CoNLL-2003) but keeps some attached
(`@user`, `#tag`, URLs, WNUT-17): the model learned which. `edge_rules` reads it off the training
tokens, per character and word edge: a punctuation mark that stands alone as a token more often
than it sits at that edge of a word is cut off there in plain text (`Paris.` -> `Paris` `.`);
one the data keeps attached stays (`@user`).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from spanflow.data.examples import NerExample
from spanflow.data.formats.common import character_level, characters, ideograph, invisible, kana
from spanflow.data.formats.tokens import NON_SPACE, cut_edges
from spanflow.errors import ModelDirError

TOKENIZER, WHITESPACE = "tokenizer", "whitespace"
KINDS = (TOKENIZER, WHITESPACE)
# CoNLL joins adjacent CJK tokens without a space: a few texts of joined word tokens in otherwise
# whitespace-tokenised data must not send a model back to subword words (character-level sentences
# match as their characters: see _in_characters); spaCy's tokens (punctuation split off) fall far
# below this share
MATCH_SHARE = 0.99
# how a model of TOKENIZER words cuts them: PUNCTUATION at punctuation marks and at CJK ideographs
# (batching.align.encode_texts), as models are trained now; IDEOGRAPHS at ideographs alone, as
# directories saved before the key read text: the tokenizer's own words (a SentencePiece
# tokenizer's run from space to space) except that an unspaced Chinese line is not one word, which
# no model could have found an entity inside
IDEOGRAPHS, PUNCTUATION = "ideographs", "punctuation"
SPLITS = (IDEOGRAPHS, PUNCTUATION)

BETWEEN_ZWSP = re.compile("[^\u200b]+")  # a whitespace word's pieces between zero-width spaces
MAX_WHOLE = 2000  # the most frequent training tokens kept whole: spanflow.json stays small
# an abbreviation keeps its last dot: letters in runs of one to three, each closed by a dot
# (U.S., e.g., a.m.); an ellipsis (Paris...) or a domain at a sentence's end (example.com.) does not
ABBREVIATION = re.compile(r"(?:[^\W\d_]{1,3}\.){2,}")


def whitespace_words(text: str, edges: dict | None = None, whole: frozenset[str] | None = None, *,
                     plain: bool = False) -> list[tuple[int, int]]:
    """(start, end) of each whitespace-separated token of `text`; with `edges` ({"start": chars,
    "end": chars, "whole": [tokens]}, see edge_rules) those punctuation marks are cut off a
    token's ends, one word each, except where what is left is a token the training data had
    whole (`Corp.` of `Corp.,`) or an abbreviation (`U.S.`); a token of punctuation only stays
    whole. `whole`: edges["whole"] as a set, made once by the caller."""
    spans = [m.span() for m in NON_SPACE.finditer(text)]
    if plain:  # plain text's words, before their punctuation is cut: see visible
        spans = visible(text, spans)
    chars = bool(edges and edges.get("chars"))
    if not edges or not (edges.get("start") or edges.get("end") or chars):
        return spans
    if whole is None:
        whole = frozenset(edges.get("whole") or ())
    start, end = edges.get("start", ""), edges.get("end", "")
    return [w for s, e in spans for w in (_characters(text, s, e) if chars and _unspaced_script(text, s, e)
                                          else _cut(text, s, e, start, end, whole))]


def _unspaced_script(text: str, s: int, e: int) -> bool:
    """Whether text[s:e] holds a Chinese ideograph or Japanese kana: what a character-level sentence's
    words hold (full-width punctuation alone does not make one, nor does Hangul: Korean spaces its words)."""
    return any(ideograph(c) or kana(c) for c in text[s:e])


def _characters(text: str, s: int, e: int) -> list[tuple[int, int]]:
    """text[s:e] as one word per visible character (a character of several code points is one)."""
    return [(a, b) for a, b in characters(text, s, e) if not all(invisible(c) for c in text[a:b])]


def _kept(word: str, whole: frozenset[str]) -> bool:
    return word in whole or ABBREVIATION.fullmatch(word) is not None


def _cut(text: str, s: int, e: int, start: str, end: str, whole: frozenset[str]) -> list[tuple[int, int]]:
    """One whitespace token cut as whitespace_words says: its end marks off one at a time, until
    the rest is a word kept whole, then its start marks."""
    if _kept(text[s:e], whole) or not any(c.isalnum() for c in text[s:e]):
        return [(s, e)]
    tail = []
    while text[e - 1] in end and not text[e - 1].isalnum():
        e -= 1
        tail.append((e, e + 1))
        if _kept(text[s:e], whole):
            return [(s, e)] + tail[::-1]
    return cut_edges(text, s, e, start, "") + tail[::-1]


def shown_marks(chars: str) -> str:
    """Marks as a line shows them: apart by spaces, an invisible one (U+200B) by its code point."""
    return " ".join(c if c.isprintable() else f"U+{ord(c):04X}" for c in chars) or "none"


def _is_mark(c: str) -> bool:
    return not c.isalnum() and not c.isspace()


def edge_rules(examples: list[NerExample]) -> dict:
    """{"start", "end": the punctuation marks to cut off each end of a whitespace word, those the
    training tokens have standing alone more often than at that end of a word (an abbreviation's
    last dot not counted); "whole": the training tokens these rules would cut, kept whole (at most
    MAX_WHOLE, the most frequent), where any}."""
    alone: dict[str, int] = {}
    at = {"start": {}, "end": {}}
    for e in examples:
        for a, b in e.words or ():
            t = e.text[a:b]
            if not any(c.isalnum() for c in t):
                for c in set(t):
                    alone[c] = alone.get(c, 0) + 1
                continue
            i, j = 0, len(t)
            while i < j and _is_mark(t[i]):
                at["start"][t[i]] = at["start"].get(t[i], 0) + 1
                i += 1
            if ABBREVIATION.fullmatch(t[i:]):  # an abbreviation's dot (`U.S.`) stays in any case
                j -= 1
            while j > i and _is_mark(t[j - 1]):
                at["end"][t[j - 1]] = at["end"].get(t[j - 1], 0) + 1
                j -= 1
    cut = {edge: "".join(sorted(c for c, n in alone.items() if n > at[edge].get(c, 0))) for edge in at}
    whole: dict[str, int] = {}  # tokens that keep a mark these rules would cut (`Corp.`, `Inc.`), as trained
    for e in examples:
        for a, b in e.words or ():
            if len(_cut(e.text, a, b, cut["start"], cut["end"], frozenset())) > 1:
                whole[e.text[a:b]] = whole.get(e.text[a:b], 0) + 1
    kept = sorted(whole, key=lambda t: (-whole[t], t))[:MAX_WHOLE]
    chars = {"chars": True} if _character_level(examples) else {}
    return {**cut, **({"whole": sorted(kept)} if kept else {}), **chars}


def _character_level(examples: list[NerExample]) -> bool:
    """Whether any training text is a character-level sentence of Chinese or Japanese (see _in_characters)."""
    for e in examples:
        given = set(map(tuple, e.words or ()))
        if _spelled_out(e) and any(_in_characters(e.text, s, t, given) for s, t in whitespace_words(e.text)):
            return True
    return False


def _spelled_out(e: NerExample) -> bool:
    """Whether the example's tokens are a character-level sentence's (formats.common.character_level)."""
    return bool(e.words) and character_level([e.text[a:b] for a, b in e.words])


def _in_characters(text: str, s: int, e: int, given: set) -> bool:
    """Whether the whitespace word text[s:e] of a character-level sentence came as its characters,
    as plain text is cut with "chars": it holds Chinese or Japanese, and more than one character,
    each a token."""
    cut = _characters(text, s, e)
    return len(cut) > 1 and _unspaced_script(text, s, e) and all(w in given for w in cut)


def words_of(examples: list[NerExample]) -> str:
    """How the words of a model trained on `examples` are made: WHITESPACE when every example
    came as tokens and (nearly) every whitespace token of the texts is exactly one of them, or a
    character-level sentence's characters (edge_rules then says "chars"), else TOKENIZER."""
    if not examples or any(e.words is None for e in examples):
        return TOKENIZER
    total = same = 0
    for e in examples:
        given, spelled = set(map(tuple, e.words)), _spelled_out(e)
        pieces = whitespace_words(e.text)
        total += len(pieces)
        same += sum(p in given or (spelled and _in_characters(e.text, *p, given)) for p in pieces)
    return WHITESPACE if total and same >= MATCH_SHARE * total else TOKENIZER


def valid_edges(edges) -> bool:
    """Whether `edges` is edge_rules' shape (as read back from a model directory)."""
    # other keys would be a later spanflow's, which this one does without
    return (isinstance(edges, dict) and all(isinstance(edges.get(k, ""), str) for k in ("start", "end"))
            and isinstance(edges.get("whole", []), list) and all(isinstance(t, str) for t in edges.get("whole", []))
            and isinstance(edges.get("chars", False), bool))


def splitter(kind: str, edges: dict | None = None) -> Callable[[str], list[tuple[int, int]]] | None:
    """The function that cuts plain text into a model's words; None: the tokenizer's words."""
    if kind != WHITESPACE:
        return None
    whole = frozenset((edges or {}).get("whole") or ())  # once, not per text
    return lambda text: whitespace_words(text, edges, whole, plain=True)


def visible(text: str, words: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`words` cut at each zero-width space inside them (U+200B: how Thai, Khmer or Burmese text
    marks a word boundary it draws no space at) and without the invisible format characters at
    their ends (U+FEFF, a direction mark: category Cf), which are no part of an entity in plain
    text; a word of them alone is none."""
    out = []
    for a, b in words:
        for s, e in (m.span() for m in BETWEEN_ZWSP.finditer(text, a, b)):
            while s < e and invisible(text[s]):
                s += 1
            while e > s and invisible(text[e - 1]):
                e -= 1
            if s < e:
                out.append((s, e))
    return out


def config_words(cfg: dict, path: str) -> str:
    """The "words" of a model's config; absent (a model saved before the key): TOKENIZER."""
    kind = cfg.get("words")
    if kind is None:
        return TOKENIZER
    if kind not in KINDS:
        raise ModelDirError(f"{path}: unknown words {str(kind)[:50]!r}; this spanflow knows {', '.join(KINDS)} "
                            "(a newer spanflow may have written it: upgrade to load this model)")
    return kind


def config_split(split, path: str, where: str) -> str:
    """A model's word split as its directory records it (`where` names the key); absent (a model
    saved before the key): IDEOGRAPHS, the words it was trained on."""
    if split is None:
        return IDEOGRAPHS
    if split not in SPLITS:
        raise ModelDirError(f"{path}: unknown {where} {str(split)[:50]!r}; this spanflow knows {', '.join(SPLITS)} "
                            "(a newer spanflow may have written it: upgrade to load this model)")
    return split
