"""A task spanflow does not ship, written only against its public interfaces: one label per
text (mean-pooled encoder + linear layer). tests/test_task_interface.py registers it and
drives it through the CLI and the server; nothing else in the package knows it exists."""
from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

from spanflow.tasks.api import (SERVE_PAD_MULTIPLE, DataError, Plan, TaskDefaults, Workload, check_names,
                                check_train_options, config_int,
                                fill_head, fit, for_encoder, full_batches, infer_tokens, load_model_dir, pad_rows,
                                parse_json, quality_at_length, read_lines, records_response, register,
                                resolve_policy, save_model_dir, start_encoder, token_budget_batches)

DEFAULTS = {"pretrained": TaskDefaults(lr=5e-5, head_lr=1e-3, epochs=5),
            "tiny": TaskDefaults(lr=3e-3, head_lr=None, epochs=10, patience=0)}


class Ids(list):
    """A text's token ids and its label id; len() is its token length, as the loop expects."""

    label = 0


def read_textcat(path: str) -> list[tuple[str, str]]:
    out = []
    for lineno, line in read_lines(path):
        if line.strip():
            rec = parse_json(line, path, lineno)
            if not (isinstance(rec, dict) and isinstance(rec.get("text"), str) and isinstance(rec.get("label"), str)):
                raise DataError('expected {"text": str, "label": str}', path=path, line=lineno)
            out.append((rec["text"], rec["label"]))
    return out


class Classifier(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1))


def collate(items: list, pad_id: int) -> dict:
    x, m = pad_rows(items, pad_id)
    lens = [len(i) for i in items]
    return {"input_ids": torch.from_numpy(x), "attention_mask": torch.from_numpy(m),
            "labels": torch.tensor([i.label for i in items]), "n_targets": len(items), "real_tokens": sum(lens),
            "padded_tokens": max(lens) * len(lens)}


def loss_fn(model, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]).float(), batch["labels"],
                                       reduction="sum")


class TextcatModel:
    task = "textcat"

    def __init__(self, encoder, tokenizer, labels, max_length, head=None, policy=None):
        self.tokenizer, self.labels, self.max_length = tokenizer, list(labels), max_length
        self.limit = max_length
        self.module = Classifier(encoder, head or nn.Linear(encoder.config.hidden_size, len(self.labels)))
        self.policy = policy or resolve_policy()
        self.module.to(self.policy.device).eval()

    @classmethod
    def load(cls, path, *, device="auto", precision="auto"):
        cfg, encoder, tokenizer, state = load_model_dir(path, "textcat")
        labels = check_names(cfg, "labels", path)
        head = fill_head(nn.Linear(encoder.config.hidden_size, len(labels)), state, path)
        return cls(encoder, tokenizer, labels, config_int(cfg, "max_length", path), head,
                   resolve_policy(precision, device))

    def save(self, path):
        save_model_dir(path, encoder=self.module.encoder, tokenizer=self.tokenizer, head=self.module.head,
                       config={"task": "textcat", "labels": self.labels, "max_length": self.limit})

    def encode(self, texts, labels=None):
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        out = [Ids(x) for x in ids]
        for item, lab in zip(out, labels or []):
            item.label = self.labels.index(lab)
        return out

    # the task-model interface
    def units(self, texts):
        items = self.encode(texts)
        return items, [len(i) for i in items], None

    def run_batch(self, units):
        x, m = pad_rows(units, self.tokenizer.pad_token_id, SERVE_PAD_MULTIPLE)
        with torch.inference_mode(), self.policy.autocast():
            logits = self.module(torch.from_numpy(x).to(self.policy.device), torch.from_numpy(m).to(self.policy.device))
        return [self.labels[i] for i in logits.argmax(-1).tolist()]

    def assemble(self, texts, units, results, ctx):
        return results

    def predict(self, texts, *, max_tokens=None):
        items = self.encode(texts)
        out = [None] * len(items)
        budget = max(max_tokens or infer_tokens(self.policy.device), self.max_length)
        with full_batches(budget, self.max_length):  # a bulk loop: its short batches share a few shapes
            for b in token_budget_batches([len(i) for i in items], budget, shuffle=False):
                for i, lab in zip(b, self.run_batch([items[i] for i in b])):
                    out[i] = lab
        return out

    def predict_stream(self, texts, *, max_tokens=None, on_batch=None):
        texts = list(texts)
        yield from self.predict(texts, max_tokens=max_tokens)
        if on_batch:
            on_batch(len(texts), 0, 0)

    @staticmethod
    def output_record(text, label):
        return {"text": text, "label": label}

    def evaluate(self, examples, *, max_tokens=None, **_):  # one process: no sharding over ranks
        pred = self.predict([t for t, _ in examples], max_tokens=max_tokens)
        acc = float(np.mean([p == g for p, (_, g) in zip(pred, examples)])) if examples else 0.0
        return {"f1": acc, "accuracy": acc, "n": len(examples)}

    @staticmethod
    def format_metrics(m):
        return f"accuracy {m['accuracy']:.4f} on {m['n']} texts"

    def set_max_length(self, max_length=None, stride=None):
        if max_length:
            self.max_length = min(max_length, self.limit)


def train_textcat(train, dev, *, model, out_dir, options=None, log_fn=print):
    check_train_options(options, "textcat")  # a field of other tasks' (stride, class_weights) is refused

    def setup(run):
        encoder, tokenizer, max_length = start_encoder(run.source, [t for t, _ in train],
                                                       max_length=run.opts.max_length, seed=run.opts.seed)
        tm = TextcatModel(encoder, tokenizer, sorted({lab for _, lab in train}), max_length, policy=run.policy)
        return Plan(model=tm, items=tm.encode([t for t, _ in train], [lab for _, lab in train]),
                    collate=lambda b: collate(b, tokenizer.pad_token_id), loss_fn=loss_fn,
                    defaults=for_encoder(DEFAULTS, encoder), targets=lambda i: 1)

    return fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=TextcatModel.load, log_fn=log_fn)


class TextcatTask:
    name, summary, route, request_field, trains = "textcat", "one label per text", "/v1/classify", "texts", True

    def add_train_args(self, p):
        pass

    def train_from_args(self, a, options):
        dev = read_textcat(a.dev) if a.dev else None
        model = train_textcat(read_textcat(a.train), dev, model=a.model, out_dir=a.out, options=options)
        return f"labels: {', '.join(model.labels)}"

    def load(self, path, *, device="auto", precision="auto"):
        return TextcatModel.load(path, device=device, precision=precision)

    def read_labelled(self, path, **_):
        return read_textcat(path)

    def workload(self, model, data, *, mode, policy, sample, **_):
        examples = read_textcat(data)[:sample]
        tm = TextcatModel.load(model, device=str(policy.device), precision=policy.name)

        def items(L):
            keep = tm.max_length
            tm.max_length = min(L, keep)
            try:
                return tm.encode([t for t, _ in examples], [lab for _, lab in examples])
            finally:
                tm.max_length = keep

        return Workload(tm.module, items, lambda b: collate(b, tm.tokenizer.pad_token_id), loss_fn, tm.max_length,
                        quality_at_length(tm, examples))

    response = staticmethod(records_response)


def write_examples(path, examples) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for text, label in examples:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    return str(path)


register(TextcatTask())
