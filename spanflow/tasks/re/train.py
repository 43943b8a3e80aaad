"""train_re: CasRel's part of training (start model, features, cascade loss); fit() does the rest."""
from __future__ import annotations

import os
from collections.abc import Callable

from spanflow.batching.sampling import rarity_weights
from spanflow.data.examples import ReExample, check_examples
from spanflow.errors import ConfigError, counted, quote
from spanflow.models.encoder import require_special_tokens, start_encoder, window_limit
from spanflow.tasks.re.features import (
    feature_relations,
    make_casrel_loss,
    make_collate,
    prepare_features,
    trained_triples,
)
from spanflow.tasks.re.model import SPECIAL_TOKENS, ReModel
from spanflow.tasks.registry import check_train_options
from spanflow.training.defaults import TaskDefaults, for_encoder
from spanflow.training.fit import Plan, fit
from spanflow.training.options import TrainOptions
from spanflow.training.setup import Run, check_dev_gold, hold_longest, is_model_dir, warn_alike, warn_unseen

# measured for time to dev F1 (docs/defaults.md): webnlg with all-MiniLM-L6-v2
DEFAULTS = {"pretrained": TaskDefaults(lr=1e-4, head_lr=2e-3, epochs=12),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
TRAIN_FIELDS = frozenset(("head_lr", "label_smoothing", "oversample"))  # TrainOptions fields of some tasks'


def check_relations(train: list[ReExample], relations: list[str]) -> None:
    """A ConfigError when `relations` lacks some of the training data's: their triples would be
    dropped (the relation list is the model's output layer)."""
    counts: dict[str, int] = {}
    known = set(relations)
    for e in train:
        for _, r, _ in e.triples:
            if r not in known:
                counts[r] = counts.get(r, 0) + 1
    if counts:
        named = ", ".join(f"{r} ({n})" for r, n in sorted(counts.items())[:5]) + (", ..." if len(counts) > 5 else "")
        n = sum(counts.values())
        raise ConfigError(f"the relation list ({len(relations)}) lacks {counted(len(counts), 'relation')} of the "
                          f"training data, whose {counted(n, 'triple')} would be left out: {named}")


def start_model(source: str, train: list[ReExample], relations: list[str], opts: TrainOptions, policy, *,
                resuming: bool = False) -> ReModel:
    """The model to train: a spanflow RE model to continue (`resuming`: a checkpoint's), or a fresh
    CasRel head on an encoder or `tiny`."""
    if is_model_dir(source):
        start = ReModel.load(source, device=str(policy.device), precision="fp32")
        if start.relations != relations and resuming:
            raise ConfigError(f"--resume: the checkpoint in {os.path.dirname(source)} is of a run with "
                              f"other relations ({len(start.relations)}; the data has {len(relations)}); resume "
                              "with what it was started with, or start a new run (another --out, or no --resume)")
        if start.relations != relations:
            raise ConfigError(f"{source} was trained on other relations than the data has: to train a model of these "
                              f"relations, start from its encoder (--model {os.path.join(source, 'encoder')})")
        return ReModel(encoder=start.module.encoder, tokenizer=start.tokenizer, relations=relations,
                       limit=window_limit(source, start.module.encoder, start.tokenizer, opts.max_length,
                                          trained=start.limit), head=start.module.head, policy=policy)
    encoder, tokenizer, limit = start_encoder(source, [e.text for e in train], max_length=opts.max_length,
                                              seed=opts.seed)
    require_special_tokens(tokenizer, source, SPECIAL_TOKENS)
    return ReModel(encoder=encoder, tokenizer=tokenizer, relations=relations, limit=limit, policy=policy)


def train_re(train: list[ReExample], dev: list[ReExample] | None, *, model: str = "tiny", out_dir: str,
             options: TrainOptions | None = None, relations: list[str] | None = None, all_subjects: bool = True,
             log_fn: Callable[[str], None] | None = print) -> ReModel:
    """Train a CasRel model; the best by dev exact F1 is saved to `<out_dir>/model` and returned
    (a run stopped by `max_steps` returns its last weights, kept in `<out_dir>/checkpoint`).

    `relations`: the relation list the model extracts, in its order (None: the training data's,
    sorted); one the data has but the list lacks is a ConfigError. The object stage trains on
    every gold subject of a text; `all_subjects=False` samples one per text and step, as the
    CasRel paper does (slower to learn, docs/defaults.md)."""
    check_train_options(options, "re")
    if relations is not None and (isinstance(relations, str) or not isinstance(relations, (list, tuple))
                                  or not all(isinstance(r, str) and r for r in relations)):
        raise ConfigError(f"relations takes a list of relation names, got {quote(relations, 60)}")
    twice = sorted({r for r in relations or () if relations.count(r) > 1})
    if twice:  # caught here, not after the run, when the model directory would refuse them
        raise ConfigError(f"relations names {', '.join(map(repr, twice))} more than once: each relation is one "
                          "output of the model, named once")
    if not isinstance(all_subjects, bool):
        raise ConfigError(f"all_subjects takes True or False, got {quote(all_subjects, 40)}")
    check_examples(train, ReExample, "train")
    if dev is not None:
        check_examples(dev, ReExample, "dev", empty="pass None to train without dev data")
        check_dev_gold(dev, lambda e: bool(e.triples or e.unlocated), "triples",
                       " (CasRel JSON's \"triple_list\", or JSONL \"relations\")")
    if relations is not None:
        check_relations(train, relations)
    source = "of the list given" if relations is not None else "of the training data"
    relations = relations or sorted({r for e in train for _, r, _ in e.triples})
    if not relations:
        raise ConfigError("the training data has no located triples")

    def setup(run: Run) -> Plan:
        opts, log = run.opts, run.log
        if dev:
            warn_unseen(relations, {r for e in dev for _, r, _ in e.triples}
                        | {r for e in dev for _, r, _ in e.unlocated}, "relations", log)
        warn_alike({r for e in [*train, *(dev or [])] for _, r, _ in [*e.triples, *e.unlocated]}, "relations", log)
        rm = start_model(run.source, train, relations, opts, run.policy, resuming=run.source != model)
        feats = prepare_features(train, rm.tokenizer, rm.rel2id, max_length=rm.limit)
        longest = max((len(f) for f in feats), default=0)
        # as NER's: a budget set to cap memory holds
        hold_longest(run, longest, f"--max-tokens {opts.max_tokens} is below the longest training text, {longest} "
                                   f"tokens (at most --max-length): one text must fit in a batch (give --max-tokens "
                                   f"{longest} or more, or a lower --max-length)")
        log(f"{counted(len(train), 'training text')}, {counted(trained_triples(feats), 'triple')} trained on, "
            f"{counted(len(relations), 'relation')} {source}"
            + (" (object stage on all gold subjects)" if all_subjects else " (one sampled subject per text)"))
        weights = rarity_weights(feature_relations(feats), opts.oversample) if opts.oversample else None
        return Plan(model=rm, items=feats, defaults=for_encoder(DEFAULTS, rm.module.encoder),
                    collate=make_collate(rm.tokenizer.pad_token_id or 0, len(relations), seed=opts.seed,
                                         all_subjects=all_subjects),
                    loss_fn=make_casrel_loss(label_smoothing=opts.label_smoothing), targets=lambda f: len(f) - 2,
                    weights=weights, course={"--subjects": "all" if all_subjects else "sample"},
                    option_fields=TRAIN_FIELDS)

    return fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=ReModel.load, log_fn=log_fn)
