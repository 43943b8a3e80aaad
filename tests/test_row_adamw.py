"""Sparse vocabulary gradients on the CPU: RowAdamW's rows paid what they missed, the clip norm over sparse and
dense gradients, which tables go sparse, and a training run that learns and resumes with them."""
import copy

import pytest
import torch
from torch import nn

from spanflow.training import optim
from spanflow.training.optim import RowAdamW, build_optimizer, sparse_tables
from spanflow.training.row_adamw import paid
from spanflow.training.options import TrainOptions
from spanflow.training.step import clip_grad_norm

CPU = torch.device("cpu")


class Bag(nn.Module):
    """A vocabulary table, a position table and a linear head."""

    def __init__(self, rows: int = 5000):
        super().__init__()
        self.word_embeddings = nn.Embedding(rows, 16, padding_idx=0)
        self.pos = nn.Embedding(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.word_embeddings(ids) + self.pos.weight[: ids.shape[1]]).pow(2).mean()


def _pair(seed=0):
    torch.manual_seed(seed)
    dense = Bag()
    rows = copy.deepcopy(dense)
    assert sparse_tables(rows, CPU) == [rows.word_embeddings]
    return dense, rows


def _train(model, opt, batches, clip=None):
    for ids in batches:
        model(ids).backward()
        if clip is not None:
            clip(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_only_vocabulary_tables_go_sparse_and_only_on_the_cpu():
    m = Bag()
    assert sparse_tables(m, torch.device("cuda")) == [] and not m.word_embeddings.sparse
    assert sparse_tables(m, CPU) == [m.word_embeddings]
    assert m.word_embeddings.sparse and not m.pos.sparse  # the position table is not a vocabulary
    # the flag is set both ways: a module made sparse once, then trained where tables stay dense
    assert sparse_tables(m, torch.device("cuda")) == [] and not m.word_embeddings.sparse
    sparse_tables(m, CPU)
    build_optimizer(m, TrainOptions(lr=1e-3, grad_compression="fp16"), CPU)  # DDP's hooks take no sparse one
    assert not m.word_embeddings.sparse
    frozen = Bag()
    frozen.word_embeddings.weight.requires_grad_(False)
    assert sparse_tables(frozen, CPU) == []
    long_positions = Bag()
    long_positions.pos = nn.Embedding(8194, 16)  # a long position table is no vocabulary
    assert sparse_tables(long_positions, CPU) == [long_positions.word_embeddings]


def test_tiny_encoders_bigram_table_goes_sparse():
    from spanflow.models.encoder import build_tiny

    enc, _ = build_tiny(["a few words to fit a tokenizer on"] * 4, bigram_buckets=10007)
    assert enc.bigrams.num_embeddings >= optim.VOCABULARY_ROWS
    assert sparse_tables(enc, CPU) == [enc.bigrams]  # its word table (under 4096 rows here) stays dense


def test_touched_rows_follow_adamw_and_untouched_rows_stay():
    dense, rows = _pair()
    start = rows.word_embeddings.weight.detach().clone()
    kw = dict(lr=1e-2, weight_decay=0.1)
    ids = torch.randint(1, 60, (6, 5))  # the same rows every step: there lazy and dense AdamW agree
    _train(dense, torch.optim.AdamW(dense.parameters(), **kw), [ids] * 6, clip=nn.utils.clip_grad_norm_)
    _train(rows, RowAdamW(rows.parameters(), fused=True, **kw), [ids] * 6, clip=clip_grad_norm)
    seen = ids.unique()
    torch.testing.assert_close(rows.word_embeddings.weight[seen], dense.word_embeddings.weight[seen], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows.head.weight, dense.head.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows.pos.weight, dense.pos.weight, rtol=1e-5, atol=1e-6)
    others = torch.ones(start.shape[0], dtype=torch.bool)
    others[seen] = False
    assert torch.equal(rows.word_embeddings.weight[others], start[others])  # owed AdamW's decay, not yet given it
    assert not torch.equal(rows.word_embeddings.weight[seen], start[seen])


def _same_gradients(steps, betas=(0.9, 0.999), lr=1e-2, weight_decay=0.1, midway=None, seed=0):
    """A 60-row table stepped by AdamW on dense gradients and by RowAdamW on the same gradients
    sparse, each step's holding 3 random rows (so rows miss runs of steps), under warmup and
    linear decay; `midway(opt, rows)` is called before step steps // 2."""
    gen = torch.Generator().manual_seed(seed)
    dense = nn.Parameter(torch.randn(60, 8, generator=gen))
    rows = nn.Parameter(dense.detach().clone())
    kw = dict(lr=lr, weight_decay=weight_decay, betas=betas)
    opt_d, opt_r = torch.optim.AdamW([dense], **kw), RowAdamW([rows], **kw)
    lam = optim.warmup_linear(steps, 0.2)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lam) for o in (opt_d, opt_r)]
    for k in range(steps):
        if midway is not None and k == steps // 2:
            midway(opt_r, rows)
        idx = torch.randint(0, 60, (3,), generator=gen)
        grad = torch.sparse_coo_tensor(idx[None], torch.randn(3, 8, generator=gen), (60, 8), check_invariants=True)
        dense.grad, rows.grad = grad.to_dense(), grad
        for o, s in zip((opt_d, opt_r), scheds):
            o.step()
            s.step()
    return dense, rows, opt_d, opt_r


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.99, 0.999), (0.0, 0.99), (0.5, 0.99)])  # the last: K = 24,
# so rows missed K steps or more (one lookup each) are many
def test_caught_up_rows_equal_adamw_on_the_same_gradients(betas):
    dense, rows, opt_d, opt_r = _same_gradients(150, betas=betas)
    before = rows.detach().clone()
    opt_r.catch_up()
    assert not torch.equal(rows, before)  # rows not seen lately were owed their decay and momentum
    torch.testing.assert_close(rows, dense, rtol=1e-5, atol=1e-6)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(opt_r.state[rows][key], opt_d.state[dense][key], rtol=1e-5, atol=1e-7, msg=key)


def test_rows_with_zero_moments_are_paid_as_every_other_row_would_be():
    """catch_up and paid() take the weight decay alone from rows whose moments are zero (a large
    vocabulary's unseen rows); bit for bit what the general row path applies them. Rows 0-19 are
    never seen, row 20 has only a zero momentum (a zero gradient seen once, then its moments set
    by hand), the rest are seen at random; CHUNK is cut so the table spans several chunks."""
    from spanflow.training import row_adamw
    gen = torch.Generator().manual_seed(3)
    table = nn.Parameter(torch.randn(60, 8, generator=gen))
    opt = RowAdamW([table], lr=1e-2, weight_decay=0.1)
    for k in range(40):
        idx = torch.randint(21, 60, (3,), generator=gen) if k else torch.tensor([20, 30, 40])
        vals = torch.randn(3, 8, generator=gen) * (idx != 20)[:, None]
        table.grad = torch.sparse_coo_tensor(idx[None], vals, (60, 8), check_invariants=True)
        opt.step()
    opt.state[table]["exp_avg"][20] = 0.0
    opt.state[table]["exp_avg_sq"][20] = 1e-6  # m zero, v not: its v still decays
    general = copy.deepcopy({"table": table, "opt": opt})
    book, state = general["opt"]._rows[general["table"]], general["opt"].state[general["table"]]
    row_adamw._missed(book, torch.arange(60), general["table"], state, 1e-8)  # every row by the general path
    before = table.detach().clone()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(row_adamw, "CHUNK", 16)
        with paid(opt):
            inside = table.detach().clone()
        assert torch.equal(table, before)  # paid() hands the table back as it was
        opt.catch_up()
    assert not torch.equal(inside[:20], before[:20])  # unseen rows were owed their decay
    assert torch.equal(inside, general["table"]) and torch.equal(table, general["table"])
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[table][key], state[key]), key


def test_a_row_update_is_adamw_to_double_precision():
    """Bias corrections in double, as AdamW computes them: in float32, 1 - 0.999 ** 1 is off by 5e-5."""
    gen = torch.Generator().manual_seed(0)
    dense = nn.Parameter(torch.randn(6, 4, generator=gen, dtype=torch.float64))
    rows = nn.Parameter(dense.detach().clone())
    opt_d, opt_r = (cls([p], lr=1e-2, weight_decay=0.1) for cls, p in ((torch.optim.AdamW, dense), (RowAdamW, rows)))
    for _ in range(3):
        grad = torch.randn(6, 4, generator=gen, dtype=torch.float64)
        dense.grad, rows.grad = grad, grad.to_sparse(sparse_dim=1)
        opt_d.step()
        opt_r.step()
        torch.testing.assert_close(rows, dense, rtol=1e-12, atol=1e-14)


def test_a_row_is_caught_up_when_it_is_seen_again():
    dense, rows, opt_d, opt_r = _same_gradients(100)
    grad = torch.sparse_coo_tensor(torch.arange(60)[None], torch.randn(60, 8), (60, 8), check_invariants=True)  # every row, once more
    dense.grad, rows.grad = grad.to_dense(), grad
    opt_d.step()
    opt_r.step()
    torch.testing.assert_close(rows, dense, rtol=1e-5, atol=1e-6)


def _catch_up(opt, rows):
    before = rows.detach().clone()
    opt.catch_up()
    assert not torch.equal(rows, before)  # it paid the rows what they were owed
    assert "row_adamw" not in opt.state_dict()  # and owes nothing: AdamW's state dict alone


def _reload(opt, rows):
    before = rows.detach().clone()
    state = copy.deepcopy(opt.state_dict())
    assert torch.equal(rows, before) and state["row_adamw"]  # read without paying: what is owed goes with it
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    opt.load_state_dict(state)


def _checkpoint_and_resume(opt, rows):
    """As the loop's checkpoint and a resume from it: the model saved inside paid(), then the
    optimizer's state; the resumed run starts from that model and loads that state."""
    owed = copy.deepcopy({"table": rows, "opt": opt})
    owed["opt"].catch_up()
    before = rows.detach().clone()
    with paid(opt):
        saved = rows.detach().clone()
    torch.testing.assert_close(saved, owed["table"].detach(), rtol=0, atol=0)  # the model holds every row paid
    assert torch.equal(rows, before) and not torch.equal(saved, before)  # and training goes on from the table as it was
    state = copy.deepcopy(opt.state_dict())
    assert all("table" in d for d in state["row_adamw"].values())
    with torch.no_grad():
        rows.copy_(saved)
    opt.load_state_dict(state)
    assert torch.equal(rows, before)


def _older_checkpoint(opt, rows):
    """A checkpoint written before the optimizer's state kept the table: its model is the table as it stood."""
    state = copy.deepcopy(opt.state_dict())
    for d in state["row_adamw"].values():
        del d["table"]
    opt.load_state_dict(state)


@pytest.mark.parametrize("midway", [_catch_up, _reload, _checkpoint_and_resume, _older_checkpoint],
                         ids=["catch_up", "state_dict_round_trip", "checkpoint_and_resume", "older_checkpoint"])
def test_catching_up_or_reloading_midway_changes_nothing_later(midway):
    _, once, _, opt_once = _same_gradients(120)
    opt_once.catch_up()
    dense, again, _, opt_again = _same_gradients(120, midway=midway)
    opt_again.catch_up()
    torch.testing.assert_close(again, once)
    torch.testing.assert_close(again, dense, rtol=1e-5, atol=1e-6)


def test_a_state_whose_table_is_not_this_models_is_refused_and_changes_nothing():
    _, rows, _, opt = _same_gradients(20)
    before, kept = rows.detach().clone(), copy.deepcopy(opt.state_dict())
    state = copy.deepcopy(kept)
    state["state"][0]["exp_avg"].add_(1.0)  # what a load would take over, were it not refused
    for d in state["row_adamw"].values():
        d["table"] = d["table"][:-1]
    with pytest.raises(ValueError, match=r"table 0 has shape \(59, 8\), the model's parameter \(60, 8\)"):
        opt.load_state_dict(state)
    assert torch.equal(rows, before)
    torch.testing.assert_close(opt.state_dict()["state"], kept["state"], rtol=0, atol=0)


def test_a_copy_owes_what_the_original_owes_and_a_fresh_one_nothing():
    dense, rows, _, opt = _same_gradients(60)
    copied = copy.deepcopy({"table": rows, "opt": opt})
    copied["opt"].catch_up()
    torch.testing.assert_close(copied["table"], dense, rtol=1e-5, atol=1e-6)
    fresh = RowAdamW(Bag().parameters(), lr=1e-2)
    fresh.catch_up()  # nothing stepped, nothing owed
    assert fresh.state_dict()["state"] == {}


def test_the_history_grows_past_its_first_buffer_and_a_settled_run_starts_a_new_one():
    dense, rows, _, opt = _same_gradients(700)  # the history starts at 256 + K steps
    assert len(opt._rows[rows].cw) > 700
    opt.catch_up()
    torch.testing.assert_close(rows, dense, rtol=1e-5, atol=1e-6)
    assert opt._rows[rows].base == opt._rows[rows].t == 700


def test_betas_the_closed_form_cannot_take_are_refused_before_any_update():
    table = nn.Parameter(torch.zeros(10, 2))
    table.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 2), (10, 2), check_invariants=True)
    for betas in [(0.9, 0.8), (0.5, 0.0)]:
        with pytest.raises(ValueError, match="beta1 < sqrt"):
            RowAdamW([table], lr=1e-2, betas=betas).step()
    assert torch.equal(table, torch.zeros(10, 2))


@pytest.mark.parametrize("resumed", [False, True], ids=["same_optimizer", "checkpoint_resumed_dense"])
def test_a_table_whose_gradient_comes_dense_again_is_paid_first(resumed):
    """Also a checkpoint that owes rows, resumed where the table trains dense (an accelerator)."""
    dense, rows, opt_d, opt_r = _same_gradients(40, weight_decay=0.0)
    if resumed:
        state = copy.deepcopy(opt_r.state_dict())
        opt_r = RowAdamW([rows], lr=1.0)  # the state's groups bring back the run's lr
        opt_r.load_state_dict(state)
    g = torch.randn(60, 8)
    dense.grad, rows.grad = g, g.clone()  # the same step, dense this time
    opt_d.step()
    opt_r.step()
    torch.testing.assert_close(rows, dense, rtol=1e-5, atol=1e-6)
    assert rows not in opt_r._rows


def test_a_model_trained_with_rows_caught_up_follows_dense_adamw():
    """A loss whose gradient in a row depends on the row: a row's gradient is taken at its weight
    before the updates it is owed, so the runs part, but by a fraction of a percent of how far
    training moved the table (the lazy rule alone was off by most of it)."""
    dense, rows = _pair()
    start = dense.word_embeddings.weight.detach().clone()
    kw = dict(lr=1e-3, weight_decay=0.1)
    opts = [torch.optim.AdamW(dense.parameters(), **kw), RowAdamW(rows.parameters(), **kw)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(1, 60, (1, 3), generator=gen)
        for m, o in zip((dense, rows), opts):
            m(ids).backward()
            o.step()
            o.zero_grad(set_to_none=True)
    opts[1].catch_up()
    moved = (dense.word_embeddings.weight - start)[1:60].norm()
    off = (rows.word_embeddings.weight - dense.word_embeddings.weight)[1:60].norm()
    assert off < 0.01 * moved, (float(off), float(moved))


def test_the_clip_norm_is_the_dense_one():
    dense, rows = _pair()
    ids = torch.randint(1, 4000, (4, 7))
    for m in (dense, rows):
        m(ids).backward()
        m(ids[:, :3]).backward()  # two micro-batches: the sparse gradient holds repeated rows
    assert rows.word_embeddings.weight.grad.is_sparse
    want = nn.utils.clip_grad_norm_(dense.parameters(), 1e-3)
    got = clip_grad_norm(rows.parameters(), 1e-3)
    torch.testing.assert_close(got, want)
    assert rows.word_embeddings.weight.grad.is_coalesced()
    torch.testing.assert_close(rows.word_embeddings.weight.grad.to_dense(), dense.word_embeddings.weight.grad)
    torch.testing.assert_close(rows.head.weight.grad, dense.head.weight.grad)


def test_a_plain_adamw_checkpoint_resumes_in_rowadamw():
    batches = [torch.randint(1, 60, (4, 6), generator=torch.Generator().manual_seed(k)) for k in range(4)]
    dense, rows = _pair()
    kw = dict(lr=1e-2, weight_decay=0.01)
    plain = torch.optim.AdamW(dense.parameters(), **kw)
    _train(dense, plain, batches[:2])
    rows.load_state_dict(dense.state_dict())
    opt = RowAdamW(rows.parameters(), **kw)
    opt.load_state_dict(copy.deepcopy(plain.state_dict()))
    _train(dense, plain, [batches[2]] * 2)
    _train(rows, opt, [batches[2]] * 2)  # the same rows again: lazy and dense agree on them
    seen = batches[2].unique()
    torch.testing.assert_close(rows.word_embeddings.weight[seen], dense.word_embeddings.weight[seen])
    torch.testing.assert_close(rows.head.weight, dense.head.weight)


def test_hooks_run_once_grads_come_back_and_a_closure_is_evaluated():
    torch.optim.AdamW([nn.Parameter(torch.ones(1))])  # a plain AdamW in the process hooks AdamW.step
    _, rows = _pair()
    opt = RowAdamW(rows.parameters(), lr=1e-2)
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    ids = torch.randint(1, 50, (2, 3))

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = rows(ids)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert calls == ["pre"] and loss is not None
    assert rows.word_embeddings.weight.grad.is_sparse  # the gradient the step read is left in place


def test_state_round_trip_continues_as_one_run():
    batches = [torch.randint(1, 300, (4, 6), generator=torch.Generator().manual_seed(k)) for k in range(6)]
    _, whole = _pair()
    base = copy.deepcopy(whole)
    opt = RowAdamW(whole.parameters(), lr=1e-2, weight_decay=0.01)
    _train(whole, opt, batches)

    first = base
    opt1 = RowAdamW(first.parameters(), lr=1e-2, weight_decay=0.01)
    _train(first, opt1, batches[:3])
    state = copy.deepcopy(opt1.state_dict())
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}  # AdamW's keys: checkpoints read either way
    second = copy.deepcopy(first)
    opt2 = RowAdamW(second.parameters(), lr=1e-2, weight_decay=0.01)
    opt2.load_state_dict(state)
    _train(second, opt2, batches[3:])
    for k, v in whole.state_dict().items():
        torch.testing.assert_close(second.state_dict()[k], v, msg=k)


def test_build_optimizer_makes_the_table_sparse_before_the_first_step():
    m = Bag()
    opt = build_optimizer(m, TrainOptions(lr=1e-3), CPU)
    assert isinstance(opt, RowAdamW) and m.word_embeddings.sparse
    m(torch.randint(1, 100, (2, 4))).backward()
    assert m.word_embeddings.weight.grad.is_sparse
    opt.step()  # the fused dense step takes no sparse gradient: RowAdamW keeps it away from it


def test_amsgrad_and_a_loss_scaler_are_refused_before_any_update():
    _, rows = _pair()
    before = copy.deepcopy(rows.state_dict())
    opt = RowAdamW(rows.parameters(), lr=1e-2, amsgrad=True)
    rows(torch.randint(1, 50, (2, 3))).backward()
    with pytest.raises(ValueError, match="amsgrad"):
        opt.step()
    scaled = RowAdamW(rows.parameters(), lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("cpu")
    scaled.zero_grad(set_to_none=True)
    scaler.scale(rows(torch.randint(1, 50, (2, 3)))).backward()
    with pytest.raises(ValueError, match="loss scaler"):
        scaler.step(scaled)
    for k, v in rows.state_dict().items():  # neither touched the dense parameters first
        assert torch.equal(v, before[k]), k


def test_ner_learns_and_resumes_with_sparse_tables(tmp_path, monkeypatch):
    """A from-scratch NER run whose tables go sparse: it memorises its data, and a run stopped
    mid-way and resumed ends where the uninterrupted one does."""
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.ner import NerModel, train_ner

    monkeypatch.setattr(optim, "VOCABULARY_ROWS", 64)  # the tiny encoder's tables, small here, made sparse
    monkeypatch.setattr(optim, "VOCABULARY_NAMES", None)
    made = []
    real = optim.sparse_tables
    monkeypatch.setattr(optim, "sparse_tables", lambda m, d, **k: made.extend(real(m, d, **k)) or made)
    data = synthetic_ner(40, seed=1, max_clauses=1)
    opts = dict(epochs=12, lr=2e-2, max_tokens=256, max_length=64, warmup_ratio=0.05, patience=0, log_every=0, seed=0,
                device="cpu")  # sparse tables are a CPU feature (training/optim.py)
    model = train_ner(data, data, model="tiny", out_dir=str(tmp_path / "fit"), options=TrainOptions(**opts),
                      log_fn=lambda s: None)
    assert made  # sparse while it trained, dense again in the model handed back
    assert not any(t.sparse for t in made)
    assert model.evaluate(data)["f1"] >= 0.95
    short = {**opts, "epochs": 3}
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path / "full"), options=TrainOptions(**short),
              log_fn=lambda s: None)
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path / "part"), options=TrainOptions(**short, max_steps=4),
              log_fn=lambda s: None)
    train_ner(data, data[:10], model="tiny", out_dir=str(tmp_path / "part"), options=TrainOptions(**short, resume=True),
              log_fn=lambda s: None)
    a = NerModel.load(str(tmp_path / "full" / "checkpoint" / "model")).module.state_dict()
    b = NerModel.load(str(tmp_path / "part" / "checkpoint" / "model")).module.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_checkpoint_between_evaluations_holds_a_model_with_every_row_paid(tmp_path, monkeypatch):
    """A run stopped by max_steps mid-epoch: its checkpoint's model (the one the run tells the
    user to take) is the model the run hands back, every row paid; resumed, it ends as the
    uninterrupted run (test_ner_learns_and_resumes_with_sparse_tables)."""
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.ner import NerModel, train_ner

    monkeypatch.setattr(optim, "VOCABULARY_ROWS", 64)
    monkeypatch.setattr(optim, "VOCABULARY_NAMES", None)
    data = synthetic_ner(40, seed=1, max_clauses=1)
    opts = TrainOptions(epochs=2, lr=2e-2, max_tokens=256, max_length=64, patience=0, log_every=0, seed=0, max_steps=5,
                        device="cpu")
    handed = train_ner(data, None, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lambda s: None)
    saved = NerModel.load(str(tmp_path / "checkpoint" / "model"), device="cpu").module.state_dict()
    for k, v in handed.module.state_dict().items():
        torch.testing.assert_close(saved[k], v, rtol=0, atol=0, msg=k)
    trainer = torch.load(tmp_path / "checkpoint" / "trainer.pt", weights_only=True)
    owed = trainer["optimizer"]["row_adamw"]  # the state a resume needs: what the rows still owe, and the table
    assert owed and all("table" in d for d in owed.values())
    for d in owed.values():  # each table against the model's parameter of its shape (one each here)
        same = [k for k in saved if saved[k].shape == d["table"].shape]
        assert len(same) == 1 and not torch.equal(d["table"], saved[same[0]])  # as training left it, not paid


def test_training_evaluates_and_hands_back_rows_that_owe_nothing(tmp_path, monkeypatch):
    """Every evaluation, and the model a run hands back (to its end or stopped by max_steps),
    sees the table with every update its rows were owed."""
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.ner import NerModel, train_ner
    from spanflow.training import loop as loop_mod

    monkeypatch.setattr(optim, "VOCABULARY_ROWS", 64)
    monkeypatch.setattr(optim, "VOCABULARY_NAMES", None)
    made, owed_at_eval = [], []
    real_build, real_eval = loop_mod.build_optimizer, NerModel.evaluate
    monkeypatch.setattr(loop_mod, "build_optimizer", lambda *a, **k: made.append(real_build(*a, **k)) or made[-1])

    def owed() -> int:
        return sum(book.t != book.base for book in made[-1]._rows.values())

    def evaluate(self, *a, **k):
        owed_at_eval.append(owed() if made else None)
        return real_eval(self, *a, **k)

    monkeypatch.setattr(NerModel, "evaluate", evaluate)
    data = synthetic_ner(40, seed=1, max_clauses=1)
    opts = dict(epochs=2, lr=2e-2, max_tokens=256, max_length=64, patience=0, log_every=0, seed=0, device="cpu")
    for extra, dev in (({"eval_every": 3}, data[:10]), ({"max_steps": 5}, data[:10]), ({}, None)):
        owed_at_eval.clear()  # no dev set: nothing evaluates, so only the end of the run can pay
        train_ner(data, dev, model="tiny", out_dir=str(tmp_path / str(len(extra)) / str(extra)),
                  log_fn=lambda s: None, options=TrainOptions(**opts, **extra))
        assert made[-1]._rows, extra  # the table was sparse and its rows were owed between steps
        assert len(owed_at_eval) >= (2 if "eval_every" in extra else 0)
        assert owed_at_eval == [0] * len(owed_at_eval), (extra, owed_at_eval)
        assert owed() == 0, extra


def test_a_checkpoint_leaves_out_a_tables_zero_moment_rows_and_a_load_puts_them_back(tmp_path):
    """A vocabulary table's moments are zero in the rows training never reached: trainer.pt holds the
    others and their indices, and a load gives the optimizer back its state bit for bit (-0.0 and
    NaN rows included), so the run goes on as if it had not been saved."""
    import os

    from spanflow.training.checkpoint import PACKED, load_checkpoint, save_checkpoint

    def run(model, opt, steps, seed):
        gen = torch.Generator().manual_seed(seed)
        _train(model, opt, [torch.randint(1, 40, (4, 5), generator=gen) for _ in range(steps)])

    torch.manual_seed(0)
    model = Bag()
    assert sparse_tables(model, CPU)
    opt = RowAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    run(model, opt, 3, seed=1)
    table = model.word_embeddings.weight
    opt.state[table]["exp_avg"][4000, 0] = -0.0  # a zero row but for its sign bit: kept
    opt.state[table]["exp_avg"][4001, 1] = float("nan")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    state = {"epoch": 0, "step_in_epoch": 3, "global_step": 3, "bad_evals": 0, "stopped": False}
    save_checkpoint(str(tmp_path / "ckpt"), save_model=os.makedirs, optimizer=opt, scheduler=sched, scaler=None,
                    state=state)
    raw = torch.load(tmp_path / "ckpt" / "trainer.pt", weights_only=True)["optimizer"]["state"]
    packed = [v for st in raw.values() for v in st.values() if isinstance(v, dict)]
    assert len(packed) == 2 and all(len(v[PACKED]) < 50 for v in packed)  # the table's two moments: 42 of 5000 rows
    # the table as training left it (what its rows owe) is written whole; its two moments were as large again
    assert os.path.getsize(tmp_path / "ckpt" / "trainer.pt") < 2 * 5000 * 16 * 4

    again = copy.deepcopy(model)
    opt2 = RowAdamW(again.parameters(), lr=1e-2, weight_decay=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda step: 1.0)
    assert load_checkpoint(str(tmp_path / "ckpt"), optimizer=opt2, scheduler=sched2, scaler=None) == state
    for p, q in zip(model.parameters(), again.parameters()):
        for key, v in opt.state[p].items():
            w = opt2.state[q][key]
            assert w.dtype == v.dtype and torch.equal(w.view(torch.int32) if v.dtype == torch.float32 else w,
                                                      v.view(torch.int32) if v.dtype == torch.float32 else v), key
    opt.state[table]["exp_avg"][4001, 1] = opt2.state[again.word_embeddings.weight]["exp_avg"][4001, 1] = 0.0
    run(model, opt, 3, seed=2)
    run(again, opt2, 3, seed=2)
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q)
