"""train_ner: NER's part of training (start model, windows with BIO targets, loss); fit() does the rest."""
from __future__ import annotations

import os
from collections.abc import Callable

from spanflow.batching.align import check_window, max_stride
from spanflow.batching.collate import round_up
from spanflow.batching.sampling import rarity_weights
from spanflow.data.examples import NerExample, check_examples
from spanflow.errors import ConfigError
from spanflow.models.encoder import require_special_tokens, start_encoder, window_limit
from spanflow.tasks.ner.features import (
    bio_label_list,
    class_weight_tensor,
    make_collate,
    make_ner_loss,
    pack_examples,
    prepare_windows,
    single_line,
    window_kinds,
    window_targets,
)
from spanflow.tasks.ner.hf import bio_rows, select_rows, token_classification_config
from spanflow.tasks.ner.model import DEFAULT_STRIDE, NerModel
from spanflow.tasks.ner.tagging import SPECIAL_TOKENS
from spanflow.tasks.ner.words import TOKENIZER, WHITESPACE, edge_rules, shown_marks, words_of
from spanflow.tasks.registry import check_train_options
from spanflow.training.defaults import TaskDefaults, for_encoder
from spanflow.training.fit import Plan, fit
from spanflow.training.options import TrainOptions
from spanflow.runtime.policy import Policy
from spanflow.training.setup import Run, check_dev_gold, hold_longest, is_model_dir, warn_alike, warn_unseen

# what the training line's `words:` means for the texts the model will read
WORDS_MEAN = {WHITESPACE: "plain text is cut into words at its spaces, as these tokens were, and an entity starts and "
                          "ends only at a word's ends",
              TOKENIZER: "plain text is cut into words by the tokenizer, which splits punctuation off"}

# measured for time to dev F1 (docs/defaults.md): wnut17 with all-MiniLM-L6-v2, resume_ner with tiny
DEFAULTS = {"pretrained": TaskDefaults(lr=5e-5, head_lr=1e-3, epochs=10),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
DEFAULT_HEAD = "crf"
# the TrainOptions fields of some tasks' (metadata "some") that NER training takes
TRAIN_FIELDS = frozenset(("head_lr", "stride", "label_smoothing", "class_weights", "pack", "pack_span", "oversample"))


def continues(model: str) -> bool:
    """Whether training starts from a trained NER model (a spanflow one or an HF classifier)."""
    return is_model_dir(model) or token_classification_config(model) is not None


def softmax_flags(opts: TrainOptions) -> str:
    """The softmax-only options a run was given, as their flags, with their verb."""
    given = [flag for flag, on in (("--label-smoothing", bool(opts.label_smoothing)),
                                   ("--class-weights", opts.class_weights is not None)) if on]
    return " and ".join(given) + (" apply" if len(given) > 1 else " applies")


def start_model(model: str, train: list[NerExample], labels: list[str], opts: TrainOptions,
                policy: Policy, head_type: str | None = None, fresh_head: str = DEFAULT_HEAD, *,
                resuming: bool = False) -> NerModel:
    """The model to train: a spanflow NER model to continue (its head unless another is
    asked for; `resuming`: a checkpoint's), or a fresh head on a local encoder or `tiny`;
    head_type None: as found, else `fresh_head`."""
    if continues(model):
        start = (NerModel.load(model, device=str(policy.device), precision="fp32") if is_model_dir(model)
                 else NerModel.from_hf(model, device=str(policy.device), bio=True))
        if start.labels != sorted(labels) and resuming:
            raise ConfigError(f"--resume: the checkpoint in {os.path.dirname(model)} is of a run with labels "
                              f"{start.labels} (the data has {sorted(labels)}); resume with the data it was started "
                              "with, or start a new run (another --out, or no --resume)")
        if start.labels != sorted(labels):
            start_from = (f"its encoder (--model {os.path.join(model, 'encoder')})" if is_model_dir(model)
                          else "an encoder")
            raise ConfigError(f"{model} was trained on labels {start.labels}, the data has {sorted(labels)}: to train "
                              f"a model of these labels, start from {start_from}")
        if head_type is not None and start.head_type != head_type:
            raise ConfigError(f"{model} has a {start.head_type} head; --head {head_type} was asked for")
        head, bio = start.module.head, bio_label_list(start.labels)
        if start.id2label != bio:  # an imported classifier's label order: its rows onto spanflow's BIO labels
            head.proj = select_rows(head.proj, bio_rows(start.id2label, bio))
        limit = window_limit(model, start.module.encoder, start.tokenizer, opts.max_length, trained=start.limit)
        return NerModel(encoder=start.module.encoder, tokenizer=start.tokenizer, labels=labels, limit=limit,
                        stride=_stride(opts, limit, start.stride), head=head, head_type=start.head_type, policy=policy)
    encoder, tokenizer, limit = start_encoder(model, [e.text for e in train], max_length=opts.max_length,
                                              seed=opts.seed)
    require_special_tokens(tokenizer, model, SPECIAL_TOKENS)
    return NerModel(encoder=encoder, tokenizer=tokenizer, labels=labels, limit=limit,
                    stride=_stride(opts, limit, DEFAULT_STRIDE), head_type=head_type or fresh_head, policy=policy)


def _stride(opts: TrainOptions, limit: int, otherwise: int) -> int:
    """--stride where given (a ConfigError past half the window), else `otherwise`: a continued model's
    own, or the default, as far as a window of `limit` takes it (make_windows's cap, so the model
    directory records the overlap its windows have)."""
    if opts.stride is None:
        return min(otherwise, max_stride(limit))
    return check_window(limit, opts.stride, limit)[1]


def train_ner(train: list[NerExample], dev: list[NerExample] | None, *, model: str = "tiny", out_dir: str,
              options: TrainOptions | None = None, head: str | None = None,
              log_fn: Callable[[str], None] | None = print) -> NerModel:
    """Train an NER model; the best one (by dev F1) is saved to `<out_dir>/model` and returned (a
    run stopped by `max_steps` returns its last weights, kept in `<out_dir>/checkpoint`).

    `head` is "crf" (BIO-constrained CRF, Viterbi decoding) or "softmax" (per-token
    cross-entropy); None: a new model takes DEFAULT_HEAD, a spanflow model keeps its head.
    Options left unset take the task's DEFAULTS for the starting point, sized to the data.
    """
    check_train_options(options, "ner")
    check_examples(train, NerExample, "train")
    if dev is not None:
        check_examples(dev, NerExample, "dev", empty="pass None to train without dev data")
        check_dev_gold(dev, lambda e: bool(e.spans), "entities", " (CoNLL tags, or JSONL \"entities\" spans)")
    labels = sorted({lab for e in train for _, _, lab in e.spans})
    if not labels:
        raise ConfigError("the training data has no entities")

    def setup(run: Run) -> Plan:
        opts, log = run.opts, run.log
        if dev:
            warn_unseen(labels, {lab for e in dev for _, _, lab in e.spans}, "labels", log)
        warn_alike({lab for e in [*train, *(dev or [])] for _, _, lab in e.spans}, "labels", log)
        # label smoothing and class weights are softmax recipes: asking for one picks that head for a new model
        softmax_recipe = bool(opts.label_smoothing or opts.class_weights is not None)
        nm = start_model(run.source, train, labels, opts, run.policy, head,
                         fresh_head="softmax" if softmax_recipe else DEFAULT_HEAD, resuming=run.source != model)
        if nm.head_type == "crf" and softmax_recipe:
            raise ConfigError(f"{softmax_flags(opts)} to the softmax head, not the CRF")
        if opts.class_weights not in (None, "auto"):  # labels the data lacks: refused before the note on the head
            class_weight_tensor(opts.class_weights, [], nm.id2label)
        if softmax_recipe and head is None and DEFAULT_HEAD != "softmax" and not continues(run.source):
            log(f"note: {softmax_flags(opts)} to the softmax head only: this new model takes a softmax head "
                f"instead of the default {DEFAULT_HEAD} (docs/recipes.md compares them)")
        label2id = {lab: i for i, lab in enumerate(nm.id2label)}
        defaults = for_encoder(DEFAULTS, nm.module.encoder)
        pack = opts.pack if opts.pack is not None else defaults.pack
        if not pack and opts.pack_span != TrainOptions.pack_span:  # the default: 1
            log(f"warning: --pack-span {opts.pack_span:g} has no effect without --pack (no texts are joined)")
        texts = pack_examples(train, pack, span=opts.pack_span, seed=opts.seed)
        nm.lines = single_line(texts)
        nm.words = words_of(train)  # plain text is cut as the training data's tokens were, when it can be
        nm.word_edges = edge_rules(train) if nm.words == WHITESPACE else None
        windows = prepare_windows(texts, nm.tokenizer, label2id, max_length=nm.limit, stride=nm.stride,
                                  lines=nm.lines, log=log)
        longest = max(len(w) for w in windows)
        # the data's longest, not the encoder's limit
        hold_longest(run, longest, f"--max-tokens {opts.max_tokens} is below the longest training window, {longest} "
                                   f"tokens: one window must fit in a batch (give --max-tokens {longest} or more)")
        nm.max_length = min(nm.limit, round_up(longest, 8))
        joined = f" ({len(texts)} after joining neighbours)" if len(texts) < len(train) else ""
        log(f"{len(train)} training texts{joined} -> {len(windows)} windows; labels: {', '.join(labels)}; "
            f"head {nm.head_type}; "
            f"words: {nm.words} ({WORDS_MEAN[nm.words]}"
            + (f"; punctuation cut off a word's start: {shown_marks(nm.word_edges['start'])}; off its end: "
               f"{shown_marks(nm.word_edges['end'])}" if nm.word_edges else "")
            + ("; a word holding Chinese or Japanese is cut into its characters, as the character-level "
               "sentences were" if nm.word_edges and nm.word_edges.get("chars") else "") + ")")
        weights = rarity_weights(window_kinds(windows, nm.id2label), opts.oversample) if opts.oversample else None
        loss_fn = make_ner_loss(label_smoothing=opts.label_smoothing,
                                class_weights=class_weight_tensor(opts.class_weights, windows, nm.id2label))
        return Plan(model=nm, items=windows, collate=make_collate(nm.tokenizer.pad_token_id), loss_fn=loss_fn,
                    defaults=defaults, targets=window_targets, weights=weights, option_fields=TRAIN_FIELDS)

    return fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=NerModel.load, log_fn=log_fn)
