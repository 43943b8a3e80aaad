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
