import pytest
import torch

from spanflow.errors import ConfigError
from spanflow.runtime.policy import resolve_policy


def test_cpu_defaults_to_fp32():
    p = resolve_policy("auto", "cpu")
    assert p.device.type == "cpu" and p.amp_dtype is None and not p.use_scaler
    assert "fp32" in p.describe()


def test_training_says_why_it_chose_its_precision(monkeypatch):
    from spanflow.runtime import policy

    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: False)
    assert resolve_policy("auto", "cpu", cpu_bf16=True).describe().endswith("(this CPU has no native bf16)")
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)
    assert resolve_policy("auto", "cpu", cpu_bf16=True).describe().endswith("(this CPU runs bf16 natively)")
    assert resolve_policy("fp32", "cpu", cpu_bf16=True).describe().endswith("precision fp32 (as asked)")


def test_cpu_bf16_autocasts_matmuls():
    p = resolve_policy("bf16", "cpu")
    lin = torch.nn.Linear(4, 4)
    with p.autocast():
        y = lin(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16 and lin.weight.dtype == torch.float32  # fp32 master weights


def test_bad_choices_are_config_errors():
    with pytest.raises(ConfigError, match="fp16 is for CUDA"):
        resolve_policy("fp16", "cpu")
    with pytest.raises(ConfigError, match="unknown precision"):
        resolve_policy("int3", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA"):
            resolve_policy("auto", "cuda")


def test_int8_is_no_precision_and_the_error_names_quantize():
    with pytest.raises(ConfigError, match="int8 is a quantization, not a precision: use --quantize int8"):
        resolve_policy("int8", "cpu")


def _nan_in(path, name=None):
    """Write one NaN into a safetensors file (its tensor `name`, else its first floating one)."""
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    key = name or next(k for k, v in state.items() if v.is_floating_point())
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float("nan")
    save_file(state, path)
    return key


def test_a_model_whose_weights_hold_nan_is_refused_at_load_naming_the_weight(tmp_path, capsys):
    """A NaN weight gave all-NaN embeddings (the .npy's error-row mark) or no entities at all, exit 0,
    and `--quantize int8` a traceback."""
    from helpers import tiny_bert

    from spanflow.cli.main import main
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.data.formats.jsonl import write_jsonl_record

    texts = [e.text for e in synthetic_ner(20, seed=1)]
    enc, tok = tiny_bert(texts, hidden=16, layers=1, heads=2)
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    key = _nan_in(str(tmp_path / "enc" / "model.safetensors"))
    (tmp_path / "in.txt").write_text("\n".join(texts[:3]) + "\n")
    for extra in ([], ["--quantize", "int8"]):
        rc = main(["embed", "--model", str(tmp_path / "enc"), "--input", str(tmp_path / "in.txt"), "--output",
                   str(tmp_path / "v.npy"), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and f"its weight {key} holds NaN values" in err and "Traceback" not in err, err
        assert not (tmp_path / "v.npy").exists()
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as f:
        for e in synthetic_ner(20, seed=1):
            write_jsonl_record(f, e.text, e.spans)
    assert main(["train", "ner", "--train", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "run"),
                 "--epochs", "1", "--log-every", "0"]) == 0
    model = tmp_path / "run" / "model"
    head = _nan_in(str(model / "head.safetensors"))
    rc = main(["predict", "--model", str(model), "--input", str(tmp_path / "in.txt"), "--output",
               str(tmp_path / "p.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and f"head.safetensors: its weight {head} holds NaN values" in err


def test_a_named_precision_whose_agreement_is_nan_is_refused(monkeypatch):
    """`nan < 0.999` is False: a bf16 run whose cosines came out nan passed the gate."""
    from spanflow.tasks.embed.model import Embedder

    nan = {"precision": "bf16", "n": 3, "mean_cosine": float("nan"), "min_cosine": float("nan"), "threshold": 0.999}
    monkeypatch.setattr(Embedder, "calibrate", lambda self, texts, what="": nan)
    with pytest.raises(ConfigError, match=r"bf16 embeddings reach a mean cosine of nan"):
        Embedder.check_precision(object.__new__(Embedder), ["a"])
    assert Embedder.check_precision(object.__new__(Embedder), ["a"], force=True) is nan


def test_with_precision_refuses_auto_and_a_bf16_twin_shares_the_fp32_tables():
    """with_precision('auto') gave fp32 without a word; the bf16 twin deep-copied the embedding
    tables its docstring says are shared (66 MiB more for MiniLM)."""
    from helpers import tiny_bert

    from spanflow.tasks.embed.model import Embedder
    from spanflow.tasks.embed.pooling import Pooling

    enc, tok = tiny_bert(["a b c", "d e f"], hidden=16, layers=1, heads=2)
    emb = Embedder(encoder=enc, tokenizer=tok, pooling=Pooling(mode="mean", normalize=False), precision="fp32")
    with pytest.raises(ConfigError, match=r"^with_precision takes 'fp32', 'bf16' or 'fp16'; 'auto' is chosen"):
        emb.with_precision("auto")
    twin = emb.with_precision("bf16")
    fp32 = {p.data_ptr() for p in emb.module.parameters()}
    kept = [n for n, p in twin.module.named_parameters() if p.dtype == torch.float32]
    assert kept and all(p.data_ptr() in fp32 for n, p in twin.module.named_parameters() if n in kept)
    assert any("word_embeddings" in n for n in kept)
    assert [(n, p.dtype) for n, p in twin.module.named_parameters() if p.dtype != torch.float32]  # Linear cast
    import numpy as np

    np.testing.assert_allclose(twin.encode(["a b c"]), emb.encode(["a b c"]), atol=0.05)
    int8 = emb.with_precision("fp32", quantize="int8")  # quantize_dynamic copied the copy again
    tables = [p for n, p in int8.module.named_parameters() if "word_embeddings" in n]
    assert tables and all(p.data_ptr() in fp32 for p in tables)


def test_emulated_bf16_is_said_once_however_often_the_precision_is_resolved(monkeypatch, caplog):
    from spanflow.runtime import policy

    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: False)
    policy._warn_emulated_bf16.cache_clear()
    with caplog.at_level("WARNING", logger="spanflow"):
        for _ in range(3):
            assert resolve_policy("bf16", "cpu").amp_dtype is torch.bfloat16
    assert [r.getMessage() for r in caplog.records].count(
        "this CPU has no native bf16 instructions: bf16 will run emulated, slower than fp32") == 1
