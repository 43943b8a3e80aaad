"""ReModel: an encoder with a CasRel head; load, predict, evaluate, save."""
from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from spanflow.batching.align import Encoded, check_window, encode_heads, encode_texts
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import SERVE_PAD_MULTIPLE
from spanflow.batching.prefetch import chunked
from spanflow.data.examples import ReExample, Triple, check_examples
from spanflow.errors import ConfigError, ModelDirError, as_path
from spanflow.models.directory import (
    check_names,
    config_int,
    fill_head,
    load_model_dir,
    save_model_dir,
)
from spanflow.models.encoder import keeps_rng
from spanflow.models.linear import full_batches
from spanflow.runtime.budget import infer_tokens
from spanflow.runtime.precision import load_auto
from spanflow.tasks.inputs import check_max_tokens, text_list, text_stream
from spanflow.tasks.metrics import format_table, with_unknown, with_warning
from spanflow.tasks.re.casrel import CasRelHead, CasRelModel, extract
from spanflow.tasks.re.features import input_features, make_collate, off_tokens, token_span, word_span
from spanflow.tasks.re.metrics import re_metrics
from spanflow.tasks.registry import autocast_twin, get as get_task
from spanflow.training.distributed import Dist, shard_gather
from spanflow.runtime.policy import Policy, resolve_policy

if TYPE_CHECKING:
    import pyarrow as pa


def check_threshold(threshold) -> float:
    """`threshold` if it is a probability strictly between 0 and 1."""
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0.0 < threshold < 1.0:
        raise ConfigError(f"threshold must be a number between 0 and 1, got {threshold!r:.60}")
    return float(threshold)


def _threshold(value, path: str) -> float:
    """spanflow.json's threshold, checked as check_threshold checks one given: a ModelDirError naming the file."""
    try:
        return check_threshold(value)
    except ConfigError as e:
        raise ModelDirError(f"{path}: {e} (in spanflow.json)") from None


SPECIAL_TOKENS = ("cls", "sep")  # what an input starts and ends with (padding falls back to id 0)


CHECK_CHUNK = 4096  # examples evaluate's span check tokenizes at a time


class ReModel:
    """An encoder with a CasRel head, its tokenizer and relation set."""

    task = "re"

    def __init__(self, *, encoder, tokenizer, relations: list[str], limit: int, max_length: int | None = None,
                 threshold: float = 0.5, head: CasRelHead | None = None, policy: Policy | None = None):
        self.tokenizer, self.relations = tokenizer, list(relations)
        self.rel2id = {r: i for i, r in enumerate(self.relations)}
        # limit: the length trained at; max_length: what inference reads (at most the limit)
        self.limit, self.threshold = limit, threshold
        self.max_length = min(max_length or limit, limit)
        self.truncated = 0  # texts cut at max_length so far (RE reads no windows): bulk predict says how many
        head = head or CasRelHead(hidden_size=encoder.config.hidden_size, num_relations=len(self.relations))
        self.module = CasRelModel(encoder, head)
        self.policy = policy or resolve_policy()
        self.module.to(self.policy.device).eval()  # inference mode until a training loop says otherwise

    @classmethod
    @keeps_rng
    def load(cls, path: str, *, device: str = "auto", precision: str = "auto") -> "ReModel":
        """Load a spanflow RE model directory. precision "auto" picks what `--precision auto` picks
        (runtime.precision.load_auto); "fp32" skips the check."""
        path = as_path(path, "ReModel.load")
        if precision == "auto":
            return load_auto(get_task(cls.task), path, device=device)
        cfg, encoder, tokenizer, head_state = load_model_dir(path, "re", SPECIAL_TOKENS)
        relations = check_names(cfg, "relations", path)
        head = CasRelHead(hidden_size=encoder.config.hidden_size, num_relations=len(relations))
        limit = config_int(cfg, "limit" if "limit" in cfg else "max_length", path)  # format 1: max_length
        # format 1's max_length was the limit; a format 2 model saved before it kept its own reads the limit
        return cls(encoder=encoder, tokenizer=tokenizer, relations=relations, limit=limit,
                   max_length=config_int(cfg, "max_length", path, limit) if "limit" in cfg else None,
                   threshold=_threshold(cfg.get("threshold", 0.5), path),
                   head=fill_head(head, head_state, path), policy=resolve_policy(precision, device))

    def save(self, path: str) -> None:
        """Write a self-contained model directory (the length it reads included)."""
        save_model_dir(path, encoder=self.module.encoder, tokenizer=self.tokenizer, head=self.module.head,
                       config={"task": "re", "relations": self.relations, "limit": self.limit,
                               "max_length": self.max_length, "threshold": self.threshold})

    def with_precision(self, precision: str, quantize: str | None = None) -> "ReModel":
        """This model in another precision, sharing its weights (see tasks.registry.autocast_twin)."""
        return autocast_twin(self, precision, quantize)

    def set_max_length(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Read texts up to `max_length` tokens (at most the trained length); RE does not slide windows."""
        if stride is not None:
            raise ConfigError("--stride applies to NER; relation extraction reads each text whole, "
                              "up to --max-length tokens")
        if max_length is not None:
            self.max_length, _ = check_window(max_length, 0, self.limit)

    def predict(self, texts: list[str] | str, *, max_tokens: int | None = None,
                threshold: float | None = None, on_batch: Callable | None = None) -> list[list[Triple]] | list[Triple]:
        """Char-offset triples ((s, e), relation, (s, e)) for each text, in input order (one
        string: its triples alone); `on_batch(0, real_tokens, padded_tokens)` after each batch."""
        texts, one = text_list(texts, "predict")
        out = self._predict(texts, max_tokens, threshold, on_batch)
        return out[0] if one else out

    def _predict(self, texts: list[str], max_tokens: int | None, threshold: float | None,
                 on_batch: Callable | None) -> list[list[Triple]]:
        # the short batches: few distinct products (models/linear.py)
        with full_batches(self._budget(max_tokens), self.max_length):
            # a long text is tokenized only as far as the max length reads ([CLS] and [SEP] take two)
            encs = encode_heads(self.tokenizer, texts, self.max_length - 2)
            return self.predict_encoded(encs, max_tokens=max_tokens, threshold=threshold, on_batch=on_batch)

    def _budget(self, max_tokens: int | None) -> int:
        return max(check_max_tokens(max_tokens) or infer_tokens(self.policy.device), self.max_length)

    def predict_encoded(self, encs: list[Encoded], *, max_tokens: int | None = None,
                        threshold: float | None = None, pad_multiple: int = 1,
                        on_batch: Callable | None = None) -> list[list[Triple]]:
        """predict() for texts already tokenized with encode_texts (the server tokenizes once;
        it also rounds padded lengths up to `pad_multiple`)."""
        thr = self.threshold if threshold is None else check_threshold(threshold)
        feats = input_features(encs, self.tokenizer, self.max_length)
        self.truncated += sum(len(e.ids) > self.max_length - 2 for e in encs)  # [CLS] and [SEP] take two
        collate = make_collate(self.tokenizer.pad_token_id or 0, len(self.relations), pad_multiple=pad_multiple,
                               limit=self.max_length)
        out: list[list[Triple]] = [[] for _ in feats]
        seen: list[set] = [set() for _ in feats]
        budget = self._budget(max_tokens)
        self.module.eval()
        dev = self.policy.device
        for batch in token_budget_batches([len(f) for f in feats], budget, shuffle=False):
            t = collate([feats[i] for i in batch])
            if on_batch:
                on_batch(0, sum(len(feats[i]) for i in batch), t["input_ids"].numel())
            with torch.inference_mode(), self.policy.autocast():
                res = extract(self.module, t["input_ids"].to(dev), t["content_mask"].to(dev),
                              t["attention_mask"].to(dev), thr)
            # the six index columns in one copy: one read per batch, where there were six (extract's
            # two nonzero calls also wait for the device: the object pass is sized by the subjects)
            for row, s, e, r, os_, oe in zip(*torch.stack(res).cpu().tolist()):
                enc = encs[batch[row]]
                subj, obj = word_span(enc, s - 1, e - 1), word_span(enc, os_ - 1, oe - 1)
                trip = (subj, self.relations[r], obj)
                if trip not in seen[batch[row]]:  # a set: a weak model's thousands of triples stay linear
                    seen[batch[row]].add(trip)
                    out[batch[row]].append(trip)
        return out

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None, on_batch: Callable | None = None,
                       chunk_size: int = 4096) -> Iterator[list[Triple]]:
        """Triples for each text, in order, a chunk of texts at a time (bounded memory)."""
        for chunk in chunked(text_stream(texts), chunk_size):
            yield from self._predict(chunk, max_tokens, None, on_batch)
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

    @staticmethod
    def arrow_results(texts: list[str], results: list, **_) -> pa.Table:
        """The `relations` column of a Parquet/Arrow output, flat for queries: list<struct<head_start,
        head_end: int32, type: string, tail_start, tail_end: int32, head_text, tail_text: string>>,
        one row per text, null where the result is None."""
        import pyarrow as pa

        i32, s = pa.int32(), pa.string()
        relation = pa.struct([("head_start", i32), ("head_end", i32), ("type", s), ("tail_start", i32),
                              ("tail_end", i32), ("head_text", s), ("tail_text", s)])
        rows = [None if triples is None else [
            {"head_start": h[0], "head_end": h[1], "type": r, "tail_start": t[0], "tail_end": t[1],
             "head_text": text[h[0]:h[1]], "tail_text": text[t[0]:t[1]]} for h, r, t in triples]
            for text, triples in zip(texts, results)]
        return pa.table({"relations": pa.array(rows, type=pa.list_(relation))})

    def units(self, texts: list[str]) -> tuple[list, list[int], None]:
        """(encodings, token lengths, None): the server's units, tokenized once."""
        encs = encode_heads(self.tokenizer, texts, self.max_length - 2)
        return encs, [min(len(e.ids) + 2, self.max_length) for e in encs], None

    def run_batch(self, units: list) -> list:
        """The triples of each of the server's units (encodings), in one batch."""
        return self.predict_encoded(units, max_tokens=10**9, pad_multiple=SERVE_PAD_MULTIPLE)

    def assemble(self, texts: list[str], units: list, results: list, ctx) -> list:
        """Each text's triples: a unit is a whole text, so its result as it is."""
        return results

    @staticmethod
    def format_metrics(m: dict) -> str:
        """The evaluate table per relation, then the partial-match line."""
        p = m["partial"]
        return (format_table({**m, "per_label": m["per_relation"]}, name="relation")
                + f"\npartial (last-word) match: precision {p['precision']:.4f} recall {p['recall']:.4f} f1 {p['f1']:.4f}")

    def evaluate(self, examples: list[ReExample], *, max_tokens: int | None = None, dist: Dist = Dist(),
                 check_spans: bool = True) -> dict:
        """Exact and partial triple P/R/F1 (sharded over ranks under torchrun); `check_spans`: also
        warn of gold subjects and objects off the model's words (as NerModel.evaluate)."""
        check_examples(examples, ReExample, "examples", empty="there is nothing to score")
        # a chunk of texts at a time: memory bounded as a bulk job's, whatever the file's size
        pred = shard_gather([e.text for e in examples],
                            lambda t: list(self.predict_stream(t, max_tokens=max_tokens)), dist)
        gold = [e.string_triples() for e in examples]
        got = [{(e.text[s[0]:s[1]], r, e.text[o[0]:o[1]]) for s, r, o in p} for e, p in zip(examples, pred)]
        m = with_unknown(re_metrics(gold, got), self.relations, {r for g in gold for _, r, _ in g}, "relations")
        return with_warning(m, self._off_tokens(examples, sum(map(len, gold))) if check_spans else None)

    def _off_tokens(self, examples: list[ReExample], total: int) -> str | None:
        """A warning where gold subjects or objects do not start and end on the model's words ("Ford"
        inside "Stanford"): the model extracts whole words, so no prediction can match them."""
        moved, first = 0, None
        for part in chunked(examples, CHECK_CHUNK):  # a chunk at a time: its memory, not the file's
            for ex, enc in zip(part, encode_texts(self.tokenizer, [e.text for e in part])):
                # scored as strings: a triple whose strings one placement puts on words can be matched
                on, said = set(), {}  # said: what is off, by the triple's strings
                for s, r, o in ex.triples:
                    spans = [(span, token_span(enc, span, len(enc.ids))) for span in (s, o)]
                    off = off_tokens(ex.text, enc, *[x for x in spans if x[1] is not None],
                                     verb="can only be found as")
                    key = (ex.text[s[0]:s[1]], r, ex.text[o[0]:o[1]])
                    if off:
                        said.setdefault(key, off)
                    else:
                        on.add(key)
                missed = [m for k, m in said.items() if k not in on]
                moved += len(missed)
                first = first or next(iter(missed), None)
        if not moved:
            return None
        return (f"{moved} of the data's {total} gold triples {'has' if moved == 1 else 'have'} a subject or object "
                f"that does not start and end on the model's words, so no prediction can match them and each counts "
                f"as a miss; the first: {first}")


