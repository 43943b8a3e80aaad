"""Per task and mode, a `measure(max_tokens, max_length) -> figures` function over a data sample."""
from __future__ import annotations

import functools

import torch

from spanflow.batching.batcher import token_budget_batches
from spanflow.training.optim import build_optimizer
from spanflow.training.options import TrainOptions
from spanflow.tuning.probe import run_probe


def _train_step(module, items, collate, loss_fn, policy, optimizer):
    def step(batch):
        b = collate([items[i] for i in batch])
        t = {k: v.to(policy.device) for k, v in b.items() if torch.is_tensor(v)}
        with policy.autocast():
            loss = loss_fn(module, t) / max(1, b["n_targets"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _f1_at_length(task_model, examples):
    """quality(L): F1 on the labelled sample with the model's max length set to L (cached)."""
    limit = task_model.max_length

    @functools.lru_cache(maxsize=None)
    def quality(L):
        task_model.max_length = min(L, limit)
        try:
            return task_model.evaluate(examples)["f1"]
        finally:
            task_model.max_length = limit

    return quality


def _model_measure(module, items_at, collate, loss_fn, quality, *, mode, policy, opt, seed):
    """measure(budget, max_length, seconds) for a token model: training steps or forward passes."""

    def measure(b, L, seconds=5.0):
        items = items_at(L)
        lengths = [len(w) for w in items]
        if mode == "train":
            module.train()
            step = _train_step(module, items, collate, loss_fn, policy, opt)
            batches = token_budget_batches(lengths, b, seed=seed)
        else:
            module.eval()

            def step(batch):
                t = collate([items[i] for i in batch])
                with torch.inference_mode(), policy.autocast():
                    module(t["input_ids"].to(policy.device), t["attention_mask"].to(policy.device))
            batches = token_budget_batches(lengths, b, shuffle=False)
        out = run_probe(step, batches, lengths, device=policy.device, max_seconds=seconds)
        out["quality"] = quality(L) if mode == "infer" else None
        return out

    return measure


def ner_measure(model: str, examples, *, mode: str, policy, seed: int = 0):
    from spanflow.ner import NerModel, _start_model
    from spanflow.tasks.ner import make_collate, ner_loss, prepare_windows

    labels = sorted({lab for e in examples for *_, lab in e.spans})
    if mode == "train":
        nm = _start_model(model, examples, labels, TrainOptions(max_tokens=10**9, seed=seed), policy)
    else:
        nm = NerModel.load(model, device=str(policy.device), precision=policy.name)
    l2i = {lab: i for i, lab in enumerate(nm.id2label)}
    limit = nm.max_length
    opt = build_optimizer(nm.module, TrainOptions(lr=1e-5), policy.device) if mode == "train" else None

    @functools.lru_cache(maxsize=None)
    def windows(L):
        return prepare_windows(examples, nm.tokenizer, l2i, max_length=min(L, limit), stride=nm.stride)

    quality = _f1_at_length(nm, examples)

    collate = make_collate(nm.tokenizer.pad_token_id)

    return _model_measure(nm.module, windows, collate, ner_loss, quality, mode=mode, policy=policy, opt=opt,
                          seed=seed), limit


def embed_measure(model: str, texts: list[str], *, policy, precision: str):
    from spanflow.embedder import Embedder, cosines

    emb = Embedder.load(model, precision=precision, device=str(policy.device))
    limit = emb.max_length

    def at_length(L):
        emb.set_max_length(min(L, limit))

    @functools.lru_cache(maxsize=None)
    def ref():
        at_length(limit)
        return emb.encode(texts)

    @functools.lru_cache(maxsize=None)
    def quality(L):
        r = ref()
        at_length(L)
        return float(cosines(r, emb.encode(texts)).mean())

    @functools.lru_cache(maxsize=None)
    def token_ids(L):  # once per length, not once per budget
        at_length(L)
        return emb.tokenize(texts)[0]

    def measure(b, L, seconds=5.0):
        q = quality(L)
        ids = token_ids(L)
        lengths = [len(x) for x in ids]

        def step(batch):
            emb._forward(emb.model, ids, batch, True)
        out = run_probe(step, token_budget_batches(lengths, b, shuffle=False), lengths, device=policy.device,
                        max_seconds=seconds)
        out["quality"] = q
        return out

    return measure, limit


def re_measure(model: str, examples, *, mode: str, policy, seed: int = 0):
    from spanflow.models.encoder import encoder_max_length, load_encoder
    from spanflow.re import ReModel
    from spanflow.tasks.re import casrel_loss, make_collate, prepare_features

    if mode == "train":
        enc, tok = load_encoder(model)
        rels = sorted({r for e in examples for _, r, _ in e.triples})
        rm = ReModel(encoder=enc, tokenizer=tok, relations=rels, max_length=encoder_max_length(enc, tok),
                     policy=policy)
    else:
        rm = ReModel.load(model, device=str(policy.device), precision=policy.name)
    limit = rm.max_length
    collate = make_collate(rm.tokenizer.pad_token_id or 0, len(rm.relations), seed=seed)
    opt = build_optimizer(rm.module, TrainOptions(lr=1e-5), policy.device) if mode == "train" else None

    quality = _f1_at_length(rm, examples)

    @functools.lru_cache(maxsize=None)
    def features(L):  # once per length, not once per budget
        return prepare_features(examples, rm.tokenizer, rm.rel2id, max_length=min(L, limit))

    return _model_measure(rm.module, features, collate, casrel_loss, quality, mode=mode, policy=policy, opt=opt,
                          seed=seed), limit
