"""Training recipes: CRF head, label smoothing, class weights, layer-wise lr decay,
entity-aware sampling and gradient checkpointing."""
import copy
import itertools
import math

import pytest
import torch
from helpers import count_ops, padded_batch

from spanflow.batching.align import IGNORE, Window
from spanflow.batching.sampling import epoch_indices, rarity_weights
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.tasks.ner.crf import CRF, bio_transition_mask, compact
from spanflow.tasks.ner.heads import CrfTaggingHead, EncoderWithHead, TokenClassificationHead
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.tasks.ner.features import bio_label_list, class_weight_tensor, make_ner_loss, window_kinds
from spanflow.training.plan import epoch_plan
from spanflow.training.optim import build_optimizer, encoder_depth, param_lr
from spanflow.training.options import TrainOptions

ID2LABEL = bio_label_list(["A", "B"])  # O B-A I-A B-B I-B


def small_opts(**kw):
    base = dict(epochs=12, lr=2e-2, max_tokens=512, max_length=64, warmup_ratio=0.05, patience=0, log_every=0,
                seed=0)
    base.update(kw)
    return TrainOptions(**base)


def _crf(seed=0):
    torch.manual_seed(seed)
    crf = CRF(len(ID2LABEL), bio_transition_mask(ID2LABEL))
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


def _path_score(crf, em, tags):
    trans = crf.transitions + crf.transition_mask
    s = crf.start[tags[0]] + em[0, tags[0]] + crf.end[tags[-1]]
    for t in range(1, len(tags)):
        s = s + trans[tags[t - 1], tags[t]] + em[t, tags[t]]
    return s


def test_crf_nll_and_viterbi_match_enumeration_over_ragged_rows():
    crf = _crf()
    C, lengths = len(ID2LABEL), [4, 2, 1]
    em = torch.randn(3, 4, C)
    mask = torch.arange(4)[None] < torch.tensor(lengths)[:, None]
    tags = torch.randint(0, C, (3, 4))
    nll = crf.nll(em, tags, mask)
    best = crf.viterbi(em, mask)
    for r, n in enumerate(lengths):
        paths = list(itertools.product(range(C), repeat=n))
        scores = torch.stack([_path_score(crf, em[r], list(p)) for p in paths])
        want = torch.logsumexp(scores, 0) - _path_score(crf, em[r], tags[r, :n].tolist())
        assert torch.allclose(nll[r], want, atol=1e-4)
        assert best[r, :n].tolist() == list(paths[int(scores.argmax())])


def _leaf_grads(crf, em, fn):
    for t in (em, *crf.parameters()):
        t.grad = None
    fn().backward()
    return [t.grad.clone() for t in (em, crf.transitions, crf.start, crf.end)]


def test_crf_nll_gradients_match_enumeration_over_ragged_rows():
    """The closed-form backward (forward-backward marginals) against autograd through every path."""
    crf = _crf(1)
    C, lengths = len(ID2LABEL), [4, 3, 1, 0]
    em = torch.randn(4, 4, C, requires_grad=True)
    mask = torch.arange(4)[None] < torch.tensor(lengths)[:, None]
    tags = torch.randint(0, C, (4, 4))
    w = torch.tensor([0.7, -1.3, 2.0, 0.5])

    def enumerated():
        rows = []
        for r, n in enumerate(lengths):
            if n == 0:
                rows.append(em.sum() * 0)
                continue
            scores = torch.stack([_path_score(crf, em[r], list(p)) for p in itertools.product(range(C), repeat=n)])
            rows.append(torch.logsumexp(scores, 0) - _path_score(crf, em[r], tags[r, :n].tolist()))
        return (torch.stack(rows) * w).sum()

    got = _leaf_grads(crf, em, lambda: (crf.nll(em, tags, mask) * w).sum())
    want = _leaf_grads(crf, em, enumerated)
    for g, e, name in zip(got, want, ["emissions", "transitions", "start", "end"]):
        assert torch.allclose(g, e, atol=1e-4), name
    assert got[0][3].abs().sum() == 0  # an empty row gets no gradient


def test_crf_nll_stays_exact_where_a_float32_product_would_underflow():
    """I-A may follow only B-A or I-A; both 110 nats below O at the first word, then I-A 120 up:
    a float32 product of exponentials loses every way into I-A (log 0), logsumexp does not."""
    crf = CRF(len(ID2LABEL), bio_transition_mask(ID2LABEL))
    em = torch.full((1, 2, len(ID2LABEL)), -110.0)
    em[0, 0, 0] = 0.0
    em[0, 1] = 0.0
    em[0, 1, ID2LABEL.index("I-A")] = 120.0
    em.requires_grad_()
    tags = torch.tensor([[ID2LABEL.index("B-A"), ID2LABEL.index("I-A")]])
    nll = crf.nll(em, tags, torch.ones(1, 2, dtype=torch.bool))
    paths = list(itertools.product(range(len(ID2LABEL)), repeat=2))
    exact, e64 = copy.deepcopy(crf).double(), em.detach().double()[0]
    scores = torch.stack([_path_score(exact, e64, list(p)) for p in paths])
    want = torch.logsumexp(scores, 0) - _path_score(exact, e64, tags[0].tolist())
    assert torch.allclose(nll.double(), want, atol=1e-3), (nll, want)
    nll.sum().backward()
    assert torch.isfinite(em.grad).all() and em.grad.abs().max() <= 1 + 1e-5  # marginals minus indicators


def test_crf_nll_gradients_stay_finite_whatever_the_unlabelled_slots_hold():
    """Past a row's end the emissions are those of slots without a label (padding, subword
    continuations): unbounded, and left out of every gradient."""
    crf = _crf()
    em = torch.randn(2, 5, len(ID2LABEL))
    em[0, 3:] = 1e4
    em[1, 1:] = -1e4
    em.requires_grad_()
    mask = torch.arange(5)[None] < torch.tensor([3, 1])[:, None]
    crf.nll(em, torch.randint(0, len(ID2LABEL), (2, 5)), mask).sum().backward()
    for t in (em, *crf.parameters()):
        assert torch.isfinite(t.grad).all()
    assert em.grad[0, 3:].abs().sum() == 0 and em.grad[1, 1:].abs().sum() == 0


def _graph_nodes(t: torch.Tensor) -> int:
    seen, todo = set(), [t.grad_fn]
    while todo:
        f = todo.pop()
        if f is not None and f not in seen:
            seen.add(f)
            todo.extend(n for n, _ in f.next_functions)
    return len(seen)


def test_crf_nll_records_no_operator_per_word():
    """The recursion over the words runs outside autograd: the graph is as large for 24 words as for 3
    (autograd through the loop recorded several nodes a word, each replayed by the host backward)."""
    crf = _crf()
    sizes = []
    for n in (3, 24):
        em = torch.randn(2, n, len(ID2LABEL), requires_grad=True)
        mask = torch.arange(n)[None] < torch.tensor([n, n - 1])[:, None]
        sizes.append(_graph_nodes(crf.nll(em, torch.randint(0, len(ID2LABEL), (2, n)), mask).sum()))
    assert sizes[0] == sizes[1], sizes


def test_crf_nll_runs_in_fp32_under_bf16_autocast():
    crf = _crf()
    em = torch.randn(3, 7, len(ID2LABEL))
    mask = torch.arange(7)[None] < torch.tensor([7, 5, 2])[:, None]
    tags = torch.randint(0, len(ID2LABEL), (3, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = crf.nll(em, tags, mask)
    assert low.dtype == torch.float32
    assert torch.allclose(low, crf.nll(em, tags, mask), atol=1e-5)


def test_crf_head_nll_over_the_words_equals_over_the_tokens():
    """The collation's count of labelled positions bounds the CRF's steps; the loss and its
    gradients are those of the full token width."""
    from spanflow.tasks.ner.features import make_collate

    head = CrfTaggingHead(hidden_size=4, id2label=ID2LABEL)
    windows = [Window(0, 0, 8, list(range(1, 9)), [IGNORE, 1, IGNORE, 2, 0, IGNORE, 0, IGNORE]),
               Window(1, 0, 5, list(range(1, 6)), [IGNORE, 3, 4, IGNORE, IGNORE])]
    batch = make_collate(0)(windows)
    assert batch["labelled_width"] == 4 < batch["labels"].shape[1]
    logits = torch.randn(2, 8, len(ID2LABEL), requires_grad=True)
    grads = []
    for words in (None, batch["labelled_width"]):
        logits.grad = None
        loss = head.nll(logits, batch["labels"], IGNORE, words)
        loss.backward()
        grads.append((loss.detach(), logits.grad.clone()))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5)


def test_crf_nll_backward_zero_fills_no_copy_of_the_emissions_per_step():
    """Emissions taken by indexing per word (in the gold score, or a recursion autograd records)
    would zero-fill all the emissions per word in backward."""
    crf = _crf()
    em = torch.randn(3, 6, len(ID2LABEL), requires_grad=True)
    mask = torch.arange(6)[None] < torch.tensor([6, 4, 2])[:, None]
    loss = crf.nll(em, torch.randint(0, len(ID2LABEL), (3, 6)), mask).sum()
    aten = torch.ops.aten
    assert count_ops(loss.backward, aten.slice_backward.default, aten.select_backward.default) == 0
    assert em.grad is not None and em.grad.abs().sum() > 0


def test_crf_never_decodes_an_invalid_bio_transition():
    crf = CRF(len(ID2LABEL), bio_transition_mask(ID2LABEL))  # zero scores: emissions alone would pick I- after O
    em = torch.zeros(1, 3, len(ID2LABEL))
    em[0, 0, 0] = 5.0  # O
    em[0, 1, ID2LABEL.index("I-A")] = 3.0
    em[0, 2, ID2LABEL.index("I-B")] = 3.0
    tags = [ID2LABEL[i] for i in crf.viterbi(em, torch.ones(1, 3, dtype=torch.bool))[0].tolist()]
    for prev, cur in zip(tags, tags[1:]):
        assert not cur.startswith("I-") or prev[2:] == cur[2:], tags


def test_compact_moves_kept_positions_forward():
    x = torch.arange(12.).view(2, 6)
    keep = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    out, index, mask = compact(x, keep)
    assert out[0].tolist() == [1., 3., 4.] and out[1, 0].item() == 6.
    assert mask.tolist() == [[True] * 3, [True, False, False]]
    assert index[0].tolist() == [1, 3, 4]


def test_crf_head_decode_scatters_back_to_word_starts():
    head = CrfTaggingHead(hidden_size=4, id2label=ID2LABEL)
    logits = torch.full((1, 5, len(ID2LABEL)), -5.0)
    logits[0, 1, ID2LABEL.index("B-A")] = 5
    logits[0, 3, ID2LABEL.index("I-A")] = 5
    first = torch.tensor([[False, True, False, True, False]])
    ids = head.decode(logits, first)[0].tolist()
    assert [ID2LABEL[ids[1]], ID2LABEL[ids[3]]] == ["B-A", "I-A"]


@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_crf_overfit_and_save_load_roundtrip(tmp_path, head):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path), options=small_opts(), head=head,
                      log_fn=lambda s: None)
    assert model.evaluate(data)["f1"] >= 0.95
    again = NerModel.load(str(tmp_path / "model"))
    assert again.head_type == head
    assert not any(m.training for m in again.module.modules())  # loaded for inference: no dropout anywhere
    assert isinstance(again.module.head, CrfTaggingHead if head == "crf" else TokenClassificationHead)
    texts = [e.text for e in data[:10]]
    assert again.predict(texts) == model.predict(texts)
    # continuing from the saved model keeps its head; asking for the other one is an error
    more = train_ner(data, None, model=str(tmp_path / "model"), out_dir=str(tmp_path / "more"),
                     options=small_opts(epochs=1), log_fn=lambda s: None)
    assert more.head_type == head
    other = "softmax" if head == "crf" else "crf"
    with pytest.raises(ConfigError, match=f"has a {head} head"):
        train_ner(data, None, model=str(tmp_path / "model"), out_dir=str(tmp_path / "x"), head=other,
                  options=small_opts(epochs=1), log_fn=lambda s: None)


def test_label_smoothing_and_class_weights_change_the_loss_as_defined():
    torch.manual_seed(0)
    head = TokenClassificationHead(hidden_size=4, num_labels=3)
    model = EncoderWithHead(_IdentityEncoder(), head).eval()
    batch = {"input_ids": torch.randn(2, 5, 4), "attention_mask": torch.ones(2, 5),
             "labels": torch.tensor([[IGNORE, 0, 1, 2, IGNORE], [IGNORE, 2, 2, 0, IGNORE]])}
    logits = model(batch["input_ids"], batch["attention_mask"])
    keep = batch["labels"] != IGNORE
    logp, y = logits[keep].log_softmax(-1), batch["labels"][keep]
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    assert torch.allclose(make_ner_loss()(model, batch), nll.sum(), atol=1e-5)
    eps = 0.2
    want = ((1 - eps) * nll - eps / 3 * logp.sum(-1)).sum()
    assert torch.allclose(make_ner_loss(label_smoothing=eps)(model, batch), want, atol=1e-5)
    w = torch.tensor([1.0, 3.0, 0.5])
    assert torch.allclose(make_ner_loss(class_weights=w)(model, batch), (w[y] * nll).sum(), atol=1e-5)


class _IdentityEncoder(torch.nn.Module):
    """Passes its 'input_ids' (already vectors) through as token states."""

    class _Out:
        def __init__(self, h):
            self.last_hidden_state = h

    def forward(self, input_ids, attention_mask):
        return self._Out(input_ids)


def _windows(label_rows):
    return [Window(0, 0, len(r), list(range(len(r))), labels=r) for r in label_rows]


def test_auto_class_weights_favour_rare_labels_and_keep_the_mean():
    # O x 8, B-A x 3, I-A x 1, B-B x 1 (I-B never seen)
    wins = _windows([[IGNORE, 0, 0, 0, 0, 1, 2, IGNORE], [0, 0, 0, 0, 1, 1, 3]])
    w = class_weight_tensor("auto", wins, ID2LABEL)
    counts = torch.tensor([8., 3., 1., 1., 0.])
    assert w[0] < w[1] < w[2] and w[2] == w[3] and w[4] == 1.0
    assert math.isclose(float((w * counts).sum() / counts.sum()), 1.0, rel_tol=1e-5)
    given = class_weight_tensor("A=2.5,O=0.5", wins, ID2LABEL)
    assert given.tolist() == [0.5, 2.5, 2.5, 1.0, 1.0]
    assert class_weight_tensor({"I-B": 4}, wins, ID2LABEL).tolist() == [1, 1, 1, 1, 4]
    with pytest.raises(ConfigError, match="unknown label 'C'"):
        class_weight_tensor("C=2", wins, ID2LABEL)
    with pytest.raises(ConfigError, match="LABEL=WEIGHT"):
        class_weight_tensor("A:2", wins, ID2LABEL)
    # taken as given, they weighed nothing (and switched a new model to the softmax head) or kept the last
    for text, said in (("", "LABEL=WEIGHT"), (",", "LABEL=WEIGHT"), ("A=2,A=3", "'A' is given twice"),
                       ("auto,A=2", "'auto' stands alone")):
        with pytest.raises(ConfigError, match=said):
            TrainOptions(class_weights=text)
    assert TrainOptions(class_weights=" auto ").class_weights == "auto"  # spaces round a value are no part of it


def test_layerwise_lr_decay_groups():
    from transformers import BertConfig, BertModel

    enc = BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                               intermediate_size=16), add_pooling_layer=False)
    model = EncoderWithHead(enc, TokenClassificationHead(hidden_size=8, num_labels=3))
    opts = TrainOptions(lr=1e-3, head_lr=1e-2, llrd=0.5)
    assert encoder_depth("encoder.embeddings.word_embeddings.weight", 3) == 0
    assert encoder_depth("encoder.encoder.layer.2.output.dense.weight", 3) == 3
    lrs = {name: param_lr(name, opts, 3) for name, _ in model.named_parameters()}
    assert lrs["head.proj.weight"] == 1e-2
    assert lrs["encoder.encoder.layer.2.output.dense.weight"] == 1e-3
    assert lrs["encoder.encoder.layer.0.output.dense.weight"] == pytest.approx(1e-3 * 0.25)
    assert lrs["encoder.embeddings.word_embeddings.weight"] == pytest.approx(1e-3 * 0.125)
    opt = build_optimizer(model, opts, torch.device("cpu"))
    got = sorted({round(g["lr"], 12) for g in opt.param_groups})
    assert got == sorted({1e-2, 1e-3, 5e-4, 2.5e-4, 1.25e-4})
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    flat = {round(g["lr"], 12) for g in build_optimizer(model, TrainOptions(lr=1e-3), torch.device("cpu")).param_groups}
    assert flat == {1e-3}


def test_rarity_weights_and_epoch_draws():
    kinds = [{"common"}] * 60 + [{"rare"}] * 15 + [set()] * 25 + [{"common", "rare"}] * 0
    w = rarity_weights(kinds, 1.0)
    assert w[0] == 1.0 and w[60] == 4.0 and w[80] == 1.0
    assert rarity_weights(kinds, 0.5)[60] == 2.0 and rarity_weights(kinds, 0.0) == [1.0] * 100
    draws = [epoch_indices(w, seed=0, epoch=e) for e in range(20)]
    assert draws[3] == epoch_indices(w, seed=0, epoch=3) and draws[3] != draws[4]
    assert all(abs(len(d) - 100) <= 12 for d in draws)
    rare = sum(1 for d in draws for i in d if 60 <= i < 75) / 20
    common = sum(1 for d in draws for i in d if i < 60) / 20
    # rare items are 4x as likely per item: 15*4 / (60 + 60 + 25) of ~100 draws
    assert 35 < rare < 48 and 36 < common < 46


def test_weighted_epoch_plan_repeats_rare_windows_within_budget():
    lengths = [10] * 50 + [30] * 10
    weights = [1.0] * 50 + [5.0] * 10
    opts = TrainOptions(max_tokens=120, seed=1)
    plan = epoch_plan(lengths, opts, 0, 1, weights)
    items = [i for step in plan for mb in step for i in mb]
    assert sum(1 for i in items if i >= 50) > 25  # each rare window ~ 3 times
    assert all(max(lengths[i] for i in mb) * len(mb) <= 120 for step in plan for mb in step if mb)


def test_window_kinds_reads_entity_types():
    wins = _windows([[IGNORE, 0, 3, 4, IGNORE], [IGNORE, 2, 0], [0, 0]])
    assert window_kinds(wins, ID2LABEL) == [{"B"}, {"A"}, set()]


@pytest.mark.parametrize("kind", ["transformer", "native", "tiny"])
def test_gradient_checkpointing_keeps_gradients(tmp_path, kind):
    from helpers import tiny_bert
    from spanflow.models.encoder import build_tiny, enable_checkpointing, is_checkpointing, load_encoder

    texts = [e.text for e in synthetic_ner(20, seed=2)]
    grads = []
    for ckpt in (False, True):
        enc, tok = tiny_bert(texts, hidden=128, seed=0) if kind != "tiny" else build_tiny(texts, seed=0)
        if kind == "native":  # the BERT training runs (spanflow.models.bert), from the same weights
            enc.save_pretrained(tmp_path / "enc")
            tok.save_pretrained(tmp_path / "enc")
            enc = load_encoder(str(tmp_path / "enc"))[0]
            assert type(enc).__name__ == "NativeBert"
        torch.manual_seed(4)
        model = EncoderWithHead(enc, TokenClassificationHead(hidden_size=enc.config.hidden_size, num_labels=3)).train()
        assert not is_checkpointing(enc)
        if ckpt:
            enable_checkpointing(enc)
            assert is_checkpointing(enc)
        batch = padded_batch(tok, texts[:4])
        torch.manual_seed(5)  # same dropout masks; checkpointing replays the RNG state in recompute
        model(batch["input_ids"], batch["attention_mask"]).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_recipes_train_end_to_end_and_reject_bad_combinations(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    opts = small_opts(label_smoothing=0.1, class_weights="auto", llrd=0.8, oversample=0.5, grad_checkpointing=True)
    lines = []
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lines.append)
    assert model.evaluate(data)["f1"] >= 0.9
    # a softmax recipe picks the softmax head for a new model, and the run says so
    assert model.head_type == "softmax"
    notes = [s for s in lines if s.startswith("note: ") and "softmax head" in s]
    assert notes == ["note: --label-smoothing and --class-weights apply to the softmax head only: this new model "
                     "takes a softmax head instead of the default crf (docs/recipes.md compares them)"]
    lines.clear()  # continuing that softmax model changes no head: no note
    train_ner(data, None, model=str(tmp_path / "model"), out_dir=str(tmp_path / "d"),
              options=small_opts(label_smoothing=0.1, max_steps=1), log_fn=lines.append)
    assert not [s for s in lines if "softmax head" in s]
    with pytest.raises(ConfigError, match="softmax head"):
        train_ner(data, None, model="tiny", out_dir=str(tmp_path / "b"), head="crf",
                  options=small_opts(label_smoothing=0.1))
    for bad in (dict(label_smoothing=1.0), dict(llrd=0.0), dict(oversample=-1)):
        with pytest.raises(ConfigError):
            train_ner(data, None, model="tiny", out_dir=str(tmp_path / "c"), options=small_opts(**bad))


def test_cli_train_with_recipes_from_docbin(tmp_path, capsys):
    pytest.importorskip("spacy")
    from spanflow.cli.main import main
    from spanflow.data.io import write_ner
    from spanflow.models.directory import read_model_config

    write_ner(synthetic_ner(40, seed=1, max_clauses=1), tmp_path / "train.spacy")
    args = ["train", "ner", "--train", str(tmp_path / "train.spacy"), "--dev", str(tmp_path / "train.spacy"),
            "--model", "tiny", "--epochs", "2", "--max-tokens", "512", "--max-length", "64", "--log-every", "0"]
    assert main(args + ["--out", str(tmp_path / "run"), "--head", "crf", "--llrd", "0.9", "--head-lr", "1e-2",
                        "--oversample", "0.5", "--grad-checkpointing"]) == 0
    assert read_model_config(str(tmp_path / "run" / "model"))["head"] == "crf"
    capsys.readouterr()
    assert main(args + ["--out", str(tmp_path / "bad"), "--head", "crf", "--label-smoothing", "0.1"]) == 2
    assert "error: --label-smoothing applies to the softmax head, not the CRF" in capsys.readouterr().err  # its own
    assert main(args + ["--out", str(tmp_path / "bad"), "--class-weights", "person=x"]) == 2
    assert "LABEL=WEIGHT" in capsys.readouterr().err


def test_pack_span_without_pack_is_said_to_do_nothing(tmp_path):
    lines: list[str] = []
    data = synthetic_ner(20, seed=1, max_clauses=1)
    train_ner(data, None, model="tiny", out_dir=str(tmp_path), options=small_opts(epochs=1, pack_span=3.0),
              log_fn=lines.append)
    assert "warning: --pack-span 3 has no effect without --pack (no texts are joined)" in lines


def test_class_weights_of_a_label_the_data_lacks_are_refused_before_any_note(tmp_path):
    lines: list[str] = []
    with pytest.raises(ConfigError, match="unknown label 'FOO'"):
        train_ner(synthetic_ner(20, seed=1, max_clauses=1), None, model="tiny", out_dir=str(tmp_path),
                  options=small_opts(epochs=1, class_weights="FOO=2"), log_fn=lines.append)
    assert not any("softmax head only" in x for x in lines), lines  # no note on a head for a run that never starts
