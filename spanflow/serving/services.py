"""What the server runs per task: how a request becomes units, and a batch becomes results."""
from __future__ import annotations

import os
from dataclasses import dataclass


from spanflow.batching.align import decode_spans, encode_texts, merge_windows, windows_for
from spanflow.inference.tagging import tag_windows, word_starts


# padded lengths are rounded up to this: a server meets every (batch, length) shape, and on
# a CPU each new one costs a kernel build and a cache entry kept for the life of the process.
# MiniLM on 400 server-like batches: RSS 1010 -> 745 MiB, throughput unchanged (560-590 vs
# 520-630 texts/s); under a 20 s overload the kernel caches had grown RSS by 380 MiB.
PAD_MULTIPLE = 8


@dataclass
class Service:
    """A loaded model behind one task route."""

    name: str
    task: str  # "embed" | "ner" | "re"
    model: object

    def units(self, texts: list[str]):
        """(units, token lengths, context to assemble the response)."""
        if self.task == "embed":
            ids, _ = self.model.tokenize(texts)
            return ids, [len(x) for x in ids], None
        if self.task == "ner":
            m = self.model
            encs = encode_texts(m.tokenizer, texts)
            wins = windows_for(encs, max_length=m.window, stride=m.stride, cls_id=m.tokenizer.cls_token_id,
                               sep_id=m.tokenizer.sep_token_id)
            # a unit is a window and its word starts (a CRF head decodes over those)
            return [(w, word_starts(encs, w)) for w in wins], [len(w) for w in wins], encs
        encs = encode_texts(self.model.tokenizer, texts)  # tokenized once: run_batch reuses it
        return encs, [min(len(e.ids) + 2, self.model.max_length) for e in encs], None

    def run_batch(self, units: list) -> list:
        """Runs in the worker thread."""
        if self.task == "embed":
            emb = self.model._forward(self.model.model, units, list(range(len(units))), True, PAD_MULTIPLE)
            return list(emb.cpu().numpy())  # float32 rows; the response writes them
        if self.task == "ner":
            m = self.model
            return tag_windows(m.module, [w for w, _ in units], [f for _, f in units], m.tokenizer.pad_token_id,
                               m.policy, PAD_MULTIPLE, m.max_length)
        return self.model.predict_encoded(units, max_tokens=10**9, pad_multiple=PAD_MULTIPLE)

    def assemble(self, texts: list[str], units: list, results: list, ctx) -> list:
        if self.task == "embed":
            return results
        if self.task == "ner":
            per_text: list[list] = [[] for _ in texts]
            for (w, _), pred in zip(units, results):
                per_text[w.example].append((w.start, w.end, pred))
            out = []
            for i, enc in enumerate(ctx):
                merged = merge_windows(len(enc.ids), per_text[i]) if enc.ids else []
                out.append([{"start": s, "end": e, "label": lab, "text": texts[i][s:e]}
                            for s, e, lab in decode_spans(enc, merged, self.model.id2label)])
            return out
        return [[{"head": list(h), "type": r, "tail": list(t_), "head_text": text[h[0]:h[1]],
                  "tail_text": text[t_[0]:t_[1]]} for h, r, t_ in triples] for text, triples in zip(texts, results)]


def load_service(spec: str, *, precision: str = "auto", device: str = "auto") -> Service:
    """NAME=DIR or DIR (named after the directory): a spanflow NER/RE model or an embedding model."""
    name, _, path = spec.rpartition("=")
    path = path or spec
    name = name or os.path.basename(os.path.normpath(path))
    if os.path.exists(os.path.join(path, "spanflow.json")):
        from spanflow.cli.common import load_task_model

        model = load_task_model(path, device=device, precision=precision)
        return Service(name, model.task, model)
    from spanflow.embedder import Embedder

    return Service(name, "embed", Embedder.load(path, precision=precision, device=device))
