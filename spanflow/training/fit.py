"""One fit() trains every task: out-dir claim, torchrun, precision, defaults, loop, best model.

A task gives fit() one function, `setup(run) -> Plan`: from the started run (options, device
policy, the model to start from) it builds its model and its training items. Everything
else, before and after, is here once.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from spanflow.errors import as_log, as_path
from spanflow.training.defaults import TaskDefaults, fill_defaults
from spanflow.training.distributed import init_from_env
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.options import TrainOptions, check_options
from spanflow.training.outcome import outcome_line
from spanflow.monitor import clock
from spanflow.monitor.report import clock_time
from spanflow.training.outdir import claim_out_dir
from spanflow.training.setup import Run, best_model, prepare_encoder, start_run


@dataclass
class Plan:
    """What a task trains: its model, the items (len() = tokens) and how they become a loss.

    `model` is the task's model object: `.module` (the nn.Module with an `.encoder`), `.save(dir)`
    and `.evaluate(examples, dist=..., check_spans=False)` returning at least {"f1": ...}."""

    model: Any
    items: list
    collate: Callable[[list], dict]
    loss_fn: Callable[[nn.Module, dict], Any]
    defaults: TaskDefaults  # the task's defaults for this starting point (training/defaults.for_encoder)
    targets: Callable[[Any], int] | None = None  # loss targets of one item (global step normalisation)
    weights: list[float] | None = None  # per-item sampling weights (batching.sampling), None: uniform
    metric: str = "F1"  # the name of evaluate's "f1" in what training prints (embeddings: Spearman)
    # a pretrained start scores on dev as it is (embeddings; a new head scores 0): what to try where
    # training never beat it (None: the start is not scored)
    untrained_hint: str | None = None
    options: TrainOptions | None = None  # the run's options as the task sized them (None: the run's own)
    step: Callable[..., Any] | None = None  # a step's forward and backward (None: training/step.forward_backward)
    # the task's settings that set the run's course (its loss, the kind of data it is fed), by the
    # names its flags give them: a --resume under others is refused, as one of other options is
    course: dict | None = None
    # items an update needs to teach anything: a loss that compares the items of an update (a ranking
    # loss's in-batch negatives, CoSENT's order) learns nothing from one; fewer are left out of the epoch
    min_update: int = 1
    # the TrainOptions fields of some tasks' that this one takes (its task's train_fields): those it
    # does not take are left out of OUT/train_options.json and the reporters' parameters; None: all
    option_fields: frozenset[str] | None = None


def fit(setup: Callable[[Run], Plan], *, dev: list | None, model: str, out_dir: str,
        options: TrainOptions | None, load: Callable[..., Any], log_fn: Callable[[str], None] | None = print) -> Any:
    """Train what `setup` plans into `out_dir`; return the best model (by dev F1), reloaded with
    `load(path, device=..., precision=...)`, or the last one when the run stopped early; the run
    ends with one line saying where its model is (training/outcome.py).

    `model` is where training starts: a model directory of the task, an encoder directory or
    `tiny`; `run.source` is that, or the checkpoint's model when `options.resume` finds one.
    The caller's random state is left as it was: a run seeds torch's generators with its own
    seed (a resume restores the checkpoint's), and a seeded notebook would otherwise draw the
    run's numbers after it, whatever its own seed. That is torch's CPU generator, and the CUDA
    devices' where the caller had started CUDA (saving them otherwise would start a CUDA
    context on every device, from every rank)."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        return _fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=load, log_fn=log_fn)


def _fit(setup: Callable[[Run], Plan], *, dev: list | None, model: str, out_dir: str,
         options: TrainOptions | None, load: Callable[..., Any], log_fn: Callable[[str], None] | None = print):
    """fit, inside the caller's saved random state."""
    began = clock.began(time.perf_counter())  # a command's start: its data read and budget measured count
    out_dir, model = as_path(out_dir, "out_dir"), as_path(model, "model")
    check_options(options)
    as_log(log_fn)  # a log_fn that is no function is told before the run starts
    with claim_out_dir(out_dir, init_from_env()):  # the group first, so every rank learns of a refused claim
        run = start_run(options, model=model, out_dir=out_dir, log_fn=log_fn)
        plan = setup(run)
        prepare_encoder(plan.model.module.encoder, run.opts, run.log)
        opts = fill_defaults(plan.options or run.opts, plan.defaults, lengths=[len(it) for it in plan.items],
                             device=run.policy.device, world=run.dist.world, log=run.log,
                             tiny=model == "tiny" and run.source == model, dev=bool(dev), asked=run.opts,
                             min_update=plan.min_update)
        # each epoch's score alone: the check of gold spans against the model's words, which training
        # never printed, tokenized the dev data again every time
        evaluate = (lambda module: plan.model.evaluate(dev, dist=run.dist, check_spans=False)) if dev else None
        scoring = time.perf_counter()
        start = _start_score(plan, dev, run, model)  # a pretrained start's dev score: the time line's evaluation
        scoring = time.perf_counter() - scoring
        hooks = TaskHooks(collate=plan.collate, loss_fn=plan.loss_fn, evaluate=evaluate,
                          save_model=plan.model.save, targets=plan.targets, metric=plan.metric,
                          step=plan.step, course={**(plan.course or {}), "--dev": _dev_said(dev)},
                          min_update=plan.min_update, option_fields=plan.option_fields)
        origin = os.path.abspath(model) if os.path.exists(model) else model  # as the checkpoint records it
        summary = train_loop(plan.model.module, plan.items, hooks, opts=opts, policy=run.policy, out_dir=out_dir,
                             origin=origin,
                             log=run.log, dist=run.dist, weights=plan.weights)
        policy = run.policy
        best = best_model(summary, out_dir, lambda d: load(d, device=str(policy.device), precision=policy.name),
                          plan.model)
        encoders = _encoders(plan.model, best)
        rescored = best.evaluate(dev, dist=run.dist, check_spans=False)["f1"] if dev and encoders else None
        # before the line on how to go on; without --dev no evaluation ran to name
        run.log(time_line(time.perf_counter() - began, summary["seconds"], scoring, evaluated=bool(dev)))
        run.log(outcome_line(summary, out_dir, metric=plan.metric, precision=policy.name, rescored=rescored,
                             encoders=encoders))
        if start is not None and summary["best_f1"] is not None and not summary["best_f1"] > start:
            run.log(unbeaten_line(start, summary["best_f1"], plan.metric, model, plan.untrained_hint))
        return best


def time_line(total: float, seconds: dict, scoring: float = 0.0, *, evaluated: bool = True) -> str:
    """Where the run's time went: its steps, its dev evaluations (`scoring`: the starting model's,
    before the loop), its saves (models and checkpoints) and the rest (loading the model and data,
    sizing the batches, measuring the peak, the best model's reload)."""
    steps = seconds["loop"] - seconds["evaluation"] - seconds["saving"]
    parts = [("training steps", steps), ("dev evaluation", seconds["evaluation"] + scoring),
             ("saving", seconds["saving"]), ("start-up and the rest", total - seconds["loop"] - scoring)]
    return f"time: {clock_time(total)} in all: " + ", ".join(f"{name} {clock_time(max(0.0, t))}"
                                                           for name, t in parts if evaluated or name != "dev evaluation")


def _dev_said(dev: list | None) -> str:
    """The dev data as a checkpoint records it: a resume scored on other data would pick its best
    model by scores of two sets."""
    if not dev:
        return "none"
    import hashlib

    return f"{len(dev)} examples, digest {hashlib.sha1(repr(list(dev)).encode()).hexdigest()[:8]}"


def _start_score(plan: Plan, dev: list | None, run: Run, model: str) -> float | None:
    """The dev score of the model training starts from, as it is, said before the first step: where
    it scores untrained (a pretrained embedding model), on a fresh run from a directory."""
    if plan.untrained_hint is None or not dev or model == "tiny" or run.source != model:
        return None
    module = plan.model.module
    module.eval()
    try:
        score = plan.model.evaluate(dev, dist=run.dist, check_spans=False)["f1"]
    finally:
        module.train()
    run.log(f"the starting model, before this run's training: dev {plan.metric} {score:.4f}")
    return score


def unbeaten_line(start: float, best: float, metric: str, model: str, hint: str) -> str:
    """The warning of a run whose evaluations never beat the model it started from."""
    return (f"warning: training did not beat the starting model's dev {metric} {start:.4f} (the best {best:.4f}): "
            f"{model} as it is may serve this data better; {hint}")


def _encoders(trained, saved) -> tuple[str, str] | None:
    """The class names of the encoder training ran and of the saved model's, where they differ
    (one implementation trained, another runs the saved model; BERT encoders train and run as
    NativeBert): the two round apart in a reduced precision, so the saved model is scored again
    as `spanflow evaluate` scores it."""
    ran, runs = type(trained.module.encoder), type(saved.module.encoder)
    return (ran.__name__, runs.__name__) if saved is not trained and runs is not ran else None
