"""Plain text is cut into the training data's kind of words: a model trained on whitespace-separated
tokens (CoNLL) keeps a URL whole in predict, serve, the Python API, the spaCy component and its
Hugging Face export; models trained on JSONL spans, and model directories saved before the
`words` key, keep the tokenizer's words."""
import json
import random
import re
import shutil

import pytest
from helpers import tiny_bert

from spanflow.cli.main import main
from spanflow.data.examples import NerExample
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.io import read_ner
from spanflow.errors import ModelDirError
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.tasks.ner.tagging import tag_texts
from spanflow.tasks.ner.words import TOKENIZER, WHITESPACE, whitespace_words, words_of
from spanflow.training.options import TrainOptions

NAMES = ["dani alves", "lionel messi", "ana lopez", "marco rossi", "sara berg", "tom hanks"]
PLACES = ["oslo", "madrid", "lisbon", "berlin"]


def url(name: str, place: str) -> str:
    """One token of punctuation and underscores that holds entity words, as a tweet's link does."""
    return "http://x.y/" + "_".join(name.split() + ["in", place])


def tagged(rng: random.Random) -> list[tuple[str, str]]:
    """A sentence as (token, BIO tag) pairs; the URL token is O."""
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    person = [(w, ("I-" if i else "B-") + "person") for i, w in enumerate(name.split())]
    where = [(place, "B-location")]
    o = [(w, "O") for w in ("watch", "in")]
    kind = rng.randrange(3)
    if kind == 0:
        return person + [("played", "O"), ("in", "O")] + where + [("today", "O")]
    if kind == 1:
        return o[:1] + person + o[1:] + where + [(url(name, place), "O")]
    return [(url(name, place), "O"), ("is", "O"), ("news", "O"), ("from", "O")] + where


def write_conll(path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("".join(f"{tok}\t{tag}\n" for tok, tag in tagged(rng)) + "\n" for _ in range(n))


# texts never trained on: other name/place pairs inside the links, and punctuation glued to words
TEXTS = [f"watch {n} in {p} {url(n, p)}" for n, p in (("marco rossi", "berlin"), ("sara berg", "oslo"))] + \
        [f"{url(n, p)} is news from {p}" for n, p in (("tom hanks", "lisbon"), ("dani alves", "madrid"))] + \
        ["ana lopez played in madrid today", "lionel messi, in oslo! today"]


def cut_inside(text: str, spans) -> list:
    """The spans that start or end inside a whitespace token of `text`."""
    words = whitespace_words(text)
    starts, ends = {a for a, _ in words}, {b for _, b in words}
    return [s for s in spans if s[0] not in starts or s[1] not in ends]


def opts(**kw) -> TrainOptions:
    base = {"epochs": 10, "lr": 3e-3, "head_lr": 3e-3, "max_tokens": 512, "max_length": 64, "warmup_ratio": 0.05,
            "patience": 0, "log_every": 0, "seed": 0}
    return TrainOptions(**{**base, **kw})


@pytest.fixture(scope="module")
def conll_model(tmp_path_factory):
    """A CRF model on a Hugging Face BERT encoder (so it can be exported), trained on CoNLL tokens."""
    d = tmp_path_factory.mktemp("words")
    write_conll(d / "train.conll", 120, seed=1)
    train = read_ner(str(d / "train.conll"))
    enc, tok = tiny_bert([e.text for e in train] + TEXTS, hidden=32, layers=2, heads=2)
    enc.save_pretrained(d / "enc")
    tok.save_pretrained(d / "enc")
    train_ner(train, None, model=str(d / "enc"), out_dir=str(d / "run"), options=opts(), log_fn=lambda s: None)
    return d, NerModel.load(str(d / "run" / "model"), precision="fp32")


def test_a_conll_model_keeps_whitespace_tokens_whole_in_predict(conll_model, tmp_path):
    d, model = conll_model
    assert json.loads((d / "run" / "model" / "spanflow.json").read_text())["words"] == WHITESPACE
    assert model.words == WHITESPACE
    got = model.predict(TEXTS)
    assert sum(map(len, got)) >= 6  # the model finds entities, so where they end means something
    assert [cut_inside(t, s) for t, s in zip(TEXTS, got)] == [[]] * len(TEXTS)
    # the same spans as the evaluate path, which passes the CoNLL tokens as words
    assert got == model.predict(TEXTS, words=[whitespace_words(t) for t in TEXTS])
    # the case bites: on the tokenizer's words the same model tags names inside the links
    model.words = TOKENIZER
    try:
        assert any(cut_inside(t, s) for t, s in zip(TEXTS, model.predict(TEXTS)))
    finally:
        model.words = WHITESPACE
    # the server's units and `spanflow predict` give the same spans
    units, _, encs = model.units(TEXTS)
    assert model.assemble(TEXTS, units, model.run_batch(units), encs) == got
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "out.jsonl"), "--precision", "fp32"]) == 0
    lines = [json.loads(x)["entities"] for x in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [[(x["start"], x["end"], x["label"]) for x in ents] for ents in lines] == got


def test_a_model_dir_without_the_key_predicts_on_tokenizer_words(conll_model, tmp_path):
    d, model = conll_model
    old = tmp_path / "old"
    shutil.copytree(d / "run" / "model", old)
    cfg = json.loads((old / "spanflow.json").read_text())
    del cfg["words"]
    (old / "spanflow.json").write_text(json.dumps(cfg))
    loaded = NerModel.load(str(old), precision="fp32")
    assert loaded.words == TOKENIZER
    before = list(tag_texts(loaded.module, loaded.tokenizer, TEXTS, id2label=loaded.id2label,
                            max_length=loaded.max_length, stride=loaded.stride, max_tokens=4096,
                            policy=loaded.policy, lines=loaded.lines))  # what predict ran before the key
    assert loaded.predict(TEXTS) == before
    assert before != model.predict(TEXTS)
    cfg["words"] = "sentencepiece"
    (old / "spanflow.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match="unknown words 'sentencepiece'"):
        NerModel.load(str(old))


def test_the_spacy_component_sets_the_spans_predict_finds(conll_model):
    spacy = pytest.importorskip("spacy")
    d, model = conll_model
    nlp = spacy.blank("en")  # splits "messi," and "oslo!" finer than whitespace, keeps the links whole
    comp = nlp.add_pipe("spanflow_ner", config={"model": str(d / "run" / "model"), "precision": "fp32"})
    docs = list(nlp.pipe(TEXTS, batch_size=4))
    want = model.predict(TEXTS)
    assert [[(e.start_char, e.end_char, e.label_) for e in doc.ents] for doc in docs] == want
    assert comp.expanded == 0 and comp.overlapping == 0


def test_the_hf_export_keeps_the_words_for_spanflow(conll_model, tmp_path, capsys):
    d, _ = conll_model
    assert main(["export", "--model", str(d / "run" / "model"), "--to", "hf", "--lossy", str(tmp_path / "hf")]) == 0
    assert "labels whitespace-separated words" in capsys.readouterr().err  # a note, on stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["spanflow_words"] == WHITESPACE
    back = NerModel.load(str(tmp_path / "hf"), precision="fp32")  # the emissions, decoded token by token
    assert back.words == WHITESPACE
    got = back.predict(TEXTS)
    assert sum(map(len, got)) >= 6
    assert [cut_inside(t, s) for t, s in zip(TEXTS, got)] == [[]] * len(TEXTS)


def test_a_jsonl_model_keeps_the_tokenizer_words(tmp_path):
    rng = random.Random(2)
    data = tmp_path / "train.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(80):
            name, place = rng.choice(NAMES), rng.choice(PLACES)
            text = f"{name} loves #{place}"  # the entity is the place, without its '#'
            write_jsonl_record(f, text, [(0, len(name), "person"), (len(text) - len(place), len(text), "location")])
    train = read_ner(str(data))
    model = train_ner(train, None, model="tiny", out_dir=str(tmp_path / "run"),
                      options=opts(epochs=12, lr=2e-2, head_lr=None), log_fn=lambda s: None)
    assert model.words == TOKENIZER
    assert json.loads((tmp_path / "run" / "model" / "spanflow.json").read_text())["words"] == TOKENIZER
    text = "sara berg loves #lisbon"
    assert (17, 23, "location") in NerModel.load(str(tmp_path / "run" / "model")).predict([text])[0]


def test_which_training_tokens_are_whitespace_words():
    def ex(text, words):
        return NerExample(text, [], words=words)

    assert words_of([ex("a b", [(0, 1), (2, 3)])]) == WHITESPACE
    assert words_of([ex("a b", None)]) == TOKENIZER  # plain text or JSONL spans
    assert words_of([ex("ab, c", [(0, 2), (2, 3), (4, 5)])]) == TOKENIZER  # spaCy's tokens: punctuation apart
    assert words_of([ex("北京", [(0, 1), (1, 2)])]) == WHITESPACE  # characters (BMES): cut into characters
    assert words_of([ex("北京", [(0, 2)])]) == WHITESPACE
    assert words_of([ex("北京大学", [(0, 2), (2, 4)])]) == TOKENIZER  # Chinese words, joined: not reproducible
    # a character of several code points is one (as CoNLL reads a token), in the data and in plain text
    assert words_of([ex("❤️北京", [(0, 2), (2, 3), (3, 4)])]) == WHITESPACE
    assert whitespace_words("❤️北e\u0301", {"chars": True}, plain=True) == [(0, 2), (2, 3), (3, 5)]
    # full-width punctuation or Hangul alone is no Chinese or Japanese word: cut as any other
    assert whitespace_words("Hewlett-Packard（HP） 서울에서", {"chars": True}, plain=True) == [(0, 19), (20, 24)]
    # CoNLL joins neighbouring CJK tokens without a space: one such text among many keeps whitespace words
    many = [ex("a b", [(0, 1), (2, 3)])] * 200 + [ex("x 北京大学", [(0, 1), (2, 4), (4, 6)])]
    assert words_of(many) == WHITESPACE
    assert whitespace_words(" a\u00a0b\tc  ") == [(1, 2), (3, 4), (5, 6)]


def test_punctuation_the_training_tokens_split_off_is_cut_off_plain_text_words():
    from spanflow.tasks.ner.words import edge_rules

    def ex(tokens):
        text, words, at = "", [], 0
        for t in tokens:
            words.append((at, at + len(t)))
            text += t + " "
            at += len(t) + 1
        return NerExample(text.rstrip(), [], words=words)

    # punctuation mostly its own token (Paris .), but @ kept at the start of a word (@user)
    data = [ex(["in", "Paris", ".", "@anna", "said", ",", "(", "ok", ")"])] * 3 + [ex(["U.S.", "@", "x"])]
    edges = edge_rules(data)
    assert "." in edges["end"] and "," in edges["end"] and "(" in edges["start"] and ")" in edges["end"]
    assert "@" not in edges["start"]  # attached 3 times, alone once: kept
    text = "Paris, (Reuters) @anna http://x.y/a_b ..."
    words = [text[a:b] for a, b in whitespace_words(text, edges)]
    assert words == ["Paris", ",", "(", "Reuters", ")", "@anna", "http://x.y/a_b", "..."]
    assert whitespace_words(text, {"start": "", "end": ""}) == whitespace_words(text)


def test_a_token_the_training_data_had_whole_and_an_abbreviation_keep_their_dot():
    """News-style CoNLL has `.` alone far more often than at a word's end, so `.` is cut off
    plain-text words; `Corp.` (a training token) and `U.S.` (an abbreviation) keep theirs, as
    trained, while a sentence's last word still loses it."""
    from spanflow.tasks.ner.words import edge_rules

    def ex(tokens):
        return NerExample(" ".join(tokens), [], words=[(m.start(), m.end()) for m in re.finditer(r"\S+", " ".join(tokens))])

    data = [ex(["Shares", "of", "Acme", "Corp.", "rose", "."])] * 2 + [ex(["in", "U.S.", "markets", "."])] * 3
    edges = edge_rules(data)
    assert "." in edges["end"] and edges["whole"] == ["Corp."]
    text = "Acme Corp. sued Globex Corp. in the U.S. and e.g. Oslo."
    words = [text[a:b] for a, b in whitespace_words(text, edges)]
    assert words == ["Acme", "Corp.", "sued", "Globex", "Corp.", "in", "the", "U.S.", "and", "e.g.", "Oslo", "."]
    # a mark after a word kept whole is cut off it; an ellipsis and a domain are no abbreviations
    text = "(Acme Corp.), Globex Corp., Paris... example.com."
    marks = {"start": "(", "end": ",.)", "whole": ["Corp."]}
    assert [text[a:b] for a, b in whitespace_words(text, marks)] == [
        "(", "Acme", "Corp.", ")", ",", "Globex", "Corp.", ",", "Paris", ".", ".", ".", "example.com", "."]


def test_the_cut_punctuation_is_saved_with_the_model(conll_model, tmp_path):
    from spanflow.tasks.ner import NerModel

    d, _ = conll_model
    m = NerModel.load(str(d / "run" / "model"), device="cpu", precision="fp32")  # a copy: the fixture stays as trained
    m.word_edges = {"start": "(", "end": ",.)"}
    m.save(str(tmp_path / "m"))
    again = NerModel.load(str(tmp_path / "m"), device="cpu", precision="fp32")
    assert again.word_edges == m.word_edges
    texts = ["ana lopez, in madrid."]
    assert again.predict(texts) == m.predict(texts) and again.predict(texts)[0], again.predict(texts)
    cut = [whitespace_words(t, again.word_edges) for t in texts]  # the saved punctuation, cut off
    assert [[t[a:b] for a, b in w] for t, w in zip(texts, cut)] == [["ana", "lopez", ",", "in", "madrid", "."]]
    assert again.predict(texts) == again.predict(texts, words=cut)  # plain text is cut as the model says
    assert again.predict(texts) != again.predict(texts, words=[whitespace_words(t) for t in texts])  # "madrid."
    ends = [{b for _, b in w} for w in cut]
    assert all(e in ends[k] for k, spans in enumerate(again.predict(texts)) for _, e, _ in spans)


def test_plain_text_words_leave_invisible_format_characters_off_their_ends():
    from spanflow.tasks.ner.words import WHITESPACE, splitter

    text = "\ufeffZo\u00eb lives in Z\u00fcrich\u200b \u200f \u200b"
    for edges in (None, {"start": "", "end": "."}):
        assert [text[s:e] for s, e in splitter(WHITESPACE, edges)(text)] == ["Zo\u00eb", "lives", "in", "Z\u00fcrich"]


def test_a_zero_width_space_inside_a_word_is_a_word_boundary():
    """Thai, Khmer and Burmese mark word boundaries with U+200B, no space: the whole line was one
    word, so one entity."""
    from spanflow.tasks.ner.words import WHITESPACE, splitter

    text = "\u0e2a\u0e21\u0e0a\u0e32\u0e22\u200b\u0e44\u0e1b\u200b\u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e \u0e04\u0e23\u0e31\u0e1a"
    assert [text[s:e] for s, e in splitter(WHITESPACE)(text)] == [
        "\u0e2a\u0e21\u0e0a\u0e32\u0e22", "\u0e44\u0e1b", "\u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e",
        "\u0e04\u0e23\u0e31\u0e1a"]


def test_an_invisible_character_at_a_words_edge_hides_no_punctuation_from_the_cut():
    from spanflow.tasks.ner.words import WHITESPACE, splitter

    edges = {"start": "(", "end": ".,)"}
    for text, want in (("Z\u00fcrich.\u200b is", ["Z\u00fcrich", ".", "is"]),
                       ("\u200b(Paris) x", ["(", "Paris", ")", "x"]),
                       ("Paris,\u200bLyon x", ["Paris", ",", "Lyon", "x"])):
        assert [text[s:e] for s, e in splitter(WHITESPACE, edges)(text)] == want, text


def mixed_conll(path, seed: int = 0) -> None:
    """English word tokens (`Hewlett-Packard` one of them) beside character-level Chinese sentences
    (one character per line, as BMES data has), which CoNLL joins without spaces."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(80):
            if i % 8 == 7:
                who, where = rng.choice(["李娜", "王伟"]), rng.choice(["北京", "上海"])
                tags = [(c, ("I-" if k else "B-") + "person") for k, c in enumerate(who)] + [("在", "O")]
                tags += [(c, ("I-" if k else "B-") + "location") for k, c in enumerate(where)] + [(c, "O") for c in "工作。"]
            else:
                name, place = rng.choice(NAMES), rng.choice(PLACES)
                tags = [("Hewlett-Packard", "B-corporation"), ("hired", "O")]
                tags += [(w, ("I-" if k else "B-") + "person") for k, w in enumerate(name.split())]
                tags += [("in", "O"), (place, "B-location")]
            f.write("".join(f"{t}\t{g}\n" for t, g in tags) + "\n")


def test_character_level_sentences_beside_word_tokens_keep_the_training_words(tmp_path):
    """A few character-level Chinese sentences among English word tokens made the words the
    tokenizer's, so `Hewlett-Packard`, one training token, was cut at its hyphen in predict while
    evaluate scored it whole; now plain text is cut as the tokens were, characters where they were."""
    from spanflow.tasks.ner.words import edge_rules

    mixed_conll(tmp_path / "train.conll")
    train = read_ner(str(tmp_path / "train.conll"))
    assert words_of(train) == WHITESPACE
    edges = edge_rules(train)
    assert edges.get("chars") is True
    assert [whitespace_words(e.text, edges, plain=True) for e in train] == [list(map(tuple, e.words)) for e in train]
    plain_edges = {k: v for k, v in edges.items() if k != "chars"}  # a model saved before the key
    assert whitespace_words("李娜在北京", plain_edges, plain=True) == [(0, 5)]
    assert whitespace_words("ana 李娜在 Hewlett-Packard", edges, plain=True) == [(0, 3), (4, 5), (5, 6), (6, 7), (8, 23)]
    # English word tokens alone never get the cut, nor do word-level Chinese tokens however short
    english = [e for e in train if e.text.isascii()]
    assert "chars" not in edge_rules(english)
    words = [NerExample("我爱 Python 和你", [], words=[(0, 1), (1, 2), (3, 9), (10, 11), (11, 12)])]
    assert "chars" not in edge_rules(english + words)
    enc, tok = tiny_bert([e.text for e in train], hidden=32, layers=1, heads=2)
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    train_ner(train, None, model=str(tmp_path / "enc"), out_dir=str(tmp_path / "run"), options=opts(epochs=8),
              log_fn=lambda s: None)
    assert json.loads((tmp_path / "run" / "model" / "spanflow.json").read_text())["word_edges"]["chars"] is True
    model = NerModel.load(str(tmp_path / "run" / "model"), precision="fp32")
    texts = [e.text for e in train[:16]]
    got = model.predict(texts)
    assert any(any(t[s:e] == "Hewlett-Packard" for s, e, _ in spans) for t, spans in zip(texts, got))
    assert got == model.predict(texts, words=[e.words for e in train[:16]])  # as evaluate reads them
