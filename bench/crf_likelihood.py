"""The CRF head's likelihood, forward and backward, three ways at one batch shape:

  autograd      the recursion over the positions recorded by autograd and replayed backward
                (what spanflow's CRF did before LogPartition), over the row's token width
  closed_form   spanflow's LogPartition (forward-backward marginals), over the token width
  words         the same over the most labelled positions of the batch (the collation's
                count), which training now passes

Each is timed in this process with the three alternating (so a shared machine's drift falls on
all of them); reported: median ms per call, aten operators dispatched per call (what the
host issues one by one on an accelerator) and the differences of the
loss (relative) and of the emissions' gradient (largest) to `autograd`'s.

    python bench/crf_likelihood.py                        # WNUT-17's shape: 13 tags, 32 x 36
    python bench/crf_likelihood.py --rows 64 --tokens 48 --words 32 --types 18
    python bench/crf_likelihood.py --device cuda       # where the host issuing operators is the cost
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from common import median, write_results  # noqa: E402
from spanflow.tasks.ner.crf import CRF, bio_transition_mask  # noqa: E402
from spanflow.tasks.ner.features import bio_label_list  # noqa: E402


def autograd_log_z(crf: CRF, em: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log Z with autograd through the recursion (the reference)."""
    trans = crf.transitions + crf.transition_mask
    ems, cols = em.unbind(1), mask.unsqueeze(2).unbind(1)
    alpha = crf.start + ems[0]
    for t in range(1, em.shape[1]):
        alpha = torch.where(cols[t], torch.logsumexp(alpha.unsqueeze(2) + trans, dim=1) + ems[t], alpha)
    return torch.logsumexp(alpha + crf.end, dim=1)


class Dispatched(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=36, help="the batch's token width")
    ap.add_argument("--words", type=int, default=24, help="the most labelled positions in a row")
    ap.add_argument("--types", type=int, default=6, help="entity types (BIO: 2 x types + 1 tags)")
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--device", default="cpu", help="cpu or cuda [%(default)s]")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="crf_likelihood")
    a = ap.parse_args()

    torch.manual_seed(0)
    labels = bio_label_list([f"T{i}" for i in range(a.types)])
    crf = CRF(len(labels), bio_transition_mask(labels))
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_(0, 0.5)
    lengths = torch.randint(max(1, a.words // 2), a.words + 1, (a.rows,))
    lengths[0] = a.words
    dev = torch.device(a.device)
    crf.to(dev)
    wide_mask = (torch.arange(a.tokens)[None] < lengths[:, None]).to(dev)
    em = torch.randn(a.rows, a.tokens, len(labels), device=dev, requires_grad=True)
    tags = torch.randint(0, len(labels), (a.rows, a.tokens)).to(dev)

    def wait() -> None:  # a GPU's kernels done, so the clock takes them
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def nll(kind: str) -> torch.Tensor:
        width = a.words if kind == "words" else a.tokens
        e, t, m = em[:, :width], tags[:, :width], wide_mask[:, :width]
        if kind == "autograd":  # CRF.nll with its log Z through autograd
            return ((autograd_log_z(crf, e, m) - crf.gold_score(e, t, m)) * m.any(1)).sum()
        return crf.nll(e, t, m).sum()

    def run(kind: str) -> tuple[float, torch.Tensor]:
        em.grad = None
        loss = nll(kind)
        loss.backward()
        return loss.detach(), em.grad.clone()

    kinds = ("autograd", "closed_form", "words")
    ref_loss, ref_grad = run("autograd")
    rows = []
    times = {k: [] for k in kinds}
    for i in range(a.passes + 3):
        for k in (kinds if i % 2 == 0 else kinds[::-1]):
            wait()
            t = time.perf_counter()
            run(k)
            wait()
            if i >= 3:
                times[k].append((time.perf_counter() - t) * 1e3)
    for k in kinds:
        d = Dispatched()
        with d:
            em.grad = None
            nll(k).backward()
        loss, grad = run(k)
        rows.append({"way": k, "ms": round(median(times[k]), 3),
                     "vs_autograd": round(median(times[k]) / median(times["autograd"]), 3),
                     "aten_ops": d.n,
                     "loss_rel_diff": float((loss - ref_loss).abs() / ref_loss.abs()), "grad_diff": float((grad - ref_grad).abs().max())})
        print(rows[-1])
    write_results(a.out, a.name, {"description": f"the CRF head's likelihood forward + backward, {len(labels)} tags, "
                                                 f"{a.rows} rows of {a.tokens} tokens, at most {a.words} labelled "
                                                 f"positions a row, on {a.device}; median of {a.passes} alternating passes (ms); "
                                                 "aten_ops: operators dispatched per call; "
                                                 "loss_rel_diff: the summed loss's relative difference to autograd's; grad_diff: the emissions' gradient's largest",
                                  "shape": vars(a)},
                  rows, ["way", "ms", "vs_autograd", "aten_ops", "loss_rel_diff", "grad_diff"])


if __name__ == "__main__":
    main()
