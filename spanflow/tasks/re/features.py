"""Relation extraction as CasRel cascade tagging: token features, sampled-subject
collation, masked BCE losses."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from spanflow.batching.align import Encoded, encode_texts
from spanflow.batching.collate import pad_rows
from spanflow.data.examples import ReExample
from spanflow.errors import counted

log = logging.getLogger("spanflow")


@dataclass
class ReFeature:
    """One model input; token indices count the leading [CLS]."""

    index: int
    input_ids: list[int]
    # subject (start, end) -> [(relation id, object start, object end)]
    subjects: dict[tuple[int, int], list[tuple[int, int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)


def token_span(enc: Encoded, span: tuple[int, int], limit: int) -> tuple[int, int] | None:
    """First and last token (input positions, +1 for [CLS]) of the words a char span overlaps; None
    where those are not all within the first `limit` tokens (a span the cut crosses would train the
    model on the part of it that is left)."""
    toks = [j for j, (a, b) in enumerate(enc.offsets) if a < span[1] and b > span[0]]
    if not toks:
        return None
    first, last = word_tokens(enc, toks[0], toks[-1])
    return (first + 1, last + 1) if last < limit else None


def char_span(enc: Encoded, tokens: tuple[int, int]) -> tuple[int, int]:
    """The characters a token span (input positions, as token_span gives) covers, as the model
    extracts it: over the characters its tokens are widened to (a variation selector after a word).
    Its end is the furthest of its tokens' (a token of white space alone is left empty where the
    word before it ends, before what that word was widened to)."""
    starts = enc.starts or [a for a, _ in enc.offsets]
    ends = enc.ends or [b for _, b in enc.offsets]
    return starts[tokens[0] - 1], max(ends[tokens[0] - 1:tokens[1]])


def word_tokens(enc: Encoded, first: int, last: int) -> tuple[int, int]:
    """Tokens first..last (indices into `enc`'s tokens) widened to whole words: the model's subjects
    and objects are words, as NER's entities are, so a span starting or ending inside a word ('Th' of
    'The') is trained on and read as those words."""
    while first > 0 and not enc.first[first]:
        first -= 1
    n = len(enc.ids)
    # a token of white space alone (SentencePiece's lone `▁`, left empty) starts no word, and is no part of one
    while last + 1 < n and not enc.first[last + 1] and enc.offsets[last + 1][0] < enc.offsets[last + 1][1]:
        last += 1
    return first, last


def word_span(enc: Encoded, first: int, last: int) -> tuple[int, int]:
    """The characters of the words tokens first..last (indices into `enc`'s tokens) touch."""
    first, last = word_tokens(enc, first, last)
    return char_span(enc, (first + 1, last + 1))


def off_tokens(text: str, enc: Encoded, *found: tuple[tuple[int, int], tuple[int, int]], verb: str) -> str | None:
    """For a triple's subject and object, each (its char span, its token span): None where both start
    and end on the model's words, else the first that does not, said as `'Ford' in '...Stanford...'
    <verb> 'Stanford'`."""
    for (a, b), tokens in found:
        u, v = char_span(enc, tokens)
        if (u, v) != (a, b):
            return f"{text[a:b]!r} in {text[max(0, a - 30):b + 30]!r} {verb} {text[u:v]!r}"
    return None


def input_features(encs: list[Encoded], tokenizer, max_length: int) -> list[ReFeature]:
    """Model inputs ([CLS] tokens [SEP], cut at max_length) without labels."""
    cls, sep, limit = tokenizer.cls_token_id, tokenizer.sep_token_id, max_length - 2
    return [ReFeature(i, [cls] + enc.ids[:limit] + [sep]) for i, enc in enumerate(encs)]


def prepare_features(examples: list[ReExample], tokenizer, rel2id: dict[str, int], *, max_length: int,
                     encs: list[Encoded] | None = None, quiet: bool = False) -> list[ReFeature]:
    """Features for training/eval; texts longer than max_length are cut, and counted, and so are
    subjects and objects that do not start and end on words (they train as the words they touch).
    `quiet`: no warning of them (a measurement's sample, cut at the lengths it sweeps, trains nothing)."""
    encs = encs or encode_texts(tokenizer, [e.text for e in examples])
    limit = max_length - 2
    cut = lost = unknown = moved = 0
    first = None
    feats = input_features(encs, tokenizer, max_length)
    for f, ex, enc in zip(feats, examples, encs):
        cut += len(enc.ids) > limit
        for s, rel, o in ex.triples:
            if rel not in rel2id:
                unknown += 1
                continue
            ts, to = token_span(enc, s, limit), token_span(enc, o, limit)
            if ts is None or to is None:
                lost += 1
                continue
            f.subjects.setdefault(ts, []).append((rel2id[rel], *to))
            off = off_tokens(ex.text, enc, (s, ts), (o, to), verb="trains as")
            moved += off is not None
            first = first or off
    said = ([f"{counted(cut, 'text')} longer than {max_length} tokens {'was' if cut == 1 else 'were'} cut; "
             f"{counted(lost, 'triple')} fell outside the tokens kept and {'is' if lost == 1 else 'are'} not trained "
             "on"] if cut or lost else [])
    said += [f"{counted(unknown, 'triple')} with a relation outside the model's set"] if unknown else []
    said += [f"{counted(moved, 'triple')} with a subject or object that does not start and end on the model's "
             f"words (found inside a word, or offsets that cut one): the first, {first}"] if moved else []
    if said and not quiet:
        log.warning("; ".join(said))
    return feats


def trained_triples(feats: list[ReFeature]) -> int:
    """The triples features hold: those the model trains on."""
    return sum(len(objs) for f in feats for objs in f.subjects.values())


def make_collate(pad_id: int, num_relations: int, *, seed: int = 0, all_subjects: bool = False,
                 pad_multiple: int = 1, limit: int | None = None):
    """Collate features; the object stage gets one sampled gold subject per text (the
    paper's recipe) or, with all_subjects, every gold subject. Sampling is seeded by the
    batch's contents, so it repeats exactly for a seed, across resumes too. `pad_multiple`,
    `limit`: see batching.collate.round_up."""

    def fn(feats: list[ReFeature]) -> dict:
        # numpy, not torch: this runs in the prefetch thread (see batching.collate.pad_rows)
        ids, att = pad_rows([f.input_ids for f in feats], pad_id, pad_multiple, limit)
        (B, T), R = ids.shape, num_relations
        sub = np.zeros((B, T, 2), dtype=np.float32)
        rng = np.random.default_rng([seed] + [f.index for f in feats])
        rows, starts, ends, objs = [], [], [], []
        for b, f in enumerate(feats):
            for (s, e) in f.subjects:
                sub[b, s, 0] = sub[b, e, 1] = 1
            keys = list(f.subjects)
            if not keys:
                continue
            chosen = keys if all_subjects else [keys[rng.integers(len(keys))]]
            for s, e in chosen:
                rows.append(b)
                starts.append(s)
                ends.append(e)
                objs.append(f.subjects[(s, e)])
        content = att.copy()
        content[:, 0] = 0
        content[np.arange(B), att.sum(1) - 1] = 0  # [CLS] and [SEP] are never subjects or objects
        obj = np.zeros((len(rows), T, R, 2), dtype=np.float32)
        for k, triples in enumerate(objs):
            for r, os_, oe in triples:
                obj[k, os_, r, 0] = obj[k, oe, r, 1] = 1
        lens = [len(f) for f in feats]
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(att),
                "content_mask": torch.from_numpy(content), "sub_labels": torch.from_numpy(sub),
                "obj_rows": torch.tensor(rows, dtype=torch.long), "obj_starts": torch.tensor(starts, dtype=torch.long),
                "obj_ends": torch.tensor(ends, dtype=torch.long), "obj_labels": torch.from_numpy(obj),
                "n_targets": int(content.sum()), "real_tokens": sum(lens), "padded_tokens": max(lens) * B}

    return fn


def make_casrel_loss(*, label_smoothing: float = 0.0):
    """Subject BCE (start + end) plus object BCE summed over relations (as the paper does: a
    mean over hundreds of relations starves the object taggers), summed over content tokens.
    Label smoothing pulls the 0/1 targets to eps/2 and 1 - eps/2."""

    def smooth(y: torch.Tensor) -> torch.Tensor:
        return y * (1 - label_smoothing) + label_smoothing / 2 if label_smoothing else y

    def loss_fn(model, batch: dict) -> torch.Tensor:
        h = model(batch["input_ids"], batch["attention_mask"])  # (B, T, H)
        head = getattr(model, "module", model).head  # DDP wraps the model; the head's params are still reduced
        mask = batch["content_mask"].float()  # (B, T)
        sub = F.binary_cross_entropy_with_logits(head.subjects(h).float(), smooth(batch["sub_labels"]),
                                                 reduction="none")
        loss = (sub.sum(-1) * mask).sum()
        rows = batch["obj_rows"]
        if rows.numel():
            logits = head.objects(h, rows, batch["obj_starts"], batch["obj_ends"]).float()  # (N, T, R, 2)
            obj = F.binary_cross_entropy_with_logits(logits, smooth(batch["obj_labels"]), reduction="none")
            loss = loss + (obj.sum((-1, -2)) * mask[rows]).sum()
        return loss

    return loss_fn


casrel_loss = make_casrel_loss()


def feature_relations(feats: list[ReFeature]) -> list[set[int]]:
    """The relation ids each feature holds (for relation-aware sampling)."""
    return [{r for objs in f.subjects.values() for r, _, _ in objs} for f in feats]
