"""What every task's train function does first: join torchrun, fill options, pick the
precision policy, and decide whether to start from the model or from a checkpoint."""
from __future__ import annotations

import os
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass

import torch

from spanflow.errors import ConfigError, as_log
from spanflow.training.checkpoint import has_checkpoint
from spanflow.training.distributed import Dist, init_from_env
from spanflow.training.options import TrainOptions
from spanflow.runtime.policy import Policy, resolve_policy


@dataclass
class Run:
    opts: TrainOptions
    dist: Dist
    policy: Policy
    log: Callable[[str], None]  # silent on ranks other than 0
    source: str  # the model to start from: the given one, or the checkpoint's when resuming


def warn_unseen(trained: list[str], dev: set[str], what: str, log: Callable[[str], None]) -> None:
    """One warning line naming the dev `what` (labels, relations) that training never shows."""
    unseen = sorted(dev - set(trained))
    if not unseen:
        return
    if not dev & set(trained):
        log(f"warning: none of the --dev {what} occurs in --train ({', '.join(unseen[:10])}"
            f"{', ...' if len(unseen) > 10 else ''}): dev F1 will stay 0; check that the two files match")
    else:
        said = (f"{what} never occur in --train and count as misses" if len(unseen) > 1 else
                f"{what[:-1]} never occurs in --train and counts as a miss")
        log(f"warning: {len(unseen)} --dev {said}: "
            f"{', '.join(unseen[:10])}{', ...' if len(unseen) > 10 else ''}")


def warn_alike(names: set[str], what: str, log: Callable[[str], None]) -> None:
    """One warning line where `what` (labels, relations) differ only in case or white space:
    each is learned as a type of its own, which is seldom what the data meant."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(" ".join(name.split()).casefold(), []).append(name)
    alike = [g for g in groups.values() if len(g) > 1]
    if alike:
        log(f"warning: {what} that differ only in case or white space are learned as {what} of their own: "
            + "; ".join(" and ".join(repr(n) for n in g) for g in alike[:5]) + ("; ..." if len(alike) > 5 else ""))


def check_dev_gold(dev: list | None, gold: Callable[[object], bool], what: str, hint: str = "") -> None:
    """A ConfigError, before the run starts, where dev data holds no gold `what` at all: its F1
    would stay 0, choose no epoch's model, and have the run advise a higher learning rate."""
    if dev and not any(gold(e) for e in dev):
        raise ConfigError(f"the --dev data holds no {what} (no gold to score against): its F1 would stay 0 and "
                          f"choose no epoch's model; give labelled data{hint}, or leave --dev out")


def start_run(options: TrainOptions | None, *, model: str, out_dir: str, log_fn: Callable[[str], None] | None) -> Run:
    """Join torchrun's process group (if any), seed, pick the precision policy and where training
    starts (a resume: its checkpoint's model), and say what an earlier run in `out_dir` will lose."""
    dist = init_from_env()
    opts = options or TrainOptions()  # unset values are filled from the data later (training/defaults.py)
    log = as_log(log_fn if dist.is_main else None)  # None: quiet
    torch.manual_seed(opts.seed)
    policy = resolve_policy(opts.precision, opts.device, cpu_bf16=True)
    log(policy.describe() + (f", {dist.world} processes" if dist.enabled else ""))
    os.makedirs(out_dir, exist_ok=True)
    ckpt = os.path.join(out_dir, "checkpoint")
    earlier = [p for p in ("model", "checkpoint") if os.path.isdir(os.path.join(out_dir, p))]
    if earlier and not opts.resume:
        log(f"note: {out_dir} holds an earlier run's {' and '.join(earlier)}; this run starts over and replaces "
            f"{'them' if len(earlier) > 1 else 'it'} (--resume continues that run instead)")
    source = os.path.join(ckpt, "model") if opts.resume and has_checkpoint(ckpt) else model
    return Run(opts, dist, policy, log, source)


def is_model_dir(path: str) -> bool:
    """A spanflow model directory (to continue training from), rather than an encoder or `tiny`."""
    from spanflow.models.directory import CONFIG

    return os.path.exists(os.path.join(path, CONFIG))


def prepare_encoder(encoder, opts: TrainOptions, log: Callable[[str], None]) -> None:
    """What every task does to its encoder before the loop: gradient checkpointing when asked."""
    if opts.grad_checkpointing:
        from spanflow.models.encoder import enable_checkpointing

        enable_checkpointing(encoder)
        log("gradient checkpointing: layer activations are recomputed in backward (see peak mem per epoch)")


def best_model(summary: dict, out_dir: str, load: Callable[[str], object], last):
    """The best model the run saved (OUT/model, reloaded), or `last` when the run stopped early,
    in eval mode as a loaded one is (dropout off: the same text gives the same output)."""
    best = os.path.join(out_dir, "model")
    if summary["completed"] and os.path.isdir(best):
        return load(best)
    getattr(last, "module", last).eval()
    return last


def hold_longest(run: Run, longest: int, refused: str) -> None:
    """Make run.opts' token budget hold the longest training item (`longest` tokens): a measured one
    (budget_measured) is raised to it, with a note; one given is refused with the message `refused`."""
    budget = run.opts.max_tokens
    if budget is None or budget >= longest:
        return
    if not run.opts.budget_measured:
        raise ConfigError(refused)
    run.log(f"note: max_tokens {budget}, measured on a sample of shorter texts, is below the longest training item, "
            f"{longest} tokens: raised to {longest}, so that it fits in a batch")
    run.opts = dataclasses.replace(run.opts, max_tokens=longest)
