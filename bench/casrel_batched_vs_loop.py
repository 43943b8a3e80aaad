"""CasRel inference: batched cascade (one encoder pass per sentence, every subject of every
sentence in one object pass) against two one-sentence-at-a-time baselines: the per-sentence
path of the public PyTorch reimplementation most CasRel work builds on (each sentence alone,
all its candidate subjects in one object pass: `per_sentence`), and a per-subject loop (one
object pass per subject: `per_subject_loop`).

Identity is checked in fp32, where a padded and an unpadded row compute the same numbers; in
bf16 the paths round differently, so there the speed is reported with the batched path's
triple F1 to its own fp32 triples (what `--precision auto` checks), not an identity. Each
baseline's ratio is given at the same precision and against its faster precision.

    python bench/casrel_batched_vs_loop.py --model runs/webnlg/model --data ../shared/data/webnlg/dev_triples.json

(runs/webnlg: `spanflow train re --train webnlg/train_triples.json --dev webnlg/dev_triples.json
--model MINILM_DIR --out runs/webnlg`, default flags.) Prints a final JSON line with the fp32
identity, the ratios and the bf16 agreement.
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


def loop_predict(model: ReModel, texts: list[str], per_subject: bool = True) -> list[list]:
    """One sentence at a time; the object stage once per candidate subject (`per_subject`) or
    once per sentence for all its subjects. Each subject's objects are decoded with the same
    tensor ops as the batched path, so the comparison measures batching, not Python decoding."""
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
            groups = [[s] for s in starts] if per_subject else ([starts] if starts else [])
            triples = []
            for group in groups:
                ends = [int(nxt[s]) for s in group]
                q = torch.sigmoid(head.objects(h, torch.zeros(len(group), dtype=torch.long), torch.tensor(group),
                                               torch.tensor(ends)).float())  # (k, T, R, 2)
                for s, e, qk in zip(group, ends, q):
                    o_start = (qk[..., 0].T > thr) & keep  # (R, T)
                    onxt = next_true((qk[..., 1].T > thr) & keep)
                    for r, o in (o_start & (onxt < n)).nonzero().tolist():
                        t = ((enc.starts[s - 1], enc.ends[e - 1]), model.relations[r],
                             (enc.starts[o - 1], enc.ends[int(onxt[r, o]) - 1]))
                        if t not in triples:
                            triples.append(t)
            out.append(triples)
    return out


PATHS = {"batched_cascade": lambda m, t: m.predict(t),
         "per_sentence": lambda m, t: loop_predict(m, t, per_subject=False),
         "per_subject_loop": lambda m, t: loop_predict(m, t, per_subject=True)}


def timed(model: ReModel, texts: list[str], repeats: int) -> tuple[dict, dict]:
    """Median seconds of each path (PATHS, alternating within each repeat) and its triples."""
    for fn in PATHS.values():  # warm-up
        fn(model, texts[:16])
    times, triples = {k: [] for k in PATHS}, {}
    for _ in range(repeats):
        for name, fn in PATHS.items():
            t = time.perf_counter()
            triples[name] = fn(model, texts)
            times[name].append(time.perf_counter() - t)
    return {k: median(v) for k, v in times.items()}, triples


def _short(path: str) -> str:
    """A path as the results name it: its last three parts (runs/webnlg/model, data/webnlg/dev.json)."""
    return "/".join(os.path.normpath(path).split(os.sep)[-3:])


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
    secs, trip = {}, {}
    for precision in ("fp32", "bf16"):
        model = ReModel.load(a.model, device="cpu", precision=precision)
        secs[precision], trip[precision] = timed(model, texts, a.repeats)
    base32 = trip["fp32"]["batched_cascade"]
    same = {k: sum(sorted(x) == sorted(y) for x, y in zip(base32, trip["fp32"][k])) for k in PATHS}
    res = {"texts": len(texts), "triples_fp32": sum(len(x) for x in base32),
           "identical_texts_fp32": same, "identical_fp32": all(v == len(texts) for v in same.values()),
           "bf16_triple_f1_to_fp32": triple_f1(trip["bf16"]["batched_cascade"], base32),
           "command": "python bench/casrel_batched_vs_loop.py " + " ".join(
               f"--{k.replace('_', '-')} {_short(v) if k in ('model', 'data') else v}"
               for k, v in vars(a).items() if k != "out")}
    rows = []
    for precision in ("fp32", "bf16"):
        ours = secs[precision]["batched_cascade"]
        for name in PATHS:
            s_ = secs[precision][name]
            best = min(secs["fp32"][name], secs["bf16"][name])
            rows.append({"run": name, "precision": precision, "seconds": round(s_, 3),
                         "ratio_same_precision": None if name == "batched_cascade" else round(s_ / ours, 2),
                         "ratio_to_its_best_precision": None if name == "batched_cascade" else round(best / ours, 2),
                         "identical_texts_fp32": same[name]})
            res[f"ratio_{name}_{precision}"] = s_ / ours
    write_results(a.out, "casrel_batched_vs_loop",
                  {"description": f"{len(texts)} texts of {os.path.basename(a.data)}, CPU; medians of {a.repeats}, the "
                                  "paths alternating. fp32: each baseline's triples identical to the batched ones on "
                                  f"{same} texts ({res['triples_fp32']} triples); bf16 batched triple F1 to fp32 "
                                  f"{res['bf16_triple_f1_to_fp32']:.4f}; ratio_to_its_best_precision: the baseline "
                                  "at whichever precision it ran faster against the batched path at this one",
                   **res},
                  rows, ["run", "precision", "seconds", "ratio_same_precision", "ratio_to_its_best_precision",
                         "identical_texts_fp32"])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
