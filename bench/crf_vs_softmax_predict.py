"""Prediction speed and F1 of two NER model directories on the same texts, measured in
alternation (median of repeats), e.g. a CRF head against a softmax head.

    python bench/crf_vs_softmax_predict.py --softmax RUN_A/model --crf RUN_B/model \
        --data ../shared/data/wnut17/dev.conll [--precision bf16] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import median, write_results  # noqa: E402


def _constrained_f1(model, data) -> float:
    import torch

    from spanflow.tasks.ner.crf import CRF, bio_transition_mask, compact

    crf = CRF(len(model.id2label), bio_transition_mask(model.id2label)).to(model.policy.device)

    def decode(logits, first):
        em, index, mask = compact(logits.float().log_softmax(-1), first.to(logits.device))
        tags = torch.where(mask, crf.viterbi(em, mask), torch.zeros_like(index))
        return torch.zeros(first.shape, dtype=torch.long, device=logits.device).scatter_(1, index, tags)

    model.module.head.decode = decode
    return model.evaluate(data)["f1"]


def main() -> None:
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import NerModel

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--softmax", required=True)
    ap.add_argument("--crf", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    data = read_ner(a.data)
    texts = [e.text for e in data]
    models = {"softmax": NerModel.load(a.softmax, precision=a.precision),
              "crf": NerModel.load(a.crf, precision=a.precision)}
    times: dict[str, list[float]] = {k: [] for k in models}
    for k, m in models.items():
        m.predict(texts[:64])  # warm-up
    for _ in range(a.repeats):
        for k, m in models.items():  # alternate, so drifts in machine load hit both alike
            t = time.perf_counter()
            m.predict(texts)
            times[k].append(time.perf_counter() - t)
    rows = []
    for k, m in models.items():
        rows.append({"head": k, "dev_f1": m.evaluate(data)["f1"], "texts_per_s": len(texts) / median(times[k]),
                     "median_s": median(times[k])})
    rows[1]["speed_vs_softmax"] = rows[1]["texts_per_s"] / rows[0]["texts_per_s"]
    # how much of the CRF's gain is the BIO constraint alone: the softmax model's scores
    # decoded with the same constrained Viterbi (zero learnt transitions)
    rows.append({"head": "softmax + constrained Viterbi", "dev_f1": _constrained_f1(models["softmax"], data)})
    write_results(a.out, "crf_vs_softmax_predict", {
        "description": f"predict on {len(texts)} texts of {os.path.basename(a.data)}, {a.precision}, median of "
                       f"{a.repeats} alternating runs; models {a.softmax} and {a.crf}"},
        rows, ["head", "dev_f1", "texts_per_s", "median_s", "speed_vs_softmax"])


if __name__ == "__main__":
    main()
