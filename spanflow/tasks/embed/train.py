"""train_embedder: embeddings' part of training (pairs -> token ids, the loss); fit() does the rest."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import numbers
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spanflow.batching.collate import pad_rows
from spanflow.errors import ConfigError, quote
from spanflow.inference.heap import GrowthTrim, available_bytes
from spanflow.models.encoder import start_encoder
from spanflow.runtime.budget import default_budget
from spanflow.tasks.embed.cached import gathered_step, side_inputs
from spanflow.tasks.embed.losses import LOSSES, NAMES, SCORED_LOSSES, matryoshka
from spanflow.tasks.embed.model import Embedder
from spanflow.tasks.embed.pairs import SCORED, Pair, check_pairs
from spanflow.tasks.embed.pooling import Pooling
from spanflow.tasks.embed.st_dir import read_embedding_config
from spanflow.tasks.registry import check_train_options
from spanflow.training.defaults import TaskDefaults, for_encoder, update_tokens
from spanflow.training.fit import Plan, fit
from spanflow.training.options import TrainOptions, check_types, in_api_words
from spanflow.training.setup import Run, hold_longest

# the rates are at REFERENCE_TOKENS padded tokens per update and follow the update size
# (training/defaults.py); docs/defaults.md has the runs behind them
DEFAULTS = {"pretrained": TaskDefaults(lr=5e-5, head_lr=None, epochs=4, patience=2),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
RANKING_DEFAULTS = {"pretrained": TaskDefaults(lr=2e-5, head_lr=None, epochs=4, patience=2),
                    "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
TRAIN_FIELDS: frozenset[str] = frozenset()  # it takes no TrainOptions field of some tasks' (no head, no windows)
MIXED_MICRO_BATCHES = 2  # a scored-pair update: this many length buckets ranked together
MAX_PAIRS_PER_STEP = 256  # the default update of a ranking loss: its pool of in-batch negatives
MIN_STEPS_PER_EPOCH = 20  # a small pair set still gets this many updates an epoch
# what a training graph holds per padded token and layer: bytes per unit of width (hidden plus
# intermediate), and per attention head and key. Fitted above MiniLM's measured graphs in bf16 on
# a CPU at short, middling and long rows, spanflow's encoder and transformers' (whose residual
# stream stays fp32); fp32 taken as twice that
GRAPH_BYTES_PER_UNIT, GRAPH_BYTES_PER_SCORE = 12, 8
GRAPH_MEMORY_SHARE = 1 / 3  # of the memory available, the most an update's graphs may take on a CPU
SPLIT_SAVING = 0.8  # a batch's sides are padded apart when that leaves at most this share of the padded tokens


@dataclass(frozen=True)
class EmbedTraining:
    """What is particular to training embeddings (the rest is TrainOptions)."""

    loss: str = "auto"  # auto: cosent for scored pairs, ranking for pairs and triplets
    symmetric: bool = False  # ranking: also each positive picks its anchor
    matryoshka_dims: tuple[int, ...] | None = None  # also train the embeddings cut to these sizes
    pairs_per_step: int | None = None  # ranking: pairs per optimizer update (the negatives' pool)

    def __post_init__(self):
        """Checked as TrainOptions are: an error names the field (EmbedTraining.loss), the
        command line the flag."""
        try:
            self._check()
        except ConfigError as e:
            raise in_api_words(e, self) from None

    def _check(self) -> None:
        check_types(self, skip=("matryoshka_dims",))
        dims = self.matryoshka_dims
        if dims is not None and not (isinstance(dims, (tuple, list)) and all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims)):
            raise ConfigError(f"EmbedTraining.matryoshka_dims must be a tuple of whole sizes or None, got {dims!r}",
                              field="matryoshka_dims")
        if dims is not None:  # frozen: set as the dataclass's own __init__ does
            object.__setattr__(self, "matryoshka_dims", tuple(int(d) for d in dims))
        if self.loss not in ("auto", *LOSSES):
            raise ConfigError(f"--loss must be one of auto, {', '.join(LOSSES)}, got {self.loss!r}", field="loss")
        if self.pairs_per_step is not None and self.pairs_per_step < 2:
            raise ConfigError(f"--pairs-per-step must be >= 2, got {self.pairs_per_step}", field="pairs_per_step")
        if self.matryoshka_dims is not None and (not self.matryoshka_dims or min(self.matryoshka_dims) < 1):
            raise ConfigError(f"--matryoshka-dims must be positive sizes, got {self.matryoshka_dims}",
                              field="matryoshka_dims")


def parse_dims(text: str | None) -> tuple[int, ...] | None:
    """'384,256,128' -> (384, 256, 128); a ConfigError naming the flag for anything else."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--matryoshka-dims takes comma-separated sizes such as 384,256,128, got {text!r}",
                          field="matryoshka_dims") from None


class PairItem:
    """One example's token ids, a tuple of its sides (two, or three with a hard negative); len() is
    what the batcher counts: every side as long as the longest (an upper bound on its padded tokens)."""

    __slots__ = ("sides", "score")

    def __init__(self, sides: tuple[list[int], ...], score: float | None = None):
        self.sides, self.score = sides, score

    def __len__(self) -> int:
        return len(self.sides) * max(len(s) for s in self.sides)


def make_collate(pad_id: int) -> Callable[[list], dict]:
    """Every side of n examples, as one (k n, T) batch of rows side by side (all first sides,
    then all second sides, then the negatives), or, where that saves a fifth of the padded
    tokens, as one (n, T_j) part per side, each padded to its own longest (a question then
    pads to questions, not to its passage). A part's rows are `part{j}_ids`, `part{j}_mask`;
    cached.side_inputs hands the parts to the model, whose rows come back in side order."""
    def collate(items: list[PairItem]) -> dict:
        k, n = len(items[0].sides), len(items)
        sides = [[it.sides[j] for it in items] for j in range(k)]
        longest = [max(map(len, rows)) for rows in sides]
        # apart, each part's products are smaller, which costs on a CPU (STS-B's sides, of one
        # length, ran slower apart): worth it only where the padding saved is larger
        parts = sides if sum(longest) <= SPLIT_SAVING * k * max(longest) else [[r for rows in sides for r in rows]]
        out = {"sides": k, "n_pairs": n, "n_targets": n, "real_tokens": sum(len(r) for rows in sides for r in rows),
               "padded_tokens": 0}
        for j, rows in enumerate(parts):
            x, m = pad_rows(rows, pad_id)
            out[f"part{j}_ids"], out[f"part{j}_mask"] = torch.from_numpy(x), torch.from_numpy(m)
            out["padded_tokens"] += int(x.size)
        if items[0].score is not None:
            out["scores"] = torch.tensor([it.score for it in items], dtype=torch.float32)
        else:  # the ranking loss leaves out candidates that repeat a right answer's text
            out["keys"] = text_keys([r for rows in sides for r in rows])
        return out
    return collate


def sharing_pairs(items: list[PairItem]) -> int:
    """How many examples share their first or second side's tokens with another example."""
    first, second = Counter(tuple(it.sides[0]) for it in items), Counter(tuple(it.sides[1]) for it in items)
    return sum(first[tuple(it.sides[0])] > 1 or second[tuple(it.sides[1])] > 1 for it in items)


def text_keys(rows: list[list[int]]) -> torch.Tensor:
    """A 63-bit key per row of token ids, the same in every process (Python's str hash is salted
    per process, and a distributed update compares the keys of every rank)."""
    return torch.tensor([int.from_bytes(hashlib.blake2b(array("q", r).tobytes(), digest_size=8).digest(), "little") >> 1
                         for r in rows], dtype=torch.int64)


def _batch_loss(loss) -> Callable:
    """A loss of embeddings as the loop's loss of (module, batch): a scored-pair loss works per batch."""
    def loss_fn(module, batch: dict) -> torch.Tensor:
        return loss(module(*side_inputs(batch)).float(), batch)
    return loss_fn


cosent_loss = _batch_loss(LOSSES["cosent"])  # CoSENT on one batch of scored pairs


def start_embedder(source: str, texts: list[str], opts: TrainOptions, policy) -> Embedder:
    """The model to train: an embedding directory's encoder, pooling and normalisation (a plain
    encoder: mean pooling), or `tiny`; fp32 weights, the loop's autocast doing the casting."""
    cfg = read_embedding_config(source, start=True) if source != "tiny" else {"encoder_dir": "tiny", "pooling": "mean",
                                                                  "normalize": False, "max_seq_length": None,
                                                                  "lowercase": False}
    encoder, tokenizer, _ = start_encoder(cfg["encoder_dir"], texts, max_length=opts.max_length, seed=opts.seed)
    pooling = Pooling(mode=cfg["pooling"], normalize=cfg["normalize"])
    emb = Embedder(encoder=encoder, tokenizer=tokenizer, pooling=pooling, precision="fp32", device=str(policy.device),
                   max_length=opts.max_length or cfg["max_seq_length"], lowercase=cfg["lowercase"])
    emb.policy = policy  # evaluation during training runs in the training precision's autocast
    return emb


def choose_loss(train: list[Pair], config: EmbedTraining) -> str:
    """The loss `config` names, checked against the data; auto: CoSENT for scored pairs, else ranking."""
    scored = all(p.score is not None for p in train)
    name = config.loss if config.loss != "auto" else ("cosent" if scored else "ranking")
    if name in SCORED_LOSSES and not scored:
        raise ConfigError(f"--loss {name} takes scored pairs (s1, s2, score); these are pairs or triplets: "
                          "use --loss ranking (the default for them)", field="loss")
    if name in SCORED_LOSSES and len({p.score for p in train}) == 1:  # they order pairs by score: none to order
        raise ConfigError(f"every training pair has the same score: --loss {name} learns from pairs scored apart and "
                          "would learn nothing; without the score column the pairs train with --loss ranking",
                          field="loss")
    if name == "ranking" and len({p.b for p in train}) == 1 and all(p.negative is None for p in train):
        # each anchor's answer is every other's: no other answer to tell it from, a loss of 0 from the start
        raise ConfigError(f"every training pair has the same second text ({quote(train[0].b, 40)}): the ranking loss "
                          "learns to tell a pair's answer from the others' and would learn nothing; give pairs "
                          "with different answers, or triplets")
    if config.symmetric and name != "ranking":
        raise ConfigError("--symmetric applies to the ranking loss (pairs and triplets)", field="symmetric")
    if config.pairs_per_step is not None and name != "ranking":
        raise ConfigError("--pairs-per-step applies to the ranking loss; scored pairs are batched by "
                          "--max-tokens", field="pairs_per_step")
    return name


def typical_pair(items: list[PairItem]) -> int:
    """Padded tokens of a pair of median length (sides x the longer side)."""
    lengths = sorted(len(it) for it in items)
    return lengths[len(lengths) // 2]


def check_update(opts: TrainOptions, items: list[PairItem], world: int, given: int | None) -> None:
    """A ConfigError when the update `given` --max-tokens (None: training sized it, always to hold
    two) makes holds fewer than two pairs of a typical length: both losses compare each pair with
    the others of its update, and one alone gives a loss of 0."""
    if given is None:
        return
    typical = typical_pair(items)
    accum = opts.grad_accum or 1
    per_update = opts.max_tokens * accum * world
    if per_update < 2 * typical:
        need = math.ceil(2 * typical / (accum * world))
        raise ConfigError(f"--max-tokens {given}: an update holds {per_update // typical} pair"
                          f"{'s' * (per_update // typical != 1)} of a typical {typical} tokens; the loss compares each "
                          f"pair with the others of its update, so it needs at least 2: give --max-tokens {need} or "
                          "more", field="max_tokens")


def default_pairs_per_step(n_pairs: int) -> int:
    """The ranking loss's update: MAX_PAIRS_PER_STEP in-batch negatives, fewer on a small data set so
    an epoch still has MIN_STEPS_PER_EPOCH updates (a power of two, at least 16 pairs)."""
    fit_in = max(16, 2 ** int(math.log2(max(1, n_pairs // MIN_STEPS_PER_EPOCH))))
    return max(2, min(MAX_PAIRS_PER_STEP, fit_in))


def size_ranking_update(opts: TrainOptions, items: list[PairItem], pairs: int, device, world: int) -> TrainOptions:
    """An update of about `pairs` pairs over every rank, in as few micro-batches of at most the
    device's token budget (or --max-tokens) as hold them, or in --grad-accum of them when set:
    the gradient cache joins them."""
    budget = opts.max_tokens or default_budget("train", device)
    need = math.ceil(pairs * _mean_length(items) / world)  # padded tokens of this rank's share of an update
    accum = opts.grad_accum if opts.grad_accum is not None else max(1, math.ceil(need / budget))
    micro = max(max(len(it) for it in items), math.ceil(need / accum))
    # --grad-accum alone sets the micro-batches: each is then 1/N of the update, past the device's
    # default budget if need be; a --max-tokens given caps them (held_pairs says what that leaves)
    if opts.grad_accum is None or opts.max_tokens is not None:
        micro = min(budget, micro)
    return dataclasses.replace(opts, max_tokens=micro, grad_accum=accum)


def held_pairs(o: TrainOptions, items: list[PairItem], pairs: int, world: int) -> int:
    """About how many of the `pairs` asked an update of `o` holds: a micro-batch is padded to its
    longest pair, and training's length buckets make that about each pair's own length, so a pair
    of length L is in one of max_tokens // L pairs (a mean over the tokens counted fractions of a
    pair no micro-batch holds); their mean over the pairs, times the update's micro-batches and ranks."""
    each = sum(max(1, o.max_tokens // len(it)) for it in items) / max(1, len(items))
    return min(pairs, round(each * o.grad_accum * world))


def _mean_length(items: list[PairItem]) -> float:
    return sum(len(it) for it in items) / max(1, len(items))


def size_scored_update(opts: TrainOptions, items: list[PairItem], device, world: int) -> TrainOptions:
    """With --max-tokens and --grad-accum unset: the update training's defaults size from the data,
    cut into MIXED_MICRO_BATCHES micro-batches. The batcher sorts pairs by length within a bucket
    so a micro-batch pads little but holds pairs of one length (in STS-B, mostly of one genre);
    CoSENT ranked within it never learns to order short pairs against long ones. Ranked over
    micro-batches of different buckets, it does. With --grad-accum alone, each micro-batch is
    what training's defaults would size (said here, so the cache is decided on it)."""
    if opts.max_tokens is not None:
        return dataclasses.replace(opts, grad_accum=opts.grad_accum or 1)
    # at least two pairs of a typical length: the loss ranks a pair against the others of its update
    two = math.ceil(2 * typical_pair(items) / world)
    update = max(update_tokens([len(it) for it in items], device, world), two)
    if opts.grad_accum is not None:
        return dataclasses.replace(opts, max_tokens=update)
    micro = max(max(len(it) for it in items), update // MIXED_MICRO_BATCHES)
    return dataclasses.replace(opts, max_tokens=micro, grad_accum=max(1, update // micro, math.ceil(two / micro)))


def graph_bytes(encoder: torch.nn.Module, tokens: int, length: float, policy) -> float | None:
    """About what the graphs of `tokens` padded tokens, in rows `length` long, hold for the
    backward pass (fp32 twice autocast's); None where the encoder's shape is unknown."""
    cfg = getattr(encoder, "config", None)
    layers, hidden, heads = (getattr(cfg, k, None) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    if not (layers and hidden and heads):
        return None
    width = hidden + (getattr(cfg, "intermediate_size", None) or 4 * hidden)
    per_token = layers * (GRAPH_BYTES_PER_UNIT * width + GRAPH_BYTES_PER_SCORE * heads * length)
    return tokens * per_token * (1 if policy.amp_dtype is not None else 2)


def needs_cache(opts: TrainOptions, asked: int | None, device, world: int, graph: float | None = None,
                avail: int | None = None) -> bool:
    """A gradient cache when the update's micro-batches hold more tokens than --max-tokens (`asked`)
    or, unset, the device's budget, or run on several processes; otherwise each micro-batch keeps
    its graph until the loss is taken. On a CPU with --max-tokens unset, the budget is a speed
    choice, not memory's: there the graphs are kept while they (`graph` bytes) fit in a share of
    the memory available (`avail` bytes), and the cache's second forward pass is saved."""
    if world > 1:
        return True
    budget = asked or default_budget("train", device)
    if (opts.max_tokens or budget) * (opts.grad_accum or 1) <= budget:
        return False
    if memory_decides(opts, asked, device, world) and graph is not None and avail is not None:
        return graph > avail * GRAPH_MEMORY_SHARE
    return True


def memory_decides(opts: TrainOptions, asked: int | None, device, world: int) -> bool:
    """Whether memory, not the device's budget, decides the cache: one process on a CPU, with
    --max-tokens unset (`asked`), and an update over the budget."""
    budget = default_budget("train", device)
    return (asked is None and world == 1 and torch.device(device).type == "cpu"
            and (opts.max_tokens or budget) * (opts.grad_accum or 1) > budget)


def step_of(loss: Callable, run: Run, cache: bool, graph: float | None) -> Callable:
    """The update's step. Where memory let it keep its graphs, the heap is trimmed once it holds
    more than one update's graphs past what it held after the last trim: glibc keeps the freed
    blocks of micro-batches whose shapes change, and resident memory would otherwise grow with
    the run (bench/results/ranking_qa_trim.md). A trim after every update would fault the next
    update's pages in again each time: the slack lets the heap keep what the next update reuses."""
    trim = GrowthTrim(int(graph)) if not cache and graph is not None else None
    return functools.partial(gathered_step, loss=loss, dist=run.dist, cache=cache, trim=trim)


def cache_words(o: TrainOptions, cache: bool, graph: float | None, avail: int | None) -> str:
    """What the run line says of the gradient cache, and of the memory that decided it."""
    if o.grad_accum == 1:
        return "no gradient cache needed"
    if graph is None or avail is None:
        return "gradient cache on" if cache else "no gradient cache needed"
    size = f"{graph / 2**30:.1f} GiB" if graph >= 2**30 else f"{graph / 2**20:.0f} MiB"
    if cache:
        return f"gradient cache on: the update's graphs (about {size}) would take over a third of the memory available"
    return f"no gradient cache: the update's graphs (about {size}) fit in the memory available"


def train_embedder(train: list[Pair], dev: list[Pair] | None, *, model: str = "tiny", out_dir: str,
                   options: TrainOptions | None = None, config: EmbedTraining | None = None,
                   log_fn: Callable[[str], None] | None = print) -> Embedder:
    """Fine-tune a sentence embedder: CoSENT (or AnglE) on scored pairs, an in-batch-negatives
    ranking loss on pairs and triplets. The best by dev score (Spearman for scored dev pairs,
    MRR@10 for pairs) is saved to `<out_dir>/model` as a sentence-transformers directory."""
    check_train_options(options, "embed")
    if config is not None and not isinstance(config, EmbedTraining):
        raise ConfigError(f"config takes an EmbedTraining (the loss and its settings), got {type(config).__name__}"
                          + ("; TrainOptions go to options=" if isinstance(config, TrainOptions) else ""))
    check_pairs(train, "train", 2)  # both losses compare a pair with others
    if dev is not None:
        check_pairs(dev, "dev", SCORED)
    config = config or EmbedTraining()
    try:
        name = choose_loss(train, config)
    except ConfigError as e:  # the API names EmbedTraining's fields; the command line keeps the flags
        raise in_api_words(e, config) from None
    loss = LOSSES[name] if not config.symmetric else functools.partial(LOSSES[name], symmetric=True)

    def setup(run: Run) -> Plan:
        emb = start_embedder(run.source, [t for p in train for t in _texts(p)], run.opts, run.policy)
        dims = config.matryoshka_dims
        if dims and max(dims) > emb.dim:
            raise ConfigError(f"--matryoshka-dims: {max(dims)} is larger than the model's {emb.dim} dimensions",
                              field="matryoshka_dims")
        if name == "angle" and any(d % 2 for d in (emb.dim, *(dims or ()))):
            raise ConfigError("--loss angle reads each embedding as complex numbers: it needs even sizes "
                              f"(the model's {emb.dim}{f', --matryoshka-dims {list(dims)}' if dims else ''})",
                              field="loss")
        # the whole vector is always trained: a size list without it left the full embedding (what
        # embed and the server give unless asked for fewer dimensions) out of the loss
        # a resume compares the sizes asked (the model's own is added alike to both runs)
        asked = sorted(set(dims), reverse=True) if dims else None
        added = bool(dims) and emb.dim not in dims
        dims = sorted({*dims, emb.dim}, reverse=True) if dims else None
        fn = matryoshka(loss, dims) if dims else loss
        items, cut = items_of(emb, train, scored=name in SCORED_LOSSES)
        what = "scored training pairs" if name in SCORED_LOSSES else (
            "training triplets" if train[0].negative is not None else "training pairs")
        # --loss ranking on scored pairs: every pair trains as a match, the low-scored ones too; asked
        # for, so not refused, but said, where a slip would otherwise train unseen
        if name not in SCORED_LOSSES and train[0].score is not None:
            mid = (min(p.score for p in train) + max(p.score for p in train)) / 2
            low = sum(p.score < mid for p in train)
            what += (f" (scored; the ranking loss takes every pair as a match whatever its score: {low} scored in the "
                     "lower half of the range train as matches too)")
        run.log(f"{len(train)} {what}; {NAMES[name]}{' (symmetric)' if config.symmetric else ''}"
                f"{f', Matryoshka dims {dims}' if dims else ''}"
                f"{f' ({emb.dim}, the whole vector, added)' if added else ''}; {emb.module.pooling.mode} pooling, "
                f"max length {emb.max_length}" + (f" ({cut} texts longer, cut there)" if cut else ""))
        table = DEFAULTS if name in SCORED_LOSSES else RANKING_DEFAULTS
        # the dev data's kind decides; without any, the training data's (the run's record names it)
        metric = "Spearman" if all(p.score is not None for p in dev or train) else "MRR@10"
        kind = "scored pairs" if train[0].score is not None else "triplets" if train[0].negative is not None else "pairs"
        course = {"training data of": kind, "--loss": name, "--symmetric": config.symmetric,
                  "--matryoshka-dims": asked,
                  "--pairs-per-step": config.pairs_per_step}
        plan = Plan(model=emb, items=items, collate=make_collate(emb.tokenizer.pad_token_id or 0),
                    loss_fn=_batch_loss(fn), defaults=for_encoder(table, emb.module.encoder), targets=lambda it: 1,
                    metric=metric, untrained_hint="a lower --lr or more training pairs may help", course=course,
                    min_update=1 if kind == "triplets" else 2,  # a triplet ranks its own negative
                    option_fields=TRAIN_FIELDS)
        world, device = run.dist.world, run.policy.device
        longer = [len(it) / len(it.sides) for it in items]
        length = sum(x * x for x in longer) / max(1, sum(longer))  # a token's row length, on average

        def cache_for(o: TrainOptions) -> tuple[bool, float | None, int | None]:
            """(the cache, and where memory decides it: the update's graphs and the memory available)."""
            if not memory_decides(o, run.opts.max_tokens, device, world):
                return needs_cache(o, run.opts.max_tokens, device, world), None, None
            tokens = (o.max_tokens or default_budget("train", device)) * o.grad_accum
            graph, avail = graph_bytes(emb.module.encoder, tokens, length, run.policy), available_bytes()
            return needs_cache(o, None, device, world, graph, avail), graph, avail

        longest = max(len(it) for it in items)
        hold_longest(run, longest, f"--max-tokens {run.opts.max_tokens} is below the longest training item, "  # as ner, re
                                   f"{longest} tokens (its texts together): one must fit in a micro-batch (give "
                                   f"--max-tokens {longest} or more)")
        if name in SCORED_LOSSES:
            plan.options = o = size_scored_update(run.opts, items, device, world)
            if o.grad_accum > 1 or world > 1:
                plan.step = step_of(fn, run, *cache_for(o)[:2])
            each = f"on each of {world} processes " if world > 1 else ""
            if o.grad_accum > 1:
                run.log(f"{NAMES[name]} over each update: {o.grad_accum} micro-batches of {o.max_tokens} tokens "
                        f"{each}from different length buckets, ranked together")
            else:  # said too where --max-tokens was given: how the loss ranks is the run's choice to know
                run.log(f"{NAMES[name]} over each update: one micro-batch of {o.max_tokens} tokens {each}(pairs of "
                        "about one length; --grad-accum 2 or more ranks pairs of different lengths together)")
        else:
            pairs = config.pairs_per_step or default_pairs_per_step(len(items))
            if pairs > len(items):  # an update holds the data at most: sized (and its rate scaled) for that
                if config.pairs_per_step:
                    run.log(f"--pairs-per-step {pairs} is more than the {len(items)} training pairs: an update "
                            "holds them all")
                pairs = len(items)
            plan.options = o = size_ranking_update(run.opts, items, pairs, device, world)
            cache, graph, avail = cache_for(o)
            plan.step = step_of(fn, run, cache, graph)
            shared = sharing_pairs(items)
            if shared:
                run.log(f"{shared} of the {len(items)} training pairs share their anchor or positive text with "
                        "another: where both are in one update, neither is counted as the other's negative")
            held = held_pairs(o, items, pairs, world)
            # a budget given (or measured) that cut the micro-batches (not one above what the update needs)
            capped = run.opts.max_tokens is not None and o.max_tokens >= run.opts.max_tokens
            short = ""
            if held < pairs * (1 if capped else 0.9):  # a few short: a sized update's padding, within "about"
                short = (f" of the {pairs} {'asked' if config.pairs_per_step else 'sized for'}: "
                         + ("--max-tokens x --grad-accum holds no more" if capped
                            else "its micro-batches pad to their longest pair") + ";")
            run.log(f"ranking update: about {held if short else pairs} pairs ({short.lstrip()}{short and ' '}"
                    f"{o.grad_accum} micro-batch{'es' if o.grad_accum > 1 else ''} of {o.max_tokens} tokens"
                    f"{f' on each of {world} processes' if world > 1 else ''}); "
                    + cache_words(o, cache, graph, avail))
        check_update(plan.options, items, world, run.opts.max_tokens)
        return plan

    return fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=Embedder.load, log_fn=log_fn)


def _texts(p: Pair) -> tuple[str, ...]:
    return (p.a, p.b) if p.negative is None else (p.a, p.b, p.negative)


def items_of(emb: Embedder, train: list[Pair], scored: bool) -> tuple[list[PairItem], int]:
    """Token ids of every side, and how many texts were cut at the max length; a scored pair keeps
    its score."""
    k = 3 if not scored and all(p.negative is not None for p in train) else 2
    sides, cut = [], 0
    for j in range(k):
        ids, n = emb.tokenize([_texts(p)[j] for p in train])
        sides.append(ids)
        cut += n
    return [PairItem(tuple(s[i] for s in sides), p.score if scored else None) for i, p in enumerate(train)], cut
