"""The Python API's inputs, checked where they enter: one string is one text, a wrong type is a
ConfigError naming the item at fault (never a TypeError from the tokenizer or a silent
truncation), examples built in code are checked as the readers check a file, and a cached
precision verdict is for the model's files as they were."""
import json
import os
import re

import numpy as np
import pytest
import torch

from spanflow.data.examples import NerExample, ReExample
from spanflow.data.io import read_ner, write_ner
from spanflow.errors import ConfigError, DataError
from spanflow.models.encoder import build_tiny
from spanflow.runtime.cache import cache_path
from spanflow.runtime.policy import pick_device, resolve_policy
from spanflow.tasks.embed import Embedder
from spanflow.tasks.embed.train import train_embedder
from spanflow import Pair  # the public name
from spanflow.tasks.embed.pooling import Pooling
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.tasks.re import ReModel, train_re
from spanflow.training.options import TrainOptions

TEXTS = ["Ann lives in Rome .", "Bob works for Hooli in Oslo ."]


def tiny():
    return build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)


@pytest.fixture(scope="module")
def ner():
    enc, tok = tiny()
    return NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=32, policy=resolve_policy("fp32", "cpu"))


@pytest.fixture(scope="module")
def rel():
    enc, tok = tiny()
    return ReModel(encoder=enc, tokenizer=tok, relations=["lives_in", "works_for"], limit=32,
                   policy=resolve_policy("fp32", "cpu"))


@pytest.fixture(scope="module")
def emb():
    enc, tok = tiny()
    return Embedder(encoder=enc, tokenizer=tok, pooling=Pooling(), precision="fp32", device="cpu")


def test_one_string_is_one_text_and_its_result_comes_alone(ner, rel, emb):
    text = TEXTS[1]
    assert ner.predict(text) == ner.predict([text])[0]  # not one result per character
    assert ner.predict(text, words=[(0, 3), (4, 9)]) == ner.predict([text], words=[[(0, 3), (4, 9)]])[0]
    assert rel.predict(text) == rel.predict([text])[0]
    one, listed = emb.encode(text), emb.encode([text])
    assert one.shape == (emb.dim,) and np.array_equal(one, listed[0])


@pytest.mark.parametrize("texts, said", [
    (None, "takes a list of strings, got NoneType"),
    ([None], "text 0 is NoneType None, not a string"),
    (["ok", 1], "text 1 is int 1, not a string"),
    ([b"bytes"], "text 0 is bytes b'bytes', not a string"),
    (["a \ud800 b"], "text 0 is not valid Unicode: a lone surrogate '\\ud800' at character 2"),
])
def test_a_text_that_is_not_a_string_is_named(ner, rel, emb, texts, said):
    for call in (ner.predict, rel.predict, emb.encode, lambda t: list(ner.predict_stream(t)),
                 lambda t: list(rel.predict_stream(t)), lambda t: list(emb.encode_stream(t))):
        with pytest.raises(ConfigError) as e:
            call(texts)
        assert said in str(e.value)


def test_a_set_of_texts_is_refused_as_it_has_no_order(ner, emb):
    for call in (ner.predict, emb.encode):
        with pytest.raises(ConfigError, match="got a set, which has no order; pass a list"):
            call({"a", "b"})
    with pytest.raises(AttributeError, match="module 'spanflow' has no attribute 'Nope'"):
        __import__("spanflow").Nope


def test_a_stream_of_one_string_is_refused(ner, rel, emb):
    for call in (ner.predict_stream, rel.predict_stream, emb.encode_stream):
        with pytest.raises(ConfigError, match="got one string; pass \\[text\\]"):
            list(call("Ann lives in Rome ."))


def test_options_of_the_wrong_type_are_named(ner, rel, emb):
    for call in (ner.predict, rel.predict, emb.encode):
        with pytest.raises(ConfigError, match="max_tokens must be a whole number of tokens >= 1"):
            call(TEXTS, max_tokens="x")
    with pytest.raises(ConfigError, match="threshold must be a number between 0 and 1"):
        rel.predict(TEXTS, threshold="x")
    for bad in ("x", 0, 4):
        with pytest.raises(ConfigError, match="--max-length must be"):
            emb.set_max_length(bad)
        with pytest.raises(ConfigError, match="--max-length must be"):
            ner.set_max_length(bad)


def test_words_must_match_the_texts(ner):
    with pytest.raises(ConfigError, match="words ran out after 2 items"):
        list(ner.predict_stream(iter(TEXTS + TEXTS), words=iter([None] * 2)))
    with pytest.raises(ConfigError, match="words has 1 items for 2 texts"):
        ner.predict(TEXTS, words=[None])
    with pytest.raises(ConfigError, match="words has 3 items for 2 texts"):
        ner.predict(TEXTS, words=[None, None, None])
    with pytest.raises(ConfigError, match="words has more items than the 2 texts"):
        list(ner.predict_stream(iter(TEXTS), words=iter([None] * 3)))
    with pytest.raises(ConfigError, match="text 0: its words .* within its 3 characters"):
        ner.predict(["a b"], words=[[(0, 50)]])
    with pytest.raises(ConfigError, match="text 1: its words"):
        ner.predict(TEXTS, words=[None, [(4, 9), (0, 3)]])  # out of order
    assert ner.predict(TEXTS, words=[None, None]) == ner.predict(TEXTS)
    given = [[(0, 3), (4, 9)], [(0, 3), (4, 9)]]
    assert ner.predict(TEXTS, words=[iter(w) for w in given]) == ner.predict(TEXTS, words=given)  # read once


def test_examples_built_in_code_are_checked_before_anything_is_written(tmp_path):
    good = [NerExample("Grace Hopper flew .", [(0, 12, "PER")])] * 4
    cases = [
        ([NerExample("Grace Hopper flew .", [(0, 50, "PER")])], "train[0]: span (0, 50, 'PER') is out of range"),
        ([NerExample("Grace Hopper flew .", [(0, 5, 3)])], "needs a label that is a non-empty string"),
        (["Grace Hopper flew ."], "train[0] is str 'Grace Hopper flew .', not a NerExample"),
        ([NerExample("Grace Hopper flew .", [(0, 12)])], "train[0]: its spans [(0, 12)] are not a list of (start, end, "
                                                        "label)"),
        ([NerExample("Grace Hopper flew .", None)], "train[0]: its spans None are not a list of"),
        ("train.conll", "train takes a list of NerExample, got str"),
    ]
    for train, said in cases:
        with pytest.raises(ConfigError, match=re.escape(said)):
            train_ner(train, None, model="tiny", out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="dev\\[1\\]: spans"):
        train_ner(good, [good[0], NerExample("ab cd", [(0, 4, "X"), (3, 5, "Y")])], model="tiny",
                  out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="options takes a TrainOptions"):
        train_ner(good, None, model="tiny", out_dir=str(tmp_path / "run"), options={"epochs": 1})
    with pytest.raises(ConfigError, match="out_dir takes a path, got NoneType"):
        train_ner(good, None, model="tiny", out_dir=None)
    for train in (train_re, train_embedder):
        with pytest.raises(ConfigError, match="options takes a TrainOptions"):
            train([], None, model="tiny", out_dir=str(tmp_path / "run"), options={"epochs": 1})
    with pytest.raises(ConfigError, match="train\\[0\\]: triple .* out of range"):
        train_re([ReExample("a b", [((0, 90), "r", (2, 3))])], None, model="tiny", out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"train\[0\]: triple .* has a span of white space alone \(' '\)"):
        train_re([ReExample("a  b", [((1, 2), "r", (0, 1))])], None, model="tiny", out_dir=str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")


def test_write_ner_refuses_a_span_it_would_write_as_another(tmp_path):
    out = tmp_path / "x.conll"
    with pytest.raises(ConfigError, match="examples\\[0\\]: span \\(0, 9, 'X'\\) is out of range"):
        write_ner([NerExample("ab cd", [(0, 9, "X")])], out)
    assert not out.exists()
    # white space alone: JSONL wrote it and its reader refused it; CoNLL dropped it
    for name in ("x.conll", "x.jsonl"):
        with pytest.raises(ConfigError, match=r"examples\[1\]: span \(2, 3, 'X'\) holds white space alone \(' '\)"):
            write_ner([NerExample("ab", []), NerExample("ab cd", [(2, 3, "X")])], tmp_path / name)
        assert not (tmp_path / name).exists()
    write_ner([NerExample("ab cd", [(0, 5, "X")])], out)
    assert read_ner(str(out)) == [NerExample("ab cd", [(0, 5, "X")])]


def test_paths_and_pairs_of_the_wrong_type_are_named(ner, emb, tmp_path):
    with pytest.raises(ConfigError, match="NerModel.load takes a path, got NoneType"):
        NerModel.load(None)
    with pytest.raises(ConfigError, match="read_ner takes a path, got NoneType"):
        read_ner(None)
    with pytest.raises(ConfigError, match="examples\\[0\\] is str 'text', not a NerExample"):
        ner.evaluate(["text"])
    with pytest.raises(ConfigError, match="examples holds 1 pair; it needs at least 2"):
        emb.evaluate([Pair("a", "b", 0.5)])  # a correlation of one pair
    with pytest.raises(ConfigError, match="examples\\[0\\] is NerExample"):
        emb.evaluate([NerExample("a b")])
    from spanflow.tasks.embed.pairs import read_pairs

    bad = tmp_path / "pairs.jsonl"  # from a file: its line
    bad.write_text('{"sentence1": "a", "sentence2": "b"}\n{"sentence1": "a \\ud800", "sentence2": "b"}\n')
    with pytest.raises(DataError, match=r"first text is not valid Unicode: a lone surrogate '\\ud800'") as e:
        read_pairs(str(bad))
    assert e.value.line == 2
    with pytest.raises(ConfigError, match=r"train\[1\] is not valid Unicode: a lone surrogate '\\ud800'"):
        train_embedder([Pair("a", "b", 0.5), Pair("a \ud800", "b", 1.0)], None, model="tiny", out_dir="unused")


@pytest.mark.parametrize("field, value, said", [
    ("epochs", 1.5, "TrainOptions.epochs must be a whole number or None, got 1.5"),
    ("epochs", "3", "TrainOptions.epochs must be a whole number or None, got '3'"),
    ("lr", "1e-4", "TrainOptions.lr must be a number or None, got '1e-4'"),
    ("max_tokens", "auto", "TrainOptions.max_tokens must be a whole number or None, got 'auto'"),
    ("resume", 1, "TrainOptions.resume must be True or False, got 1"),
    ("weight_decay", True, "TrainOptions.weight_decay must be a number, got True"),
    ("precision", "bfloat16", "unknown precision 'bfloat16'; expected one of auto, fp32, bf16, fp16"),
    ("precision", "int8", "int8 is a quantization, not a precision: use --quantize int8 (embed, serve and tune, "
                          "CPU; Python: quantize=\"int8\")"),
    ("device", "gpu", "TrainOptions.device='gpu': not a device name; use auto, cpu, cuda, cuda:N or mps"),
    ("device", "meta", "TrainOptions.device='meta': spanflow runs on auto, cpu, cuda, cuda:N or mps"),
])
def test_train_options_check_their_types(field, value, said):
    with pytest.raises(ConfigError) as e:
        TrainOptions(**{field: value})
    assert str(e.value) == said
    assert TrainOptions(epochs=np.int64(3), lr=np.float32(1e-4), class_weights={"PER": 2.0}).epochs == 3
    assert TrainOptions(precision="fp16", device="cuda:3").device == "cuda:3"  # names: found where it trains


def test_a_relation_model_keeps_the_length_it_reads(tmp_path):
    enc, tok = tiny()
    rel = ReModel(encoder=enc, tokenizer=tok, relations=["r"], limit=32, policy=resolve_policy("fp32", "cpu"))
    rel.set_max_length(16)
    rel.save(str(tmp_path / "m"))
    torch.manual_seed(0)
    assert ReModel.load(str(tmp_path / "m"), precision="fp32").max_length == 16
    after_load = torch.rand(3)  # the head's and encoder's random init before their weights: not the caller's
    torch.manual_seed(0)
    assert torch.equal(after_load, torch.rand(3))
    cfg = json.loads((tmp_path / "m" / "spanflow.json").read_text())
    del cfg["max_length"]  # as models saved before it kept its own were
    (tmp_path / "m" / "spanflow.json").write_text(json.dumps(cfg))
    assert ReModel.load(str(tmp_path / "m"), precision="fp32").max_length == 32  # the limit


def test_a_cached_verdict_is_for_the_model_files_as_they_were(tmp_path):
    model = tmp_path / "model"
    (model / "encoder").mkdir(parents=True)
    (model / "spanflow.json").write_text("{}")
    (model / "encoder" / "model.safetensors").write_bytes(b"1234")
    key = dict(model=str(model), device=pick_device("cpu"), task="ner", mode="infer", precision="bf16")
    first = cache_path("verdicts", **key)
    (model / "runs" / "deep").mkdir(parents=True)
    (model / "runs" / "deep" / "verdict.json").write_text("{}")  # below the model's folders: not the model
    assert cache_path("verdicts", **key) == first
    (model / "encoder" / "model.safetensors").write_bytes(b"12345")  # retrained in place
    assert cache_path("verdicts", **key) != first


def test_numpy_option_values_train_and_checkpoint(tmp_path):
    good = [NerExample("Grace Hopper flew to Oslo .", [(0, 12, "PER"), (21, 25, "LOC")])] * 8
    opts = TrainOptions(lr=np.float32(1e-3), max_steps=np.int64(2), max_tokens=np.int64(256), max_length=np.int64(64),
                        log_every=0)
    train_ner(good, None, model="tiny", out_dir=str(tmp_path / "run"), options=opts, log_fn=lambda line: None)
    state = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())  # written as JSON
    assert state["run"]["options"]["max_tokens"] == 256 and state["global_step"] == 2


def test_pairs_given_in_code_are_checked_as_a_file_is(tmp_path, emb):
    from spanflow.tasks.embed.pairs import read_pairs
    from spanflow.tasks.embed.train import EmbedTraining

    with pytest.raises(ConfigError, match=r"examples\[1\] .* a finite number"):  # NaN: a Pearson of nan, no error
        emb.evaluate([Pair("a", "b", 0.2), Pair("c", "d", float("nan")), Pair("e", "f", 0.9)])
    with pytest.raises(ConfigError, match=r"^train\[1\]\.b is empty; every text of a pair needs words"):
        train_embedder([Pair("a", "b", 0.5), Pair("c", "", 1.0)], None, model="tiny", out_dir=str(tmp_path))
    with pytest.raises(TypeError, match="batch_size"):  # as NerModel.evaluate: a misspelt keyword is no default
        emb.evaluate([Pair("a", "b", 0.2), Pair("c", "d", 0.9)], batch_size=8)
    with pytest.raises(ConfigError, match=r"^examples\[0\]\.negative is blank"):
        emb.evaluate([Pair("a", "b", negative=" "), Pair("c", "d", negative="e")])
    with pytest.raises(ConfigError, match=r"mixes scored pairs \(train\[0\]\) and pairs without a score "
                                          r"\(train\[1\]\)"):
        train_embedder([Pair("a", "b", 0.5), Pair("c", "d")], None, model="tiny", out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"mixes triplets \(train\[0\]\) and pairs without"):
        train_embedder([Pair("a", "b", negative="x"), Pair("c", "d")], None, model="tiny", out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="^config takes an EmbedTraining .*; TrainOptions go to options=$"):
        train_embedder([Pair("a", "b")], None, model="tiny", out_dir=str(tmp_path), config=TrainOptions())
    EmbedTraining()  # the right kind passes
    with pytest.raises(ConfigError, match="examples holds 1 pair; it needs at least 2"):
        emb.evaluate([Pair("a", "b")])  # a retrieval among one answer: every figure 1
    assert emb.evaluate([Pair("Ann ran", "Bob sat"), Pair("Cat", "Dog")])["warnings"] == [
        "only 2 distinct answers to rank: recall@10 is 1 whatever the model (evaluate on more pairs)"]
    with pytest.raises(ConfigError, match="^examples: every pair has the same answer"):
        emb.evaluate([Pair("Ann ran", "x"), Pair("Bob sat", "x")])
    p = tmp_path / "p.csv"
    p.write_text("s1,s2,score\nAnn ran,Bob ran,0.5\nAnn sat,Bob ran,0.1\n")
    assert read_pairs(str(p), columns=["s1", "s2", "score"]) == read_pairs(str(p), columns="s1,s2,score")
    assert read_pairs(str(p), columns=[0, 1]) == read_pairs(str(p), columns="0,1")


def test_a_wrong_argument_is_a_config_error_not_a_python_one(tmp_path, rel, emb):
    from spanflow.data.records import read_texts

    with pytest.raises(ConfigError, match="^read_texts takes a path, got NoneType"):
        read_texts(None)
    (tmp_path / "t.txt").write_text("a\n")
    with pytest.raises(ConfigError, match="errors must be 'raise' or 'record', got 'skip'"):
        read_texts(str(tmp_path / "t.txt"), errors="skip")  # silently meant "raise"
    # the Python API's options are named as it sets them; the command line keeps its flags
    with pytest.raises(ConfigError, match="^TrainOptions.grad_compression must be one of none, fp16, got 'int8'$") as e:
        TrainOptions(grad_compression="int8")
    assert e.value.cli == "--grad-compression must be one of none, fp16, got 'int8'"
    ex = [ReExample("Ann lives in Rome .", [((0, 3), "lives_in", (13, 17))])]
    with pytest.raises(ConfigError, match="^relations takes a list of relation names, got 'lives_in'"):
        train_re(ex, None, out_dir=str(tmp_path), relations="lives_in")  # read as its letters
    with pytest.raises(ConfigError, match="^relations names 'lives_in' more than once"):  # before any training
        train_re(ex, None, out_dir=str(tmp_path / "twice"), relations=["lives_in", "born_in", "lives_in"])
    assert not (tmp_path / "twice").exists()
    with pytest.raises(ConfigError, match="^all_subjects takes True or False, got 'no'"):
        train_re(ex, None, out_dir=str(tmp_path), all_subjects="no")
    for opts, said in ((TrainOptions(stride=16), r"TrainOptions.stride \(--stride\) applies to NER training"),
                       (TrainOptions(oversample=0.5), r"oversample \(--oversample\) applies to NER and RE training")):
        with pytest.raises(ConfigError, match=said + "; embed training would ignore it"):  # not silently ignored
            train_embedder([Pair("a", "b", 0.5), Pair("c", "d", 1.0)], None, model="tiny", out_dir="unused",
                           options=opts)
    blank = [ReExample("Ann lives in Rome .", [((0, 3), " ", (13, 17))])]  # a name of spaces only is no name
    with pytest.raises(Exception, match=r"train\[0\]: triple .* needs a relation name"):
        train_re(blank, None, out_dir=str(tmp_path))
    for size in (0, "2"):  # would hold the whole input in one chunk
        with pytest.raises(ConfigError, match="chunk_size must be a whole number of texts >= 1"):
            next(iter(emb.encode_stream(TEXTS, chunk_size=size)))
        with pytest.raises(ConfigError, match="chunk_size must be a whole number of texts >= 1"):
            next(rel.predict_stream(TEXTS, chunk_size=size))
    f = tmp_path / "train.conll"
    f.write_text("Ann B-PER\n")
    with pytest.raises(Exception, match=r"train\.conll is a file; a model is a directory"):
        NerModel.load(str(f))


def test_training_with_log_fn_none_is_quiet(tmp_path, capsys):
    data = [NerExample("Ann lives in Rome .", [(0, 3, "PER"), (13, 17, "LOC")])] * 4
    train_ner(data, None, out_dir=str(tmp_path), log_fn=None, options=TrainOptions(epochs=1, log_every=0))
    assert capsys.readouterr().out == ""
    with pytest.raises(ConfigError, match=r"^log_fn takes a function of one line \(None: quiet\), got str 'x'"):
        train_ner(data, None, out_dir=str(tmp_path / "x"), log_fn="x", options=TrainOptions(epochs=1, log_every=0))
    assert not (tmp_path / "x").exists()  # told before the run claims its folder


def test_the_package_lists_what_it_imports_lazily():
    import spanflow

    assert {"NerModel", "train_ner", "Embedder", "WriteError"} <= set(dir(spanflow))
    assert issubclass(spanflow.WriteError, spanflow.SpanflowError)


def test_doctor_takes_the_task_of_a_spanflow_model(rel, tmp_path, monkeypatch):
    from spanflow.cli.main import main
    from spanflow.tuning import doctor

    rel.save(str(tmp_path / "re"))
    asked = []
    monkeypatch.setattr(doctor, "doctor", lambda **kw: asked.append((kw["task"], kw["task_from"])))
    assert main(["doctor", "--model", str(tmp_path / "re"), "--data", "triples.json"]) == 0
    assert main(["doctor", "--model", "tiny", "--data", "train.conll"]) == 0
    assert main(["doctor", "--model", str(tmp_path / "re"), "--data", "x", "--task", "ner"]) == 0
    # was ner, and an error naming the model's own task; how each was told, said (an empty or
    # missing file was "told from --model and --data", where ner was the default)
    assert asked == [("re", "its --model's task"),
                     ("ner", "the default: neither --model nor --data tells another; --task names one"),
                     ("ner", "--task")]


def test_doctor_on_an_encoder_takes_the_task_its_data_is_for(tmp_path, monkeypatch):
    from spanflow.cli.main import main
    from spanflow.tuning import doctor

    pairs, triples = tmp_path / "pairs.csv", tmp_path / "rel.json"
    pairs.write_text("".join(f"a cat sat on mat {i},a cat lay on a mat {i},{i % 5}.0\n" for i in range(12)))
    triples.write_text('[{"text": "Ann lives in Oslo", "triple_list": [["Ann", "lives_in", "Oslo"]]}]\n')
    asked = []
    monkeypatch.setattr(doctor, "doctor", lambda **kw: asked.append(kw["task"]))
    assert main(["doctor", "--model", "tiny", "--data", str(pairs)]) == 0
    assert main(["doctor", "--model", "tiny", "--data", str(triples)]) == 0
    assert main(["doctor", "--model", "tiny", "--data", str(tmp_path / "missing.conll")]) == 0
    assert asked == ["embed", "re", "ner"]  # an encoder's doctor was a NER probe of any data


def test_a_save_never_replaces_a_folder_of_the_users_that_holds_a_config_json(ner, tmp_path):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "config.json").write_text("{}")
    (proj / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds a model and 2 other file\(s\) \(e.g. notes.txt\): saving there"):
        ner.save(str(proj))
    assert sorted(os.listdir(proj)) == ["config.json", "notes.txt", "src"]
    ner.save(str(tmp_path / "m"))
    ner.save(str(tmp_path / "m"))  # its own save: replaced whole
    with pytest.raises(ConfigError, match="save takes a path, got NoneType None"):
        ner.save(None)
    with pytest.raises(ConfigError, match="from_hf takes a path, got int 5"):
        NerModel.from_hf(5)


def test_numpy_integers_and_huge_numbers_are_taken_or_named(ner, emb):
    texts = ["Ann lives in Rome ."]
    assert ner.with_precision("bf16").predict(texts, max_tokens=np.int64(64)) == ner.with_precision("bf16").predict(
        texts, max_tokens=64)  # numpy's int reached int.bit_length in the bf16 path
    for kw, said in ((dict(epochs=10**30), "TrainOptions.epochs must be at most 10000"),
                     (dict(grad_accum=10**30), "TrainOptions.grad_accum must be between 1 and 4096"),
                     (dict(lr=10**400), "TrainOptions.lr must be a finite number")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            TrainOptions(**kw)
    assert isinstance(TrainOptions(lr=1).lr, float)
    with pytest.raises(ConfigError, match="needs strings for its texts and a finite number"):
        emb.evaluate([Pair("a b", "c d", 10**400), Pair("e f", "g h", 0)])
    with pytest.raises(ConfigError, match="check_precision takes"):
        emb.with_precision("bf16").check_precision(None)
    with pytest.raises(ConfigError, match="text 1"):
        emb.with_precision("bf16").check_precision(["a", 1])


def test_nothing_to_score_and_an_empty_dev_are_refused(ner, rel, tmp_path):
    for model in (ner, rel):
        with pytest.raises(ConfigError, match="examples is an empty list: there is nothing to score"):
            model.evaluate([])
    with pytest.raises(ConfigError, match="dev is an empty list: pass None to train without dev data"):
        train_ner([NerExample("Ann ran", [(0, 3, "PER")])], [], out_dir=str(tmp_path / "r"))
    from spanflow.data.records import read_texts

    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="column takes a column's index or name, got float 1.5"):
        list(read_texts(str(tmp_path / "t.csv"), column=1.5))


def test_an_option_out_of_range_names_the_field_in_the_api_and_the_flag_on_the_command_line(tmp_path, capsys):
    from spanflow.cli.main import main

    with pytest.raises(ConfigError, match=r"^TrainOptions.max_tokens must be >= 1, got 0$"):
        TrainOptions(max_tokens=0)
    from spanflow.tasks.embed.train import EmbedTraining

    with pytest.raises(ConfigError, match=r"^EmbedTraining.pairs_per_step must be >= 2, got 1$") as e:
        EmbedTraining(pairs_per_step=1)
    assert e.value.cli == "--pairs-per-step must be >= 2, got 1" and e.value.field == "pairs_per_step"
    data = tmp_path / "t.conll"
    data.write_text("Ada B-PER\nsmiled O\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / "o"), "--warmup-ratio", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --warmup-ratio must be in [0, 1), got 2.0"


def test_streams_read_the_users_iterable_on_the_callers_thread(ner, rel, emb):
    """A sqlite cursor may be read only on the thread that made it: NER's and the Embedder's
    streams read their input on a background thread (sqlite3.ProgrammingError), RE's did not."""
    import sqlite3

    con = sqlite3.connect(":memory:")
    con.execute("create table t (x text)")
    con.executemany("insert into t values (?)", [(t,) for t in TEXTS * 3])

    def rows():
        return (r[0] for r in con.execute("select x from t"))

    assert list(ner.predict_stream(rows())) == ner.predict(TEXTS * 3)
    assert list(rel.predict_stream(rows())) == rel.predict(TEXTS * 3)
    assert np.array_equal(np.concatenate(list(emb.encode_stream(rows()))), emb.encode(TEXTS * 3))
    assert np.array_equal(np.stack(list(emb.predict_stream(rows()))), emb.encode(TEXTS * 3))


def test_a_stream_reads_a_chunk_ahead_of_what_it_gives_not_more(ner, emb):
    """An endless input: the first results come after `chunk_size` texts and one chunk more are
    read (five results from NER's stream read 40,960 texts, with no chunk_size to ask fewer)."""
    import itertools

    for stream in (ner.predict_stream, emb.predict_stream):
        read = itertools.count()
        endless = (TEXTS[next(read) % 2] for _ in itertools.count())
        got = list(itertools.islice(stream(endless, chunk_size=4), 5))
        assert len(got) == 5 and next(read) <= 3 * 4, stream  # chunks 1 and 2 given, chunk 3 prepared ahead


def test_read_texts_checks_its_path_at_the_call_and_load_does_not_offer_tiny(tmp_path):
    """read_texts said it checks the path at the call, but told a missing file at the first
    next(); Embedder.load's hint offered 'tiny', which it then refused."""
    from spanflow.data.records import read_texts
    from spanflow.errors import ModelDirError

    with pytest.raises(DataError, match=r"nope\.txt: file not found$"):
        read_texts(str(tmp_path / "nope.txt"))
    (tmp_path / "junk").mkdir()
    with pytest.raises(ModelDirError) as e:
        Embedder.load(str(tmp_path / "junk"))
    assert "or 'tiny')" not in str(e.value) and "'tiny', a new encoder, only where training starts" in str(e.value)


def test_train_embedder_starts_from_tiny_as_the_other_train_functions(tmp_path):
    emb = train_embedder([Pair("a b", "c d"), Pair("e f", "g h")], None, out_dir=str(tmp_path / "e"),
                         options=TrainOptions(epochs=1, log_every=0), log_fn=None)
    assert emb.dim > 0 and (tmp_path / "e" / "model" / "modules.json").exists()


def test_a_stream_whose_input_fails_gives_the_chunks_read_before_it_first():
    """The chunks read before the input's error come before it, as the stream read on its own
    thread gave them: a caller writing results as they come keeps them."""
    from spanflow.batching.prefetch import chunked, prepared

    def source():
        yield from range(6)
        raise OSError("the disk went away")

    got = []
    with pytest.raises(OSError, match="the disk went away"):
        for c in prepared(chunked(source(), 4), lambda c: [x * 10 for x in c]):
            got.append(c)
    assert got == [[0, 10, 20, 30], [40, 50]]  # the partly read chunk too (it was lost with chunked's list)


def test_a_stream_left_unfinished_exits_quietly():
    """A stream a script stops reading (an endless one: the docs show those) is closed as Python
    exits; the prepare pool's shutdown printed a traceback then (its modules were gone)."""
    import subprocess
    import sys

    script = ("import itertools, torch\n"
              "from spanflow.batching.prefetch import prepared\n"
              "class M:\n"
              "    def stream(self, texts):\n"
              "        for c in prepared(([t] for t in texts), lambda c: torch.zeros(len(c))):\n"
              "            yield c\n"
              "s = M().stream('x' for _ in itertools.count())\n"
              "print(next(s).shape)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "torch.Size([1])"
    assert done.stderr == ""  # was: Exception ignored in: <generator object prepared ...> AttributeError


def test_reading_ahead_passes_every_record_read_before_an_error_and_the_error_itself():
    """Bulk jobs read their records ahead in lists of 1024 on a thread: the records of a list cut
    short by the reader's error were lost (a chunk of 1500 read in full came out as 1024)."""
    import threading

    from spanflow.batching.prefetch import chunked, prepared, read_ahead

    err = OSError("the disk went away")

    def source():
        yield from range(3000)
        raise err

    got = []
    with pytest.raises(OSError) as e:
        for c in prepared(chunked(read_ahead(source()), 1500), list):
            got += c
    assert e.value is err and got == list(range(3000))
    stream = read_ahead(iter(range(10_000)), size=16)
    assert next(stream) == 0
    stream.close()  # stopped early: its thread is gone, nothing left reading
    assert not [t for t in threading.enumerate() if t.name == "spanflow-prefetch"]
