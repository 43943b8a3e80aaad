"""spanflow.models.linear: CPU low-precision products see a fixed, small set of row counts."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import spanflow.models.bert as bert
from spanflow.models.bert import NativeBert
from spanflow.models.files import Config
import spanflow.models.linear as linear
from spanflow.models.linear import Linear, full_batches, rounded_rows


class _Rows(TorchDispatchMode):
    """The row counts of the matrix products run inside it."""

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.linear.default:  # inference mode keeps it whole
            self.rows.append(args[0].numel() // args[0].shape[-1])
        elif func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
            a = args[1] if func is torch.ops.aten.addmm.default else args[0]
            self.rows.append(a.shape[0])
        return func(*args, **(kwargs or {}))


def _bert() -> NativeBert:
    torch.manual_seed(0)
    cfg = Config(**{"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 64, "max_position_embeddings": 64, "type_vocab_size": 2,
                  "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                  "pad_token_id": 0})
    return NativeBert(cfg)


def _shapes():
    # token-budget batches as bulk jobs make them: B * T near a 2048-token budget, B by T
    return [(b, t) for t in range(4, 60, 3) for b in range(max(1, 2048 // t - 12), 2048 // t + 1, 2)]


def test_rounded_rows_is_a_small_fixed_set_close_above():
    seen = set()
    for m in range(1, 20000):
        r = rounded_rows(m)
        assert m <= r <= m + max(8, m / 32)
        assert rounded_rows(r) == r
        seen.add(r)
    assert len(seen) < 300  # against 19999 row counts unrounded


def test_linear_equals_nn_linear_and_rounds_only_low_precision_cpu_products():
    torch.manual_seed(0)
    ref = nn.Linear(16, 24)
    ours = Linear(16, 24)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 7, 16)  # 35 rows: rounded to 40
    with _Rows() as fp32:
        assert torch.equal(ours(x), ref(x))
    assert fp32.rows == [35, 35]
    with torch.autocast("cpu", dtype=torch.bfloat16), _Rows() as low:
        a, b = ours(x), ref(x)
    assert low.rows == [40, 35]
    assert a.shape == b.shape == (5, 7, 24) and a.dtype == b.dtype == torch.bfloat16
    assert torch.allclose(a.float(), b.float(), atol=2e-2)
    half = Linear(16, 24).to(torch.bfloat16)
    with _Rows() as cast:
        assert half(x.bfloat16()).shape == (5, 7, 24)
    assert cast.rows == [40]


def test_native_bert_under_bf16_meets_only_rounded_row_counts():
    model = _bert().eval()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16), _Rows() as seen:
        for b, t in _shapes():
            model(torch.randint(1, 50, (b, t)), torch.ones(b, t, dtype=torch.long))
    unrounded = {b * t for b, t in _shapes()}
    assert all(rounded_rows(m) == m for m in seen.rows)
    assert len(set(seen.rows)) * 4 < len(unrounded)
    with torch.inference_mode(), _Rows() as fp32:  # fp32: the products as the batch makes them
        for b, t in _shapes()[:5]:
            model(torch.randint(1, 50, (b, t)), torch.ones(b, t, dtype=torch.long))
    assert set(fp32.rows) == {b * t for b, t in _shapes()[:5]}


def test_rounded_rows_change_neither_outputs_nor_gradients(monkeypatch):
    model = _bert()
    for m in model.modules():  # no dropout: the rounded rows would shift the masks' draws
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    for layer in model.encoder.layer:
        layer.attention.self.p = 0.0
    ids = torch.randint(1, 50, (5, 7))  # 35 rows: rounded to 40
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[1, 4:] = 0

    def run():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), _Rows() as seen:
            out = model(ids, mask).last_hidden_state
        out.float().pow(2).mean().backward()
        return out.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}, seen.rows

    out_r, grads_r, rows_r = run()
    monkeypatch.setattr(bert, "rounded_rows", lambda m: m)
    monkeypatch.setattr("spanflow.models.linear.rounded_rows", lambda m: m)
    out_p, grads_p, rows_p = run()
    assert 40 in rows_r and 35 not in rows_r and 35 in rows_p  # the runs differ where they should
    assert out_r.shape == out_p.shape == (5, 7, 32)
    assert torch.allclose(out_r, out_p, atol=3e-2)
    for n, g in grads_p.items():
        assert torch.allclose(grads_r[n], g, atol=1e-2, rtol=0.1), n


def test_int8_quantization_still_finds_the_layers():
    from spanflow.tasks.embed.model import _quantize_int8

    q = _quantize_int8(_bert().eval())
    kinds = {type(m).__module__ for m in q.modules()}
    assert any("quantized" in k for k in kinds)
    assert not any(type(m) is Linear for m in q.modules())


def test_compiled_graphs_are_not_rounded(monkeypatch):
    # a rounding traced into a dynamic graph would pin it to one row count (a recompile per B * T)
    layer = Linear(16, 24)
    x = torch.randn(5, 7, 16)
    monkeypatch.setattr(torch.compiler, "is_dynamo_compiling", lambda: True)
    with torch.autocast("cpu", dtype=torch.bfloat16), _Rows() as seen:
        assert layer(x).shape == (5, 7, 24)
    assert seen.rows == [35]


def test_inside_full_batches_the_short_products_round_to_powers_of_two():
    sizes = range(1, 3000)
    fine = [rounded_rows(m) for m in sizes]
    with full_batches(2048, 512):  # short below min(3/4 of 2048, 2048 - 512): 1536
        inside = [rounded_rows(m) for m in sizes]
        with full_batches(None, 512):  # a nested loop without a budget: the fine steps
            assert [rounded_rows(m) for m in sizes] == fine
    assert [rounded_rows(m) for m in sizes] == fine  # left as it was
    assert all(m <= r and rounded_rows(r) == r for m, r in zip(sizes, inside))  # idempotent inside too
    assert set(inside[:1535]) == {8, 16, 32, 64, 128, 256, 512, 1024, 1536}
    assert inside[1535:] == fine[1535:]  # the full batches keep the fine steps
    assert len(set(fine[:1535])) > 90
    with full_batches(1024, 342):  # long texts: a full batch holds more than 1024 - 342 rows
        assert rounded_rows(684) == fine[683]  # two texts of 342 tokens: a full batch, the fine step
        assert rounded_rows(300) == 512  # short: a power of two, up to the bound's own size
        assert rounded_rows(600) == rounded_rows(681) == fine[681] == 688
    for budget, longest in ((3000, 64), (100, 30), (7, 1), (512, 512), (4097, 100), (0, 0)):
        with full_batches(budget, longest):
            for m in range(0, 5000):
                r = rounded_rows(m)
                assert m <= r and rounded_rows(r) == r and linear._fine(r) == r, (budget, m)  # a fine size


def _embedder(tmp_path):
    from helpers import tiny_bert
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.embed import Embedder

    texts = [e.text for e in synthetic_ner(120, seed=4, max_clauses=3)]
    enc, tok = tiny_bert(texts, hidden=32, layers=1, heads=2, seed=0)
    enc.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    emb = Embedder.load(str(tmp_path), precision="bf16", device="cpu")
    emb.set_max_length(48)
    return emb, texts


def test_a_bulk_embedding_loop_rounds_its_short_batches_and_the_server_does_not(tmp_path):
    emb, texts = _embedder(tmp_path)
    budget = 256
    bound = min(budget * 3 // 4, budget - emb.max_length)
    with _Rows() as bulk:  # chunks of 17 texts: each chunk's last batch is short
        got = np.concatenate(list(emb.encode_stream(texts, chunk_size=17, max_tokens=budget)))
    assert got.shape == (len(texts), emb.dim) and np.isfinite(got).all()
    short = [r for r in bulk.rows if r < bound]
    assert len(set(short)) >= 2 and all(r & (r - 1) == 0 for r in short)  # powers of two
    assert all(r & (r - 1) == 0 or r >= bound for r in bulk.rows)
    units, _, _ = emb.units(texts[:3])
    with _Rows() as served:
        emb.run_batch(units)
    from spanflow.batching.collate import SERVE_PAD_MULTIPLE as k

    padded = 3 * -(-max(len(u) for u in units) // k) * k
    assert served.rows and all(r == rounded_rows(padded) for r in served.rows)
    assert all(r < 1 << (padded - 1).bit_length() for r in served.rows)  # the fine step, not a power of two


def test_the_ner_and_re_bulk_loops_run_inside_full_batches_and_their_servers_do_not(monkeypatch, tiny_tokenizer):
    import spanflow.tasks.ner.model as ner_model
    import spanflow.tasks.ner.tagging as tagging
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.ner.model import NerModel
    from spanflow.tasks.re.model import ReModel

    seen = []

    def windows(model, bw, *a):
        seen.append(("ner", linear._SHORT_BELOW.get()))
        return [[0] * 64 for _ in bw]  # "O" for every token

    monkeypatch.setattr(tagging, "tag_windows", windows)
    monkeypatch.setattr(ner_model, "tag_windows", windows)
    texts = ["alpha beta gamma", "delta epsilon", "zeta"]
    policy = resolve_policy("fp32", "cpu")
    out = list(tagging.tag_texts(nn.Identity(), tiny_tokenizer, texts, id2label=["O"], max_length=32, stride=8,
                                 max_tokens=512, policy=policy))
    assert len(out) == 3
    ner = object.__new__(NerModel)
    ner.module, ner.tokenizer, ner.policy, ner.limit = nn.Identity(), tiny_tokenizer, policy, 32
    ner.run_batch([(None, [True])])

    rel = object.__new__(ReModel)
    rel.tokenizer, rel.max_length, rel.policy = tiny_tokenizer, 32, policy
    monkeypatch.setattr(ReModel, "predict_encoded",
                        lambda self, encs, **kw: seen.append(("re", linear._SHORT_BELOW.get())) or [[] for _ in encs])
    assert rel.predict(texts, max_tokens=1024) == [[], [], []]
    rel.run_batch([])
    # min(3/4 budget, budget - longest): NER 384 (512 - 32 = 480), RE 768 (1024 - 32 = 992)
    assert seen == [("ner", 384), ("ner", 0), ("re", 768), ("re", 0)]
    assert linear._SHORT_BELOW.get() == 0  # and nothing left set after them
