"""CasRel inference: batched cascade (one encoder pass per sentence, every subject of every
sentence in one object pass) vs the per-subject loop of published implementations.

Identity is checked in fp32, where a padded and an unpadded row compute the same numbers; in
bf16 the two paths round differently, so there the speed is reported with the batched path's
triple F1 to its own fp32 triples (what `--precision auto` checks), not an identity.

    python bench/casrel_batched_vs_loop.py --model runs/webnlg/model --data ../shared/data/webnlg/dev_triples.json

Prints a final JSON line with the fp32 identity, the ratios and the bf16 agreement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import median, write_results  # noqa: E402
from spanflow.batching.align import encode_texts  # noqa: E402
from spanflow.data.io import read_re  # noqa: E402
from spanflow.tasks.re.casrel import next_true  # noqa: E402
from spanflow.tasks.re import ReModel  # noqa: E402


def loop_predict(model: ReModel, texts: list[str]) -> list[list]:
    """One sentence at a time, and the object stage once per candidate subject (decoding
    each subject's objects with the same tensor ops as the batched path, so the comparison
    measures batching, not Python decoding)."""
    tok, head, thr = model.tokenizer, model.module.head, model.threshold
    out = []
    model.module.eval()
    with torch.inference_mode(), model.policy.autocast():
        for enc in encode_texts(tok, texts):
            ids = torch.tensor([[tok.cls_token_id] + enc.ids[:model.max_length - 2] + [tok.sep_token_id]])
            n = ids.shape[1]
            keep = torch.zeros(n, dtype=torch.bool)
            keep[1:n - 1] = True
            h = model.module(ids, torch.ones_like(ids))  # (1, T, H)
            p = torch.sigmoid(head.subjects(h).float())[0]  # (T, 2)
            nxt = next_true((p[:, 1] > thr) & keep)
            starts = ((p[:, 0] > thr) & keep & (nxt < n)).nonzero().flatten().tolist()
            triples = []
            for s in starts:  # the per-subject loop
                e = int(nxt[s])
                q = torch.sigmoid(head.objects(h, torch.tensor([0]), torch.tensor([s]), torch.tensor([e])).float())[0]
                o_start = (q[..., 0].T > thr) & keep  # (R, T)
                onxt = next_true((q[..., 1].T > thr) & keep)
                for r, o in (o_start & (onxt < n)).nonzero().tolist():
                    t = ((enc.starts[s - 1], enc.ends[e - 1]), model.relations[r],
                         (enc.starts[o - 1], enc.ends[int(onxt[r, o]) - 1]))
                    if t not in triples:
                        triples.append(t)
            out.append(triples)
    return out


def timed_pair(model: ReModel, texts: list[str], repeats: int) -> tuple[float, float, list, list]:
    """Median seconds of the batched and the loop path, and the triples of each."""
    model.predict(texts[:32])
    loop_predict(model, texts[:8])
    t_b, t_l, batched, looped = [], [], None, None
    for _ in range(repeats):
        t = time.perf_counter()
        batched = model.predict(texts)
        t_b.append(time.perf_counter() - t)
        t = time.perf_counter()
        looped = loop_predict(model, texts)
        t_l.append(time.perf_counter() - t)
    return median(t_b), median(t_l), batched, looped


def triple_f1(pred: list, gold: list) -> float:
    tp = sum(len(set(p) & set(g)) for p, g in zip(pred, gold))
    n_p, n_g = sum(len(set(p)) for p in pred), sum(len(set(g)) for g in gold)
    return 1.0 if n_p == n_g == 0 else 2 * tp / max(1, n_p + n_g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    texts = [e.text for e in read_re(a.data)]
    runs = {}
    for precision in ("fp32", "bf16"):
        model = ReModel.load(a.model, device="cpu", precision=precision)
        runs[precision] = timed_pair(model, texts, a.repeats)
    b32, l32, batched32, looped32 = runs["fp32"]
    b16, l16, batched16, _ = runs["bf16"]
    same = sum(sorted(x) == sorted(y) for x, y in zip(batched32, looped32))
    res = {"texts": len(texts), "triples_fp32": sum(len(x) for x in batched32),
           "identical_fp32": same == len(texts), "identical_texts_fp32": same,
           "ratio_fp32": l32 / b32, "ratio_bf16": l16 / b16,
           "bf16_triple_f1_to_fp32": triple_f1(batched16, batched32)}
    write_results(a.out, "casrel_batched_vs_loop",
                  {"description": f"{len(texts)} texts of {a.data}, model {a.model}, CPU; medians of {a.repeats}. "
                                  f"fp32: batched and loop identical on {same}/{len(texts)} texts "
                                  f"({res['triples_fp32']} triples); bf16 batched triple F1 to fp32 "
                                  f"{res['bf16_triple_f1_to_fp32']:.4f}", **res},
                  [{"run": "per_subject_loop", "precision": "fp32", "seconds": l32},
                   {"run": "batched_cascade", "precision": "fp32", "seconds": b32, "ratio": l32 / b32},
                   {"run": "per_subject_loop", "precision": "bf16", "seconds": l16},
                   {"run": "batched_cascade", "precision": "bf16", "seconds": b16, "ratio": l16 / b16}],
                  ["run", "precision", "seconds", "ratio"])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
