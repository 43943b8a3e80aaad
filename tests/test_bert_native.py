"""The plain-PyTorch BERT matches transformers' BertModel on the same directory."""
import json

import pytest
import torch
from helpers import tiny_bert
from transformers import BertConfig, BertForTokenClassification, BertModel

from spanflow.models.bert import NativeBert, load_native
from spanflow.models.encoder import load_encoder

TEXTS = ["Grace Hopper was born in New York City .", "short one", "a longer sentence with many words to pad the rest"]


def outputs(model, tok, texts=TEXTS):
    b = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    return h[b["attention_mask"].bool()]  # padded positions are not outputs


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=4, seed=3)
    with torch.no_grad():  # a trained encoder's token-type row is not zero: make sure it is added
        enc.embeddings.token_type_embeddings.weight.normal_()
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return d, enc.eval(), tok


def test_native_bert_gives_transformers_outputs(bert_dir):
    d, ref, tok = bert_dir
    native, _ = load_encoder(str(d))
    assert isinstance(native, NativeBert) and not native.training
    assert torch.allclose(outputs(native, tok), outputs(ref, tok), atol=1e-5)
    # padding does not leak: a text alone gives what it gives in a padded batch
    alone = outputs(native, tok, TEXTS[1:2])
    assert torch.allclose(alone, outputs(native, tok)[len(tok(TEXTS[0])["input_ids"]):][:len(alone)], atol=1e-5)
    assert native.config.hidden_size == 32 and native.config.model_type == "bert"


def test_native_bert_saves_what_transformers_loads(bert_dir, tmp_path):
    d, ref, tok = bert_dir
    native = load_native(str(d))
    native.save_pretrained(str(tmp_path))
    again = BertModel.from_pretrained(str(tmp_path), add_pooling_layer=False).eval()
    assert torch.allclose(outputs(again, tok), outputs(ref, tok), atol=1e-5)


def test_a_directorys_pooler_is_written_back(tmp_path):
    """A pretrained BERT's pooler, which no task runs, is saved again: sentence-transformers loads
    BertModel with its pooler, and reported a missing one as newly initialised weights."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ref = BertModel(cfg)  # with its pooler, as all-MiniLM-L6-v2 has one
    ref.save_pretrained(str(tmp_path / "src"))
    load_native(str(tmp_path / "src")).save_pretrained(str(tmp_path / "out"))
    whole, info = BertModel.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and torch.equal(whole.pooler.dense.weight, ref.pooler.dense.weight)


def test_prefixed_weights_load_and_other_encoders_fall_back(bert_dir, tmp_path):
    d, ref, tok = bert_dir
    cfg = BertConfig.from_pretrained(str(d))
    cfg.num_labels = 3
    full = BertForTokenClassification(cfg)  # weights named bert.*, plus a classifier
    full.bert.load_state_dict(ref.state_dict(), strict=False)
    full.save_pretrained(tmp_path / "tc")
    native = load_native(str(tmp_path / "tc"))
    assert native is not None and torch.allclose(outputs(native, tok), outputs(ref, tok), atol=1e-5)
    # an activation this module does not implement: transformers' own class runs it
    other = tmp_path / "relu"
    ref.save_pretrained(other)
    tok.save_pretrained(other)
    c = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**c, "hidden_act": "relu"}))
    assert load_native(str(other)) is None
    enc, _ = load_encoder(str(other))
    assert isinstance(enc, BertModel)
    assert isinstance(load_encoder(str(d), native=False)[0], BertModel)  # transformers' class, when asked


def test_predict_on_a_bert_model_does_not_import_transformers(bert_dir, tmp_path):
    """The start-up cut: a job on a BERT model never imports transformers."""
    import subprocess
    import sys

    from spanflow.tasks.ner import NerModel

    _, ref, tok = bert_dir
    model = NerModel(encoder=ref, tokenizer=tok, labels=["LOC", "PER"], limit=64, head_type="softmax")
    model.save(str(tmp_path / "model"))
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    code = ("import sys; from spanflow.cli.main import main; rc = main(sys.argv[1:]); "
            "heavy = ('transformers', 'torch._dynamo'); "
            "print('LOADED', [m for m in heavy if m in sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "predict", "--model", str(tmp_path / "model"), "--input",
                          str(tmp_path / "in.txt"), "--output", str(tmp_path / "p.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout, out.stdout
    assert len((tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()) == len(TEXTS)


def test_native_tokenizer_encodes_as_transformers_does(bert_dir, tmp_path):
    from spanflow.models import tokenizer as native_tokenizer
    from spanflow.models.encoder import load_tokenizer

    d, _, _ = bert_dir
    texts = TEXTS + ["Ünïcödé naïve café", "中文 北京", "emoji 😂 ok", "", "a\u200bb\ufe0fc", "tab\there\nline",
                     " ".join(["word"] * 600)]
    ours, theirs = native_tokenizer.load(str(d)), load_tokenizer(str(d))
    assert ours is not None
    for special in (False, True):
        a = ours(texts, add_special_tokens=special, return_offsets_mapping=True)
        b = theirs(texts, add_special_tokens=special, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"]
        assert [[tuple(o) for o in x] for x in a["offset_mapping"]] == [[tuple(o) for o in x] for x in b["offset_mapping"]]
        assert all(a.word_ids(i) == b.word_ids(i) for i in range(len(texts)))
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.unk_token_id, len(ours)) == \
        (theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.unk_token_id, len(theirs))
    assert ours.unk_token_id is not None
    one, ref = ours(texts[0], return_offsets_mapping=True), theirs(texts[0], return_offsets_mapping=True)
    assert (one["input_ids"], one["offset_mapping"]) == (ref["input_ids"], ref["offset_mapping"])  # a text alone
    ours.save_pretrained(str(tmp_path / "copy"))  # saved as it was: transformers reads the copy
    assert load_tokenizer(str(tmp_path / "copy"))(texts)["input_ids"] == theirs(texts)["input_ids"]
    # a tokenizer whose special tokens are unknown is left to transformers
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "tokenizer.json").write_text((d / "tokenizer.json").read_text())
    (tmp_path / "odd" / "tokenizer_config.json").write_text(json.dumps({**cfg, "cls_token": "<s>"}))
    assert native_tokenizer.load(str(tmp_path / "odd")) is None

@pytest.mark.parametrize("settings", [{"do_lower_case": True}, {"do_lower_case": False, "strip_accents": True},
                                      {"strip_accents": False, "do_lower_case": True},
                                      {"tokenize_chinese_chars": False, "do_lower_case": False}])
def test_a_bert_tokenizers_config_sets_its_normalizer_as_in_transformers(bert_dir, tmp_path, settings):
    """transformers builds a BertTokenizer's normalizer from tokenizer_config.json's do_lower_case,
    strip_accents and tokenize_chinese_chars, over tokenizer.json's: the native tokenizer too."""
    import shutil

    from spanflow.models import tokenizer as native_tokenizer
    from spanflow.models.encoder import load_tokenizer

    d, _, _ = bert_dir
    shutil.copytree(d, tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "BertTokenizer",
                                                                      **settings}))
    texts = TEXTS[:5] + ["Grace HOPPER", "Ünïcödé naïve café", "中文 北京"]
    ours, theirs = native_tokenizer.load(str(tmp_path / "t")), load_tokenizer(str(tmp_path / "t"))
    assert ours is not None and type(theirs).__name__.startswith("BertTokenizer")
    a = ours(texts, return_offsets_mapping=True)
    b = theirs(texts, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert [[tuple(o) for o in x] for x in a["offset_mapping"]] == [[tuple(o) for o in x] for x in b["offset_mapping"]]



def sdpa_spy(monkeypatch):
    """Record, at each scaled_dot_product_attention call, whether cuDNN's and the memory-efficient
    backends were allowed."""
    import torch.nn.functional as F

    seen, real = [], F.scaled_dot_product_attention

    def spy(*a, **k):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()))
        return real(*a, **k)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen, real


def test_gpu_attention_leaves_out_cudnn_and_gives_the_same_outputs(monkeypatch):
    # cuDNN's attention builds a graph per new shape on the host (models/bert.py); the others do not
    from spanflow.models.bert import _sdpa_without_cudnn

    seen, real = sdpa_spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    before = torch.backends.cuda.cudnn_sdp_enabled()
    y = _sdpa_without_cudnn(q, k, v, mask, 0.0)
    assert seen == [(False, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # the choice is the call's alone
    torch.testing.assert_close(y, real(q, k, v, attn_mask=mask))


def test_gpu_attention_compiles_whole(monkeypatch):
    # a compiled server runs the same attention: the backend choice traces into the graph
    from spanflow.models.bert import _sdpa_without_cudnn

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 4:] = False
    compiled = torch.compile(_sdpa_without_cudnn, fullgraph=True, dynamic=True)  # a graph break raises
    torch.testing.assert_close(compiled(q, k, v, mask, 0.0), _sdpa_without_cudnn(q, k, v, mask, 0.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_gpu_attention_gives_the_default_backends_outputs_on_a_gpu():
    import torch.nn.functional as F

    from spanflow.models.bert import _sdpa_without_cudnn

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(3, 4, 37, 16, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(3, 1, 1, 37, dtype=torch.bool, device="cuda")
    mask[1, ..., 20:] = False
    torch.testing.assert_close(_sdpa_without_cudnn(q, k, v, mask, 0.0),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_a_training_step_on_a_gpu_takes_no_cudnn_attention(bert_dir, monkeypatch):
    model, _ = load_encoder(str(bert_dir[0]))
    assert isinstance(model, NativeBert)
    model.cuda().train()
    tok = bert_dir[2]
    seen, _ = sdpa_spy(monkeypatch)
    b = tok(TEXTS, padding=True, return_tensors="pt").to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    h.float().square().mean().backward()
    assert seen and all(s == (False, True) for s in seen), seen


@pytest.mark.parametrize("training", [False, True])
def test_cpu_low_precision_keeps_the_residual_stream_in_bf16(bert_dir, training):
    """Under CPU bf16 autocast the layers pass bf16 rows to each other (autocast's layer norms
    would return fp32 and every product cast it again), and the outputs stay within bf16
    rounding of fp32's."""
    d, ref, tok = bert_dir
    native = load_native(str(d)).train(training)
    seen: list[torch.dtype] = []
    hooks = [layer.register_forward_hook(lambda m, args, out: seen.extend([args[0].dtype, out.dtype]))
             for layer in native.encoder.layer]
    b = tok(TEXTS, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = native(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    for hook in hooks:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16} and h.dtype == torch.bfloat16
    if training:  # and it trains: every parameter takes a gradient through the bf16 stream
        h.float().pow(2).mean().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
                   for p in native.parameters())
    else:
        keep = b["attention_mask"].bool()
        assert torch.allclose(h[keep].float(), outputs(ref, tok), atol=0.05, rtol=0.02)
    with torch.no_grad():  # fp32 (no autocast) keeps fp32 throughout
        assert native(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state.dtype == torch.float32
