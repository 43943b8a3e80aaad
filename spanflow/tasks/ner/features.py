"""NER as token classification: BIO labels on first subwords, cross-entropy, span decoding."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from spanflow.batching.align import IGNORE, LINE_BREAK, encode_texts, windows_for
from spanflow.batching.collate import collate
from spanflow.data.examples import NerExample, join_examples
from spanflow.tasks.ner.bio import bio_labels, decode_spans
from spanflow.training.options import check_weights, parse_weights


def bio_label_list(entity_labels: list[str]) -> list[str]:
    """['O', 'B-A', 'I-A', 'B-B', ...] in a stable order."""
    return ["O"] + [f"{p}-{lab}" for lab in sorted(entity_labels) for p in ("B", "I")]


def pack_examples(examples: list[NerExample], share: float, *, span: float = 1.0,
                  seed: int = 0) -> list[NerExample]:
    """Join runs of consecutive texts into multi-sentence training texts.

    About `share` of the texts start a run that takes the following texts while the run is
    no longer than `span` times the longest single text (at 1, the trained window does not
    grow; longer packs put more sentences after other text); the rest stay alone. A model
    trained only on single sentences loses F1 on documents of many sentences, where every
    sentence but the first has context it never saw.
    """
    import random

    if share <= 0 or len(examples) < 2:
        return list(examples)
    rng = random.Random(seed)
    limit = span * max(len(e.text) for e in examples)
    out, i = [], 0
    while i < len(examples):
        j, n = i + 1, len(examples[i].text)
        if rng.random() < share:
            while j < len(examples) and n + 1 + len(examples[j].text) <= limit:
                n += 1 + len(examples[j].text)
                j += 1
        out.append(join_examples(examples[i:j]) if j > i + 1 else examples[i])
        i = j
    return out


def prepare_windows(examples: list[NerExample], tokenizer, label2id: dict[str, int], *, max_length: int,
                    stride: int, lines: bool = False, log: Callable[[str], None] | None = None) -> list:
    """Labelled model windows for every example (long texts become several windows;
    `lines`: see batching.align.windows_for). `log` gets a warning where entities do not
    start and end on the words the model tags, and so train as other spans."""
    encs = encode_texts(tokenizer, [e.text for e in examples], [e.words for e in examples])
    labels = [bio_labels(enc, e.spans, label2id) for enc, e in zip(encs, examples)]
    if log is not None:
        warn_moved(examples, encs, labels, label2id, log)
    return windows_for(encs, max_length=max_length, stride=stride, cls_id=tokenizer.cls_token_id,
                       sep_id=tokenizer.sep_token_id, labels=labels, lines=lines)


def moved_spans(examples: list[NerExample], encs: list, labels: list[list[int]], label2id: dict[str, int],
                verb: str = "trains as") -> tuple[int, str | None]:
    """How many of the examples' spans tags on words do not give back (a span that starts or ends
    inside a word, two in one word, one across a line break), and the first of them, said with
    `verb` and what its words give instead."""
    id2label = sorted(label2id, key=label2id.get)
    moved, first = 0, None
    for e, enc, lab in zip(examples, encs, labels):
        got = set(decode_spans(enc, lab, id2label))
        lost = [tuple(s) for s in e.spans if tuple(s) not in got]  # the API takes spans as lists too
        if lost:
            moved += len(lost)
            if first is None:
                s, t, kind = lost[0]
                over = [g for g in got if g[0] < t and s < g[1]]  # what the words it touches give
                first = (f"{e.text[s:t]!r} ({kind}) in {e.text[max(0, s - 30):t + 30]!r} {verb} "
                         + (" and ".join(f"{e.text[a:b]!r} ({k})" for a, b, k in sorted(over)) or "no entity"))
    return moved, first


def warn_moved(examples: list[NerExample], encs: list, labels: list[list[int]], label2id: dict[str, int],
               log: Callable[[str], None]) -> None:
    """One warning line where tags on words do not give an example's spans back (moved_spans):
    they train as the whole words they touch, or as one."""
    moved, first = moved_spans(examples, encs, labels, label2id)
    if moved:
        total = sum(len(e.spans) for e in examples)
        log(f"warning: {moved} of {total} training entities do not start and end on the words the model tags (the "
            f"tokenizer's, or the input's own tokens), and train as other spans; the first: {first}")


def make_collate(pad_id: int):
    """Collate windows into tensors plus host-side counts: those the loop reports, and the most
    labelled positions in a window (the CRF's steps)."""

    def fn(windows: list) -> dict:
        batch = collate(windows, pad_id)
        lens = [len(w) for w in windows]
        labelled = [sum(1 for x in w.labels if x != IGNORE) for w in windows]
        batch["n_targets"] = sum(labelled)
        batch["labelled_width"] = max([1, *labelled])  # the CRF's steps: its words, not the row's tokens
        batch["real_tokens"] = sum(lens)
        batch["padded_tokens"] = max(lens) * len(lens)
        return batch

    return fn


def make_ner_loss(*, label_smoothing: float = 0.0, class_weights: torch.Tensor | None = None):
    """The NER loss, summed over labelled tokens (the loop divides by the step's count).

    A softmax head takes cross-entropy, optionally label-smoothed and class-weighted; a
    CRF head takes the sequence negative log-likelihood of its word-initial tags.
    """

    def loss_fn(model: nn.Module, batch: dict) -> torch.Tensor:
        logits = model(batch["input_ids"], batch["attention_mask"])  # (B, T, C)
        head = getattr(model, "module", model).head  # DDP wraps the model; the head's params are still reduced
        if hasattr(head, "nll"):
            return head.nll(logits, batch["labels"], IGNORE, batch.get("labelled_width"))
        weight = class_weights.to(logits.device) if class_weights is not None else None
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), weight=weight,
                               ignore_index=IGNORE, reduction="sum", label_smoothing=label_smoothing)

    return loss_fn


ner_loss = make_ner_loss()


def class_weight_tensor(spec, windows: list, id2label: list[str]) -> torch.Tensor | None:
    """Per-label loss weights from `spec`: None, "auto" or {entity label or BIO label: weight}.

    "auto" weighs each label by (n / (C * count)) ** 0.5 (inverse square-root frequency,
    gentler than inverse frequency, which over-predicts rare types), rescaled so the
    average weight over training tokens is 1 and the loss keeps its scale.
    Given weights name an entity type (applies to its B- and I- tags), a BIO tag, or "O";
    labels not named weigh 1.
    """
    from spanflow.errors import ConfigError

    if spec is None:
        return None
    C = len(id2label)
    if spec == "auto":
        counts = torch.zeros(C)
        for w in windows:
            for x in w.labels:
                if x != IGNORE:
                    counts[x] += 1
        n = counts.sum()
        weights = (n / (C * counts.clamp(min=1))) ** 0.5
        weights = weights * n / (weights * counts).sum()
        return torch.where(counts > 0, weights, torch.ones(C))  # unseen labels never reach the loss
    if isinstance(spec, str):
        spec = parse_weights(spec)
    spec = check_weights(spec)  # as the options checked them: a dict may have changed since
    weights = torch.ones(C)
    for key, value in spec.items():
        hits = [i for i, lab in enumerate(id2label) if lab == key or lab[2:] == key]
        if not hits:
            types = sorted({lab[2:] for lab in id2label if lab != "O"})
            raise ConfigError(f"class weight for unknown label {key!r}; entity labels: {', '.join(types)} (or a BIO "
                              f"tag: {', '.join(id2label)})")
        weights[hits] = float(value)
    return weights


def window_kinds(windows: list, id2label: list[str]) -> list[set[str]]:
    """The entity types each window holds (for entity-aware sampling)."""
    return [{id2label[x][2:] for x in w.labels if x != IGNORE and id2label[x] != "O"} for w in windows]


def window_targets(window) -> int:
    """Labelled tokens of a window: what its loss is summed over."""
    return sum(1 for x in window.labels if x != IGNORE)


def single_line(examples: list[NerExample]) -> bool:
    """Whether every training text is one line: a model trained so reads each line of a
    longer input on its own."""
    return not any(LINE_BREAK.search(e.text) for e in examples)
