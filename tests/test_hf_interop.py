"""Hugging Face token-classification directories in (predict, evaluate, serve, train) and out
(`spanflow export --to hf`), checked against transformers' own pipeline."""
import json
import os

import pytest
import torch

from helpers import tiny_bert
from spanflow.cli.main import main
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ModelDirError
from spanflow.tasks.ner.hf import bio_tags

DATA = synthetic_ner(60, seed=21, max_clauses=2)
TEXTS = [e.text for e in synthetic_ner(25, seed=22, max_clauses=2)]


def write_data(path, examples):
    with open(path, "w", encoding="utf-8") as f:
        for e in examples:
            write_jsonl_record(f, e.text, e.spans)
    return str(path)


def pipeline_entities(model_dir, texts):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(model_dir), aggregation_strategy="first", device="cpu")
    return [sorted((e["start"], e["end"], e["entity_group"]) for e in out) for out in pipe(texts)]


def predicted(path):
    return [sorted((x["start"], x["end"], x["label"]) for x in json.loads(line)["entities"])
            for line in open(path, encoding="utf-8")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    enc, tok = tiny_bert([e.text for e in DATA] + TEXTS, hidden=32, layers=2, heads=2)
    enc.save_pretrained(d / "enc")
    tok.save_pretrained(d / "enc")
    train = write_data(d / "train.jsonl", DATA)
    assert main(["train", "ner", "--train", train, "--dev", train, "--model", str(d / "enc"), "--out", str(d / "run"),
                 "--head", "softmax", "--epochs", "6", "--lr", "3e-3", "--head-lr", "3e-3", "--max-tokens", "512",
                 "--log-every", "0"]) == 0
    (d / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return d


def test_export_gives_the_pipeline_the_same_entities_as_predict(trained, capsys):
    d = trained
    assert main(["export", "--model", str(d / "run" / "model"), "--to", "hf", str(d / "hf")]) == 0
    assert main(["predict", "--model", str(d / "run" / "model"), "--input", str(d / "texts.txt"), "--output",
                 str(d / "ours.jsonl"), "--precision", "fp32"]) == 0  # the pipeline runs in fp32
    ours = predicted(d / "ours.jsonl")
    assert sum(map(len, ours)) > 5  # the model found entities, so the comparison means something
    assert pipeline_entities(d / "hf", TEXTS) == ours
    # spanflow runs the export as it ran the model: its words, word edges, window and stride come back
    from spanflow.tasks.ner import NerModel

    src, back = NerModel.load(str(d / "run" / "model")), NerModel.load(str(d / "hf"))
    assert (back.words, back.word_edges, back.max_length, back.stride, back.lines) == \
        (src.words, src.word_edges, src.max_length, src.stride, src.lines)


def test_a_crf_model_is_exported_only_when_asked_to_drop_its_transitions(trained, capsys, caplog):
    from spanflow.tasks.ner import NerModel

    d = trained
    train = str(d / "train.jsonl")
    assert main(["train", "ner", "--train", train, "--model", str(d / "enc"), "--out", str(d / "crf"), "--epochs", "1",
                 "--max-tokens", "512", "--log-every", "0"]) == 0
    capsys.readouterr()
    assert main(["export", "--model", str(d / "crf" / "model"), "--to", "hf", str(d / "crf_hf")]) == 2
    assert "--head softmax" in capsys.readouterr().err and not (d / "crf_hf").exists()
    assert main(["export", "--model", str(d / "crf" / "model"), "--to", "hf", "--lossy", str(d / "crf_hf")]) == 0
    assert "transition scores are left out" in capsys.readouterr().err  # a warning, on stderr
    assert (d / "crf_hf" / "model.safetensors").exists()
    assert json.loads((d / "crf_hf" / "config.json").read_text())["spanflow_lossy_crf"] is True
    with caplog.at_level("WARNING", logger="spanflow"):  # said again where spanflow runs it
        NerModel.load(str(d / "crf_hf"))
    assert "lossy export of a CRF model" in caplog.text
    # an earlier export is replaced by the next (the trained models never are: test_first_contact_messages)
    assert main(["export", "--model", str(d / "run" / "model"), "--to", "hf", str(d / "crf_hf")]) == 0
    assert "crf_hf" in capsys.readouterr().out
    # a model continued from the lossy export and exported again carries none of the earlier export's marks
    assert main(["train", "ner", "--train", train, "--model", str(d / "crf_hf"), "--out", str(d / "again"),
                 "--epochs", "1", "--max-tokens", "512", "--log-every", "0", "--head", "softmax"]) == 0
    assert main(["export", "--model", str(d / "again" / "model"), "--to", "hf", str(d / "again_hf")]) == 0
    assert "spanflow_lossy_crf" not in json.loads((d / "again_hf" / "config.json").read_text())
    # but not one that holds anything an export does not write (a model fine-tuned from it keeps its marks)
    (d / "crf_hf" / "README.md").write_text("notes")
    assert main(["export", "--model", str(d / "run" / "model"), "--to", "hf", str(d / "crf_hf")]) == 2
    assert "holds a model or encoder and files no export writes (README.md)" in capsys.readouterr().err
    assert (d / "crf_hf" / "README.md").read_text() == "notes"


def test_a_directory_saved_by_transformers_is_predicted_evaluated_and_served(trained, tmp_path, capsys):
    from transformers import BertConfig, BertForTokenClassification

    d = trained
    enc_cfg = json.loads((d / "enc" / "config.json").read_text())
    types = sorted({s[2] for e in DATA for s in e.spans})
    labels = ["O"] + [f"{p}-{t}" for t in types for p in ("I", "B")]  # an order of its own
    cfg = BertConfig(**{k: v for k, v in enc_cfg.items() if k in BertConfig().to_dict()},
                     id2label=dict(enumerate(labels)), label2id={lab: i for i, lab in enumerate(labels)})
    torch.manual_seed(0)
    hf = BertForTokenClassification(cfg)
    hf.save_pretrained(tmp_path / "hfdir")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(d / "enc").save_pretrained(tmp_path / "hfdir")
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(tmp_path / "hfdir"), "--input", str(d / "texts.txt"), "--output",
                 str(out), "--precision", "fp32"]) == 0
    assert predicted(out) == pipeline_entities(tmp_path / "hfdir", TEXTS)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "hfdir"), "--data", str(d / "train.jsonl"), "--json"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["f1"] <= 1.0

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from spanflow.serving.app import create_app
    from spanflow.serving.options import ServeOptions
    from spanflow.serving.services import load_service

    with TestClient(create_app([load_service(f"hf={tmp_path / 'hfdir'}", device="cpu")], ServeOptions())) as c:
        r = c.post("/v1/ner", json={"texts": TEXTS[:3]}).json()
    got = [sorted((x["start"], x["end"], x["label"]) for x in res["entities"]) for res in r["results"]]
    assert got == predicted(out)[:3]
    # and training continues from it: its classifier carried onto spanflow's BIO rows
    assert main(["train", "ner", "--train", str(d / "train.jsonl"), "--model", str(tmp_path / "hfdir"), "--out", str(tmp_path / "cont"),
                 "--epochs", "1", "--max-tokens", "512", "--log-every", "0"]) == 0


def test_schemes_read_as_bio_and_unusable_directories_are_one_line(tmp_path, capsys):
    assert bio_tags("d", {"0": "O", "1": "S-PER", "2": "B-PER", "3": "E-PER", "4": "I-PER"}) == \
        ["O", "B-PER", "B-PER", "I-PER", "I-PER"]
    assert bio_tags("d", {0: "O", 1: "U-LOC", 2: "L-LOC"}) == ["O", "B-LOC", "I-LOC"]
    assert bio_tags("d", {0: "I-ORG", 1: "O", 2: "B-ORG"}) == ["I-ORG", "O", "B-ORG"]  # IOB1
    from spanflow.tasks.ner.hf import bio_rows

    # an IOB1 classifier's I-PER row starts PER entities: it is what B-PER continues training from
    assert bio_rows(["O", "I-PER", "I-LOC", "B-LOC"], ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]) == [0, 3, 2, 1, 1]
    with pytest.raises(ModelDirError, match="LABEL_0"):
        bio_tags("d", {0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(ModelDirError, match="id2label's ids are 0, 1, 3; they must be 0 to 2"):
        bio_tags("d", {"0": "O", "1": "B-PER", "3": "I-PER"})  # output 2 would be read as I-PER
    from transformers import BertConfig, BertForTokenClassification

    enc, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    BertForTokenClassification(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "in.txt").write_text("a b\n")
    rc = main(["predict", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt"), "--output",
               str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and "id2label" in err and "Traceback" not in err
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())  # usable names, one short of the outputs
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "id2label": {"0": "O"}, "label2id": {"O": 0}}))
    rc = main(["predict", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt"), "--output",
               str(tmp_path / "o.jsonl")])
    assert rc == 2 and capsys.readouterr().err.strip().endswith(
        "config.json: id2label names 1 label, but the classifier's weights have 2 outputs; id2label (and num_labels) "
        "must name one label per output")


def test_weights_saved_without_their_tokenizer_are_refused(trained, tmp_path, capsys):
    import shutil

    assert main(["export", "--model", str(trained / "run" / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    (tmp_path / "bare").mkdir()  # not run on a vocabulary of special tokens alone, every word [UNK]
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tmp_path / "hf" / name, tmp_path / "bare" / name)
    capsys.readouterr()
    rc = main(["predict", "--model", str(tmp_path / "bare"), "--input", str(trained / "texts.txt"), "--output",
               str(tmp_path / "o.jsonl")])
    assert rc == 2 and "no tokenizer files (tokenizer.json, or vocab.txt and its config)" in capsys.readouterr().err


def test_a_full_disk_at_export_is_one_line_and_leaves_nothing(trained, tmp_path, capsys):
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], capture_output=True, text=True,
                       check=False)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        capsys.readouterr()
        assert main(["export", "--model", str(trained / "run" / "model"), "--to", "hf", str(disk / "hf")]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == f"error: cannot write the exported model to {disk / 'hf'}: No space left on device"
        assert "Traceback" not in err
        assert os.listdir(disk) == []  # nothing half-written, no temporary left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_the_export_gets_the_umask_modes(trained, tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["export", "--model", str(trained / "run" / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(old)
    modes = {f: os.stat(tmp_path / "hf" / f).st_mode & 0o777 for f in os.listdir(tmp_path / "hf")}
    assert modes and all(m == 0o644 for m in modes.values()), modes  # safetensors alone writes 0600


def test_an_encoder_without_fused_attention_and_a_sentencepiece_tokenizer_trains_and_tags_words(tmp_path):
    """DeBERTa-v2/v3 has no torch sdpa attention in transformers (its load with it was refused),
    and its SentencePiece offsets count the space before a word: spans must still be words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import DebertaV2Config, DebertaV2Model, PreTrainedTokenizerFast

    texts = [e.text for e in DATA] + TEXTS
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]",
                                                                                         "[SEP]"], unk_token="[UNK]"))
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                  sep_token="[SEP]")
    cfg = DebertaV2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=256, relative_attention=True,
                          position_buckets=32, pos_att_type=["p2c", "c2p"], pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    DebertaV2Model(cfg).save_pretrained(tmp_path / "deb")
    tok.save_pretrained(tmp_path / "deb")
    train = write_data(tmp_path / "train.jsonl", DATA)
    assert main(["train", "ner", "--train", train, "--dev", train, "--model", str(tmp_path / "deb"),
                 "--out", str(tmp_path / "run"), "--epochs", "2", "--log-every", "0"]) == 0
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(tmp_path / "run" / "model"), "--input", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "p.jsonl")]) == 0
    spans = [s for text, row in zip(TEXTS, predicted(tmp_path / "p.jsonl")) for s in ((text, *x) for x in row)]
    assert spans  # the model tags something, and no span starts or ends on a space
    assert all(not text[s].isspace() and not text[e - 1].isspace() for text, s, e, _ in spans)


def test_a_classifier_with_layers_between_encoder_and_classifier_is_refused_both_ways(tmp_path, capsys):
    """ModernBERT's token classifier runs a dense layer and a norm (its `head`) before the
    classifier: loaded without them, or exported with them random, its logits are another model's."""
    from transformers import ModernBertConfig, ModernBertForTokenClassification, ModernBertModel

    from spanflow.errors import ConfigError
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.ner.hf import export_hf

    _, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    cfg = ModernBertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                           eos_token_id=tok.sep_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                           num_labels=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"}, label2id={"O": 0, "B-PER": 1,
                                                                                               "I-PER": 2})
    ModernBertForTokenClassification(cfg).save_pretrained(tmp_path / "mb")
    tok.save_pretrained(tmp_path / "mb")
    with pytest.raises(ModelDirError, match=r"ModernBertForTokenClassification has layers between its encoder and its "
                                            r"classifier \(head\)"):
        NerModel.load(str(tmp_path / "mb"), precision="fp32")
    model = NerModel(encoder=ModernBertModel(cfg), tokenizer=tok, labels=["PER"], limit=64, head_type="softmax")
    with pytest.raises(ConfigError, match=r"layers between its encoder and its classifier \(head\)"):
        export_hf(model, str(tmp_path / "out"), log_fn=lambda s: None)
    assert not (tmp_path / "out").exists()


def tiny_token_classifier(path) -> None:
    """A Hugging Face BertForTokenClassification of PER tags, with its tokenizer, saved at `path`."""
    from transformers import BertConfig, BertForTokenClassification

    _, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    BertForTokenClassification(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32, num_labels=3,
                                          id2label={0: "O", 1: "B-PER", 2: "I-PER"},
                                          label2id={"O": 0, "B-PER": 1, "I-PER": 2})).save_pretrained(path)
    tok.save_pretrained(path)


def test_a_token_classifier_is_not_embedded_as_an_encoder(trained, tmp_path, capsys):
    tiny_token_classifier(tmp_path / "m")
    (tmp_path / "in.txt").write_text("a b\n")
    rc = main(["embed", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt"), "--output",
               str(tmp_path / "o.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and "is a 'ner' model from elsewhere" in err and "'spanflow predict' runs it as 'ner'" in err
    assert not (tmp_path / "o.npy").exists()
    from spanflow import Embedder

    with pytest.raises(ModelDirError, match=r"is a BertForTokenClassification, an NER model \(NerModel.load runs it\)"):
        Embedder.load(str(tmp_path / "m"), precision="fp32")


def test_a_sequence_classifier_is_refused_where_it_would_run_and_trains_from_its_encoder(tmp_path, capsys):
    """A cross-encoder or text classifier from elsewhere: predict wrote its encoder's pooled vectors
    as embeddings, unsaid; its encoder is still a place for training to start."""
    from transformers import BertConfig, BertForSequenceClassification

    from spanflow import Embedder

    _, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32,
                                             num_labels=1)).save_pretrained(tmp_path / "ce")
    tok.save_pretrained(tmp_path / "ce")
    (tmp_path / "in.txt").write_text("a b\n")
    for cmd in ("predict", "embed"):
        out = tmp_path / f"{cmd}.jsonl"
        rc = main([cmd, "--model", str(tmp_path / "ce"), "--input", str(tmp_path / "in.txt"), "--output", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and "is a BertForSequenceClassification (its config.json says so)" in err, (cmd, err)
        assert not out.exists()
    with pytest.raises(ModelDirError, match="is a BertForSequenceClassification"):
        Embedder.load(str(tmp_path / "ce"), precision="fp32")
    train = write_data(tmp_path / "t.jsonl", DATA)
    assert main(["train", "ner", "--train", train, "--model", str(tmp_path / "ce"), "--out", str(tmp_path / "o"),
                 "--max-steps", "1", "--log-every", "0"]) == 0
    (tmp_path / "pairs.tsv").write_text("a b\tb a\na\tb\nb a b\ta\n")
    assert main(["train", "embed", "--train", str(tmp_path / "pairs.tsv"), "--model", str(tmp_path / "ce"), "--out",
                 str(tmp_path / "e"), "--max-steps", "1", "--log-every", "0"]) == 0


def test_a_token_classifier_whose_weights_hold_nan_is_refused(tmp_path, capsys):
    """A classifier from elsewhere loads through transformers, not spanflow's encoder loader: its NaN
    weights predicted no entities at all, exit 0."""
    from safetensors.torch import load_file, save_file

    tiny_token_classifier(tmp_path / "m")
    f = str(tmp_path / "m" / "model.safetensors")
    state = load_file(f)
    key = next(k for k in state if "query.weight" in k)
    state[key][0, 0] = float("nan")
    save_file(state, f)
    (tmp_path / "in.txt").write_text("a b\n")
    rc = main(["predict", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt"), "--output",
               str(tmp_path / "o.jsonl"), "--precision", "fp32"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds NaN values" in err and "query.weight" in err, err


@pytest.mark.parametrize("kind", ["mpnet", "roberta"])
def test_the_longest_input_of_an_encoder_whose_positions_follow_padding_runs(kind):
    """MPNet (as RoBERTa) numbers positions from padding_idx + 1: its limit counted every position
    table row, and an input of that length failed inside the model."""
    from transformers import MPNetConfig, MPNetModel, RobertaConfig, RobertaModel

    from spanflow.models.encoder import encoder_max_length

    cls, cfg = {"mpnet": (MPNetModel, MPNetConfig), "roberta": (RobertaModel, RobertaConfig)}[kind]
    model = cls(cfg(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                    max_position_embeddings=40)).eval()
    n = encoder_max_length(model, tokenizer=None)
    assert n == 38
    with torch.no_grad():
        model(input_ids=torch.full((1, n), 5))  # the longest input it is given runs


def test_an_encoders_pooler_is_kept_frozen_and_saved_back(tmp_path):
    """A RoBERTa-family encoder was loaded without its pooler, so every directory spanflow saved lacked
    it and sentence-transformers reported it newly initialised; one without a pooler gets none."""
    from transformers import AutoModel, RobertaConfig, RobertaModel

    from spanflow.models.encoder import _load_weights

    cfg = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=40)
    torch.manual_seed(0)
    RobertaModel(cfg).save_pretrained(tmp_path / "with")
    enc = _load_weights(str(tmp_path / "with"))
    want = AutoModel.from_pretrained(tmp_path / "with").pooler.dense.weight
    assert torch.equal(enc.pooler.dense.weight, want) and not any(p.requires_grad for p in enc.pooler.parameters())
    enc.save_pretrained(tmp_path / "saved")
    _, info = AutoModel.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    RobertaModel(cfg, add_pooling_layer=False).save_pretrained(tmp_path / "without")
    assert _load_weights(str(tmp_path / "without")).pooler is None
