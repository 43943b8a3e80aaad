"""The `tiny` encoder's BiLSTM on the CPU: packed rows (nn.LSTM on a PackedSequence) against the
padded recurrence it runs there (each direction over the padded rows, the backward one on rows
reversed within their lengths: models/tiny.py), forward and backward, at the default update of
about 1024 tokens, for several row lengths. In one process, the two alternating step by step;
the outputs' largest difference says they compute the same thing.

A packed LSTM's backward on the CPU takes the gradient of one slice of its input per time step,
each a zero-filled copy of the whole input, so its cost grows with the square of the length.

    python bench/tiny_recurrence.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import median, write_results  # noqa: E402
from spanflow.models.tiny import TinyModel, tiny_config  # noqa: E402

TOKENS = 1024  # padded tokens a step: the default update on WNUT-17 and WebNLG


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="16,32,64,128", help="row lengths (tokens) to measure [%(default)s]")
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each kind per length [%(default)s]")
    ap.add_argument("--name", default="tiny_recurrence")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    torch.manual_seed(0)
    enc = TinyModel(tiny_config()).train()  # the default tiny's sizes
    e = enc.config.embedding_size
    g = torch.Generator().manual_seed(1)
    rows = []
    for t in (int(v) for v in a.lengths.split(",")):
        b = max(1, TOKENS // t)
        lengths = torch.randint(max(1, t // 2), t + 1, (b,), generator=g)
        lengths[0] = t  # the batch is padded to its longest row
        x = torch.randn(b, t, e, generator=g, requires_grad=True)
        kinds = {"packed": lambda: enc._recur_packed(x, lengths), "padded": lambda: enc._recur(x, lengths)}
        diff = (kinds["packed"]() - kinds["padded"]()).abs().max().item()
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for k in range(a.steps + 3):
            for kind in (("packed", "padded") if k % 2 == 0 else ("padded", "packed")):
                started = time.perf_counter()
                kinds[kind]().sum().backward()
                if k >= 3:  # the first steps warm the allocator and the kernels
                    times[kind].append(time.perf_counter() - started)
                enc.zero_grad(set_to_none=True)
                x.grad = None
        old, new = median(times["packed"]), median(times["padded"])
        rows.append({"row_tokens": t, "rows": b, "real_tokens": int(lengths.sum()), "packed_ms": round(1000 * old, 1),
                     "padded_ms": round(1000 * new, 1), "speedup": round(old / new, 2), "max_abs_diff": f"{diff:.1e}"})
        print(rows[-1], flush=True)
    cmd = "python bench/tiny_recurrence.py " + " ".join(sys.argv[1:])
    note = (f"`{cmd.strip()}`: the default `tiny` encoder's BiLSTM (fp32, as on the CPU), forward + backward of one "
            f"step of about {TOKENS} padded tokens, rows of random lengths between half the row length and all of it; "
            f"median of {a.steps} steps of each kind, alternating; speedup: packed over padded")
    path = write_results(a.out, a.name, {"description": note, "command": cmd.strip(), "tokens_per_step": TOKENS},
                         rows, ["row_tokens", "rows", "real_tokens", "packed_ms", "padded_ms", "speedup",
                                "max_abs_diff"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
