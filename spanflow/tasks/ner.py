"""NER as token classification: BIO labels on first subwords, cross-entropy, span decoding."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spanflow.batching.align import IGNORE, bio_labels, encode_texts, windows_for
from spanflow.batching.collate import collate
from spanflow.data.examples import NerExample


def bio_label_list(entity_labels: list[str]) -> list[str]:
    """['O', 'B-A', 'I-A', 'B-B', ...] in a stable order."""
    return ["O"] + [f"{p}-{lab}" for lab in sorted(entity_labels) for p in ("B", "I")]


def prepare_windows(examples: list[NerExample], tokenizer, label2id: dict[str, int], *, max_length: int,
                    stride: int) -> list:
    """Labelled model windows for every example (long texts become several windows)."""
    encs = encode_texts(tokenizer, [e.text for e in examples])
    labels = [bio_labels(enc, e.spans, label2id) for enc, e in zip(encs, examples)]
    return windows_for(encs, max_length=max_length, stride=stride, cls_id=tokenizer.cls_token_id,
                       sep_id=tokenizer.sep_token_id, labels=labels)


def make_collate(pad_id: int):
    """Collate windows into tensors plus the host-side counts the loop reports."""

    def fn(windows: list) -> dict:
        batch = collate(windows, pad_id)
        lens = [len(w) for w in windows]
        batch["n_targets"] = sum(sum(1 for x in w.labels if x != IGNORE) for w in windows)
        batch["real_tokens"] = sum(lens)
        batch["padded_tokens"] = max(lens) * len(lens)
        return batch

    return fn


def ner_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy summed over labelled tokens (the loop divides by the step's count)."""
    logits = model(batch["input_ids"], batch["attention_mask"])  # (B, T, C)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(),
                           ignore_index=IGNORE, reduction="sum")


def window_targets(window) -> int:
    """Labelled tokens of a window: what its loss is summed over."""
    return sum(1 for x in window.labels if x != IGNORE)
