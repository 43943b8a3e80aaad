"""`spanflow train TASK ...`: the common flags here, each task's own from the task registry."""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_runtime_args
from spanflow.training.options import TrainOptions


def add_parser(sub) -> None:
    from spanflow.tasks.registry import tasks

    p = sub.add_parser("train", help="train a model", description="Train a model; the best is saved to OUT/model.")
    by_task = p.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in tasks():
        if task.trains:
            tp = by_task.add_parser(task.name, help=task.summary,
                                    description=f"Train a {task.name} model; the best is saved to OUT/model.")
            _add_common(tp)
            task.add_train_args(tp.add_argument_group(f"{task.name} options"))


def _add_common(p) -> None:
    p.add_argument("--train", required=True,
                   help="training data: NER CoNLL, JSONL or spaCy .spacy; RE CasRel JSON or JSONL")
    p.add_argument("--dev", help="development data, evaluated every epoch (or --eval-every steps)")
    p.add_argument("--model", default="tiny", help="a local encoder directory, a spanflow NER model, or 'tiny'")
    p.add_argument("--out", required=True, help="output directory")
    d = TrainOptions()
    p.add_argument("--epochs", type=int, default=None,
                   help="most epochs; early stopping on dev usually ends sooner (default: per task, docs/defaults.md)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate of the encoder (default: per task, scaled to the update size)")
    p.add_argument("--head-lr", type=float, default=None,
                   help="learning rate of a freshly initialised head (default: per task)")
    p.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--grad-accum", type=int, default=d.grad_accum)
    p.add_argument("--max-length", type=int, default=None, help="max tokens per window (default: the encoder's)")
    p.add_argument("--stride", type=int, default=d.stride, help="overlap between windows of long texts")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N optimizer steps")
    p.add_argument("--patience", type=int, default=None,
                   help="evaluations without a better dev F1 before stopping (default: per task; 0: never stop)")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N optimizer steps")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps (resumable)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (0: never)")
    p.add_argument("--devices", type=int, default=1,
                   help="processes on this node: re-launches itself through torch.distributed.run (torchrun)")
    p.add_argument("--grad-compression", choices=["none", "fp16"], default="none",
                   help="all-reduce DDP gradients in fp16 (CUDA, several processes) [%(default)s]")
    g = p.add_argument_group("recipes", "options for rare types and small data "
                                        "(docs/recipes.md has their measured effect)")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="spread this much target probability [0]")
    g.add_argument("--class-weights", default=None,
                   help="NER loss weights: 'auto' (inverse sqrt label frequency) or 'person=2,product=3'")
    g.add_argument("--llrd", type=float, default=1.0,
                   help="layer-wise lr decay: each encoder layer takes LLRD x the lr of the one above [1.0: off]")
    g.add_argument("--oversample", type=float, default=0.0,
                   help="entity-aware sampling: draw examples of rare types (f_max/f)^X times as often [0: off]")
    g.add_argument("--pack", type=float, default=None,
                   help="NER: share of training texts joined with the texts after them into multi-sentence "
                        "sequences, so long documents are tagged as well as sentences (default: per task)")
    g.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute layer activations in backward: far less memory on long inputs, ~30%% slower")
    p.add_argument("--lr-scaling", choices=["none", "sqrt", "linear"], default="none",
                   help="scale --lr for the larger global batch of several processes [%(default)s]")
    add_runtime_args(p, max_tokens=None, unset="None: sized from the data, about 100 updates per epoch")


def options_from_args(a: argparse.Namespace) -> TrainOptions:
    from spanflow.tuning.auto import resolve_max_tokens

    max_tokens = resolve_max_tokens(a.max_tokens, profile=a.profile, task=a.task, mode="train", model=a.model,
                                    data=a.train, precision=a.precision, device=a.device)
    return TrainOptions(epochs=a.epochs, lr=a.lr, head_lr=a.head_lr, weight_decay=a.weight_decay,
                        warmup_ratio=a.warmup_ratio, grad_accum=a.grad_accum,
                        max_tokens=max_tokens,
                        max_length=a.max_length, stride=a.stride, precision=a.precision, device=a.device,
                        seed=a.seed, eval_every=a.eval_every, patience=a.patience, save_every=a.save_every,
                        max_steps=a.max_steps, resume=a.resume, lr_scaling=a.lr_scaling,
                        grad_compression=a.grad_compression, log_every=a.log_every,
                        label_smoothing=a.label_smoothing, class_weights=a.class_weights, llrd=a.llrd,
                        oversample=a.oversample, grad_checkpointing=a.grad_checkpointing, pack=a.pack)


def run(a: argparse.Namespace) -> int:
    import os

    from spanflow.tasks.registry import get

    if a.devices > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        from spanflow.training.distributed import relaunch

        argv = list(a.argv)
        i = argv.index("--devices")
        return relaunch(argv[:i] + argv[i + 2:], a.devices)
    print(get(a.task).train_from_args(a, options_from_args(a)))
    return 0
