"""Run options as one typed dataclass, with defaults right for most users."""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection
from dataclasses import asdict, dataclass, field

from spanflow.batching.align import MIN_LENGTH


def opt(default, help: str | None = None, **meta):
    """A field with its command-line help (cli/options.py makes the flag from it)."""
    if help is not None:
        meta["help"] = help
    return field(default=default, metadata=meta)


RECIPES = {"group": "recipes", "group_help": "options for rare types and small data (docs/recipes.md has their "
                                             "measured effect)"}
LR_SCALINGS = ("none", "sqrt", "linear")
GRAD_COMPRESSIONS = ("none", "fp16")
# a field of some tasks' training only: a task takes it where its `train_fields` names it (the
# flag of `spanflow train TASK`, a value set through the API)
SOME = {"some": True}


MAX_EPOCHS = 10_000
MAX_GRAD_ACCUM = 4096  # micro-batches an update; the last update is padded to it


@dataclass
class TrainOptions:
    """How to train. `max_tokens` counts padded tokens per micro-batch (see the batcher).
    Unset (None) values take the task's defaults, sized to the data (training/defaults.py)."""

    epochs: int | None = opt(None, "most epochs (early stopping on dev may end a run sooner)",
                             unset="per task, docs/defaults.md")
    lr: float | None = opt(None, "peak learning rate of the encoder", unset="per task, scaled to the update size")
    head_lr: float | None = opt(None, "learning rate of a freshly initialised head",
                                    unset="per task, scaled to the update size", **SOME)
    weight_decay: float = opt(0.01, "AdamW weight decay")
    warmup_ratio: float = opt(0.1, "share of the steps spent warming the learning rate up")
    max_grad_norm: float = opt(1.0, "clip gradients to this norm (0: no clipping)")
    grad_accum: int | None = opt(None, "micro-batches per optimizer step", unset="1; train embed: as many as its update needs")
    max_tokens: int | None = None  # a runtime flag (cli/common.add_runtime_args): a number, 'auto' or a profile
    # max_tokens measured (auto, --profile) on a sample: raised to hold the longest training item, where a
    # number given is refused (a sample's texts may all be shorter than the data's longest)
    budget_measured: bool = False
    max_length: int | None = opt(None, "most tokens per training window",
                                 unset="the model's own where it has one (a continued model's; embeddings: a "
                                       "sentence-transformers max_seq_length), else the encoder's limit")
    stride: int | None = opt(None, "tokens shared by neighbouring windows of a long text", **SOME,
                             unset="32; a model continued: its own")
    precision: str = "auto"  # runtime flag
    device: str = "auto"  # runtime flag
    seed: int = opt(0, "seed of initialisation, shuffling and dropout")
    eval_every: int | None = opt(None, "evaluate every N optimizer steps", unset="once per epoch")
    patience: int | None = opt(None, "evaluations without a better dev score ({dev_metric}) before "
                                                                   "stopping (0: never stop)",
                               unset="per task, docs/training.md")
    save_every: int | None = opt(None, "also checkpoint every N optimizer steps", unset="at epoch ends")
    max_steps: int | None = opt(None, "stop after N optimizer steps, with a checkpoint to resume from")
    resume: bool = opt(False, "continue from OUT/checkpoint")
    log_every: int = opt(50, "print the loss every N steps (0: never)")
    report_to: str = opt("none", "also report to: a comma list of tensorboard, mlflow (OUT/runs, "
                                 "MLFLOW_TRACKING_URI or OUT/mlruns); 'all': every one installed")
    lr_scaling: str = opt("none", "scale --lr for the larger global batch of several processes",
                          choices=LR_SCALINGS)
    grad_compression: str = opt("none", "all-reduce DDP gradients in fp16 (CUDA, several processes)",
                                choices=GRAD_COMPRESSIONS)
    label_smoothing: float = opt(0.0, "spread this much target probability over all labels", **SOME, **RECIPES)
    class_weights: str | dict | None = opt(None, "NER loss weights: 'auto' (inverse sqrt label frequency) or "
                                                 "'person=2,product=3'", **SOME, **RECIPES)
    llrd: float = opt(1.0, "layer-wise lr decay: each encoder layer takes LLRD x the lr of the one above (1: off)",
                      **RECIPES)
    pack: float | None = opt(None, "NER: share of training texts joined with the texts after them into "
                                   "multi-sentence sequences", unset="0: off", **SOME, **RECIPES)
    pack_span: float = opt(1.0, "NER: the longest joined training text, in multiples of the longest single text "
                                "(longer packs: docs/defaults.md, long documents)", **SOME, **RECIPES)
    oversample: float = opt(0.0, "draw examples of rare entity types or relations (f_max/f)^X times as often "
                                 "(0: off)", **SOME, **RECIPES)
    grad_checkpointing: bool = opt(False, "recompute layer activations in backward: far less memory on long "
                                          "inputs, more time a step (docs/recipes.md)", **RECIPES)

    def __post_init__(self):
        """Every value checked here, once, whether it came from the CLI or the Python API: an error
        names the field as the API sets it (TrainOptions.epochs), and the flag to the command line."""
        from spanflow.errors import ConfigError

        try:
            self._check()
        except ConfigError as e:
            raise in_api_words(e, self) from None

    def _check(self) -> None:
        from spanflow.errors import ConfigError, quote
        from spanflow.training.report_to import check_installed, parse_report_to

        check_types(self)
        if self.precision != "auto" or self.device != "auto":  # named here, run (and found) where it trains
            from spanflow.runtime.policy import check_names  # (torch: only for a name to check)

            check_names(self.precision, self.device)
        self.report_to = parse_report_to(self.report_to)
        check_installed(self.report_to)  # here, so a missing extra stops the run before any model loads
        checks = [
            (self.lr_scaling in LR_SCALINGS, f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}"),
            (self.grad_compression in GRAD_COMPRESSIONS,
             f"--grad-compression must be one of {', '.join(GRAD_COMPRESSIONS)}, got {self.grad_compression!r}"),
            (0.0 <= self.label_smoothing < 1.0, f"--label-smoothing must be in [0, 1), got {self.label_smoothing}"),
            (0.0 < self.llrd <= 1.0, f"--llrd must be in (0, 1], got {self.llrd}"),
            (self.oversample >= 0, f"--oversample must be >= 0, got {self.oversample}"),
            (self.pack is None or 0.0 <= self.pack <= 1.0, f"--pack must be in [0, 1], got {self.pack}"),
            (self.pack_span >= 1.0, f"--pack-span must be >= 1, got {self.pack_span}"),
            (self.grad_accum is None or 1 <= self.grad_accum <= MAX_GRAD_ACCUM,
             f"--grad-accum must be between 1 and {MAX_GRAD_ACCUM}, got {quote(self.grad_accum, 30)}"),
            (self.epochs is None or self.epochs <= MAX_EPOCHS,  # each epoch's batches are planned at the start
             f"--epochs must be at most {MAX_EPOCHS} (--max-steps stops a run by steps), got {quote(self.epochs, 30)}"),
            (self.stride is None or self.stride >= 0, f"--stride must be >= 0, got {self.stride}"),
            (0.0 <= self.warmup_ratio < 1.0, f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}"),
            (self.max_length is None or self.max_length >= MIN_LENGTH,
             f"--max-length must be >= {MIN_LENGTH} (two special tokens and the text's), got {self.max_length}"),
        ]
        for name in ("weight_decay", "max_grad_norm", "log_every", "patience"):  # 0 means none, or off
            v = getattr(self, name)
            checks.append((v is None or v >= 0, f"--{name.replace('_', '-')} must be >= 0, got {v}"))
        for name in ("epochs", "max_tokens", "eval_every", "save_every", "max_steps"):
            v = getattr(self, name)
            checks.append((v is None or v >= 1, f"--{name.replace('_', '-')} must be >= 1, got {v}"))
        for name in ("lr", "head_lr"):
            v = getattr(self, name)
            checks.append((v is None or v > 0, f"--{name.replace('_', '-')} must be > 0, got {v}"))
        checks.append((0 <= self.seed < 2**63, f"--seed must be between 0 and 2**63 - 1, got {self.seed}"))
        for f in dataclasses.fields(self):  # an infinite rate, weight or share passes every bound above
            v = getattr(self, f.name)
            if isinstance(v, float) and math.isinf(v):
                checks.append((False, f"--{f.name.replace('_', '-')} must be a finite number, got {v}"))
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if isinstance(self.class_weights, str):  # ' auto ' is auto
            object.__setattr__(self, "class_weights", self.class_weights.strip())
        if isinstance(self.class_weights, str) and self.class_weights != "auto":
            parse_weights(self.class_weights)
        elif isinstance(self.class_weights, dict):  # a copy: the caller's dict may change after
            object.__setattr__(self, "class_weights", check_weights(self.class_weights))

    def to_dict(self, takes: Collection[str] | None = None) -> dict:
        """Every field by name (the run parameters reporters such as MLflow log); with `takes`, the
        fields of some tasks' (metadata "some") only where it names them: a run's own options."""
        d = asdict(self)
        if takes is None:
            return d
        some = {f.name for f in dataclasses.fields(self) if f.metadata.get("some")}
        return {k: v for k, v in d.items() if k not in some or k in takes}


def parse_weights(text: str) -> dict[str, float]:
    """'person=2,corporation=3' -> {'person': 2.0, 'corporation': 3.0}, each a finite number above 0."""
    from spanflow.errors import ConfigError

    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.rpartition("=")
        if part == "auto":
            raise ConfigError("--class-weights: 'auto' stands alone (it weighs every label); or give LABEL=WEIGHT "
                              f"pairs, got {text!r}")
        try:
            weight = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ConfigError(f"--class-weights: expected LABEL=WEIGHT pairs or 'auto', got {part!r}")
        if key.strip() in out:
            raise ConfigError(f"--class-weights: {key.strip()!r} is given twice, in {text!r}")
        out[key.strip()] = weight
    if not out:
        raise ConfigError(f"--class-weights: expected LABEL=WEIGHT pairs or 'auto', got {text!r}")
    return check_weights(out)


def check_weights(weights: dict) -> dict[str, float]:
    """The weights as {label: float}, where each is a finite number above 0 (at 0 or below the loss
    turns away from its label); else a ConfigError naming the first that is not."""
    from spanflow.errors import ConfigError

    out = {}
    for key, value in weights.items():
        try:
            ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 < float(value) < math.inf
        except OverflowError:  # an int past a float's range
            ok = False
        if not ok:
            raise ConfigError(f"--class-weights: the weight of {key!r} must be a finite number above 0, got {value!r}")
        out[str(key)] = float(value)
    return out


# what a value of each annotated type may be (bool is an int to Python, but no count or rate)
_KINDS = {"int": (numbers.Integral, "a whole number"), "float": (numbers.Real, "a number"),
          "bool": (bool, "True or False"), "str": (str, "a string"), "dict": (dict, "a dict")}


def check_types(opts, skip: tuple[str, ...] = ("report_to",)) -> None:
    """A ConfigError naming the first field of the dataclass `opts` whose value is not of its type
    (`epochs=1.5`, `lr="1e-4"`): the Python API's values are checked as the CLI's parsers check
    theirs. A number of another kind (numpy's) becomes Python's int or float, as configs and
    checkpoints write JSON. `skip`: fields of other types, checked by their readers (report_to: a
    string or a list of names)."""
    from spanflow.errors import ConfigError, quote

    for f in dataclasses.fields(opts):
        if f.name in skip:
            continue
        v, names = getattr(opts, f.name), [t.strip() for t in str(f.type).split("|")]
        if v is None and "None" in names:
            continue
        kinds = [_KINDS[n] for n in names if n in _KINDS]
        if not any(isinstance(v, k) and (k is bool or not isinstance(v, bool)) for k, _ in kinds):
            raise ConfigError(f"{type(opts).__name__}.{f.name} must be {' or '.join(w for _, w in kinds)}"
                              f"{' or None' if 'None' in names else ''}, got {quote(v, 60)}", field=f.name)
        if isinstance(v, numbers.Number) and not isinstance(v, bool):  # object's: a frozen dataclass too
            try:
                plain = int(v) if isinstance(v, numbers.Integral) and "float" not in names else float(v)
            except OverflowError:  # an int past a float's range (lr=10**400)
                raise ConfigError(f"{type(opts).__name__}.{f.name} must be a finite number, got {quote(v, 40)}",
                                  field=f.name) from None
            object.__setattr__(opts, f.name, plain)


def check_options(options) -> None:
    """A ConfigError where a train function's `options` is neither a TrainOptions nor None (a
    task's own train function also checks the fields it takes: registry.check_train_options)."""
    from spanflow.errors import ConfigError

    if options is not None and not isinstance(options, TrainOptions):
        raise ConfigError(f"options takes a TrainOptions (spanflow.TrainOptions(epochs=3, ...)), got "
                          f"{type(options).__name__}")


def scaled_options(opts: TrainOptions, *, default_lr: float, world: int) -> TrainOptions:
    """Fill the default learning rate and apply --lr-scaling for `world` processes.

    Each process takes max_tokens per micro-batch, so a step sees world times the tokens of
    one process. `linear` keeps the per-token step size of single-device training (good for
    SGD-like regimes and large data); `sqrt` is the milder rule that tends to suit Adam;
    `none` keeps the learning rate and simply averages over more tokens.
    """
    lr = opts.lr if opts.lr is not None else default_lr
    factor = {"none": 1.0, "sqrt": math.sqrt(world), "linear": float(world)}[opts.lr_scaling]
    head = opts.head_lr * factor if opts.head_lr else None
    return dataclasses.replace(opts, lr=lr * factor, head_lr=head)


def in_api_words(e, options):
    """`e` (a ConfigError that names flags: --max-tokens) with its text naming the fields of
    `options` as the Python API sets them (TrainOptions.max_tokens; a flag followed by the value
    given, TrainOptions.device='gpu'); its `cli` keeps the flags, which the command line says,
    and its `field` is the first field named where it had none."""
    import re

    from spanflow.errors import ConfigError

    names, cls, named = {f.name for f in dataclasses.fields(options)}, type(options).__name__, []

    def field(m: re.Match) -> str:
        name = m[1].replace("-", "_")
        if name not in names:
            return m[0]
        named.append(name)
        value, given = getattr(options, name), (m[2] or " ")[1:]
        if given and (given == value or isinstance(value, (list, tuple)) and given in value):  # the value given
            return f"{cls}.{name}={given!r}"
        return f"{cls}.{name}{m[2] or ''}"

    flags = str(e)
    api = re.sub(r"--([a-z][a-z0-9-]*)( [^ :,;]+)?", field, flags)
    return ConfigError(api, field=e.field or (named[0] if named else None), cli=flags if api != flags else None)
