"""The relation-extraction Python API: ReModel (load, predict, evaluate, save) and train_re."""
from __future__ import annotations

from collections.abc import Callable

import torch

from spanflow.batching.align import Encoded, check_window, encode_texts
from spanflow.batching.prefetch import chunked
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import SERVE_PAD_MULTIPLE
from spanflow.data.examples import ReExample, Triple
from spanflow.errors import ConfigError
from spanflow.models.casrel import CasRelHead, CasRelModel, extract
from spanflow.models.directory import check_names, config_int, fill_head, load_model_dir, save_model_dir
from spanflow.batching.sampling import rarity_weights
from spanflow.models.encoder import start_encoder
from spanflow.tasks.registry import records_response
from spanflow.tasks.re import feature_relations, input_features, make_casrel_loss, make_collate, prepare_features
from spanflow.tasks.re_metrics import re_metrics
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.setup import best_model, is_model_dir, prepare_encoder, start_run, warn_unseen
from spanflow.training.distributed import Dist, shard_gather
from spanflow.training.defaults import TaskDefaults, fill_defaults, for_encoder
from spanflow.training.options import TrainOptions
from spanflow.training.outdir import claim_out_dir

# measured for time to dev F1 (docs/defaults.md): webnlg with all-MiniLM-L6-v2
DEFAULTS = {"pretrained": TaskDefaults(lr=1e-4, head_lr=2e-3, epochs=12),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
from spanflow.training.precision import Policy, default_infer_tokens, resolve_policy


class ReModel:
    """An encoder with a CasRel head, its tokenizer and relation set."""

    task = "re"

    def __init__(self, *, encoder, tokenizer, relations: list[str], max_length: int, threshold: float = 0.5,
                 head: CasRelHead | None = None, policy: Policy | None = None):
        self.tokenizer, self.relations = tokenizer, list(relations)
        self.rel2id = {r: i for i, r in enumerate(self.relations)}
        self.max_length, self.threshold = max_length, threshold
        head = head or CasRelHead(hidden_size=encoder.config.hidden_size, num_relations=len(self.relations))
        self.module = CasRelModel(encoder, head)
        self.policy = policy or resolve_policy()
        self.module.to(self.policy.device).eval()  # inference mode until a training loop says otherwise

    @classmethod
    def load(cls, path: str, *, device: str = "auto", precision: str = "auto", native: bool = True) -> "ReModel":
        """Load a spanflow RE model directory; `native`: see models.encoder.load_encoder."""
        cfg, encoder, tokenizer, head_state = load_model_dir(path, "re", native=native)
        relations = check_names(cfg, "relations", path)
        head = CasRelHead(hidden_size=encoder.config.hidden_size, num_relations=len(relations))
        return cls(encoder=encoder, tokenizer=tokenizer, relations=relations,
                   max_length=config_int(cfg, "max_length", path), threshold=cfg.get("threshold", 0.5),
                   head=fill_head(head, head_state, path), policy=resolve_policy(precision, device))

    @property
    def network(self) -> torch.nn.Module:
        """The module whose `.encoder` reads the texts (inference.backend compiles it)."""
        return self.module

    def save(self, path: str) -> None:
        save_model_dir(path, encoder=self.module.encoder, tokenizer=self.tokenizer, head=self.module.head,
                       config={"task": "re", "relations": self.relations, "max_length": self.max_length,
                               "threshold": self.threshold})

    def set_window(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Read texts up to `max_length` tokens (at most the trained length); RE does not slide windows."""
        if stride is not None:
            raise ConfigError("--stride applies to NER; relation extraction reads each text whole, "
                              "up to --max-length tokens")
        if max_length is not None:
            self.max_length, _ = check_window(max_length, 0, self.max_length)

    def predict(self, texts: list[str], *, max_tokens: int | None = None,
                threshold: float | None = None, on_batch: Callable | None = None) -> list[list[Triple]]:
        """Char-offset triples ((s, e), relation, (s, e)) for each text, in input order;
        `on_batch(0, real_tokens, padded_tokens)` after each batch."""
        return self.predict_encoded(encode_texts(self.tokenizer, list(texts)), max_tokens=max_tokens,
                                    threshold=threshold, on_batch=on_batch)

    def predict_encoded(self, encs: list[Encoded], *, max_tokens: int | None = None,
                        threshold: float | None = None, pad_multiple: int = 1,
                        on_batch: Callable | None = None) -> list[list[Triple]]:
        """predict() for texts already tokenized with encode_texts (the server tokenizes once;
        it also rounds padded lengths up to `pad_multiple`)."""
        thr = self.threshold if threshold is None else threshold
        feats = input_features(encs, self.tokenizer, self.max_length)
        collate = make_collate(self.tokenizer.pad_token_id or 0, len(self.relations), pad_multiple=pad_multiple,
                               limit=self.max_length)
        out: list[list[Triple]] = [[] for _ in feats]
        budget = max(max_tokens or default_infer_tokens(self.policy.device), self.max_length)
        self.module.eval()
        dev = self.policy.device
        for batch in token_budget_batches([len(f) for f in feats], budget, shuffle=False):
            t = collate([feats[i] for i in batch])
            if on_batch:
                on_batch(0, sum(len(feats[i]) for i in batch), t["input_ids"].numel())
            with torch.inference_mode(), self.policy.autocast():
                res = extract(self.module, t["input_ids"].to(dev), t["content_mask"].to(dev),
                              t["attention_mask"].to(dev), thr)
            for row, s, e, r, os_, oe in zip(*[x.tolist() for x in res]):  # host sync: one per batch
                enc = encs[batch[row]]
                subj = (enc.starts[s - 1], enc.ends[e - 1])
                obj = (enc.starts[os_ - 1], enc.ends[oe - 1])
                trip = (subj, self.relations[r], obj)
                if trip not in out[batch[row]]:
                    out[batch[row]].append(trip)
        return out

    def predict_stream(self, texts, *, max_tokens: int | None = None, on_batch: Callable | None = None,
                       chunk_size: int = 4096):
        """Triples for each text, in order, a chunk of texts at a time (bounded memory)."""
        for chunk in chunked(texts, chunk_size):
            yield from self.predict(chunk, max_tokens=max_tokens, on_batch=on_batch)
            if on_batch:
                on_batch(len(chunk), 0, 0)

    @staticmethod
    def read_labelled(path: str, **_) -> list[ReExample]:
        """Labelled relation data (CasRel JSON or JSONL) for evaluate; NER format options do not apply."""
        from spanflow.data.io import read_re

        return read_re(path)

    @staticmethod
    def output_record(text: str, triples: list[Triple]) -> dict:
        """The line predict writes: head/type/tail objects with the head and tail text."""
        return {"text": text, "relations": [
            {"head": list(h), "type": r, "tail": list(t), "head_text": text[h[0]:h[1]], "tail_text": text[t[0]:t[1]]}
            for h, r, t in triples]}

    def units(self, texts: list[str]):
        """(encodings, token lengths, None): the server's units, tokenized once."""
        encs = encode_texts(self.tokenizer, texts)
        return encs, [min(len(e.ids) + 2, self.max_length) for e in encs], None

    def run_batch(self, units: list) -> list:
        return self.predict_encoded(units, max_tokens=10**9, pad_multiple=SERVE_PAD_MULTIPLE)

    def assemble(self, texts: list[str], units: list, results: list, ctx) -> list:
        return results

    @staticmethod
    def format_metrics(m: dict) -> str:
        """The evaluate table per relation, then the partial-match line."""
        from spanflow.tasks.metrics import format_table

        p = m["partial"]
        return (format_table({**m, "per_label": m["per_relation"]}).replace("label  ", "relation")
                + f"\npartial (last-word) match: precision {p['precision']:.4f} recall {p['recall']:.4f} f1 {p['f1']:.4f}")

    def evaluate(self, examples: list[ReExample], *, max_tokens: int | None = None, dist: Dist = Dist()) -> dict:
        """Exact and partial triple P/R/F1 (sharded over ranks under torchrun)."""
        pred = shard_gather([e.text for e in examples], lambda t: self.predict(t, max_tokens=max_tokens), dist)
        gold = [e.string_triples() for e in examples]
        got = [{(e.text[s[0]:s[1]], r, e.text[o[0]:o[1]]) for s, r, o in p} for e, p in zip(examples, pred)]
        return re_metrics(gold, got)


def train_re(train: list[ReExample], dev: list[ReExample] | None, *, model: str = "tiny", out_dir: str,
             options: TrainOptions | None = None, relations: list[str] | None = None, all_subjects: bool = True,
             log_fn: Callable[[str], None] = print) -> ReModel:
    """Train a CasRel model; the best by dev exact F1 is saved to `<out_dir>/model` and returned.

    The object stage trains on every gold subject of a text; `all_subjects=False` samples one
    per text and step, as the CasRel paper does (slower to learn, docs/defaults.md)."""
    with claim_out_dir(out_dir):
        return _train_re(train, dev, model=model, out_dir=out_dir, options=options, relations=relations,
                         all_subjects=all_subjects, log_fn=log_fn)


def _train_re(train: list[ReExample], dev: list[ReExample] | None, *, model: str = "tiny", out_dir: str,
              options: TrainOptions | None = None, relations: list[str] | None = None, all_subjects: bool = True,
              log_fn: Callable[[str], None] = print) -> ReModel:
    relations = relations or sorted({r for e in train for _, r, _ in e.triples})
    if not relations:
        raise ConfigError("the training data has no located triples")
    run = start_run(options, model=model, out_dir=out_dir, log_fn=log_fn)
    opts, dist, policy, log_fn, source = run.opts, run.dist, run.policy, run.log, run.source
    if dev:
        warn_unseen(relations, {r for e in dev for _, r, _ in e.triples} | {r for e in dev for _, r, _ in e.unlocated},
                    "relations", log_fn)
    if is_model_dir(source):
        start = ReModel.load(source, device=str(policy.device), native=False)
        if start.relations != relations:
            raise ConfigError(f"{source} was trained on other relations than the data has")
        encoder, tokenizer, head, max_length = start.module.encoder, start.tokenizer, start.module.head, start.max_length
    else:
        encoder, tokenizer, max_length = start_encoder(source, [e.text for e in train], max_length=opts.max_length,
                                                       seed=opts.seed)
        head = None
    if opts.class_weights is not None:
        raise ConfigError("--class-weights applies to NER; relation extraction takes --oversample instead")
    rm = ReModel(encoder=encoder, tokenizer=tokenizer, relations=relations, max_length=max_length, head=head,
                 policy=policy)
    prepare_encoder(rm.module.encoder, opts, log_fn)
    feats = prepare_features(train, tokenizer, rm.rel2id, max_length=max_length)
    log_fn(f"{len(train)} training texts, {sum(len(e.triples) for e in train)} triples, {len(relations)} relations"
           + (" (object stage on all gold subjects)" if all_subjects else " (one sampled subject per text)"))
    opts = fill_defaults(opts, for_encoder(DEFAULTS, encoder), lengths=[len(f) for f in feats], device=policy.device,
                         world=dist.world, log=log_fn)
    hooks = TaskHooks(collate=make_collate(tokenizer.pad_token_id or 0, len(relations), seed=opts.seed,
                                           all_subjects=all_subjects),
                      loss_fn=make_casrel_loss(label_smoothing=opts.label_smoothing),
                      evaluate=(lambda m: rm.evaluate(dev, dist=dist)) if dev else None, save_model=rm.save,
                      targets=lambda f: len(f) - 2)
    weights = rarity_weights(feature_relations(feats), opts.oversample) if opts.oversample else None
    summary = train_loop(rm.module, feats, hooks, opts=opts, policy=policy, out_dir=out_dir, log=log_fn,
                         dist=dist, weights=weights)
    return best_model(summary, out_dir, lambda d: ReModel.load(d, device=str(policy.device), precision=policy.name),
                      rm)


class ReTask:
    """Relation triples between character spans (CasRel): the `re` entry of the task registry."""

    name, summary, route, request_field, trains = "re", "relation triples (CasRel)", "/v1/relations", "texts", True
    # --precision auto keeps a reduced precision whose triples agree with fp32's to this F1
    agreement_name, precision_gate = "triple F1", 0.98

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        from spanflow.tasks.metrics import agreement_f1

        return agreement_f1(ref, got)

    def add_train_args(self, p) -> None:
        p.add_argument("--subjects", choices=["all", "sample"], default="all",
                       help="train the object stage on every gold subject of a text (default), or on one sampled "
                            "per text and step (the CasRel paper's recipe)")

    def train_from_args(self, a, options: TrainOptions) -> str:
        from spanflow.data.formats.casrel import read_relations_vocab
        from spanflow.data.io import read_re

        train = read_re(a.train)
        dev = read_re(a.dev) if a.dev else None
        model = train_re(train, dev, model=a.model, out_dir=a.out, options=options,
                         relations=read_relations_vocab(a.train), all_subjects=a.subjects == "all")
        return f"model saved to {a.out}/model ({len(model.relations)} relations)"

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> ReModel:
        return ReModel.load(path, device=device, precision=precision)

    def read_labelled(self, path: str, **_) -> list:
        return ReModel.read_labelled(path)

    def workload(self, model: str, data: str, *, mode: str, policy: Policy, sample: int, seed: int = 0, **_):
        from spanflow.data.io import read_re
        from spanflow.tasks.re import casrel_loss
        from spanflow.tasks.registry import Workload
        from spanflow.tuning.measures import f1_at_length

        examples = read_re(data)[:sample]
        if mode == "train":
            enc, tok, max_length = start_encoder(model, [e.text for e in examples], max_length=None, seed=seed)
            rels = sorted({r for e in examples for _, r, _ in e.triples})
            rm = ReModel(encoder=enc, tokenizer=tok, relations=rels, max_length=max_length, policy=policy)
        else:
            rm = ReModel.load(model, device=str(policy.device), precision=policy.name)
        limit = rm.max_length

        def features(L):
            return prepare_features(examples, rm.tokenizer, rm.rel2id, max_length=min(L, limit))

        return Workload(rm.module, features, make_collate(rm.tokenizer.pad_token_id or 0, len(rm.relations), seed=seed),
                        casrel_loss, limit, f1_at_length(rm, examples) if mode == "infer" else None)

    response = staticmethod(records_response)


TASK = ReTask()
