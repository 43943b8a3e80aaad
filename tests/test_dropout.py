"""The CPU dropout (models/dropout.py) and the written-out training attention of NativeBert."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spanflow.models.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_one_minus_p(p):
    torch.manual_seed(0)
    n = 1 << 20
    m = keep_mask((n,), p)
    frac = m.float().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(frac - (1 - p)) < 6 * sigma + 2 ** -16
    # each of a word's four lanes is its own draw: no two agree more often than chance
    for a, b in ((0, 1), (1, 2), (2, 3), (0, 3)):
        agree = (m[a::4] == m[b::4]).float().mean().item()
        assert abs(agree - ((1 - p) ** 2 + p ** 2)) < 0.01


def test_dropout_keeps_the_mean_and_refuses_what_is_not_a_probability():
    torch.manual_seed(2)
    n = 1 << 20
    for p in (0.3, 0.7):
        y = dropout(torch.ones(n), p, True)
        assert abs(y.mean().item() - 1.0) < 6 * (p / (1 - p) / n) ** 0.5
    nearly_all = dropout(torch.ones(4096), 0.999995, True)  # beyond the lanes' resolution: torch's kernel
    assert (nearly_all == 0).float().mean().item() > 0.99
    assert torch.equal(dropout(torch.ones(8), 1.0, True), torch.zeros(8))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            dropout(torch.ones(8), bad, True)


def test_dropout_scales_what_it_keeps_and_its_gradient_follows():
    torch.manual_seed(1)
    x = torch.randn(64, 48, requires_grad=True)
    y = dropout(x, 0.25, True)
    kept = y != 0
    assert 0.6 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(y[kept], x.detach()[kept] / 0.75)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.75)


def test_dropout_follows_the_seed_and_draws_anew_each_call():
    x = torch.ones(1000)
    torch.manual_seed(3)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, True), a)
    assert not torch.equal(a, b)


def test_dropout_module_is_an_nn_dropout_and_off_in_eval():
    layer = Dropout(0.3)
    assert isinstance(layer, torch.nn.Dropout)
    x = torch.randn(10, 10)
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(dropout(x, 0.0, True), x)
    assert not torch.equal(layer.train()(x), x)


def test_dropout_keeps_the_dtype():
    x = torch.randn(8, 16).bfloat16()
    assert dropout(x, 0.1, True).dtype == torch.bfloat16


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.__name__)
        return func(*args, **(kwargs or {}))


def _bert(dropout_p: float, attention_p: float | None = None):
    from spanflow.models.bert import NativeBert
    from spanflow.models.files import Config

    cfg = Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=dropout_p,
                 attention_probs_dropout_prob=dropout_p if attention_p is None else attention_p, pad_token_id=0)
    torch.manual_seed(0)
    return NativeBert(cfg)


def test_native_bert_trains_on_the_cpu_without_torchs_serial_dropout():
    model = _bert(0.1).train()
    ids = torch.randint(1, 50, (3, 12))
    with _Ops() as ops:
        model(ids, torch.ones_like(ids)).last_hidden_state.sum().backward()
    assert "random_.from" in ops.names
    assert not any(n.startswith(("bernoulli", "native_dropout")) for n in ops.names)


def test_training_attention_equals_the_fused_one_without_dropout():
    model = _bert(0.0)
    ids = torch.randint(1, 50, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 3:] = 0
    want = model.eval()(ids, mask).last_hidden_state
    got = model.train()(ids, mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_attention_drops_attention_and_stays_finite_without_keys():
    ids = torch.randint(1, 50, (2, 10))
    mask = torch.ones_like(ids)
    model = _bert(0.0, attention_p=0.5)
    want = model.eval()(ids, mask).last_hidden_state
    torch.manual_seed(4)
    assert not torch.allclose(model.train()(ids, mask).last_hidden_state, want)  # the attention's own dropout
    mask[1] = 0  # a row with no key at all
    assert torch.isfinite(_bert(0.0).train()(ids, mask).last_hidden_state).all()
