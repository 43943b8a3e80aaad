"""The ranking loss and its step: in-batch negatives, the gradient cache and gathered negatives
are the same gradient as one batch in one process; ranking, AnglE and Matryoshka training learn."""
import json
import os
import random
import re

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from spanflow.cli.main import main
from spanflow.runtime.policy import resolve_policy
from spanflow.tasks.embed import Embedder
from spanflow.tasks.embed.cached import gathered_step, side_inputs
from spanflow.tasks.embed.losses import angle, cosent, false_negatives, matryoshka, ranking
from spanflow.tasks.embed.pairs import Pair
from spanflow.tasks.embed.train import (
    EmbedTraining,
    PairItem,
    default_pairs_per_step,
    make_collate,
    text_keys,
    train_embedder,
)
from spanflow.training.distributed import exit_now, shutdown
from spanflow.training.options import TrainOptions
from tests.test_distributed import _join, free_port

POLICY = resolve_policy("fp32", "cpu")


class Bag(torch.nn.Module):
    """A small embedding model with dropout: mean of token vectors, then a projection."""

    def __init__(self, vocab: int = 50, dim: int = 16, p: float = 0.2):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.drop, self.proj = torch.nn.Embedding(vocab, dim), torch.nn.Dropout(p), torch.nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask):
        if isinstance(input_ids, tuple):  # a batch's sides, padded apart (as the embedding module takes them)
            return torch.cat([self(i, m) for i, m in zip(input_ids, attention_mask)])
        h = self.drop(self.emb(input_ids)) * attention_mask[..., None]
        return self.proj(h.sum(1) / attention_mask.sum(1, keepdim=True))


def items(n: int, seed: int, k: int = 2) -> list[PairItem]:
    rng = random.Random(seed)
    return [PairItem(tuple([rng.randrange(1, 50) for _ in range(rng.randrange(2, 7))] for _ in range(k)))
            for _ in range(n)]


def micro(groups: list[list[PairItem]]) -> list[dict]:
    collate = make_collate(0)
    return [{**collate(g), "weight": 1.0, "n_global": None} for g in groups]


def grads(model) -> dict:
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def reference(model, groups, loss=ranking) -> tuple[torch.Tensor, dict]:
    """The loss of all groups as one batch, in one forward, divided by the anchors; its gradient."""
    model.zero_grad()
    one = micro([[it for g in groups for it in g]])[0]
    emb = model(*side_inputs(one))
    value = loss(emb, {k: one[k] for k in ("n_pairs", "scores", "keys") if k in one}) / one["n_pairs"]
    value.backward()
    return value.detach(), grads(model)


def test_ranking_loss_is_low_when_each_anchor_is_nearest_its_positive():
    a = torch.eye(4)
    good = ranking(torch.cat([a, a]), {"n_pairs": 4})
    bad = ranking(torch.cat([a, a.roll(1, 0)]), {"n_pairs": 4})
    assert good < 0.01 < bad
    # a hard negative equal to the positive makes the choice a coin toss: log 2 per anchor
    tied = float(ranking(torch.cat([a, a, a]), {"n_pairs": 4}))
    assert tied == pytest.approx(4 * np.log(1 + 1 + 3 * np.exp(-20)), rel=1e-3)
    sym = float(ranking(torch.cat([a, a.roll(1, 0)]), {"n_pairs": 4}, symmetric=True))
    assert sym == pytest.approx(float(bad), rel=1e-5)  # a permutation is as wrong in both directions


def uneven(n: int, seed: int) -> list[PairItem]:
    """Pairs of a short first side and a long second one: their batches pad the sides apart."""
    rng = random.Random(seed)
    return [PairItem(([rng.randrange(1, 50) for _ in range(2)], [rng.randrange(1, 50) for _ in range(12)]))
            for _ in range(n)]


@pytest.mark.parametrize("cache,make", [(True, items), (False, items), (True, uneven), (False, uneven)])
def test_cached_step_is_the_gradient_of_the_whole_update_as_one_batch(cache, make):
    """Three micro-batches through the gradient cache (or each keeping its graph), and one: the
    same loss and gradient, whether a batch's sides are one tensor or padded apart."""
    model = Bag(p=0.0)
    groups = [g for g in (make(5, 1), make(7, 2), make(3, 3))]
    assert ("part1_ids" in micro(groups)[0]) == (make is uneven)
    want_loss, want = reference(model, groups)
    model.zero_grad()
    got_loss = gathered_step(model, micro(groups), POLICY, loss=ranking, cache=cache)
    torch.testing.assert_close(got_loss, want_loss)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("cache", [True, False])
def test_cached_step_replays_dropout(cache):
    """With dropout on, the second pass draws the first pass's masks: the gradient equals that of
    the same forwards kept with their graphs."""
    model, groups = Bag(p=0.5), [items(6, 4, k=3), items(4, 5, k=3)]
    torch.manual_seed(7)
    model.zero_grad()
    mbs = micro(groups)
    embs = [model(*side_inputs(b)) for b in mbs]
    pool = torch.cat([torch.cat([e[j * b["n_pairs"]:(j + 1) * b["n_pairs"]] for e, b in zip(embs, mbs)])
                      for j in range(3)])
    (ranking(pool, {"n_pairs": 10}) / 10).backward()
    want = grads(model)
    torch.manual_seed(7)
    model.zero_grad()
    gathered_step(model, micro(groups), POLICY, loss=ranking, cache=cache)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("cache", [True, False])
def test_an_update_that_keeps_its_graphs_trims_the_heap_once_they_are_freed(cache):
    """The trim runs once an update's kept graphs are freed (after its backward), once per update;
    the cache's path frees each micro-batch's graph as it goes and does not take it."""
    model, groups, seen = Bag(p=0.0), [items(5, 1), items(7, 2)], []

    def trim():
        seen.append(all(p.grad is not None for p in model.parameters()))

    gathered_step(model, micro(groups), POLICY, loss=ranking, cache=cache, trim=trim)
    assert seen == ([] if cache else [True])
    gathered_step(model, micro(groups[:1]), POLICY, loss=ranking, cache=cache, trim=trim)  # one micro-batch
    assert len(seen) == (0 if cache else 1)


def test_a_scored_update_is_cut_into_micro_batches_of_different_lengths():
    from spanflow.tasks.embed.train import MIXED_MICRO_BATCHES, needs_cache, size_scored_update

    its = [PairItem(([1] * (5 + i % 20), [2] * 6), 0.5) for i in range(2000)]
    o = size_scored_update(TrainOptions(), its, "cpu", 1)
    from spanflow.training.defaults import update_tokens

    assert o.grad_accum == MIXED_MICRO_BATCHES
    assert o.max_tokens * o.grad_accum == update_tokens([len(it) for it in its], "cpu")  # the update NER would get
    assert not needs_cache(o, None, "cpu", 1) and needs_cache(o, None, "cpu", 2)
    asked = TrainOptions(max_tokens=512)
    given = size_scored_update(asked, its, "cpu", 1)  # --max-tokens given: one micro-batch, as asked
    assert (given.max_tokens, given.grad_accum) == (512, 1)
    one = size_scored_update(TrainOptions(grad_accum=1), its, "cpu", 1)  # --grad-accum 1 given: one, not the default
    assert (one.grad_accum, one.max_tokens) == (1, update_tokens([len(it) for it in its], "cpu"))
    accum = size_scored_update(TrainOptions(grad_accum=3), its, "cpu", 1)  # --grad-accum alone: sized as defaults do
    assert (accum.grad_accum, accum.max_tokens) == (3, update_tokens([len(it) for it in its], "cpu"))
    assert needs_cache(TrainOptions(max_tokens=512, grad_accum=4), 512, "cpu", 1)


def repeating_groups() -> list[list[PairItem]]:
    """Micro-batches whose pairs repeat texts of other micro-batches (of another rank, when dealt
    out in turn): a pair twice, an anchor with a second positive, a positive with a second anchor."""
    g = [items(5, 1), items(7, 2), items(3, 3), items(4, 6), items(6, 8)]
    g[3] = g[3] + [g[0][0]]
    g[2] = g[2] + [PairItem((g[1][0].sides[0], [7, 7, 7]))]
    g[4] = g[4] + [PairItem(([8, 8], g[0][1].sides[1]))]
    return g


def test_the_ranking_loss_counts_no_repeat_of_a_right_answer_as_a_negative():
    """Perfect embeddings: distinct pairs lose nothing; a repeated pair, an anchor with two
    positives or a hard negative that is the positive's text would hold the loss at log 2 each
    (each right answer counted wrong), unless the texts' keys leave them out."""
    a = torch.eye(4)
    keys = torch.arange(8)
    twice = torch.cat([a[[0, 1, 2, 0]], a[[0, 1, 2, 0]]])  # pair 3 is pair 0 again
    tied = float(ranking(twice, {"n_pairs": 4}))
    assert tied == pytest.approx(2 * np.log(2), rel=1e-3)
    same = keys.clone()
    same[3], same[7] = same[0], same[4]
    assert float(ranking(twice, {"n_pairs": 4, "keys": same})) < 1e-6
    assert float(ranking(twice, {"n_pairs": 4, "keys": same}, symmetric=True)) < 1e-6
    with_neg = torch.cat([a, a, a[[1, 0, 3, 2]]])  # each hard negative another pair's positive text
    k3 = torch.cat([keys, torch.tensor([5, 4, 7, 6])])
    assert float(ranking(with_neg, {"n_pairs": 4})) == pytest.approx(4 * np.log(2), rel=1e-3)
    assert float(ranking(with_neg, {"n_pairs": 4, "keys": k3})) < 1e-6
    # the mask: another row's anchor or positive text, or a hard negative equal to the positive
    m = false_negatives(torch.tensor([1, 2, 1, 10, 11, 12, 20, 11, 22]), 3)
    assert m.tolist() == [[False, False, True, False, False, False],
                          [False, False, False, False, True, False],
                          [True, False, False, False, False, False]]
    # (x, y) beside (y, x): each positive is the other anchor's own text; both directions
    swapped = torch.cat([a[[0, 1]], a[[1, 0]]])
    assert float(ranking(swapped, {"n_pairs": 2})) > 1.0
    both = {"n_pairs": 2, "keys": torch.tensor([5, 6, 6, 5])}
    assert float(ranking(swapped, both)) < 1e-6 and float(ranking(swapped, both, symmetric=True)) < 1e-6
    # a hard negative that is another positive of the same anchor (the anchor asked twice)
    m = false_negatives(torch.tensor([1, 1, 10, 11, 11, 30]), 2)
    assert m.tolist() == [[False, True, True, False], [True, False, True, False]]  # n0 is 1's own positive too


def test_a_right_answer_reached_through_a_third_pair_is_no_negative():
    """(A, X), (A, Y), (B, Y): Y, as B's positive, is a right answer for A, whose other pair says
    so; with the sides swapped, (A, X), (B, X), (B, Y): B, as Y's anchor, is a right anchor of X."""
    A, B, C, X, Y, Z = 1, 2, 3, 10, 11, 12
    keys = torch.tensor([A, A, B, C, X, Y, Y, Z])
    assert false_negatives(keys, 4)[0].tolist() == [False, True, True, False]
    back = torch.tensor([X, X, Y, Z, A, B, B, C])  # the backward direction's keys, as ranking swaps them
    assert false_negatives(back, 4)[0].tolist() == [False, True, True, False]
    e = torch.eye(4)
    a_vec = (e[0] + e[1]) / 2 ** 0.5  # A as near X as Y: a Y counted as A's negative costs log 2
    emb = torch.stack([a_vec, a_vec, e[1], e[3], e[0], e[1], e[1], e[3]])
    assert float(ranking(emb, {"n_pairs": 4, "keys": keys})) < 0.01


def test_collated_keys_name_texts_alike_in_every_process():
    batch = make_collate(0)([PairItem(([1, 2], [3])), PairItem(([1, 2], [4])), PairItem(([5], [3]))])
    k = batch["keys"].tolist()
    assert k[0] == k[1] and k[3] == k[5] and len({k[0], k[2], k[3], k[4]}) == 4
    assert k == text_keys([[1, 2], [1, 2], [5], [3], [4], [3]]).tolist()  # no salt: a function of the ids
    assert "keys" not in make_collate(0)([PairItem(([1], [2]), score=0.5)])  # scored pairs rank no candidates


def test_repeats_across_micro_batches_are_left_out_as_in_one_batch():
    model = Bag(p=0.0)
    groups = repeating_groups()
    want_loss, want = reference(model, groups)
    model.zero_grad()
    one = micro([[it for g in groups for it in g]])[0]
    unmasked = ranking(model(*side_inputs(one)), {"n_pairs": one["n_pairs"]}).detach() / one["n_pairs"]
    assert abs(float(unmasked) - float(want_loss)) > 1e-3  # the repeats change the loss
    model.zero_grad()
    torch.testing.assert_close(gathered_step(model, micro(groups), POLICY, loss=ranking), want_loss)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


def _gather_worker(rank, world, port, out):
    from torch.nn.parallel import DistributedDataParallel

    d = _join(rank, world, port)
    model = Bag(p=0.0)
    ddp = DistributedDataParallel(model)
    groups = repeating_groups()
    mine = micro(groups[rank::world])
    if rank == 1:  # an uneven step: this rank's share ends in a stand-in, as the loop pads it
        mine += micro([items(1, 9)])
        mine[-1]["weight"] = 0.0
    loss = gathered_step(ddp, mine, POLICY, world=world, loss=ranking, dist=d)
    torch.save({"loss": loss, "grads": grads(model)}, os.path.join(out, f"rank{rank}.pt"))
    shutdown()
    exit_now(0)


def test_two_processes_gather_negatives_as_one_process_on_the_global_batch(tmp_path):
    mp.spawn(_gather_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    model = Bag(p=0.0)
    want_loss, want = reference(model, repeating_groups())
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        # every rank returns its share of the global batch's loss (the loop sums the ranks' to print
        # the loss), and DDP's averaged gradient is the global gradient
        torch.testing.assert_close(got["loss"] * 2, want_loss, rtol=1e-5, atol=1e-6)
        for k, g in got["grads"].items():
            torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_stand_in_micro_batch_adds_nothing_to_the_pool():
    """The empty tail of an uneven step (weight 0) joins the step without rows or gradient."""
    model = Bag(p=0.0)
    groups = [items(5, 1), items(4, 2)]
    want_loss, want = reference(model, groups)
    model.zero_grad()
    mbs = micro(groups + [items(1, 9)])
    mbs[-1]["weight"] = 0.0
    torch.testing.assert_close(gathered_step(model, mbs, POLICY, loss=ranking), want_loss)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_angle_similarity_is_one_for_equal_vectors_and_follows_the_angle():
    from spanflow.tasks.embed.losses import angle_similarity

    a = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    assert float(angle_similarity(a, a)) == pytest.approx(1.0)
    assert float(angle_similarity(a, 3 * a)) == pytest.approx(1.0)  # the length does not count
    turn = lambda t: torch.cat([a[:, :2] * np.cos(t) - a[:, 2:] * np.sin(t),  # noqa: E731
                                a[:, :2] * np.sin(t) + a[:, 2:] * np.cos(t)], dim=-1)
    # b = a turned by t in every complex dimension: |cos t + sin t| for the quotient's angle
    for t in (0.3, 1.0, 2.0):
        assert float(angle_similarity(turn(t), a)) == pytest.approx(abs(np.cos(t) + np.sin(t)), rel=1e-5)


def test_a_loss_scaler_scales_the_gradient_it_backpropagates():
    class Scaler:
        def scale(self, x):
            return x * 4

    model, groups = Bag(p=0.0), [items(5, 1), items(4, 2)]
    _, want = reference(model, groups)
    model.zero_grad()
    gathered_step(model, micro(groups), POLICY, Scaler(), loss=ranking)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, 4 * want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_angle_and_matryoshka_losses_prefer_cosines_that_follow_the_scores():
    torch.manual_seed(0)
    a = torch.randn(6, 8)
    scores = torch.linspace(0, 1, 6)
    near = torch.stack([a[i] * 1.0 + (1 - scores[i]) * torch.randn(8) * 3 for i in range(6)])
    far = torch.stack([a[i] * 1.0 + scores[i] * torch.randn(8) * 3 for i in range(6)])
    batch = {"scores": scores}
    for loss in (cosent, angle, matryoshka(cosent, [8, 4])):
        assert loss(torch.cat([a, near]), batch) < loss(torch.cat([a, far]), batch)
    whole = matryoshka(ranking, [8, 4])(torch.cat([a, a]), {"n_pairs": 6})
    parts = (ranking(torch.cat([a, a]), {"n_pairs": 6}) + ranking(torch.cat([a[:, :4], a[:, :4]]), {"n_pairs": 6})) / 2
    torch.testing.assert_close(whole, parts)


def codes(n: int, seed: int) -> list[Pair]:
    """Anchors `aX bY` whose positive is `cX dY`: only a trained model maps one to the other."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, y = rng.randrange(30), rng.randrange(30)
        out.append(Pair(f"a{x} b{y}", f"c{x} d{y}"))
    return out


def test_ranking_training_learns_and_round_trips(tmp_path):
    train, dev = codes(300, 1), codes(60, 2)
    opts = TrainOptions(epochs=10, lr=3e-3, log_every=0, patience=0, max_tokens=128)
    lines = []
    model = train_embedder(train, dev, model="tiny", out_dir=str(tmp_path / "r"), options=opts,
                           config=EmbedTraining(pairs_per_step=64, symmetric=True), log_fn=lines.append)
    assert any("gradient cache on" in x for x in lines)
    first, best = _dev_scores(tmp_path / "r")[0], max(_dev_scores(tmp_path / "r"))
    assert {json.loads(x)["dev_metric"] for x in open(tmp_path / "r" / "train_report.jsonl")} == {"MRR@10"}
    assert best > 0.6 and best > first + 0.2, (first, best)
    loaded = Embedder.load(str(tmp_path / "r" / "model"), precision="fp32", device="cpu")
    texts = [p.a for p in dev[:8]]
    np.testing.assert_allclose(loaded.encode(texts), model.with_precision("fp32").encode(texts), atol=1e-5)
    assert loaded.evaluate(dev)["mrr@10"] == pytest.approx(best, abs=1e-4)


def _dev_scores(out) -> list[float]:
    return [json.loads(x)["dev_f1"] for x in open(os.path.join(out, "train_report.jsonl"))]


def test_matryoshka_training_keeps_truncated_vectors_useful():
    """Trained with Matryoshka on (16, 4), the first 4 dimensions rank far better than when only
    the whole vector is trained."""
    def train(loss) -> list[float]:
        model = Bag(p=0.0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        data = items(64, 1)
        for _ in range(150):
            opt.zero_grad()
            gathered_step(model, micro([data[:32], data[32:]]), POLICY, loss=loss)
            opt.step()
        one = micro([data])[0]
        with torch.no_grad():
            e = model(*side_inputs(one))
        return [float(ranking(e[:, :d], {"n_pairs": 64})) / 64 for d in (4, 16)]

    plain, nested = train(ranking), train(matryoshka(ranking, [16, 4]))
    assert nested[0] < 0.5 * plain[0], (plain, nested)
    assert nested[1] < 1.0, nested  # the whole vector still learns


def test_the_update_holds_about_the_pairs_asked_for():
    from spanflow.tasks.embed.train import held_pairs, size_ranking_update

    its = [PairItem(([1] * 30, [2] * 30)) for _ in range(100)]  # 60 padded tokens each
    o = size_ranking_update(TrainOptions(), its, 80, "cpu", 1)  # 4800 tokens: over the 4096 budget
    assert o.grad_accum == 2 and o.max_tokens == 2400
    o = size_ranking_update(TrainOptions(max_tokens=32768), its, 16, "cpu", 1)  # a cap, not a size
    assert o.grad_accum == 1 and o.max_tokens == 960
    o = size_ranking_update(TrainOptions(grad_accum=4), its, 64, "cpu", 2)  # 64 pairs over 2 ranks x 4
    assert o.grad_accum == 4 and o.max_tokens == 480
    o = size_ranking_update(TrainOptions(grad_accum=1), its, 80, "cpu", 1)  # --grad-accum 1 given: one micro-batch
    assert o.grad_accum == 1 and o.max_tokens == 4800  # the whole update, past the device's default budget
    assert held_pairs(o, its, 80, 1) == 80
    o = size_ranking_update(TrainOptions(grad_accum=1, max_tokens=2400), its, 80, "cpu", 1)  # both given: capped
    assert (o.grad_accum, o.max_tokens, held_pairs(o, its, 80, 1)) == (1, 2400, 40)
    # pairs of 24 to 44 tokens (mean 34) in micro-batches of 64 over 4 x 2 ranks: one of 32 or fewer is
    # in a micro-batch of 2, a longer one alone (a mean over the tokens said 15 of the 16 asked)
    mixed = [PairItem(([1] * (n // 2), [2] * (n // 2))) for n in range(24, 46, 2) for _ in range(10)]
    o = TrainOptions(max_tokens=64, grad_accum=4)
    assert held_pairs(o, mixed, 16, 2) == round((50 * 2 + 60 * 1) / 110 * 8) == 12


def test_ranking_training_resumes_to_the_same_weights(tmp_path):
    train = codes(120, 3)
    opts = dict(epochs=2, lr=3e-3, log_every=0, patience=0, max_tokens=64, seed=2)
    config = EmbedTraining(pairs_per_step=32)
    full = train_embedder(train, None, model="tiny", out_dir=str(tmp_path / "f"), options=TrainOptions(**opts),
                          config=config, log_fn=lambda s: None)
    train_embedder(train, None, model="tiny", out_dir=str(tmp_path / "p"), options=TrainOptions(**opts, max_steps=3),
                   config=config, log_fn=lambda s: None)
    lines = []
    part = train_embedder(train, None, model="tiny", out_dir=str(tmp_path / "p"),
                          options=TrainOptions(**opts, resume=True), config=config, log_fn=lines.append)
    assert any(x.startswith("resumed from") for x in lines) and any("gradient cache on" in x for x in lines)
    a, b = full.module.state_dict(), part.module.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_default_update_fits_the_data():
    assert default_pairs_per_step(100_000) == 256
    assert default_pairs_per_step(1500) == 64  # still 20 updates an epoch
    assert default_pairs_per_step(10) == 16


@pytest.mark.parametrize("flags,message", [
    (["--loss", "cosent"], "--loss cosent takes scored pairs"),
    (["--matryoshka-dims", "8,x"], "--matryoshka-dims takes comma-separated sizes"),
    (["--matryoshka-dims", "4096"], "--matryoshka-dims: 4096 is larger than the model's"),
    (["--loss", "angle"], "--loss angle takes scored pairs"),
    (["--scored", "--symmetric"], "--symmetric applies to the ranking loss"),
    (["--scored", "--pairs-per-step", "64"], "--pairs-per-step applies to the ranking loss"),
    (["--scored", "--loss", "angle", "--matryoshka-dims", "255"], "--loss angle reads each embedding as complex"),
])
def test_a_loss_that_does_not_fit_the_data_is_one_error_line(tmp_path, capsys, flags, message):
    path = tmp_path / "pairs.tsv"
    if "--scored" in flags:
        flags = [f for f in flags if f != "--scored"]
        path.write_text("".join(f"{p.a}\t{p.b}\t{i % 5}\n" for i, p in enumerate(codes(20, 0))))
    else:
        path.write_text("".join(f"{p.a}\t{p.b}\n" for p in codes(20, 0)))
    assert main(["train", "embed", "--train", str(path), "--model", "tiny", "--out", str(tmp_path / "o"),
                 *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_cached_cosent_over_an_update_is_cosent_over_its_pairs_as_one_batch():
    """Scored pairs through the step: the update's pairs are ranked against each other across its
    micro-batches, the same loss and gradient as one batch."""
    model = Bag(p=0.0)
    rng = random.Random(3)
    groups = [[PairItem(it.sides, rng.random()) for it in items(n, s)] for n, s in ((5, 1), (6, 2))]
    want_loss, want = reference(model, groups, loss=lambda e, b: cosent(e, b))
    model.zero_grad()
    got_loss = gathered_step(model, micro(groups), POLICY, loss=cosent)
    torch.testing.assert_close(got_loss, want_loss)
    for k, g in grads(model).items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_tune_measures_training_on_a_pairs_file(tmp_path):
    from spanflow.tasks.embed.task import TASK
    from spanflow.training.step import as_micro, forward_backward

    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{p.a}\t{p.b}\n" for p in codes(20, 0)))
    w = TASK.workload("tiny", str(path), mode="train", policy=POLICY, precision="fp32", sample=16)
    rows = w.items_at(3)
    assert len(rows) == 16 and max(len(s) for it in rows for s in it.sides) <= 3
    loss = forward_backward(w.module, [as_micro(w.collate(rows))], w.loss_fn, POLICY)
    assert torch.isfinite(loss) and loss > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in w.module.parameters())


def test_angle_training_orders_pairs_as_their_scores():
    """AnglE through the step raises the Spearman of the pairs' cosines against their scores."""
    from spanflow.tasks.embed.metrics import spearman

    rng = random.Random(5)
    data = [PairItem(it.sides, rng.random()) for it in items(48, 7)]
    model = Bag(p=0.0)

    def rho() -> float:
        one = micro([data])[0]
        with torch.no_grad():
            e = model(*side_inputs(one))
        cos = torch.nn.functional.cosine_similarity(e[:48], e[48:]).numpy()
        return spearman(cos, np.array([it.score for it in data]))

    before = rho()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        opt.zero_grad()
        gathered_step(model, micro([data[:24], data[24:]]), POLICY, loss=angle)
        opt.step()
    assert rho() > max(0.8, before + 0.3), (before, rho())


def test_a_cpu_keeps_an_updates_graphs_while_they_fit_in_memory(monkeypatch):
    """Unset --max-tokens on a CPU is a speed choice: an update larger than it keeps its graphs
    (no second forward pass) while they take at most a third of the memory available."""
    from spanflow.tasks.embed import train as t

    o, avail = TrainOptions(max_tokens=4096, grad_accum=5), 12 * 2**30
    assert not t.needs_cache(o, None, "cpu", 1, graph=2 * 2**30, avail=avail)
    assert t.needs_cache(o, None, "cpu", 1, graph=5 * 2**30, avail=avail)  # over a third of what is available
    assert t.needs_cache(o, None, "cpu", 1, graph=None, avail=avail)  # an encoder of unknown shape
    assert t.needs_cache(o, 4096, "cpu", 1, graph=2**20, avail=avail)  # --max-tokens given: the memory as asked
    assert t.needs_cache(o, None, "cpu", 2, graph=2**20, avail=avail)  # several processes gather through the cache
    big = TrainOptions(max_tokens=16384, grad_accum=4)  # past an accelerator's 32768
    assert t.needs_cache(big, None, "cuda", 1, graph=2**20, avail=avail)  # an accelerator's budget is its memory's
    assert not t.needs_cache(TrainOptions(max_tokens=1024, grad_accum=2), None, "cpu", 1)  # within the budget
    assert t.needs_cache(o, None, "cpu", 1, graph=2**20, avail=None)  # memory unknown: the cache, as before
    # no micro-batch size (the trainer sizes one before this is asked): the device's budget
    assert t.needs_cache(TrainOptions(grad_accum=2), None, "cpu", 1)
    assert not t.needs_cache(TrainOptions(grad_accum=1), None, "cpu", 1)


def test_graph_estimate_follows_the_encoders_shape():
    from types import SimpleNamespace

    from spanflow.runtime.policy import Policy
    from spanflow.tasks.embed.train import graph_bytes

    enc = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                                                 intermediate_size=1536))
    bf16 = Policy(device=torch.device("cpu"), amp_dtype=torch.bfloat16, use_scaler=False)
    b = graph_bytes(enc, 1000, 40, bf16)
    assert graph_bytes(enc, 2000, 40, bf16) == 2 * b and graph_bytes(enc, 1000, 120, bf16) > b
    assert graph_bytes(enc, 1000, 40, POLICY) == 2 * b  # fp32 activations: twice autocast's
    # MiniLM's graphs measured in bf16 (KiB a token at 16, 40, 128 tokens a row; spanflow's encoder,
    # then transformers'): the estimate is above each, and within 1.5x of the smaller
    for length, native, hf in ((16, 119, 135), (40, 109, 121), (128, 159, 159)):
        assert max(native, hf) * 1024 < graph_bytes(enc, 1, length, bf16) < 1.5 * native * 1024, length
    assert graph_bytes(SimpleNamespace(config=SimpleNamespace(hidden_size=8)), 1000, 40, bf16) is None  # no attention


def test_a_default_ranking_run_on_a_cpu_says_whether_it_keeps_graphs(tmp_path, monkeypatch):
    from spanflow.tasks.embed import train as t
    from tests.helpers import tiny_bert

    train = codes(1024, 4)
    enc, tok = tiny_bert([x for p in train for x in (p.a, p.b)])
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    opts = TrainOptions(max_steps=2, log_every=0, patience=0, device="cpu")
    config = EmbedTraining(pairs_per_step=1024)  # more padded tokens than the CPU's 4096 a micro-batch
    trims = []

    class Trim:  # records the heap trims the run makes, and their slack
        def __init__(self, slack):
            self.slack, self.calls = slack, 0
            trims.append(self)

        def __call__(self):
            self.calls += 1

    monkeypatch.setattr(t, "GrowthTrim", Trim)
    for avail, want in ((16 * 2**30, "no gradient cache: the update's graphs (about "),
                        (2**20, "gradient cache on: the update's graphs (about ")):
        monkeypatch.setattr(t, "available_bytes", lambda: avail)
        lines = []
        train_embedder(train, None, model=str(tmp_path / "enc"), out_dir=str(tmp_path / str(avail)), options=opts,
                       config=config, log_fn=lines.append)
        line = next(x for x in lines if x.startswith("ranking update:"))
        assert "micro-batches of" in line and want in line, line
        # graphs kept: the trimmer is called each update, its slack one update's graphs (the estimate named);
        # the cache frees each micro-batch's graph as it goes: no trimmer
        (trim,) = trims
        assert trim.calls == 2, trim.calls
        if avail > 2**30:
            assert f"(about {trim.slack / 2**20:.0f} MiB)" in line, line
    lines = []  # --max-tokens given: the cache as asked, memory not consulted nor named
    train_embedder(train, None, model=str(tmp_path / "enc"), out_dir=str(tmp_path / "asked"),
                   options=TrainOptions(max_steps=1, log_every=0, patience=0, device="cpu", max_tokens=4096),
                   config=config, log_fn=lines.append)
    assert next(x for x in lines if x.startswith("ranking update:")).endswith("; gradient cache on")


def test_pairs_per_step_past_the_data_sizes_the_update_for_the_data(tmp_path):
    """An update holds every pair at most: --pairs-per-step beyond the data is sized (micro-batches,
    learning rate) as the data's size is, not for pairs that do not exist."""
    train = codes(40, 5)
    said = {}
    for n in (40, 100_000):
        lines = []
        train_embedder(train, None, model="tiny", out_dir=str(tmp_path / str(n)),
                       options=TrainOptions(max_steps=1, log_every=0, patience=0, device="cpu"),
                       config=EmbedTraining(pairs_per_step=n), log_fn=lines.append)
        said[n] = [x for x in lines if x.startswith("ranking update:") or " lr " in x or x.startswith("defaults")]
        assert said[n] and any(x.startswith("ranking update: about 40 pairs (1 micro-batch") for x in lines), lines
    assert "--pairs-per-step 100000 is more than the 40 training pairs: an update holds them all" in lines
    assert said[40] == said[100_000]
    lines = []  # a --max-tokens that holds fewer than the pairs asked: how many, and why, said in order
    train_embedder(train, None, model="tiny", out_dir=str(tmp_path / "cap"),
                   options=TrainOptions(max_steps=1, log_every=0, patience=0, device="cpu", max_tokens=32,
                                        grad_accum=1),
                   config=EmbedTraining(pairs_per_step=16), log_fn=lines.append)
    line = next(x for x in lines if x.startswith("ranking update:"))
    assert re.match(r"ranking update: about \d+ pairs \(of the 16 asked: --max-tokens x --grad-accum holds no "
                    r"more; 1 micro-batch of 32 tokens\); ", line), line


def test_a_resume_with_another_loss_or_data_kind_names_it_first(tmp_path, capsys):
    """The loss and the kind of data set a run's course: resuming a CoSENT run with --loss angle
    went on silently, and one on the same pairs without their scores blamed the options derived."""
    from spanflow.errors import ConfigError

    scored = [Pair(p.a, p.b, score=float(i % 5)) for i, p in enumerate(codes(40, 4))]
    opts = dict(log_every=0, patience=0, max_tokens=256, seed=2)
    train_embedder(scored, None, model="tiny", out_dir=str(tmp_path / "r"), options=TrainOptions(**opts, max_steps=1),
                   log_fn=lambda s: None)
    for data, config, said in (
            (scored, EmbedTraining(loss="angle"), "--loss cosent (now angle)"),
            ([Pair(p.a, p.b) for p in scored], None, "training data of scored pairs (now pairs); --loss cosent "
                                                     "(now ranking)")):
        with pytest.raises(ConfigError, match="of a run with " + __import__("re").escape(said)):
            train_embedder(data, None, model="tiny", out_dir=str(tmp_path / "r"), config=config,
                           options=TrainOptions(**opts, max_steps=2, resume=True), log_fn=lambda s: None)
    lines = []  # the same course: it resumes
    train_embedder(scored, None, model="tiny", out_dir=str(tmp_path / "r"),
                   options=TrainOptions(**opts, max_steps=2, resume=True), log_fn=lines.append)
    assert any(x.startswith("resumed from") for x in lines)


def test_matryoshka_always_trains_the_whole_vector(tmp_path, monkeypatch):
    """Sizes that leave out the model's own left the full embedding (what embed and the server give
    by default) out of the loss: it is added, and said."""
    import spanflow.tasks.embed.train as t

    asked = []
    monkeypatch.setattr(t, "matryoshka", lambda loss, dims: asked.append(list(dims)) or loss)
    for dims in ((8, 4), None):
        lines = []
        model = train_embedder(codes(40, 1), None, model="tiny", out_dir=str(tmp_path / str(dims)),
                               options=TrainOptions(max_steps=1, log_every=0, patience=0),
                               config=EmbedTraining(matryoshka_dims=dims), log_fn=lines.append)
        if dims:
            assert asked == [[model.dim, 8, 4]]
            assert any(f"Matryoshka dims [{model.dim}, 8, 4] ({model.dim}, the whole vector, added);" in x
                       for x in lines), lines
    assert len(asked) == 1  # none asked: no Matryoshka loss


def test_ranking_asked_for_scored_pairs_says_their_scores_are_not_read(tmp_path):
    train = [Pair(f"a{i} b", f"c{i} d", score=float(i % 4)) for i in range(12)]
    lines = []
    train_embedder(train, None, model="tiny", out_dir=str(tmp_path / "r"), options=TrainOptions(max_steps=1, log_every=0),
                   config=EmbedTraining(loss="ranking"), log_fn=lines.append)
    said = next(x for x in lines if x.startswith("12 training pairs"))
    assert said.startswith("12 training pairs (scored; the ranking loss takes every pair as a match whatever its "
                           "score: 6 scored in the lower half of the range train as matches too); ranking loss")


def test_an_update_of_one_pair_is_left_out_of_the_epoch(tmp_path, monkeypatch):
    """A length bucket's last pair made an update of its own: a ranking or CoSENT loss of one pair is
    0 (nothing to rank it against), yet the optimizer stepped and the schedule went on."""
    from spanflow.training import loop
    from spanflow.training.plan import epoch_plan

    lengths = [10] * 5  # batches of 4 and 1 at a budget of 40
    opts = TrainOptions(max_tokens=40, grad_accum=1)
    assert sorted(map(len, (s[0] for s in epoch_plan(lengths, opts, 0)))) == [1, 4]
    assert [sum(map(len, s)) for s in epoch_plan(lengths, opts, 0, min_items=2)] == [4]
    assert epoch_plan([10], opts, 0, min_items=2) == [[[0]]]  # one step of one pair: kept, not an empty epoch
    seen = []
    real = loop.epoch_plan
    monkeypatch.setattr(loop, "epoch_plan", lambda *a: seen.append(a[-1]) or real(*a))
    for data, least in ((codes(12, 1), 2), ([Pair(f"a{i}", f"c{i}", negative=f"e{i}") for i in range(12)], 1)):
        seen.clear()
        train_embedder(data, None, model="tiny", out_dir=str(tmp_path / str(least)),
                       options=TrainOptions(max_steps=1, log_every=0, patience=0, device="cpu"),
                       config=EmbedTraining(), log_fn=lambda s: None)
        assert seen and set(seen) == {least}, seen  # pairs need two an update; a triplet ranks its own negative
