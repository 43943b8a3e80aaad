"""One optimizer step of a loss over a whole update of several micro-batches, with a gradient cache.

An in-batch ranking loss compares every anchor with every positive and negative of the update
(on every rank), and CoSENT ranks every scored pair of it against the others, so neither can be
split by micro-batch. Without the cache (`cache=False`, one process) every micro-batch keeps
its graph until the loss is taken: the memory of the whole update, no extra work; the update's
micro-batches come from different length buckets, so the loss sees texts of every length while
each micro-batch pads little. Its gradient is taken in three parts
(Gao et al., 2021, "gradient cache"): embed each micro-batch without a graph, take the loss
and its gradient with respect to the embeddings of the whole update, then run each
micro-batch again with a graph and back-propagate its slice of that gradient. Memory is
that of one micro-batch plus the update's embeddings, whatever the update's size; the cost
is a second forward pass. The second pass replays each micro-batch's random state, so its
dropout is the first pass's and the gradient is exact. With one micro-batch the first pass
keeps its graph and there is no second one.

Under torchrun every rank gathers the others' embeddings: the global batch is the pool of
negatives, as one process would see it. Each rank takes the gradient of the global loss with
respect to its own rows; DDP averages the ranks' gradients, so the loss is scaled by the world
size as in training/step.forward_backward.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import torch
from torch import nn

from spanflow.inference.heap import release_freed
from spanflow.monitor.report import Meter
from spanflow.runtime.policy import Policy
from spanflow.tasks.embed.losses import EmbeddingLoss
from spanflow.training.distributed import Dist, gather_rows


def _rng_state(device: torch.device):
    """The generators dropout draws from on `device`: the CPU's, and the accelerator's."""
    if device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.get_rng_state(), torch.mps.get_rng_state()
    return torch.get_rng_state(), None


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state[1], device)
    elif device.type == "mps":
        torch.mps.set_rng_state(state[1])


def side_inputs(batch: dict) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(token ids, attention masks) of a collated pair batch's parts (train.make_collate): the
    embedding module takes the two tuples in one call (one forward under DDP) and returns the
    rows of every part, in side order."""
    k = next(j for j in itertools.count() if f"part{j}_ids" not in batch)
    return tuple(batch[f"part{j}_ids"] for j in range(k)), tuple(batch[f"part{j}_mask"] for j in range(k))


def _embed(model: nn.Module, batch: dict, policy: Policy) -> torch.Tensor:
    with policy.autocast():
        return model(*side_inputs(batch)).float()


def _pool(parts: list[torch.Tensor], counts: list[int], k: int) -> torch.Tensor:
    """Rows of several batches (each [first n_i; second n_i; negatives n_i]) as one batch of
    sum(n_i) examples in the same layout."""
    return torch.cat([torch.cat([e[j * n:(j + 1) * n] for e, n in zip(parts, counts)]) for j in range(k)])


def gathered_step(model: nn.Module, micro: list[dict], policy: Policy, scaler=None, meter: Meter | None = None,
                  world: int = 1, *, loss: EmbeddingLoss, dist: Dist = Dist(), cache: bool = True,
                  trim: Callable[[], object] | None = None) -> torch.Tensor:
    """Forward and backward of `loss` over every micro-batch of the step on every rank as one
    batch; returns the loss (normalised by the global number of anchors), detached. `trim` is
    called once the graphs kept across micro-batches are freed (a heap trim: heap.GrowthTrim)."""
    device = policy.device
    batches = [{key: v.to(device, non_blocking=True) for key, v in b.items() if torch.is_tensor(v)} for b in micro]
    counts = [b["n_pairs"] if b["weight"] else 0 for b in micro]  # a stand-in batch (weight 0) adds no rows
    k = micro[0]["sides"]
    keep_graph = len(micro) == 1 or (not cache and not hasattr(model, "no_sync"))  # DDP: always the cache
    states, outs = [], []
    for b, mb in zip(batches, micro):
        if mb["weight"] and meter is not None:
            meter.add_tokens(mb["real_tokens"], mb["padded_tokens"])
        states.append(_rng_state(device))
        with contextlib.nullcontext() if keep_graph else torch.no_grad():
            outs.append(_embed(model, b, policy))
    after = _rng_state(device)
    leaves = [e.detach().requires_grad_() for e in outs]
    mine = _pool(leaves, counts, k)  # (k * this rank's examples, H)
    ranks = gather_rows(mine, dist)  # every rank's rows, detached
    ranks[dist.rank] = mine  # the gradient flows to this rank's own rows only
    sizes = [r.shape[0] // k for r in ranks]
    pool = _pool(ranks, sizes, k)
    fields = {"n_pairs": sum(sizes)}
    if "keys" in micro[0]:  # each row's text, pooled (and gathered) as the rows are
        mine_keys = _pool([b["keys"] for b in batches], counts, k)
        fields["keys"] = _pool(gather_rows(mine_keys, dist), sizes, k)
    if "scores" in micro[0]:  # per-example targets, gathered in the pool's order
        fields["scores"] = torch.cat(gather_rows(torch.cat([b["scores"][:n] for b, n in zip(batches, counts)]), dist))
    value = loss(pool, fields) * (world / max(1, sum(sizes)))
    grads = torch.autograd.grad(scaler.scale(value) if scaler is not None else value, leaves, allow_unused=True)
    if keep_graph:  # one backward through every micro-batch's graph
        torch.autograd.backward(outs, [g if g is not None else torch.zeros_like(e) for e, g in zip(outs, grads)])
        if trim is not None and len(micro) > 1:
            trim()
        return value.detach() / world**2  # this rank's share: every rank computed the whole pool's loss
    for i, b in enumerate(batches):
        sync = i == len(batches) - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if sync else model.no_sync():
            _set_rng_state(states[i], device)
            e = _embed(model, b, policy)
            # a stand-in batch (no rows in the pool) joins the all-reduce with a zero gradient
            torch.autograd.backward(e, grads[i] if grads[i] is not None else torch.zeros_like(e))
        if device.type == "cpu":
            # the micro-batches of one update differ in shape, and glibc's heap otherwise keeps
            # the blocks of each: resident memory would grow past that of one micro-batch
            release_freed()
    _set_rng_state(after, device)
    return value.detach() / world**2
