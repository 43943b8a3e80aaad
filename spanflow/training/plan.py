"""An epoch's optimizer steps as the training loop runs them: token-budget batches of item
indices, grouped per step; the loop and the defaults line (its update count) share it."""
from __future__ import annotations

from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.sampling import epoch_indices
from spanflow.training.options import TrainOptions


def epoch_plan(lengths, opts: TrainOptions, epoch: int, world: int = 1,
               weights: list[float] | None = None, min_items: int = 1) -> list[list[list[int]]]:
    """The epoch's global optimizer steps, each `grad_accum x world` micro-batches of item
    indices; rank r runs step[r::world]. Every rank derives the same plan from the seed.
    With sampling `weights` the epoch's items are drawn first (see batching.sampling). A step of
    fewer than `min_items` items (a length bucket's last pair, for a loss that compares the
    items of an update: it learns nothing) is left out, unless every step would be."""
    if weights is None:
        batches = token_budget_batches(lengths, opts.max_tokens, seed=opts.seed, epoch=epoch, world_size=world)
    else:
        drawn = epoch_indices(weights, seed=opts.seed, epoch=epoch)
        batches = token_budget_batches([lengths[i] for i in drawn], opts.max_tokens, seed=opts.seed, epoch=epoch,
                                       world_size=world)
        batches = [[drawn[j] for j in b] for b in batches]
    n = (opts.grad_accum or 1) * world
    steps = [batches[i:i + n] for i in range(0, len(batches), n)]
    if steps and len(steps[-1]) < n:  # a short tail: empty micro-batches keep every rank in step
        steps[-1] = steps[-1] + [[] for _ in range(n - len(steps[-1]))]
    if min_items > 1:
        kept = [s for s in steps if sum(map(len, s)) >= min_items]
        steps = kept or steps
    return steps
