"""Texts -> subword tokens with character offsets and word starts, and overlapping windows.

Labels sit on the first subword of each word (the rest are ignored in the loss, -100).
A character that yields no subwords (U+FE0F, a zero-width space) simply has no token:
offsets keep every other label in place. What the labels are is the task's (tasks/bio.py).
"""
from __future__ import annotations

import numbers
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from spanflow.data.formats.common import ideograph, invisible


IGNORE = -100


@dataclass
class Encoded:
    """One text tokenized without special tokens."""

    ids: list[int]
    offsets: list[tuple[int, int]]  # character (start, end) of each token in the text
    first: list[bool]  # True where a token starts a word: the positions that carry a label
    starts: list[int] | None = None  # token start widened over adjacent characters with no token
    ends: list[int] | None = None  # token end widened likewise (e.g. a trailing U+FE0F)
    # True where a line break lies between a token and the one before; None: the text is one line
    breaks: list[bool] | None = None


@dataclass
class Window:
    """One model input: tokens [start, end) of text `example`, framed by special tokens."""

    example: int
    start: int
    end: int
    input_ids: list[int]
    labels: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_texts(tokenizer, texts: list[str], words: list | None = None, *,
                 cut_punctuation: bool = True) -> list[Encoded]:
    """Tokenize a batch of texts (fast tokenizer, no special tokens) keeping char offsets.

    A word starts at the tokenizer's word boundaries, or, where `words[i]` gives the text's
    own tokens as (start, end) offsets, at the first subword of each of those tokens.
    The tokenizer's words are cut also at CJK ideographs, and with `cut_punctuation` at punctuation
    (see _split_words); NER models saved before that cut read text without it.
    """
    if not texts:
        return []
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                    return_attention_mask=False, return_token_type_ids=False)
    out = []
    for i, ids in enumerate(enc["input_ids"]):
        text = texts[i]
        offsets, blank = _trim(text, [tuple(o) for o in enc["offset_mapping"][i]])
        owner = word_owner(words[i]) if words is not None and words[i] is not None else None
        if owner is not None:
            first = first_of_words(offsets, owner)
        else:
            wids = enc.word_ids(i)
            first = [w is not None and (j == 0 or wids[j - 1] != w) for j, w in enumerate(wids)]
            first = _split_words(text, offsets, first, blank, cut_punctuation)
        _no_blank_firsts(first, blank)
        breaks = _breaks(text, offsets) if LINE_BREAK.search(text) else None
        if breaks:  # a word never runs across a line break (SentencePiece's words split at spaces only)
            first = [f or (b and not k) for f, b, k in zip(first, breaks, blank)]
        starts, ends = _widen(text, offsets, owner)
        out.append(Encoded(ids, offsets, first, starts, ends, breaks))
    return out


# characters per token a text is read to before it is tokenized, for a model that reads only its first
# tokens (at a white space past it): more than any tokenizer's tokens hold on average, so those tokens are
# the whole text's, while a megabyte line is not tokenized whole for the few hundred tokens read of it
CHARS_PER_TOKEN = 32


def read_prefix(text: str, max_tokens: int) -> str:
    """`text` up to its last space after a word before max_tokens x CHARS_PER_TOKEN characters (the
    whole of it where it is no longer, or has no such space near there: a cut inside a word could
    change that word's tokens). A caller that gets no more than `max_tokens` tokens from a cut text
    tokenizes it whole instead (see encode_heads)."""
    limit = max_tokens * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text
    for i in range(limit, max(0, limit - 1000), -1):
        # a space after a word: every tokenizer splits there (a control character Python calls white
        # space may join two words for BERT; a run of spaces may be one token for byte-level BPE)
        if text[i] == " " and not text[i - 1].isspace():
            return text[:i]
    return text


def encode_prefixes(texts: list[str], max_tokens: int, encode: Callable[[list[str]], list],
                    overflows: Callable[[object], bool]) -> list:
    """`encode(texts)` of what a model reading the first `max_tokens` tokens of each text needs:
    its read_prefix, or the whole text where the prefix's encoding does not `overflow` the tokens
    read (the cut could have changed them). Offsets are the original text's (a prefix keeps them)."""
    cut = [read_prefix(t, max_tokens) for t in texts]
    encs = encode(cut)
    whole = [i for i, (c, t, e) in enumerate(zip(cut, texts, encs)) if len(c) < len(t) and not overflows(e)]
    for i, e in zip(whole, encode([texts[i] for i in whole]) if whole else ()):
        encs[i] = e
    return encs


def encode_heads(tokenizer, texts: list[str], max_tokens: int) -> list[Encoded]:
    """encode_texts through encode_prefixes: the encodings of the first `max_tokens` tokens' text."""
    return encode_prefixes(texts, max_tokens, lambda ts: encode_texts(tokenizer, ts),
                           lambda e: len(e.ids) > max_tokens)


# what str.splitlines() breaks at: \r alone and U+2028 end a line as \n does
LINE_BREAK = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def _breaks(text: str, offsets: list[tuple[int, int]]) -> list[bool]:
    """Whether a line break lies between each token and the last one before it that holds
    characters (a token of a line break alone, trimmed empty, does not hide it)."""
    out, last = [], None
    for s, e in offsets:
        out.append(last is not None and LINE_BREAK.search(text, last, s) is not None)
        if e > s:
            last = e
    return out


def _trim(text: str, offsets: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[bool]]:
    """(offsets without the whitespace (or invisible format characters) at a token's ends, which
    tokens held them alone).
    Byte-level BPE without offset trimming (ModernBERT's tokenizer) and SentencePiece's `▁` in
    DeBERTa-v2's count the space before a word in its first token: a span decoded from them
    would start on it (' Lagos'). A token of whitespace alone is left empty where the token
    with characters before it ends, so that no word's span reaches over it. (A `▁` that opens a
    text is given its first character by SentencePiece, so it keeps the first word's label;
    training and inference read it alike.)"""
    out, blank, last = [], [], 0
    for s, e in offsets:
        gone = s == e  # a token its tokenizer already left empty (RoBERTa's trim_offsets on a bare `Ġ`)
        if gone:
            s = e = last
        elif _edge(text[s]) or _edge(text[e - 1]):
            while s < e and _edge(text[s]):
                s += 1
            while e > s and _edge(text[e - 1]):
                e -= 1
            gone = s == e
            if gone:
                s = e = last
        if e > s:
            last = e
        blank.append(gone)
        out.append((s, e))
    return out, blank


def _split_words(text: str, offsets: list[tuple[int, int]], first: list[bool], blank: list[bool],
                 cut_punctuation: bool = True) -> list[bool]:
    """The tokenizer's words cut also at punctuation (`cut_punctuation`), as BERT's and byte-level BPE's already are:
    SentencePiece's words split at spaces only, so 'Hopper,' and '(Switzerland)' were one word each
    and an entity took the comma or was lost in the brackets; and a line of Chinese, which has no
    spaces, was one word (BERT makes each ideograph one). A token that begins with punctuation or
    a CJK ideograph, or follows one that ends with either, starts a word, as in BERT (kana runs
    stay words, and a token holding letters and punctuation stays whole: words start only where
    tokens do)."""
    def cuts(c: str) -> bool:
        return ideograph(c) or (cut_punctuation and punctuation(c))

    out, after, last = [], False, 0
    for f, (s, e), b in zip(first, offsets, blank):
        if b or s == e:
            out.append(f)
            continue
        # a token over the one before's characters (SentencePiece gives a text's opening `▁` its first
        # character) is that one's word
        out.append(f or (s >= last and (after or cuts(text[s]))))
        after, last = cuts(text[e - 1]), max(last, e)
    return out


def punctuation(c: str) -> bool:
    """BERT's punctuation: a non-alphanumeric printable ASCII character, or Unicode category P."""
    if c.isascii():
        return 33 <= ord(c) <= 126 and not c.isalnum()
    return unicodedata.category(c).startswith("P")


def _edge(c: str) -> bool:
    """What a token's offsets lose at their ends: white space, and an invisible format character
    that a tokenizer keeping it (byte-level BPE, SentencePiece) counts in a token."""
    return c.isspace() or invisible(c)


def _no_blank_firsts(first: list[bool], blank: list[bool]) -> None:
    """A word's label goes on a token with characters: a `▁` token of its own that starts a
    word hands its place to the next token of that word, and whitespace that is a word of its
    own (byte-level BPE's run of spaces) carries none."""
    for j, b in enumerate(blank):
        if b and first[j]:
            first[j] = False
            if j + 1 < len(first) and not first[j + 1] and not blank[j + 1]:
                first[j + 1] = True


def word_owner(words: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Each character of the given words -> its word's (start, end)."""
    return {c: (a, b) for a, b in words for c in range(a, b)}


def first_of_words(offsets: list[tuple[int, int]], owner: dict[int, tuple[int, int]]) -> list[bool]:
    """Which tokens start one of the words `owner` maps (word_owner): the first token that begins
    inside each word. A token outside every word (none should be) starts a word of its own."""
    first, prev = [], None
    for j, (s, _) in enumerate(offsets):
        w = owner.get(s, ("alone", j))
        first.append(w != prev)
        prev = w
    return first


def _widen(text: str, offsets: list[tuple[int, int]],
           owner: dict[int, tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """Stretch token bounds over neighbouring non-space characters that produced no token.

    Characters such as U+FE0F (a variation selector) vanish in the tokenizer; when they are
    glued to a word they belong to it, so a span decoded from tokens still covers them. One
    between two tokens goes to the one before (as a variation selector follows its character),
    never to both: two entities side by side never share it. An invisible format character
    (category Cf: U+FEFF, a zero-width space, a soft hyphen, a direction mark), or a control
    character (Cc: NUL, BEL), is no part of a word's ends, so a token never stretches over one,
    except within the text's own words where they are given (`owner`, word_owner's: the tokens a corpus was annotated on, which an entity
    covers whole); there a token stretches within its word only (a character that is a word of
    its own stays outside the entities around it).
    """
    owner = owner or {}
    starts, ends = [], []
    for j, (s, e) in enumerate(offsets):
        lo = ends[j - 1] if j else 0
        hi = offsets[j + 1][0] if j + 1 < len(offsets) else len(text)
        word = owner.get(s)
        wa, wb = word or (0, len(text))
        while s > max(lo, wa) and _glued(text[s - 1], word is not None):
            s -= 1
        while e < min(hi, wb) and _glued(text[e], word is not None):
            e += 1
        starts.append(s)
        ends.append(e)
    return starts, ends


def _glued(c: str, in_word: bool) -> bool:
    return not c.isspace() and (in_word or not _unseen(c))


def _unseen(c: str) -> bool:
    """A format character (Cf) or a control character (NUL, BEL: Cc): no part of a word's edge."""
    return invisible(c) or unicodedata.category(c) == "Cc"


MIN_LENGTH = 8  # the shortest window read, in training as in inference


def check_window(max_length: int, stride: int, limit: int) -> tuple[int, int]:
    """A valid (max_length, stride) pair for windows of an encoder that takes `limit` tokens."""
    from spanflow.errors import ConfigError

    _whole(max_length, stride)
    if not MIN_LENGTH <= max_length <= limit:
        raise ConfigError(f"--max-length must be between {MIN_LENGTH} and the model's limit {limit}, got {max_length}")
    if not 0 <= stride <= max_stride(max_length):  # what make_windows honours: more left too few new tokens a window
        raise ConfigError(f"--stride must be between 0 and half the window's {max_length - 2} tokens "
                          f"({max_stride(max_length)}), got {stride}")
    return max_length, stride


def check_window_floor(max_length: int | None, stride: int | None) -> None:
    """What check_window can tell before the model (and its limit) is loaded: a ConfigError for a
    --max-length under MIN_LENGTH or a negative --stride."""
    from spanflow.errors import ConfigError

    _whole(max_length, stride)
    if max_length is not None and max_length < MIN_LENGTH:
        raise ConfigError(f"--max-length must be at least {MIN_LENGTH} (and at most the model's limit), got {max_length}")
    if stride is not None and stride < 0:
        raise ConfigError(f"--stride must be >= 0 (NER's windows; other tasks take none), got {stride}")


def _whole(max_length, stride) -> None:
    """A ConfigError where a length or stride given through the Python API is not a whole number."""
    from spanflow.errors import ConfigError

    for name, v in (("max-length", max_length), ("stride", stride)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise ConfigError(f"--{name} must be a whole number of tokens, got {v!r:.60}")


def max_stride(max_length: int) -> int:
    """The most tokens neighbouring windows of `max_length` (special tokens included) share: half a window."""
    return (max_length - 2) // 2


def make_windows(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int]]:
    """Cut [0, n_tokens) into windows of at most max_length-2 content tokens.

    Consecutive windows overlap by `stride` tokens, at most half a window (a short trained
    window with the default stride would otherwise advance a token at a time), so every
    token has context on both sides in some window; nothing is truncated.
    """
    size = max_length - 2
    if size < 1:
        raise ValueError("max_length must be at least 3")
    if n_tokens <= size:
        return [(0, n_tokens)]
    step = max(1, size - min(stride, max_stride(max_length)))
    out, a = [], 0
    while True:
        b = min(a + size, n_tokens)
        out.append((a, b))
        if b == n_tokens:
            return out
        a += step


def line_segments(enc: Encoded) -> list[tuple[int, int]]:
    """Token ranges of a text's lines (lines without tokens have none)."""
    cuts = [j for j, b in enumerate(enc.breaks or []) if b]
    bounds = [0] + cuts + [len(enc.ids)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def windows_for(encs: list[Encoded], *, max_length: int, stride: int, cls_id: int, sep_id: int,
                labels: list[list[int]] | None = None, lines: bool = False) -> list[Window]:
    """Every text's windows, in text order, as model inputs (labels sliced alongside).

    With `lines`, no window crosses a line break: each line is read on its own, as a
    model trained on single-line texts saw its inputs (subword tokenizers drop the break
    itself, so without this the model cannot tell where one line ends).
    """
    out = []
    for i, enc in enumerate(encs):
        segments = line_segments(enc) if lines else [(0, len(enc.ids))]
        for s, e in segments:
            for a, b in make_windows(e - s, max_length, stride):
                a, b = a + s, b + s
                lab = None if labels is None else [IGNORE] + labels[i][a:b] + [IGNORE]
                out.append(Window(i, a, b, [cls_id] + enc.ids[a:b] + [sep_id], lab))
    return out


def own_tokens(windows: list[Window]) -> list[int]:
    """Each window's tokens, less those an earlier window of its text already holds (overlapping
    windows of a long text, and their special tokens). A window that overlaps none counts whole,
    so the sum is what the texts hold however short the windows: a speed counted in these does
    not grow with the work that overlapping windows repeat."""
    covered: dict[int, int] = {}
    out = []
    for w in windows:
        end = covered.get(w.example, -1)
        out.append(len(w) if w.start >= end else max(0, w.end - end))
        covered[w.example] = max(end, w.end)
    return out


def merge_windows(n_tokens: int, parts: list[tuple[int, int, list[int]]]) -> list[int]:
    """Merge per-window predictions (start, end, preds) into one per-token list.

    In an overlap each token takes the prediction of the window in which it sits further
    from the edge: the left window up to the overlap's midpoint, the right one after.
    """
    merged = [0] * n_tokens
    parts = sorted(parts)
    for k, (a, b, pred) in enumerate(parts):
        lo = a if k == 0 else (a + parts[k - 1][1]) // 2
        hi = b if k == len(parts) - 1 else (parts[k + 1][0] + b) // 2
        merged[lo:hi] = pred[lo - a:hi - a]
    return merged
