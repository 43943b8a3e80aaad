"""A NER model reads text with the words it was trained on: the SentencePiece cut at punctuation
is recorded in the model directory, and a directory saved before it keeps the tokenizer's own words."""
import json
import shutil

import pytest
import torch

from spanflow.errors import ModelDirError
from spanflow.tasks.ner import NerModel
from spanflow.tasks.ner.hf import export_hf

TEXT = "Hewlett-Packard, in (Zurich) today."
TOKENIZER_WORDS = ["Hewlett-Packard,", "in", "(Zurich)", "today."]  # SentencePiece's words: space to space
CUT_WORDS = ["Hewlett", "-", "Packard", ",", "in", "(", "Zurich", ")", "today", "."]
CHINESE = "李娜在北京"


def _sentencepiece_model() -> NerModel:
    """A tiny BERT encoder with a SentencePiece (Unigram, Metaspace) tokenizer, whose head tags every
    token B-X: each word it reads comes back as an entity of its own, so its spans are its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.train_from_iterator([TEXT, "Packard in Zurich (today), Hewlett.", CHINESE] * 20, trainers.UnigramTrainer(
        vocab_size=60, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], unk_token="[UNK]"))
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                  sep_token="[SEP]")
    torch.manual_seed(0)
    enc = BertModel(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=64), add_pooling_layer=False)
    model = NerModel(encoder=enc, tokenizer=tok, labels=["X"], limit=64, head_type="softmax")
    with torch.no_grad():
        model.module.head.proj.weight.zero_()
        model.module.head.proj.bias.copy_(torch.tensor([0.0, 5.0, 0.0]))  # O, B-X, I-X: always B-X
    return model


def _words(model: NerModel) -> list[str]:
    return [TEXT[s:e] for s, e, _ in model.predict(TEXT)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("split") / "model"
    _sentencepiece_model().save(str(d))
    return d


def test_a_new_model_records_its_split_and_reads_the_cut_words(saved):
    assert json.loads((saved / "spanflow.json").read_text())["word_split"] == "punctuation"
    model = NerModel.load(str(saved), precision="fp32")
    assert _words(model) == CUT_WORDS
    units, _, encs = model.units([TEXT])  # the server's path cuts the same words
    assert model.assemble([TEXT], units, model.run_batch(units), encs)[0] == model.predict(TEXT)


def test_a_directory_saved_before_the_key_reads_the_words_it_was_trained_on(saved, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(saved, old)
    cfg = json.loads((old / "spanflow.json").read_text())
    del cfg["word_split"]
    (old / "spanflow.json").write_text(json.dumps(cfg))
    model = NerModel.load(str(old), precision="fp32")
    assert _words(model) == TOKENIZER_WORDS
    units, _, encs = model.units([TEXT])
    assert [TEXT[s:e] for s, e, _ in model.assemble([TEXT], units, model.run_batch(units), encs)[0]] == TOKENIZER_WORDS
    # an unspaced Chinese line was one word there, which no entity could be found inside: cut at ideographs
    assert [CHINESE[s:e] for s, e, _ in model.predict(CHINESE)] == list(CHINESE)
    model.save(str(tmp_path / "again"))  # saved again, it keeps its words
    assert json.loads((tmp_path / "again" / "spanflow.json").read_text())["word_split"] == "ideographs"
    cfg["word_split"] = "sentences"
    (old / "spanflow.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match="unknown word_split in spanflow.json 'sentences'"):
        NerModel.load(str(old), precision="fp32")


def test_an_export_carries_the_split_and_an_older_export_keeps_its_words(saved, tmp_path):
    model = NerModel.load(str(saved), precision="fp32")
    out = tmp_path / "hf"
    export_hf(model, str(out), log_fn=lambda s: None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["spanflow_word_split"] == "punctuation"
    assert _words(NerModel.load(str(out), precision="fp32")) == CUT_WORDS
    del cfg["spanflow_word_split"]  # a spanflow export made before the key
    (out / "config.json").write_text(json.dumps(cfg))
    assert _words(NerModel.load(str(out), precision="fp32")) == TOKENIZER_WORDS
    for key in [k for k in cfg if k.startswith("spanflow_")]:  # another tool's classifier: spanflow's words
        del cfg[key]
    (out / "config.json").write_text(json.dumps(cfg))
    assert _words(NerModel.load(str(out), precision="fp32")) == CUT_WORDS
