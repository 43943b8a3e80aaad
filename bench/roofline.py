"""Every job against this device's limit: achieved FLOP/s over the measured peak, real tokens/s,
padding efficiency and where the time goes, for each job shape, briefly, with default flags.

Jobs: train NER, train relations (CasRel), train embeddings (each the training loop for
--steps optimizer steps: the figures of its report, train_report.jsonl), embed, NER predict,
relation predict (the model's predict_stream over the texts, timed whole), and serving (the
server's dynamic batcher in this process, one text per request from 32 concurrent clients,
no HTTP: the ceiling an HTTP server can approach). Each row names the command that runs the
same job.

FLOP counts are per padded token, as the training report counts them (6N + 12 L H T for
training, a third of that for inference; N the parameters outside embedding tables); the peak
on a CPU is the faster of a 1024^3 and a 2048^3 matmul in the job's precision, the best measured
on this machine by any run so far when the job ran (monitor.device.peak_flops;
SPANFLOW_CACHE/peaks), on a GPU its datasheet's dense figure. MFU above 100% would mean a
measured peak was measured low.

    python bench/roofline.py                                   # from-scratch BERT, synthetic data
    python bench/roofline.py --model MINILM --ner ../shared/data/wnut17/train.conll \
        --re ../shared/data/webnlg/train_triples.json --pairs ../shared/data/stsb/stsb-en-train.csv
    python bench/roofline.py --dry-run                         # a few steps each: that it runs
    python bench/roofline.py --jobs train-ner,train-re --name roofline_train   # some of the jobs
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import default_minilm, model_name, write_results  # noqa: E402
from spanflow.monitor.device import peak_flops  # noqa: E402
from spanflow.monitor.report import train_flops_per_token  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402

CONCURRENCY = 32


def peak(device: torch.device, precision: str) -> float | None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return peak_flops(device.type, name, precision)[0]


def train_row(job: str, command: str, train, out: str, steps: int, precision: str) -> tuple[dict, object]:
    """Train for `steps` optimizer steps with default flags; the row from the run's report."""
    t = time.perf_counter()
    model = train(TrainOptions(max_steps=steps, log_every=0, precision=precision), out)
    wall = time.perf_counter() - t
    with open(os.path.join(out, "train_report.jsonl"), encoding="utf-8") as f:
        rep = [json.loads(line) for line in f][-1]
    p = peak(model.policy.device, rep["precision"])
    return {"job": job, "precision": rep["precision"], "mfu": rep["mfu"],
            "achieved_tflops": rep["mfu"] * p / 1e12 if rep["mfu"] is not None and p else None,
            "peak_tflops": p / 1e12 if p else None, "real_tokens_per_s": rep["real_tokens_per_s"],
            "padding_efficiency": rep["padding_efficiency"],
            "split": f"data {rep['data_wait_frac']:.0%}, compute {rep['compute_frac']:.0%}, "
                     f"optimizer {rep['optimizer_frac']:.0%}",
            "gpu_util": rep.get("gpu_util"), "steps": rep["steps"], "seconds": round(wall, 1), "command": command}, model


def infer_row(job: str, command: str, model, texts: list[str], repeats: int) -> dict:
    """The model's predict_stream over `texts` (after one warm-up pass), median of `repeats`."""
    from spanflow.monitor.device import GpuUtilSampler

    module = model.module
    times, real, padded = [], 0, 0
    gpu = GpuUtilSampler(model.policy.device, interval_s=0.1)  # NVML every 100 ms, on a GPU
    for k in range(repeats + 1):
        seen = [0, 0]

        def on_batch(_n, r, p):
            seen[0] += r
            seen[1] += p
        t = time.perf_counter()
        for _ in model.predict_stream(texts, on_batch=on_batch):
            pass
        if k:
            times.append(time.perf_counter() - t)
        else:
            gpu.take()  # the warm-up pass's samples left out
        real, padded = seen
    util = gpu.take()
    gpu.close()
    wall = sorted(times)[len(times) // 2]
    batches_len = padded / max(1, len(texts))  # mean padded tokens per text: the attention's length
    flops = train_flops_per_token(module, batches_len) / 3 * padded / wall
    p = peak(model.policy.device, model.policy.name)
    return {"job": job, "precision": model.policy.name, "mfu": flops / p if p else None,
            "achieved_tflops": flops / 1e12, "peak_tflops": p / 1e12 if p else None,
            "real_tokens_per_s": real / wall, "padding_efficiency": real / padded if padded else None,
            "split": f"tokenize {tokenize_share(model, texts, wall):.0%} (overlapped)", "gpu_util": util, "steps": None,
            "seconds": round(wall, 2), "command": command}


def tokenize_share(model, texts: list[str], wall: float) -> float:
    """Seconds tokenizing `texts` alone, over the job's wall time (the job overlaps them)."""
    tok = getattr(model, "tokenizer", None)
    t = time.perf_counter()
    if hasattr(model, "tokenize"):
        model.tokenize(texts)
    elif tok is not None:
        tok(texts)
    return (time.perf_counter() - t) / wall


def serve_row(model, texts: list[str], requests: int) -> dict:
    """The server's batcher in this process: CONCURRENCY clients, one text per request."""
    from spanflow.serving.batcher import DynamicBatcher
    from spanflow.serving.options import ServeOptions

    opts = ServeOptions()
    real = [0]

    async def run() -> float:
        b = DynamicBatcher(model.run_batch, max_tokens=opts.max_tokens, max_wait_ms=opts.max_wait_ms)
        b.start()
        units, lengths, _ = model.units(["warm up the model"])
        await b.warm_up(units, lengths)
        todo = iter(range(requests))

        async def client():
            for i in todo:
                u, ln, _ = model.units([texts[i % len(texts)]])
                real[0] += sum(ln)
                await b.submit(u, ln)
        t = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(CONCURRENCY)])
        wall = time.perf_counter() - t
        await b.close()
        return wall

    wall = asyncio.run(run())
    return {"job": f"serve embed (batcher, {CONCURRENCY} clients, in-process)", "precision": model.policy.name,
            "mfu": None, "achieved_tflops": None, "peak_tflops": None, "real_tokens_per_s": real[0] / wall,
            "padding_efficiency": None, "split": f"{requests / wall:.0f} texts/s", "gpu_util": None, "steps": None,
            "seconds": round(wall, 2), "command": "spanflow serve --model emb=MODEL (bench/load_test.py over HTTP)"}


class Rows(list):
    """The table's rows, each printed as it comes in."""

    def append(self, row: dict) -> None:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        super().append(row)


JOBS = ("train-ner", "train-re", "train-embed", "embed", "predict-ner", "predict-re", "serve")


def one_job(a, job: str, model: str, work: str) -> dict:
    """The row of `job`, run in this process (a fresh one per job: one OpenMP team, one warm-up)."""
    from spanflow.data.io import read_ner, read_re
    from spanflow.data.synthetic import synthetic_ner, synthetic_pairs, synthetic_re
    from spanflow.tasks.embed import Embedder
    from spanflow.tasks.embed.pairs import Pair, read_pairs
    from spanflow.tasks.embed.train import train_embedder
    from spanflow.tasks.ner import NerModel, train_ner
    from spanflow.tasks.re import ReModel, train_re

    quiet = {"log_fn": lambda s: None}
    m = "tiny" if model == "tiny" else "MODEL"
    saved = ("checkpoint", "model")  # a run stopped by max_steps leaves its model in its checkpoint
    if job in ("train-ner", "embed", "predict-ner", "serve"):
        ner = read_ner(a.ner) if a.ner else synthetic_ner(2000, seed=1)
        texts = ([" ".join(e.tokens) if getattr(e, "tokens", None) else e.text for e in ner] * 4)[:a.texts]
    if job in ("train-re", "predict-re"):
        rel = read_re(a.re) if a.re else synthetic_re(2000, seed=1)
    if job == "train-ner":
        return train_row("train NER", f"spanflow train ner --train T --dev D --model {m} --out OUT",
                         lambda o, out: train_ner(ner, None, model=model, out_dir=out, options=o, **quiet),
                         os.path.join(work, "ner"), a.steps, a.precision)[0]
    if job == "train-re":
        return train_row("train relations", f"spanflow train re --train T --dev D --model {m} --out OUT",
                         lambda o, out: train_re(rel, None, model=model, out_dir=out, options=o, **quiet),
                         os.path.join(work, "re"), a.steps, a.precision)[0]
    if job == "train-embed":
        pairs = read_pairs(a.pairs) if a.pairs else [Pair(x, y, s) for x, y, s in synthetic_pairs(2000, seed=1)]
        return train_row("train embeddings", f"spanflow train embed --train T --dev D --model {m} --out OUT",
                         lambda o, out: train_embedder(pairs, None, model=model, out_dir=out, options=o, **quiet),
                         os.path.join(work, "embed"), a.steps, a.precision)[0]
    if job in ("embed", "serve"):
        from spanflow.runtime.threads import on_model_thread

        # the server loads its models on the thread that runs them (one OpenMP team)
        load = on_model_thread if job == "serve" else (lambda f, *x, **k: f(*x, **k))
        emb = load(Embedder.load, model if model != "tiny" else os.path.join(work, "embed", *saved),
                   precision=a.precision)
        if job == "serve":
            return serve_row(emb, texts, max(64, a.texts // 2))
        return infer_row("embed", f"spanflow embed --model {m} --input texts.txt --output v.npy", emb, texts, a.repeats)
    if job == "predict-ner":
        ner_model = NerModel.load(a.ner_model or os.path.join(work, "ner", *saved), precision=a.precision)
        return infer_row("predict NER", "spanflow predict --model OUT/model --input texts.txt --output p.jsonl",
                         ner_model, texts, a.repeats)
    re_model = ReModel.load(a.re_model or os.path.join(work, "re", *saved), precision=a.precision)
    return infer_row("predict relations", "spanflow predict --model OUT/model --input texts.txt --output p.jsonl",
                     re_model, ([e.text for e in rel] * 4)[:a.texts], a.repeats)


def save(a, model: str, rows: list[dict]) -> None:
    """The rows so far, as JSON and markdown."""
    write_results(a.out, a.name, {
        "description": "each job briefly with default flags, each in a fresh process: achieved FLOP/s (per padded "
                       "token: 6N + 12LHT training, a third of that inference) over the peak in the job's precision: "
                       "on a CPU the best matmul rate (1024^3 and 2048^3) measured on this machine so far, on a GPU "
                       f"the datasheet's; training: {a.steps} optimizer steps, the figures of its report's last line "
                       "(the last epoch reached, its first steps included; the JSON's steps say how many); inference: "
                       f"{a.texts} texts, median of {a.repeats} passes after a warm-up; serve: the dynamic batcher "
                       f"in-process, {CONCURRENCY} concurrent one-text requests, no HTTP",
        "jobs": a.jobs,
        "model": model_name(model),
        "data": {"ner": a.ner or "synthetic", "re": a.re or "synthetic", "pairs": a.pairs or "synthetic"},
        "predict_models": {task: getattr(a, f"{task}_model") or f"the train row's, after {a.steps} steps"
                           for task in ("ner", "re") if f"predict-{task}" in [j.strip() for j in a.jobs.split(",")]}},
        rows, ["job", "precision", "mfu", "achieved_tflops", "peak_tflops", "real_tokens_per_s",
               "padding_efficiency", "split", "gpu_util", "seconds", "command"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="encoder directory [the offline MiniLM when installed, else tiny]")
    ap.add_argument("--ner", help="NER training data [synthetic]")
    ap.add_argument("--re", help="relation training data (CasRel JSON) [synthetic]")
    ap.add_argument("--pairs", help="scored pairs for embeddings (STS-B CSV) [synthetic]")
    ap.add_argument("--ner-model", help="a trained NER model for the predict row [the one the train row made]")
    ap.add_argument("--re-model", help="a trained relation model for the predict row [the one the train row made]")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per training job [%(default)s]")
    ap.add_argument("--texts", type=int, default=2000, help="texts per inference job [%(default)s]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", default="auto", help="every job's precision [auto: each job's default]")
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated jobs to run, of: %(default)s")
    ap.add_argument("--name", default="roofline", help="the results' file name [%(default)s]")
    ap.add_argument("--dry-run", action="store_true", help="a few steps and texts each, the results in a new "
                                                          "temporary directory (not --out)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--job", choices=JOBS, help=argparse.SUPPRESS)  # a child process: one job, its row
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    model = a.model or default_minilm() or "tiny"
    jobs = [j.strip() for j in a.jobs.split(",") if j.strip()]
    if not jobs:
        ap.error("--jobs: name at least one job")
    if unknown := sorted(set(jobs) - set(JOBS)):
        ap.error(f"--jobs: unknown job {', '.join(unknown)} (jobs: {', '.join(JOBS)})")
    if set(jobs) != set(JOBS) and a.name == ap.get_default("name") and not (a.job or a.dry_run):
        ap.error("--jobs: a table of some of the jobs needs its own --name (roofline.md holds them all)")
    needs = {"predict-ner": ("train-ner", a.ner_model), "predict-re": ("train-re", a.re_model)}
    if model == "tiny":  # a from-scratch model has no embedder but the one train-embed makes
        needs.update({"embed": ("train-embed", None), "serve": ("train-embed", None)})
    for job, (first, given) in needs.items():
        if job in jobs and first not in jobs and not given:
            ap.error(f"--jobs: {job} runs the model {first} trains; add {first} (or give the model to use)")
    if a.dry_run:
        a.steps, a.texts, a.repeats = 3, 64, 1
    if a.job:
        print("ROW " + json.dumps(one_job(a, a.job, model, a.work)), flush=True)
        return
    if a.dry_run:
        a.out = tempfile.mkdtemp(prefix="roofline-")
    work = tempfile.mkdtemp(prefix="roofline-runs-")
    rows, failed = Rows(), []
    try:
        for job in (j for j in JOBS if j in jobs):  # in the table's order
            p = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--job", job,
                                "--work", work], capture_output=True, text=True)
            row = next((json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")), None)
            if p.returncode or row is None:  # the other jobs still run: one device run shows every fault
                print(f"roofline job {job} failed ({p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr, flush=True)
                failed.append(job)
                continue
            rows.append(row)
            save(a, model, rows)  # after every row: a run cut short keeps the rows it has
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print(f"wrote {os.path.join(a.out, a.name + '.md')}")
    if failed:
        raise SystemExit(f"roofline: {len(failed)} job(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
