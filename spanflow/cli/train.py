"""`spanflow train ner ...`"""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_runtime_args
from spanflow.data.io import read_ner
from spanflow.training.options import TrainOptions


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model", description="Train a model; the best is saved to OUT/model.")
    p.add_argument("task", choices=["ner", "re"], help="what to train: ner, or re (CasRel relation extraction)")
    p.add_argument("--train", required=True,
                   help="training data: NER CoNLL, JSONL or spaCy .spacy; RE CasRel JSON or JSONL")
    p.add_argument("--dev", help="development data, evaluated every epoch (or --eval-every steps)")
    p.add_argument("--model", default="tiny", help="a local encoder directory, a spanflow NER model, or 'tiny'")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--format", choices=["conll", "jsonl", "docbin"], help="input format (detected when omitted)")
    p.add_argument("--scheme", help="tag scheme of CoNLL input: bio, iob1, bioes, bmes (detected when omitted)")
    p.add_argument("--strict", action="store_true", help="reject inside tags with no opening tag instead of repairing")
    p.add_argument("--subjects", choices=["all", "sample"], default="all",
                   help="RE: train the object stage on every gold subject of a text (default), or on one "
                        "sampled per text and step (the CasRel paper's recipe)")
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
    g.add_argument("--head", choices=["softmax", "crf"], default=None,
                   help="NER: a BIO-constrained CRF with Viterbi decoding (default for a new model), or a "
                        "per-token softmax; a spanflow model keeps its head unless this is given")
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

    if a.devices > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        from spanflow.training.distributed import relaunch

        argv = list(a.argv)
        i = argv.index("--devices")
        return relaunch(argv[:i] + argv[i + 2:], a.devices)
    if a.task == "re":
        if a.head is not None:
            from spanflow.errors import ConfigError

            raise ConfigError("--head applies to NER; relation extraction uses the CasRel head")
        return run_re(a)
    from spanflow.ner import train_ner

    train = read_ner(a.train, fmt=a.format, scheme=a.scheme, strict=a.strict)
    dev = read_ner(a.dev, fmt=a.format, scheme=a.scheme, strict=a.strict) if a.dev else None
    model = train_ner(train, dev, model=a.model, out_dir=a.out, options=options_from_args(a), head=a.head)
    print(f"model saved to {a.out}/model (labels: {', '.join(model.labels)})")
    return 0


def run_re(a: argparse.Namespace) -> int:
    from spanflow.data.formats.casrel import read_relations_vocab
    from spanflow.data.io import read_re
    from spanflow.re import train_re

    train = read_re(a.train)
    dev = read_re(a.dev) if a.dev else None
    relations = read_relations_vocab(a.train)
    model = train_re(train, dev, model=a.model, out_dir=a.out, options=options_from_args(a), relations=relations,
                     all_subjects=a.subjects == "all")
    print(f"model saved to {a.out}/model ({len(model.relations)} relations)")
    return 0
