"""The cost of paying a sparse vocabulary table's rows what AdamW owes them (RowAdamW's
catch-up, training/row_adamw.py): RowAdamW.step on a MiniLM-sized table (30522 x 384) with the
catch-up and with the lazy rule (rows left alone on the steps that miss them), and one
catch_up() over every row, as before an evaluation.

Each step's gradient holds --tokens token rows drawn by a Zipf law over the vocabulary (a few
rows every step, most rarely), the same draws for both; the median step time after a warm-up,
the two kinds alternating --repeats times in this process.

    python bench/row_catch_up.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import median, write_results  # noqa: E402
from spanflow.training import row_adamw  # noqa: E402
from spanflow.training.row_adamw import RowAdamW  # noqa: E402


def lazy_missed(rows, idx, p, state, eps):
    """The lazy rule: a row missed by a step owes nothing."""
    rows.last.index_fill_(0, idx, rows.t)


def one(catch_up: bool, a, draws: list[torch.Tensor]) -> dict:
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(a.rows, a.dim))
    opt = RowAdamW([table], lr=5e-5, weight_decay=0.01)
    real = row_adamw._missed
    row_adamw._missed = real if catch_up else lazy_missed
    try:
        times = []
        for k, idx in enumerate(draws):
            table.grad = torch.sparse_coo_tensor(idx[None], torch.randn(len(idx), a.dim) * 1e-3, table.shape,
                                                 check_invariants=True)
            t = time.perf_counter()
            opt.step()
            if k >= a.warmup:
                times.append(time.perf_counter() - t)
        t = time.perf_counter()
        opt.catch_up()
        settle = time.perf_counter() - t
    finally:
        row_adamw._missed = real
    rows_per_step = median([float(len(idx.unique())) for idx in draws])
    return {"rule": "caught up" if catch_up else "lazy", "median_step_ms": round(1000 * median(times), 2),
            "catch_up_all_s": round(settle, 3), "rows_per_step": rows_per_step, "steps": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=30522)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--tokens", type=int, default=1500, help="token rows in a step's gradient [%(default)s]")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--name", default="row_catch_up")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    zipf = 1.0 / torch.arange(1, a.rows + 1, dtype=torch.float64)
    draws = [torch.multinomial(zipf, a.tokens, replacement=True, generator=gen) for _ in range(a.steps)]
    rows = [one(kind, a, draws) for _ in range(a.repeats) for kind in (True, False)]
    for r in rows:
        print(r)
    write_results(a.out, a.name, {
        "description": f"RowAdamW.step on a {a.rows} x {a.dim} table, {a.tokens} Zipf-drawn token rows a step, "
                       f"{a.steps} steps ({a.warmup} warm-up), the catch-up against the lazy rule alternating "
                       f"{a.repeats} times; catch_up_all_s: one catch_up() over every row after the steps; "
                       "`python bench/row_catch_up.py`"}, rows,
        ["rule", "median_step_ms", "catch_up_all_s", "rows_per_step", "steps"])


if __name__ == "__main__":
    main()
