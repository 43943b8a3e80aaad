"""What a run with only the required flags gets: defaults chosen for time to accuracy.

Each task states its defaults as a `TaskDefaults` per starting point (a pretrained encoder
or `tiny`); `fill_defaults` applies them to the options a user left unset, and sizes the
optimizer update from the data. docs/defaults.md holds the measurement behind each value.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spanflow.errors import counted
from spanflow.runtime.budget import default_budget
from spanflow.training.options import TrainOptions, scaled_options
from spanflow.training.plan import epoch_plan

UPDATES_PER_EPOCH = 100  # a small data set still gets enough optimizer updates to learn in a few epochs
REFERENCE_TOKENS = 1024  # the update size the learning rates below were measured at
MIN_UPDATE_TOKENS = 256


@dataclass(frozen=True)
class TaskDefaults:
    """Defaults of one task for one kind of starting point."""

    lr: float  # encoder peak learning rate at REFERENCE_TOKENS per update
    head_lr: float | None  # a freshly initialised head's own rate; None: the encoder's
    epochs: int  # the most epochs
    patience: int = 3  # evaluations without a better dev F1 before stopping; 0: run all epochs
    pack: float = 0.0  # NER: share of training texts joined with their neighbours (see tasks.ner.features.pack_examples)


def describe_defaults(field: str, tables: dict[str, dict[str, TaskDefaults]]) -> str | None:
    """What a task's defaults give an unset `field` (epochs, lr, head_lr, patience), for a
    command's --help: "an encoder 10, tiny 20"; `tables` maps a kind of data ("" for all) to the
    task's table by starting point. None for a field no table holds."""
    if field not in ("epochs", "lr", "head_lr", "patience"):  # pack is NER's recipe flag, said by its own help
        return None

    def shown(v) -> str:
        if v is None:
            return "as --lr"
        return "never" if field == "patience" and v == 0 else f"{v:g}"

    said = {kind: ", ".join(f"{'an encoder' if start == 'pretrained' else start} {shown(getattr(d, field))}"
                            for start, d in table.items()) for kind, table in tables.items()}
    if len(set(said.values())) == 1:  # the same whatever the kind: said once
        return next(iter(said.values()))
    return "; ".join(f"{kind}: {values}" if kind else values for kind, values in said.items())


def for_encoder(table: dict[str, TaskDefaults], encoder) -> TaskDefaults:
    """A task's defaults for this starting point: `tiny` (from scratch) or a pretrained encoder."""
    from spanflow.models.encoder import is_tiny

    return table["tiny" if is_tiny(encoder) else "pretrained"]


def device_budget(device: torch.device) -> int:
    """Largest padded tokens per micro-batch worth taking (runtime.budget's table)."""
    return default_budget("train", device)


def update_tokens(lengths: list[int], device: torch.device, world: int = 1) -> int:
    """Padded tokens per optimizer step (per process) for a data set of these item lengths.

    About UPDATES_PER_EPOCH updates per epoch, rounded to a power of two, never fewer
    tokens than the longest item nor more than the device's budget: on a large data set
    the update is as large as the device runs well; on a small one it is cut so the model
    still takes enough steps. More processes share one update: the whole job's update is sized
    (its floor too), then split, so N processes take as many updates an epoch as one does.
    """
    world = max(1, world)
    want = 2 ** round(math.log2(max(1.0, sum(lengths) / UPDATES_PER_EPOCH)))
    return int(max(max(lengths, default=1), -(-MIN_UPDATE_TOKENS // world),
                   min(-(-want // world), device_budget(device))))


TINY = ("model tiny (a small encoder and vocabulary built from scratch on --train, no pretrained weights; "
        "--model DIR starts from a pretrained encoder)")
NO_DEV = "no --dev: no early stopping, the model of the last epoch is kept"


def _update_said(max_tokens: int, accum: int, asked: TrainOptions) -> str:
    """An update's size as a note says it: the flags where given, the sized values otherwise."""
    size = f"--max-tokens {max_tokens}" if asked.max_tokens is not None else str(max_tokens)
    if accum == 1:
        return f"{size} tokens"
    if asked.max_tokens is not None and asked.grad_accum is not None:  # both flags: as the user wrote them
        return f"{size} x --grad-accum {accum} tokens"
    times = f"--grad-accum {accum}" if asked.grad_accum is not None else str(accum)
    return f"{times} micro-batches of {size} tokens"


def fill_defaults(opts: TrainOptions, defaults: TaskDefaults, *, lengths: list[int], device: torch.device,
                  world: int = 1, log: Callable[[str], None] = print, tiny: bool = False,
                  dev: bool = True, asked: TrainOptions | None = None, min_update: int = 1) -> TrainOptions:
    """Options with every unset value taken from `defaults` and the data, each choice logged.

    The learning rates follow the update size by the square-root rule (Adam-style
    optimizers keep their per-update noise level that way), from REFERENCE_TOKENS. The line
    also names a `tiny` start, and says what a run without `dev` data keeps. `asked`: the user's
    options where a task sized some of `opts` (the notes name a flag only where it was given);
    `min_update`: the items an update needs (Plan.min_update), so the updates counted are those trained.
    """
    asked = asked or opts
    auto = [TINY] if tiny else []
    max_tokens = opts.max_tokens or update_tokens(lengths, device, world)
    # the first epoch's plan: what the budget gives on this data (batches are rarely full: the token
    # total over the budget counts too few updates)
    plan = (epoch_plan(lengths, dataclasses.replace(opts, max_tokens=max_tokens), 0, world, min_items=min_update)
            if lengths else [])
    if opts.max_tokens is None:
        # the rule aims at UPDATES_PER_EPOCH in powers of two (or the device's cap): say what it gives here
        each = f" on each of {world} processes" if world > 1 else ""
        auto.append(f"max_tokens {max_tokens}{each} (about {counted(max(1, len(plan)), 'update')} per epoch)")
    typical = sorted(lengths)[len(lengths) // 2] if lengths else 0
    if max_tokens < typical:  # a batch holds a text at least: the update is larger than the budget asked
        flag = " (--max-tokens)" if asked.max_tokens is not None else ""
        log(f"note: a budget of {max_tokens} tokens a batch{flag} is below the median training text "
            f"({typical} tokens): a batch holds one text at least, so updates hold more than the budget, and unset "
            f"learning rates follow {typical}")
    accum = opts.grad_accum or 1
    update = max(max_tokens, typical) * accum * world
    whole = sum(max(lengths[i] for i in mb) * len(mb) for step in plan for mb in step if mb)
    if len(plan) == 1 and whole < update:  # the budget holds more than the data: one update, of the whole set
        if opts.max_tokens is not None:  # a budget of the defaults' is said in their line
            unset = opts.lr is None or opts.head_lr is None
            follow = f", and unset learning rates follow {whole} tokens" if unset else ""
            log(f"note: an update of {_update_said(max_tokens, accum, asked)} holds the whole training set ({whole} "
                f"padded tokens): 1 update per epoch{follow}")
        update = whole
    scale = math.sqrt(update / REFERENCE_TOKENS)
    checked = scaled_options(opts, default_lr=defaults.lr * scale, world=world)  # --lr-scaling for rates given
    lr = checked.lr if opts.lr is not None else defaults.lr * scale
    head_lr = checked.head_lr if opts.head_lr is not None else (defaults.head_lr * scale if defaults.head_lr else None)
    if opts.lr is None:
        auto.append(f"lr {lr:.2g}")
    if opts.head_lr is None and head_lr is not None:
        auto.append(f"head_lr {head_lr:.2g}")
    epochs = opts.epochs if opts.epochs is not None else defaults.epochs
    patience = opts.patience if opts.patience is not None else defaults.patience
    if opts.epochs is None:
        auto.append(f"epochs {epochs}")
    if not dev:
        auto.append(NO_DEV)
    elif opts.patience is None:
        auto.append(f"early stop after {patience} evaluations without gain" if patience else "no early stop")
    if auto:
        log("defaults: " + ", ".join(auto))
    alone = [f"--{f.replace('_', '-')} {getattr(opts, f)}" for f in ("lr_scaling", "grad_compression")
             if world == 1 and getattr(opts, f) != "none"]
    if alone:  # options of several processes, given to one: said, not silently nothing
        log(f"warning: {' and '.join(alone)} {'apply' if len(alone) > 1 else 'applies'} to runs of several processes (torchrun); this one has one: "
            "nothing to scale or compress")
    idle = [f"--{f.replace('_', '-')} {getattr(opts, f)}" for f in ("eval_every", "patience")
            if not dev and getattr(opts, f) is not None]
    if idle:  # options of evaluation, given to a run with nothing to evaluate on
        log(f"warning: {' and '.join(idle)} act on evaluations of --dev data; this run has none: "
            "nothing is evaluated or stopped early")
    pack = opts.pack if opts.pack is not None else defaults.pack
    # (one process compresses nothing: sparse tables stay)
    return dataclasses.replace(checked, max_tokens=max_tokens, lr=lr, head_lr=head_lr, epochs=epochs,
                               patience=patience, pack=pack, grad_accum=accum,
                               grad_compression="none" if world == 1 else checked.grad_compression)
