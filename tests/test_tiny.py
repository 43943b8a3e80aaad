"""The `tiny` encoder is plain PyTorch: its directories load without transformers, old ones too."""
import json
import subprocess
import sys

import pytest
import torch
from helpers import count_ops

from spanflow.data.synthetic import synthetic_ner
from spanflow.models.encoder import build_tiny, load_encoder
from spanflow.models.tiny import TinyModel, tiny_config
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.training.options import TrainOptions


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    data = synthetic_ner(30, seed=3, max_clauses=1)
    out = tmp_path_factory.mktemp("tiny")
    opts = TrainOptions(epochs=6, lr=2e-2, max_tokens=512, max_length=64, patience=0, log_every=0, seed=0)
    model = train_ner(data, data, model="tiny", out_dir=str(out), options=opts, log_fn=lambda s: None)
    return model, out / "model", [e.text for e in data]


def test_tiny_encoder_saves_and_loads_its_weights(tmp_path):
    enc, tok = build_tiny([e.text for e in synthetic_ner(20, seed=1)], seed=0)
    enc.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    again, _ = load_encoder(str(tmp_path))
    assert isinstance(again, TinyModel) and again.config.to_dict() == enc.config.to_dict()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        assert torch.equal(enc.eval()(ids).last_hidden_state, again(ids).last_hidden_state)


def test_a_directory_written_with_transformers_keys_still_loads(tiny_model):
    model, d, texts = tiny_model
    cfg_path = d / "encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    # what the encoder's config held when it was a transformers PreTrainedModel
    cfg.update({"architectures": ["TinyModel"], "transformers_version": "5.0.0", "dtype": "float32"})
    cfg_path.write_text(json.dumps(cfg))
    again = NerModel.load(str(d))
    assert again.predict(texts[:8]) == model.predict(texts[:8])
    assert again.module.encoder.config.architectures == ["TinyModel"]  # kept, not dropped


def test_predict_on_a_tiny_model_does_not_import_transformers(tiny_model, tmp_path):
    _, d, texts = tiny_model
    (tmp_path / "in.txt").write_text("\n".join(texts[:5]) + "\n", encoding="utf-8")
    code = ("import sys; from spanflow.cli.main import main; rc = main(sys.argv[1:]); "
            "print('LOADED', 'transformers' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "predict", "--model", str(d), "--input",
                          str(tmp_path / "in.txt"), "--output", str(tmp_path / "p.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED False" in out.stdout, out.stdout
    assert len((tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()) == 5


def test_training_a_tiny_model_does_not_import_transformers(tmp_path):
    from spanflow.data.io import write_ner

    data = tmp_path / "train.conll"
    write_ner(synthetic_ner(30, seed=3, max_clauses=1), str(data))
    code = ("import sys; from spanflow.cli.main import main; rc = main(sys.argv[1:]); "
            "print('LOADED', 'transformers' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "train", "ner", "--train", str(data), "--out",
                          str(tmp_path / "run"), "--max-steps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "LOADED False" in out.stdout, out.stdout
    assert (tmp_path / "run" / "checkpoint" / "model").is_dir()


def test_tinys_wordpiece_encodes_and_saves_as_the_transformers_tokenizer_of_the_same_vocabulary(tmp_path):
    from transformers import AutoTokenizer

    from spanflow.models.encoder import train_wordpiece, wordpiece

    texts = [e.text for e in synthetic_ner(60, seed=2)]
    traps = ["a [SEP] b [CLS][PAD] Zürich 東京 ..", "[MASK]", "  spaced   out ", "x[UNK]y", ""]
    native, ref = wordpiece(texts, 300), train_wordpiece(texts, 300)
    a = native(texts + traps, return_offsets_mapping=True)
    b = ref(texts + traps, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert [list(map(tuple, o)) for o in a["offset_mapping"]] == [list(map(tuple, o)) for o in b["offset_mapping"]]
    assert all(a.word_ids(i) == b.word_ids(i) for i in range(len(texts + traps)))
    assert (native.pad_token_id, native.cls_token_id, native.sep_token_id, len(native)) == \
        (ref.pad_token_id, ref.cls_token_id, ref.sep_token_id, len(ref))
    native.save_pretrained(str(tmp_path / "n"))
    ref.save_pretrained(str(tmp_path / "r"))
    saved = json.loads((tmp_path / "n" / "tokenizer.json").read_text())
    assert saved == json.loads((tmp_path / "r" / "tokenizer.json").read_text())
    again = AutoTokenizer.from_pretrained(str(tmp_path / "n"))  # what transformers reads back
    assert again(texts + traps)["input_ids"] == b["input_ids"] and again.model_max_length == 512


@pytest.mark.parametrize("layers", [1, 2])
def test_the_cpu_recurrence_equals_the_packed_lstm_and_its_gradients(layers):
    torch.manual_seed(0)
    enc = TinyModel(tiny_config(vocab_size=50, embedding_size=16, hidden_size=24, num_hidden_layers=layers,
                                bigram_buckets=0, dropout=0.0)).train()
    x = torch.randn(5, 9, 16, requires_grad=True)
    lengths = torch.tensor([9, 3, 7, 1, 5])
    ours = enc._recur(x, lengths)
    ref = enc._recur_packed(x, lengths)
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()
    assert torch.equal(ours[1, 3:], torch.zeros_like(ours[1, 3:]))  # padding stays zero
    weights = torch.randn_like(ref)
    got = torch.autograd.grad((ours * weights).sum(), [x, *enc.lstm.parameters()])
    want = torch.autograd.grad((ref * weights).sum(), [x, *enc.lstm.parameters()])
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-4), (g - w).abs().max()


def test_the_cpu_recurrences_backward_takes_no_gradient_of_a_slice_per_step():
    """A packed LSTM's backward on the CPU zero-fills a copy of its whole input for every time step
    (the gradient of each step's slice); the padded recurrence takes none."""
    torch.manual_seed(0)
    enc = TinyModel(tiny_config(vocab_size=50, embedding_size=16, hidden_size=24, bigram_buckets=0)).train()
    x = torch.randn(4, 12, 16, requires_grad=True)
    lengths = torch.tensor([12, 8, 5, 2])
    slices = torch.ops.aten.slice_backward.default
    ours, ref = enc._recur(x, lengths).sum(), enc._recur_packed(x, lengths).sum()
    assert count_ops(ours.backward, slices) == 0
    # the reference does (were a torch release to stop, this test would need another witness)
    assert count_ops(ref.backward, slices) >= 12


def test_stacked_layers_pass_dropout_between_them_as_the_packed_lstm_does():
    torch.manual_seed(0)
    enc = TinyModel(tiny_config(vocab_size=50, embedding_size=16, hidden_size=24, num_hidden_layers=2,
                                bigram_buckets=0, dropout=0.5))
    x = torch.randn(3, 7, 16)
    lengths = torch.tensor([7, 4, 2])
    enc.eval()  # no dropout: the two agree
    assert torch.allclose(enc._recur(x, lengths), enc._recur_packed(x, lengths), atol=1e-5)
    enc.train()  # dropout between the two layers changes the output; none after the last zeroes any of it
    y = enc._recur(x, lengths)
    assert not torch.allclose(y, enc.eval()._recur(x, lengths), atol=1e-3)
    real = torch.arange(7)[None] < lengths[:, None]
    assert (y[real] != 0).all()


def test_a_checkpointed_recurrence_gives_the_plain_ones_loss_and_gradients():
    def run(checkpointed: bool):
        torch.manual_seed(0)
        enc = TinyModel(tiny_config(vocab_size=50, embedding_size=16, hidden_size=24, bigram_buckets=0)).train()
        if checkpointed:
            enc.gradient_checkpointing_enable()
        ids = torch.randint(5, 50, (3, 6))
        mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
        torch.manual_seed(1)  # the dropout masks: replayed by the checkpoint's recomputation
        loss = enc(ids, mask).last_hidden_state.pow(2).sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in enc.lstm.parameters()]

    (plain, g1), (ckpt, g2) = run(False), run(True)
    assert torch.allclose(plain, ckpt) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g2))
