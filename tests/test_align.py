import random
import pytest

from spanflow.batching.align import (IGNORE, Encoded, encode_texts, make_windows, merge_windows, own_tokens,
                                     windows_for, word_owner)
from spanflow.tasks.ner.bio import bio_labels, decode_spans
from spanflow.data.io import read_ner
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.ner.features import bio_label_list


def roundtrip(tokenizer, examples, words=False):
    labels = sorted({lab for e in examples for *_, lab in e.spans})
    id2label = bio_label_list(labels)
    l2i = {lab: i for i, lab in enumerate(id2label)}
    encs = encode_texts(tokenizer, [e.text for e in examples], [e.words for e in examples] if words else None)
    out = []
    for e, enc in zip(examples, encs):
        lab = bio_labels(enc, e.spans, l2i)
        out.append(decode_spans(enc, [x if x != IGNORE else 0 for x in lab], id2label))
    return out


def test_roundtrip_fixtures_with_traps(asset, tiny_tokenizer):
    for name in ("wnut_like.conll", "resume_like.bmes"):
        ex = read_ner(asset(name))
        # tagged on the file's own tokens: 'Dubbz\ufeff' is one, annotated whole
        assert roundtrip(tiny_tokenizer, ex, words=True) == [sorted(e.spans) for e in ex]


def test_roundtrip_synthetic(tiny_tokenizer):
    ex = synthetic_ner(100, seed=5)
    assert roundtrip(tiny_tokenizer, ex) == [e.spans for e in ex]


def test_token_without_pieces_shifts_nothing(tiny_tokenizer):
    text = "see \u200b Paris"
    enc = encode_texts(tiny_tokenizer, [text])[0]
    assert all(text[s:e] != "\u200b" for s, e in enc.offsets)  # the tokenizer drops it
    labels = bio_labels(enc, [(8, 13, "LOC")], {"O": 0, "B-LOC": 1, "I-LOC": 2})
    firsts = [lab for lab, f in zip(labels, enc.first) if f]
    assert firsts[-1] == 1 and set(firsts[:-1]) == {0}


def _tagged(enc):  # B at each name's first token (at 0 and 4), I on through it
    enc.first = [True] * len(enc.offsets)
    return enc, [1 if s in (0, 4) else 2 if s < 8 else 0 for s, _ in enc.offsets]


def test_a_character_the_tokenizer_drops_goes_to_one_side_only(tiny_tokenizer):
    # a variation selector, which BERT's uncased normalizer drops (the tiny tokenizer keeps it): it
    # goes to the token before, never to both entities side by side
    from spanflow.batching.align import _widen

    assert _widen("Ann\ufe0fBob x", [(0, 3), (4, 7), (8, 9)]) == ([0, 4, 8], [4, 7, 9])
    # where the text's own words make it a word of its own, neither entity takes it
    words = word_owner([(0, 3), (3, 4), (4, 7), (8, 9)])
    assert _widen("Ann\ufe0fBob x", [(0, 3), (4, 7), (8, 9)], words) == ([0, 4, 8], [3, 7, 9])


def test_a_control_character_the_tokenizer_drops_stays_outside_the_word_beside_it():
    """A NUL (or BEL) next to a word went into its span ('Ada\\x00'): BERT drops control characters
    as it drops a variation selector, and the widening took it as a part of the word."""
    from spanflow.batching.align import _widen

    for c in ("\x00", "\x07", "\x7f"):
        assert _widen(f"Ada{c} met", [(0, 3), (5, 8)]) == ([0, 5], [3, 8]), repr(c)
        assert _widen(f"Ada {c}Bob", [(0, 3), (5, 8)]) == ([0, 5], [3, 8]), repr(c)
    assert _widen("Ada\ufe0f met", [(0, 3), (5, 8)]) == ([0, 5], [4, 8])  # a variation selector still is


def test_an_entity_never_runs_across_a_line_break_of_any_kind(tiny_tokenizer):
    labels = ["O", "B-ORG", "I-ORG"]
    for br in ("\n", "\r\n", "\r", "\u2028", "\x85"):
        text = f"Ann{br}Bob"
        enc = encode_texts(tiny_tokenizer, [text])[0]
        enc.first = [True] * len(enc.offsets)
        tags = [1] + [2] * (len(enc.offsets) - 1)  # one entity tagged over both lines
        assert [text[s:e] for s, e, _ in decode_spans(enc, tags, labels)] == ["Ann", "Bob"], repr(br)


def test_subword_labels_only_on_first_piece():
    enc = Encoded(ids=[1, 2, 3], offsets=[(0, 3), (3, 6), (7, 9)], first=[True, False, True])
    assert bio_labels(enc, [(0, 6, "X")], {"O": 0, "B-X": 1, "I-X": 2}) == [1, IGNORE, 0]


def test_windows_cover_everything_with_overlap():
    for n in (1, 5, 6, 7, 50, 101):
        wins = make_windows(n, max_length=8, stride=2)
        covered = set()
        for a, b in wins:
            assert b - a <= 6
            covered |= set(range(a, b))
        assert covered == set(range(n))
        for (a1, b1), (a2, b2) in zip(wins, wins[1:]):
            assert b1 - a2 == 2  # overlap equals the stride


def test_own_tokens_count_each_token_of_a_text_once_however_short_the_windows():
    encs = [Encoded(ids=list(range(n)), offsets=[(i, i + 1) for i in range(n)], first=[True] * n,
                    breaks=[i in (4, 9) for i in range(n)]) for n in (3, 20, 57)]
    for lines in (False, True):
        whole = windows_for(encs, max_length=128, stride=16, cls_id=1, sep_id=2, lines=lines)
        assert own_tokens(whole) == [len(w) for w in whole]  # no overlap: every window counts whole
        for L in (5, 8, 16):
            wins = windows_for(encs, max_length=L, stride=16, cls_id=1, sep_id=2, lines=lines)
            counts = own_tokens(wins)
            assert sum(len(w) for w in wins) > sum(counts) == sum(len(w) for w in whole)
            assert all(c >= 0 for c in counts)


def test_merge_prefers_window_centre():
    # window 0 says 1 everywhere, window 1 says 2: overlap [4, 6) splits at its midpoint
    merged = merge_windows(10, [(0, 6, [1] * 6), (4, 10, [2] * 6)])
    assert merged == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]


def test_long_text_windows_merge_back_to_gold(tiny_tokenizer):
    rng = random.Random(0)
    ex = synthetic_ner(30, seed=9, max_clauses=3)
    text, spans = "", []
    for e in ex:  # one long text far over the window size
        base = len(text) + (1 if text else 0)
        text = (text + " " if text else "") + e.text
        spans += [(s + base, e_ + base, lab) for s, e_, lab in e.spans]
    id2label = bio_label_list(sorted({lab for *_, lab in spans}))
    l2i = {lab: i for i, lab in enumerate(id2label)}
    enc = encode_texts(tiny_tokenizer, [text])[0]
    gold = bio_labels(enc, spans, l2i)
    wins = windows_for([enc], max_length=32, stride=8, cls_id=2, sep_id=3, labels=[gold])
    assert len(wins) > 10 and all(len(w) <= 32 for w in wins)
    # a perfect "model": each window predicts its own labels; noise outside the owned middle
    parts = []
    for k, w in enumerate(wins):
        pred = [x if x != IGNORE else 0 for x in w.labels[1:-1]]
        if k > 0 and rng.random() < 0.5:
            pred[0] = 1  # inner edges are overruled by the neighbour that sees them centred
        if k < len(wins) - 1 and rng.random() < 0.5:
            pred[-1] = 1
        parts.append((w.start, w.end, pred))
    merged = merge_windows(len(enc.ids), parts)
    assert decode_spans(enc, merged, id2label) == spans


def test_input_tokens_are_the_words(tiny_tokenizer, tmp_path):
    """A text read as tokens labels and decodes whole tokens: a URL the tokenizer cuts into
    many words is one word, so a span cannot start or end inside it."""
    path = tmp_path / "t.conll"
    path.write_text("see\tO\nhttp://t.co/ab\tB-product\nnow\tO\n\n", encoding="utf-8")
    ex = read_ner(str(path))[0]
    assert ex.text == "see http://t.co/ab now" and ex.words == [(0, 3), (4, 18), (19, 22)]
    enc = encode_texts(tiny_tokenizer, [ex.text], [ex.words])[0]
    by_tokenizer = encode_texts(tiny_tokenizer, [ex.text])[0]
    assert sum(enc.first) == 3 < sum(by_tokenizer.first)
    id2label = ["O", "B-product", "I-product"]
    labels = bio_labels(enc, ex.spans, {lab: i for i, lab in enumerate(id2label)})
    assert sum(x == 1 for x in labels) == 1 and sum(x == 2 for x in labels) == 0
    # a B on the URL's first piece decodes to the whole token, whatever the other pieces say
    pred = [1 if (f and enc.offsets[j][0] == 4) else 0 for j, f in enumerate(enc.first)]
    assert decode_spans(enc, pred, id2label) == [(4, 18, "product")]
    # the same prediction read at the tokenizer's words ends inside the token
    assert decode_spans(by_tokenizer, pred, id2label)[0][1] < 18


def test_overlap_is_at_most_half_a_window():
    wins = make_windows(100, 32, 32)  # 30 tokens per window; a 32-token overlap would advance by 1
    assert [b - a for a, b in wins[:-1]] == [30] * (len(wins) - 1) and wins[1][0] == 15
    assert wins[-1][1] == 100 and len(wins) == 6


def test_an_entity_never_runs_across_a_line_break(tiny_tokenizer):
    id2label = ["O", "B-LOC", "I-LOC"]
    for text, want in (("Paris London", [(0, 12, "LOC")]), ("Paris\nLondon", [(0, 5, "LOC"), (6, 12, "LOC")])):
        enc = encode_texts(tiny_tokenizer, [text])[0]
        pred = [1 if k == 0 else 2 for k in range(len(enc.ids))]  # B then I all the way
        assert decode_spans(enc, pred, id2label) == want


def _tokenizer(model, pre_tokenizer, texts):
    """A fast tokenizer whose offsets keep the space before a word, as ModernBERT's byte-level
    BPE (no offset trimming) and DeBERTa-v2's SentencePiece `▁` do."""
    from tokenizers import Tokenizer, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(model)
    t.pre_tokenizer = pre_tokenizer
    trainer = (trainers.BpeTrainer if type(model).__name__ == "BPE" else trainers.UnigramTrainer)(
        vocab_size=300, special_tokens=["[UNK]"], **({"unk_token": "[UNK]"} if type(model).__name__ == "Unigram" else {}))
    t.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")


def _space_keeping_tokenizers(texts):
    from tokenizers import models, pre_tokenizers

    return {"byte-level": _tokenizer(models.BPE(unk_token="[UNK]"), pre_tokenizers.ByteLevel(add_prefix_space=False),
                                     texts),
            "metaspace": _tokenizer(models.Unigram(), pre_tokenizers.Metaspace(), texts)}


def test_spans_start_on_the_word_where_offsets_count_the_space_before_it():
    ex = synthetic_ner(60, seed=3)
    texts = [e.text for e in ex] + ["Lagos  Lagos\nLagos Xq"]
    for name, tok in _space_keeping_tokenizers(texts).items():
        raw = tok(texts[0], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert any(texts[0][s].isspace() for s, e in raw if e > s), name  # the trap is there
        assert roundtrip(tok, ex) == [e.spans for e in ex], name
        enc = encode_texts(tok, [texts[-1]])[0]
        assert all(not texts[-1][s:e].isspace() for s, e in enc.offsets if e > s), name
        heads = [j for j, f in enumerate(enc.first) if f] + [len(enc.first)]
        words = [texts[-1][enc.starts[j]:enc.ends[k - 1]] for j, k in zip(heads, heads[1:])]
        assert words[:3] == ["Lagos", "Lagos", "Lagos"], (name, words)
        # "Lagos\nLagos": the second starts a line, so no entity runs across the break
        third = next(j for j, s in enumerate(enc.starts) if s == 13 and enc.first[j])
        assert enc.breaks[third], name


@pytest.mark.parametrize("mark", ["\u200b", "\ufeff", "\u200f", "\u00ad"])
def test_an_invisible_format_character_is_no_part_of_an_entity_but_within_a_given_word(tiny_tokenizer, mark):
    """A zero-width space, byte-order mark, direction mark or soft hyphen at a word's edge was taken
    into the entity ('\\ufeffZoë'), which no annotation of the text holds; a corpus token that holds
    one (WNUT-17's 'Dubbz\\ufeff') is annotated whole and stays so."""
    text = f"Ann{mark}Bob x"
    labels = ["O", "B-PER", "I-PER"]
    enc, tags = _tagged(encode_texts(tiny_tokenizer, [text])[0])
    assert [text[s:e] for s, e, _ in decode_spans(enc, tags, labels)] == ["Ann", "Bob"]
    enc, tags = _tagged(encode_texts(tiny_tokenizer, [text], words=[[(0, 4), (4, 7), (8, 9)]])[0])
    assert [text[s:e] for s, e, _ in decode_spans(enc, tags, labels)] == [f"Ann{mark}", "Bob"]


def test_a_tokenizer_that_keeps_an_invisible_character_in_a_token_loses_it_from_the_offsets():
    """Byte-level BPE and SentencePiece count a zero-width space in a token ('\\u200bZoë'): its
    span would start on it."""
    from spanflow.batching.align import _trim

    assert _trim("\u200bZo\u00eb x\u200f", [(0, 4), (5, 6), (6, 7)]) == ([(1, 4), (5, 6), (6, 6)],
                                                                           [False, False, True])


def test_a_long_text_is_cut_only_at_a_space_after_a_word():
    """A control character Python calls white space (\\x1c, U+0085) joins two words for BERT, and a
    run of spaces is one token for byte-level BPE: a cut there could change the last word's tokens."""
    from spanflow.batching.align import CHARS_PER_TOKEN, read_prefix

    limit = 4 * CHARS_PER_TOKEN
    for sep in ("\x1c", "\x85"):
        text = "a" * (limit - 4) + sep + "bcdefgh ij"
        assert read_prefix(text, 4) == text, repr(sep)  # no space after a word near the cut: whole
    text = "a" * (limit - 4) + "  bcdefgh ij"  # cut where the word ends, before its run of spaces
    assert read_prefix(text, 4) == "a" * (limit - 4)
    text = "word " * limit
    cut = read_prefix(text, 4)
    assert cut.endswith("word") and limit - 5 < len(cut) <= limit and text.startswith(cut + " ")


def _words(tok, text):
    enc = encode_texts(tok, [text])[0]
    heads = [j for j, f in enumerate(enc.first) if f] + [len(enc.first)]
    return [text[enc.starts[j]:enc.ends[k - 1]] for j, k in zip(heads, heads[1:])]


GLUED = [("Grace Hopper, born in (Switzerland).", [(0, 12, "PER"), (23, 34, "LOC")]),
         ("\"Hooli\" hired Ada Lovelace; Lima!", [(1, 6, "ORG"), (14, 26, "PER"), (28, 32, "LOC")]),
         ("北京是首都。", [(0, 2, "LOC")])]


def test_sentencepiece_words_end_at_punctuation_and_ideographs_as_berts_do():
    """SentencePiece's words split at spaces only: 'Hopper,' was one word, so an entity took the comma,
    one in brackets or quotes was lost, and a line of Chinese was one word."""
    from tokenizers import models, pre_tokenizers

    from spanflow.data.examples import NerExample

    texts = [e.text for e in synthetic_ner(60, seed=3)] + [t for t, _ in GLUED]
    tok = _tokenizer(models.Unigram(), pre_tokenizers.Metaspace(), texts)
    assert _words(tok, GLUED[0][0]) == ["Grace", "Hopper", ",", "born", "in", "(", "Switzerland", ")", "."]
    assert _words(tok, GLUED[2][0]) == ["北", "京", "是", "首", "都", "。"]
    ex = [NerExample(text=t, spans=s) for t, s in GLUED]
    assert roundtrip(tok, ex) == [e.spans for e in ex]


def test_a_token_its_tokenizer_left_empty_does_not_take_its_words_label():
    """RoBERTa's trim_offsets leaves a bare 'Ġ' (a vocabulary without its merge with the next
    letter) empty: it started the word, so the word's label sat on a token that decodes to nothing,
    and 'Umbrella Labs' came back as 'Labs'."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from spanflow.data.examples import NerExample

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator([e.text for e in synthetic_ner(60, seed=3)], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.RobertaProcessing(("</s>", 1), ("<s>", 0), trim_offsets=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")
    text = "Grace met Zq Umbrella Qx here ."
    raw = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert (13, 13) in [tuple(o) for o in raw]  # the trap: the empty 'Ġ' before 'Umbrella'
    assert _words(tok, text) == ["Grace", "met", "Zq", "Umbrella", "Qx", "here", "."]
    ex = [NerExample(text=text, spans=[(13, 24, "ORG")])]
    assert roundtrip(tok, ex) == [[(13, 24, "ORG")]]


def test_a_wordpiece_tokenizers_own_words_are_kept_as_they_are(tiny_tokenizer):
    """BERT's pre-tokenizer already cuts punctuation and ideographs: the split for SentencePiece adds
    nothing there, and kana runs, full-width letters and Hangul stay the words BERT makes them."""
    for text in ("コンピュータを買った", "北京是首都。", "Hopper, (Zürich) ５月 ＡＢＣ", "서울에서 만나요", "don't 3.5 e-mail"):
        enc = tiny_tokenizer(text, add_special_tokens=False)
        wids = enc.word_ids()
        own = [w is not None and (j == 0 or wids[j - 1] != w) for j, w in enumerate(wids)]
        assert encode_texts(tiny_tokenizer, [text])[0].first == own, text


class _Counted(list):
    """A token list that counts the items read from it."""

    reads = 0

    def __getitem__(self, k):
        got = super().__getitem__(k)
        _Counted.reads += len(got) if isinstance(k, slice) else 1
        return got

    def __iter__(self):
        for x in super().__iter__():
            _Counted.reads += 1
            yield x


def test_tags_of_a_long_document_read_each_token_a_few_times_not_once_a_span():
    """Each span scanned every token: evaluate on a 189k-character document spent 23 s of its 24
    checking gold spans; convert to CoNLL 16 s. The same labels, reading each token about once."""
    from spanflow.data.formats.tokens import bio_tags

    words = 4000
    offsets = [(6 * k, 6 * k + 5) for k in range(words)]  # one token a word of 5 characters
    spans = [(6 * k, 6 * k + 11, "X") for k in range(0, words, 3)]  # two words each, every third word
    l2i = {"O": 0, "B-X": 1, "I-X": 2}
    enc = Encoded(ids=[0] * words, offsets=_Counted(offsets), first=[True] * words)
    _Counted.reads = 0
    labels = bio_labels(enc, spans, l2i)
    assert labels == [(1, 2, 0)[k % 3] for k in range(words)]
    assert _Counted.reads < 10 * words  # a scan per span read 1334 x 4000
    _Counted.reads = 0
    assert bio_tags(_Counted(offsets), spans) == [("B-X", "I-X", "O")[k % 3] for k in range(words)]
    assert _Counted.reads < 10 * words


def test_predicts_real_tokens_count_each_token_of_a_text_once_however_short_the_windows(tiny_tokenizer,
                                                                                          monkeypatch):
    """predict counted every window's tokens as real, those two overlapping windows share and their
    special tokens too: a short --max-length reported a higher real tokens/s than the default,
    where tune counts each token once."""
    import torch.nn as nn

    from spanflow.runtime.precision import resolve_policy
    from spanflow.tasks.ner import tagging

    monkeypatch.setattr(tagging, "tag_windows", lambda model, bw, *a: [[0] * len(w) for w in bw])
    texts = [" ".join(["alpha beta gamma delta"] * 12), "zeta eta"]

    def real(max_length: int, stride: int) -> int:
        got = []
        list(tagging.tag_texts(nn.Identity(), tiny_tokenizer, texts, id2label=["O"], max_length=max_length,
                               stride=stride, max_tokens=512, policy=resolve_policy("fp32", "cpu"),
                               on_batch=lambda n, r, p: got.append(r)))
        return sum(got)

    whole = real(128, 16)  # one window a text
    assert whole == sum(len(tiny_tokenizer(t)["input_ids"]) for t in texts)  # every token once, specials too
    assert real(8, 3) == whole
