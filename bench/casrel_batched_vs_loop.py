"""CasRel inference: batched cascade (one encoder pass per sentence, every subject of every
sentence in one object pass) vs the per-subject loop of published implementations.

    python bench/casrel_batched_vs_loop.py --model runs/webnlg/model --data ../shared/data/webnlg/dev_triples.json

Prints a final JSON line with `ratio`, `identical`, and both times.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", default="auto", help="as `spanflow predict` takes it [auto]")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import task_of_dir

    texts = [e.text for e in read_re(a.data)]
    precision = resolve_runtime(task_of_dir(a.model), a.model, Asked(device="cpu", precision=a.precision),
                                texts=texts).precision
    model = ReModel.load(a.model, device="cpu", precision=precision)
    model.predict(texts[:32])
    loop_predict(model, texts[:8])
    t_b, t_l, batched, looped = [], [], None, None
    for _ in range(a.repeats):
        t = time.perf_counter()
        batched = model.predict(texts)
        t_b.append(time.perf_counter() - t)
        t = time.perf_counter()
        looped = loop_predict(model, texts)
        t_l.append(time.perf_counter() - t)
    same = sum(sorted(x) == sorted(y) for x, y in zip(batched, looped))
    n_triples = sum(len(x) for x in batched)
    res = {"batched_s": median(t_b), "loop_s": median(t_l), "ratio": median(t_l) / median(t_b),
           "identical": same == len(texts), "identical_texts": same, "texts": len(texts), "triples": n_triples}
    write_results(a.out, "casrel_batched_vs_loop", {"description": f"{len(texts)} texts of {a.data}, model "
                  f"{a.model}, CPU {precision} (--precision {a.precision}); medians of {a.repeats}"},
                  [{"run": "per_subject_loop", "seconds": res["loop_s"]},
                   {"run": "batched_cascade", "seconds": res["batched_s"], "ratio": res["ratio"]}],
                  ["run", "seconds", "ratio"])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
