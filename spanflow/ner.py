"""The NER Python API: NerModel (load, predict, evaluate, save) and train_ner."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from torch import nn

from spanflow.data.examples import NerExample, Span
from spanflow.batching.align import check_window, encode_texts, merge_windows, windows_for
from spanflow.batching.collate import SERVE_PAD_MULTIPLE, round_up
from spanflow.errors import ConfigError, ModelDirError
from spanflow.inference.tagging import tag_texts, tag_windows, word_starts
from spanflow.models.directory import check_names, config_int, fill_head, load_model_dir, save_model_dir
from spanflow.interop.hf import bio_rows, load_token_classifier, select_rows, token_classification_config
from spanflow.models.encoder import encoder_max_length, start_encoder
from spanflow.batching.sampling import rarity_weights
from spanflow.models.heads import HEAD_TYPES, EncoderWithHead, make_tagging_head
from spanflow.tasks.bio import decode_spans
from spanflow.tasks.metrics import agreement_f1, format_table, span_prf
from spanflow.tasks.registry import records_response
from spanflow.tasks.ner import (bio_label_list, class_weight_tensor, make_collate, make_ner_loss, pack_examples,
                                prepare_windows, single_line, window_kinds, window_targets)
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.setup import best_model, is_model_dir, prepare_encoder, start_run, warn_unseen
from spanflow.training.distributed import Dist, shard_gather
from spanflow.training.defaults import TaskDefaults, fill_defaults, for_encoder
from spanflow.training.options import TrainOptions
from spanflow.training.outdir import claim_out_dir
from spanflow.training.precision import Policy, default_infer_tokens, resolve_policy

log = logging.getLogger("spanflow")

# measured for time to dev F1 (docs/defaults.md): wnut17 with all-MiniLM-L6-v2, resume_ner with tiny
DEFAULTS = {"pretrained": TaskDefaults(lr=5e-5, head_lr=1e-3, epochs=10),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
DEFAULT_HEAD = "crf"


class NerModel:
    """An encoder with a token-tagging head (softmax or CRF), its tokenizer and label set."""

    task = "ner"

    def __init__(self, *, encoder, tokenizer, labels: list[str], max_length: int, stride: int = 32,
                 head=None, head_type: str = "softmax", policy: Policy | None = None, window: int | None = None,
                 id2label: list[str] | None = None, lines: bool = True):
        self.tokenizer = tokenizer
        self.labels = sorted(labels)
        # the BIO tag of each output of the head: spanflow's own order, or an imported classifier's
        self.id2label = list(id2label) if id2label else bio_label_list(self.labels)
        self.max_length, self.stride, self.head_type = max_length, stride, head_type
        # inference window: as long as the longest training window, not the encoder's limit,
        # so long documents are read in pieces of the length the model learned from
        self.window = min(window or max_length, max_length)
        # a model trained on single-line texts reads each line of an input on its own
        self.lines = lines
        head = head or make_tagging_head(head_type, hidden_size=encoder.config.hidden_size, id2label=self.id2label)
        self.module = EncoderWithHead(encoder, head)
        self.policy = policy or resolve_policy()
        self.module.to(self.policy.device).eval()  # inference mode until a training loop says otherwise

    @classmethod
    def load(cls, path: str, *, device: str = "auto", precision: str = "auto", native: bool = True) -> "NerModel":
        """Load a spanflow NER model directory, or a Hugging Face token-classification directory
        (no network, no pickle); `native`: see models.encoder.load_encoder."""
        if token_classification_config(path) is not None:
            return cls.from_hf(path, device=device, precision=precision)
        cfg, encoder, tokenizer, head_state = load_model_dir(path, "ner", native=native)
        labels, head_type = check_names(cfg, "labels", path), cfg.get("head", "softmax")
        if head_type not in HEAD_TYPES:
            raise ModelDirError(f"{path}: unknown head {str(head_type)[:50]!r}; this spanflow knows "
                                f"{', '.join(HEAD_TYPES)}")
        id2label = cfg.get("id2label") or bio_label_list(labels)
        head = make_tagging_head(head_type, hidden_size=encoder.config.hidden_size, id2label=id2label)
        max_length = config_int(cfg, "max_length", path)
        return cls(encoder=encoder, tokenizer=tokenizer, labels=labels, max_length=max_length,
                   stride=config_int(cfg, "stride", path, 32), head=fill_head(head, head_state, path),
                   head_type=head_type, policy=resolve_policy(precision, device),
                   window=config_int(cfg, "window", path, max_length), id2label=id2label,
                   lines=cfg.get("lines", True) is not False)

    @classmethod
    def from_hf(cls, path: str, *, device: str = "auto", precision: str = "auto", bio: bool = False) -> "NerModel":
        """A Hugging Face AutoModelForTokenClassification directory as a softmax NER model: its own
        label ids (any BIO-like scheme) for inference, or, with `bio`, its classifier carried over
        onto spanflow's BIO label rows (to continue training)."""
        encoder, tokenizer, classifier, tags = load_token_classifier(path)
        labels = sorted({t[2:] for t in tags if t != "O"})
        id2label = bio_label_list(labels) if bio else tags
        head = make_tagging_head("softmax", hidden_size=encoder.config.hidden_size, id2label=id2label)
        if bio:
            classifier = select_rows(classifier, bio_rows(tags, id2label))
        head.proj.load_state_dict(classifier.state_dict())
        max_length = encoder_max_length(encoder, tokenizer)
        return cls(encoder=encoder, tokenizer=tokenizer, labels=labels, max_length=max_length, head=head,
                   head_type="softmax", policy=resolve_policy(precision, device), id2label=id2label)

    def save(self, path: str) -> None:
        """Write a self-contained model directory."""
        save_model_dir(path, encoder=self.module.encoder, tokenizer=self.tokenizer, head=self.module.head,
                       config={"task": "ner", "labels": self.labels, "max_length": self.max_length,
                               "window": self.window, "stride": self.stride, "lines": self.lines,
                               "tag_scheme": "bio", "head": self.head_type,
                               **({} if self.id2label == bio_label_list(self.labels) else {"id2label": self.id2label})})

    @property
    def network(self) -> nn.Module:
        """The module whose `.encoder` reads the texts (inference.backend compiles it)."""
        return self.module

    def set_window(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Override the inference window (tokens, special tokens included) and its overlap."""
        self.window, self.stride = check_window(max_length or self.window, self.stride if stride is None else stride,
                                                self.max_length)

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None,
                       on_batch: Callable | None = None, words: Iterable | None = None) -> Iterator[list[Span]]:
        """Spans for each text, in order, with bounded memory for inputs of any size; `words`:
        each text's own tokens as char offsets (or None), which spans then start and end on."""
        max_tokens = max_tokens or default_infer_tokens(self.policy.device)
        return tag_texts(self.module, self.tokenizer, texts, id2label=self.id2label, max_length=self.window,
                         stride=self.stride, max_tokens=max(max_tokens, self.window), policy=self.policy,
                         on_batch=on_batch, words=words, lines=self.lines)

    def predict(self, texts: list[str], *, max_tokens: int | None = None,
                words: list | None = None) -> list[list[Span]]:
        """Character-offset (start, end, label) spans for each text (`words`: see predict_stream)."""
        return list(self.predict_stream(texts, max_tokens=max_tokens, words=words))

    @staticmethod
    def read_labelled(path: str, *, fmt: str | None = None, scheme: str | None = None) -> list[NerExample]:
        """Labelled NER data (CoNLL, JSONL or DocBin) for evaluate."""
        from spanflow.data.io import read_ner

        return read_ner(path, fmt=fmt, scheme=scheme)

    @staticmethod
    def format_metrics(m: dict) -> str:
        """The evaluate table: P/R/F1 per label and overall."""
        return format_table(m)

    @staticmethod
    def output_record(text: str, spans: list[Span]) -> dict:
        """The record of one text, from predict, the server and the API alike."""
        return {"text": text, "entities": [{"start": s, "end": e, "label": lab, "text": text[s:e]}
                                           for s, e, lab in spans]}

    def units(self, texts: list[str]):
        """(windows with their word starts, window lengths, encodings): the server's units."""
        encs = encode_texts(self.tokenizer, texts)
        wins = windows_for(encs, max_length=self.window, stride=self.stride, cls_id=self.tokenizer.cls_token_id,
                           sep_id=self.tokenizer.sep_token_id, lines=self.lines)
        return [(w, word_starts(encs, w)) for w in wins], [len(w) for w in wins], encs

    def run_batch(self, units: list) -> list:
        """Label ids of each window (a CRF head decodes over its word starts)."""
        return tag_windows(self.module, [w for w, _ in units], [f for _, f in units], self.tokenizer.pad_token_id,
                           self.policy, SERVE_PAD_MULTIPLE, self.max_length)

    def assemble(self, texts: list[str], units: list, results: list, encs) -> list[list[Span]]:
        """Each text's spans from its windows' labels."""
        per_text: list[list] = [[] for _ in texts]
        for (w, _), pred in zip(units, results):
            per_text[w.example].append((w.start, w.end, pred))
        return [decode_spans(enc, merge_windows(len(enc.ids), per_text[i]), self.id2label) if enc.ids else []
                for i, enc in enumerate(encs)]

    def evaluate(self, examples: list[NerExample], *, max_tokens: int | None = None, dist: Dist = Dist()) -> dict:
        """Entity-level exact-span P/R/F1, overall and per label (sharded over ranks under torchrun)."""
        pred = shard_gather(examples, lambda ex: self.predict([e.text for e in ex], max_tokens=max_tokens,
                                                              words=[e.words for e in ex]), dist)
        return span_prf([e.spans for e in examples], pred)


def start_model(model: str, train: list[NerExample], labels: list[str], opts: TrainOptions,
                policy: Policy, head_type: str | None = None, fresh_head: str = DEFAULT_HEAD) -> NerModel:
    """The model to train: a spanflow NER model to continue (its head unless another is
    asked for), or a fresh head on a local encoder or `tiny`; head_type None: as found, else `fresh_head`."""
    if is_model_dir(model) or token_classification_config(model) is not None:
        start = (NerModel.load(model, device=str(policy.device), native=False) if is_model_dir(model)
                 else NerModel.from_hf(model, device=str(policy.device), bio=True))
        if start.labels != sorted(labels):
            raise ConfigError(f"{model} was trained on labels {start.labels}, the data has {sorted(labels)}")
        if head_type is not None and start.head_type != head_type:
            raise ConfigError(f"{model} has a {start.head_type} head; --head {head_type} was asked for")
        head, bio = start.module.head, bio_label_list(start.labels)
        if start.id2label != bio:  # an imported classifier's label order: its rows onto spanflow's BIO labels
            head.proj = select_rows(head.proj, bio_rows(start.id2label, bio))
        return NerModel(encoder=start.module.encoder, tokenizer=start.tokenizer, labels=labels,
                        max_length=start.max_length, stride=start.stride, head=head,
                        head_type=start.head_type, policy=policy)
    encoder, tokenizer, max_length = start_encoder(model, [e.text for e in train], max_length=opts.max_length,
                                                   seed=opts.seed)
    if opts.max_tokens is not None and opts.max_tokens < max_length:
        raise ConfigError(f"--max-tokens {opts.max_tokens} is below the max length {max_length}: "
                          "one full window must fit in a batch")
    return NerModel(encoder=encoder, tokenizer=tokenizer, labels=labels, max_length=max_length,
                    stride=opts.stride, head_type=head_type or fresh_head, policy=policy)


def train_ner(train: list[NerExample], dev: list[NerExample] | None, *, model: str = "tiny", out_dir: str,
              options: TrainOptions | None = None, head: str | None = None,
              log_fn: Callable[[str], None] = print) -> NerModel:
    """Train an NER model; the best one (by dev F1) is saved to `<out_dir>/model` and returned.

    `head` is "crf" (BIO-constrained CRF, Viterbi decoding) or "softmax" (per-token
    cross-entropy); None: a new model takes DEFAULT_HEAD, a spanflow model keeps its head.
    Options left unset take the task's DEFAULTS for the starting point, sized to the data.
    """
    with claim_out_dir(out_dir):
        return _train_ner(train, dev, model=model, out_dir=out_dir, options=options, head=head, log_fn=log_fn)


def _train_ner(train: list[NerExample], dev: list[NerExample] | None, *, model: str = "tiny", out_dir: str,
               options: TrainOptions | None = None, head: str | None = None,
               log_fn: Callable[[str], None] = print) -> NerModel:
    labels = sorted({lab for e in train for _, _, lab in e.spans})
    if not labels:
        raise ConfigError("the training data has no entities")
    run = start_run(options, model=model, out_dir=out_dir, log_fn=log_fn)
    opts, dist, policy, log_fn = run.opts, run.dist, run.policy, run.log
    if dev:
        warn_unseen(labels, {lab for e in dev for _, _, lab in e.spans}, "labels", log_fn)
    # label smoothing and class weights are softmax recipes: asking for one picks that head for a new model
    softmax_recipe = bool(opts.label_smoothing or opts.class_weights is not None)
    nm = start_model(run.source, train, labels, opts, policy, head,
                      fresh_head="softmax" if softmax_recipe else DEFAULT_HEAD)
    if nm.head_type == "crf" and softmax_recipe:
        raise ConfigError("--label-smoothing and --class-weights apply to the softmax head, not the CRF")
    prepare_encoder(nm.module.encoder, opts, log_fn)
    label2id = {lab: i for i, lab in enumerate(nm.id2label)}
    defaults = for_encoder(DEFAULTS, nm.module.encoder)
    texts = pack_examples(train, opts.pack if opts.pack is not None else defaults.pack, span=opts.pack_span,
                          seed=opts.seed)
    nm.lines = single_line(texts)
    windows = prepare_windows(texts, nm.tokenizer, label2id, max_length=nm.max_length, stride=nm.stride,
                              lines=nm.lines)
    nm.window = min(nm.max_length, round_up(max(len(w) for w in windows), 8))
    log_fn(f"{len(train)} training texts" + (f" ({len(texts)} after joining neighbours)" if len(texts) < len(train)
                                             else "") + f" -> {len(windows)} windows; labels: {', '.join(labels)}")
    opts = fill_defaults(opts, defaults, lengths=[len(w) for w in windows], device=policy.device,
                         world=dist.world, log=log_fn)
    weights = rarity_weights(window_kinds(windows, nm.id2label), opts.oversample) if opts.oversample else None
    loss_fn = make_ner_loss(label_smoothing=opts.label_smoothing,
                            class_weights=class_weight_tensor(opts.class_weights, windows, nm.id2label))
    evaluate = (lambda module: nm.evaluate(dev, dist=dist)) if dev else None
    hooks = TaskHooks(collate=make_collate(nm.tokenizer.pad_token_id), loss_fn=loss_fn, evaluate=evaluate,
                      save_model=nm.save, targets=window_targets)
    summary = train_loop(nm.module, windows, hooks, opts=opts, policy=policy, out_dir=out_dir, log=log_fn,
                         dist=dist, weights=weights)
    return best_model(summary, out_dir, lambda d: NerModel.load(d, device=str(policy.device), precision=policy.name),
                      nm)


class NerTask:
    """Named entities as character-offset spans: the `ner` entry of the task registry."""

    name, summary, route, request_field, trains = "ner", "named entities (spans)", "/v1/ner", "texts", True
    exports = ("hf",)
    # --precision auto keeps a reduced precision whose entities agree with fp32's to this F1
    agreement_name, precision_gate = "entity F1", 0.98

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return agreement_f1(ref, got)

    def claims(self, path: str) -> bool:
        """A Hugging Face token-classification directory runs as an NER model."""
        return token_classification_config(path) is not None

    def export(self, model: NerModel, to: str, out: str, *, lossy: bool = False, log_fn=print) -> str:
        from spanflow.interop.hf import export_hf

        return export_hf(model, out, lossy=lossy, log_fn=log_fn)

    def add_train_args(self, p) -> None:
        p.add_argument("--format", choices=["conll", "jsonl", "docbin"], help="input format (detected when omitted)")
        p.add_argument("--scheme", help="tag scheme of CoNLL input: bio, iob1, bioes, bmes (detected when omitted)")
        p.add_argument("--strict", action="store_true",
                       help="reject inside tags with no opening tag instead of repairing")
        p.add_argument("--head", choices=list(HEAD_TYPES), default=None,
                       help="a BIO-constrained CRF with Viterbi decoding (default for a new model), or a per-token "
                            "softmax; a spanflow model keeps its head unless this is given")

    def train_from_args(self, a, options: TrainOptions) -> str:
        from spanflow.data.io import read_ner

        train = read_ner(a.train, fmt=a.format, scheme=a.scheme, strict=a.strict)
        dev = read_ner(a.dev, fmt=a.format, scheme=a.scheme, strict=a.strict) if a.dev else None
        model = train_ner(train, dev, model=a.model, out_dir=a.out, options=options, head=a.head)
        return f"model saved to {a.out}/model (labels: {', '.join(model.labels)})"

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> NerModel:
        return NerModel.load(path, device=device, precision=precision)

    def read_labelled(self, path: str, *, fmt: str | None = None, scheme: str | None = None, **_) -> list:
        return NerModel.read_labelled(path, fmt=fmt, scheme=scheme)

    def workload(self, model: str, data: str, *, mode: str, policy: Policy, sample: int, seed: int = 0, **_):
        from spanflow.data.io import read_ner
        from spanflow.tasks.ner import ner_loss
        from spanflow.tasks.registry import Workload
        from spanflow.tuning.measures import f1_at_length

        examples = read_ner(data)[:sample]
        labels = sorted({lab for e in examples for *_, lab in e.spans})
        if mode == "train":
            nm = start_model(model, examples, labels, TrainOptions(max_tokens=10**9, seed=seed), policy)
        else:
            nm = NerModel.load(model, device=str(policy.device), precision=policy.name)
        l2i = {lab: i for i, lab in enumerate(nm.id2label)}
        limit = nm.max_length

        def windows(L):
            return prepare_windows(examples, nm.tokenizer, l2i, max_length=min(L, limit), stride=nm.stride,
                                   lines=nm.lines)

        return Workload(nm.module, windows, make_collate(nm.tokenizer.pad_token_id), ner_loss, limit,
                        f1_at_length(nm, examples) if mode == "infer" else None)

    response = staticmethod(records_response)


TASK = NerTask()
