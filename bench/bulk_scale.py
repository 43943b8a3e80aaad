"""Bulk embedding at scale on one machine: the single-process `spanflow embed` against the same
job on a local Ray (`--ray`), Parquet in, Parquet out, whole process each.

Synthetic texts (sentence lengths drawn like real sentences: a log-normal word count, median
14 words) are written to Parquet in row groups. The model is `--model DIR`, or by default a
from-scratch BERT encoder (4 layers, hidden 256, a WordPiece vocabulary fitted to the texts)
built here and saved to a temporary directory, so nothing is downloaded. Both jobs run in a
fresh process with the same flags; their files must hold the same ids and the same vectors,
bit for bit (the run stops otherwise).

The Ray run starts its own Ray (RAY_ADDRESS is removed from its environment, and the bench
refuses to run while a Ray cluster is up on this machine), so Ray's start-up is in its time
and Ray's processes (GCS, raylet, workers) are in its memory. Peak memory is the peak of the
summed RSS of the process tree, sampled every --sample-s seconds, and of its summed PSS, read
on every --pss-every-th sample (psutil's memory_full_info: smaps_rollup, which walks each
process's page tables and is not free, see run()): in RSS a shared page
(Ray's object store in /dev/shm, the libraries) counts once per process that maps it, in PSS
it is split among them, so the PSS sum is what the tree holds. The input is read once before
the runs, so neither run pays for a cold page cache, and with --repeats the order of the two
runs alternates.

    python bench/bulk_scale.py --sizes 100000,1000000
    python bench/bulk_scale.py --layers 1 --hidden 32 --sizes 100000,1000000 --name bulk_scale_small_model
    python bench/bulk_scale.py --layers 1 --hidden 32 --sizes 100000,1000000 --pss-every 5 --name bulk_scale_small_model_quarters
    python bench/bulk_scale.py --sizes 2000 --out /tmp/bulk   # a check that it runs
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from common import write_results  # noqa: E402

ROW_GROUP = 10_000


def sentences(n: int, seed: int = 0):
    """`n` sentences of pseudo-words; word counts log-normal around 14 (3 to 80), like real ones."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "an", "el", "or", "us", "ti", "ba"]
    words = sorted({"".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(5000)})
    for _ in range(n):
        k = min(80, max(3, round(math.exp(rng.gauss(math.log(14), 0.5)))))
        yield " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."


def write_input(path: str, n: int) -> None:
    """The texts as Parquet (one column, `text`), in row groups of ROW_GROUP, streamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    gen = sentences(n)
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as w:
        for at in range(0, n, ROW_GROUP):
            w.write_table(pa.table({"text": [next(gen) for _ in range(min(ROW_GROUP, n - at))]}))


def tiny_encoder(path: str, layers: int = 4, hidden: int = 256) -> str:
    """A from-scratch BERT encoder directory (random weights: speed, not quality)."""
    import torch
    from transformers import BertConfig, BertModel

    from spanflow.models.encoder import train_wordpiece

    tok = train_wordpiece(list(sentences(5000, seed=1)), 4000)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=max(2, hidden // 64), intermediate_size=4 * hidden,
                     max_position_embeddings=512, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    BertModel(cfg, add_pooling_layer=False).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tree_memory(proc: psutil.Process, pss: bool) -> tuple[int, int | None]:
    """The summed RSS in bytes of `proc` and all its descendants, and with `pss` their summed
    PSS (None without). PSS shares a page among the processes that map it (Ray's object store,
    the libraries), so its sum is what the tree holds; RSS counts a shared page once per process."""
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, None
    rss, total = 0, 0 if pss else None
    for p in procs:
        try:
            m = p.memory_info()
            rss += m.rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if pss:
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                total += m.rss  # unreadable (or no PSS on this platform): its RSS, the bound above
    return rss, total


def quarters(samples: list[tuple[float, int]], secs: float) -> list[int]:
    """The peak of (t, bytes) samples in each quarter of a run `secs` long, MiB (0: no sample):
    memory bounded by the job levels off over the quarters, memory that grows with the input
    keeps rising."""
    peaks = [0, 0, 0, 0]
    for t, b in samples:
        q = min(3, int(4 * t / secs)) if secs > 0 else 0
        peaks[q] = max(peaks[q], b)
    return [round(b / 2**20) for b in peaks]


def run(cmd: list[str], env: dict, sample_s: float, pss_every: int) -> dict:
    """Run `cmd` to its end: whole-process seconds, peak tree RSS and PSS (MiB), the PSS peak of
    each quarter of the run, its stdout.
    PSS is read on every `pss_every`-th sample only: smaps_rollup walks each process's page
    tables under its memory lock (5-15 ms a process of this size here, 50-65 ms a sample for a
    Ray job's 14 processes), which every second would slow the Ray job more than the single one."""
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty job never blocks on it
        t = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        proc, peak, peak_pss, k, timeline = psutil.Process(p.pid), 0, 0, 0, []
        while p.poll() is None:
            rss, pss = tree_memory(proc, k % pss_every == 0)
            peak, peak_pss, k = max(peak, rss), max(peak_pss, pss or 0), k + 1
            if pss is not None:
                timeline.append((time.perf_counter() - t, pss))
            try:
                p.wait(timeout=sample_s)
            except subprocess.TimeoutExpired:
                continue
        secs = time.perf_counter() - t
        log.seek(0)
        out = log.read()
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{out[-4000:]}")
    return {"s": secs, "rss_mib": peak / 2**20, "pss_mib": peak_pss / 2**20,
            "pss_quarters_mib": quarters(timeline, secs), "stdout": out}


def ray_running() -> list[int]:
    """The pids of a Ray cluster's processes up on this machine (its GCS server or raylet)."""
    found = []
    for p in psutil.process_iter(["name"]):
        if (p.info["name"] or "").startswith(("gcs_server", "raylet")):
            found.append(p.pid)
    return found


def same_vectors(single: str, ray_dir: str) -> float:
    """The largest difference between the two outputs' vectors; the run stops unless their
    ids, order and vectors are equal."""
    import pyarrow.parquet as pq

    a, b = pq.read_table(single), pq.read_table(ray_dir)
    if a.column("id").to_pylist() != b.column("id").to_pylist():
        raise SystemExit("the Ray job's ids or order differ from the single-process job's")
    va = np.asarray(a.column("embedding").combine_chunks().flatten()).reshape(a.num_rows, -1)
    vb = np.asarray(b.column("embedding").combine_chunks().flatten()).reshape(b.num_rows, -1)
    diff = float(np.abs(va - vb).max()) if len(va) else 0.0
    if not np.array_equal(va, vb):
        raise SystemExit(f"the Ray job's vectors differ from the single-process job's (max abs diff {diff:g})")
    return diff


def read_once(path: str) -> None:
    """Read the file through once: both runs then find it in the page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def one_size(n: int, a, model: str, work: str, env: dict, repeat: int) -> dict:
    src = os.path.join(work, f"texts{n}.parquet")
    write_input(src, n)
    read_once(src)
    base = [sys.executable, "-m", "spanflow", "embed", "--model", model, "--input", src, "--column", "text",
            "--precision", a.precision]
    single_out, ray_out = os.path.join(work, "single.parquet"), os.path.join(work, "ray_out")
    shutil.rmtree(ray_out, ignore_errors=True)
    ray_env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}  # a Ray of its own, timed with the job
    runs = {"single": lambda: run(base + ["--output", single_out], env, a.sample_s, a.pss_every),
            "ray": lambda: run(base + ["--output", ray_out, "--ray"] + a.ray_args.split(), ray_env, a.sample_s,
                               a.pss_every)}
    order = ["single", "ray"] if repeat % 2 == 0 else ["ray", "single"]
    got = {name: runs[name]() for name in order}
    single, ray = got["single"], got["ray"]
    row = {"rows": n, "repeat": repeat, "first": order[0], "single_s": round(single["s"], 2),
           "ray_s": round(ray["s"], 2), "single_rows_per_s": round(n / single["s"]),
           "ray_rows_per_s": round(n / ray["s"]), "ray_overhead": round(ray["s"] / single["s"], 2),
           "single_peak_rss_mib": round(single["rss_mib"]), "ray_peak_rss_mib": round(ray["rss_mib"]),
           "single_peak_pss_mib": round(single["pss_mib"]), "ray_peak_pss_mib": round(ray["pss_mib"]),
           "single_pss_quarters_mib": single["pss_quarters_mib"], "ray_pss_quarters_mib": ray["pss_quarters_mib"],
           "max_abs_diff": same_vectors(single_out, ray_out)}
    row["ray_summary"] = next((line for line in ray["stdout"].splitlines() if line.startswith("wrote ")), None)
    row["single_device"] = next((line for line in single["stdout"].splitlines() if line.startswith("device ")), None)
    row["single_summary"] = next((json.loads(line) for line in single["stdout"].splitlines()
                                  if line.startswith("{")), {}).get("texts_per_s")
    print(row)
    os.remove(src)
    return row


def model_name(a) -> str:
    """The model: its directory's name and size (config.json), or the one built here."""
    if not a.model:
        return f"from-scratch BERT ({a.layers} layer{'s' if a.layers != 1 else ''}, hidden {a.hidden})"
    try:
        with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        n = cfg["num_hidden_layers"]
        size = f" ({n} layer{'s' if n != 1 else ''}, hidden {cfg['hidden_size']})"
    except (OSError, ValueError, KeyError):
        size = ""
    return os.path.basename(os.path.normpath(a.model)) + size


def command() -> str:
    """This run's command line, a --model directory written DIR."""
    import shlex

    args, shown = sys.argv[1:], []
    for k, x in enumerate(args):
        if k and args[k - 1] == "--model":
            x = "DIR"
        elif x.startswith("--model="):
            x = "--model=DIR"
        shown.append(x)
    return shlex.join(["python", "bench/bulk_scale.py"] + shown)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="rows of synthetic text, comma-separated")
    ap.add_argument("--model", default=None, help="an embedding model directory [a from-scratch BERT, built here]")
    ap.add_argument("--layers", type=int, default=4, help="the from-scratch BERT's layers")
    ap.add_argument("--hidden", type=int, default=256, help="the from-scratch BERT's hidden size (heads of 64, at "
                                                            "least 2; feed-forward 4x)")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--ray-args", default="", help="more flags for the Ray run, e.g. '--ray-actors 2'")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each size, the two jobs' order alternating")
    ap.add_argument("--sample-s", type=float, default=1.0, help="seconds between memory samples (RSS)")
    ap.add_argument("--pss-every", type=int, default=10, help="PSS on every Nth memory sample (it costs)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="bulk_scale", help="the results' file name, without extension")
    a = ap.parse_args()
    if ray_running():
        raise SystemExit(f"a Ray cluster is running on this machine (pids {ray_running()}): the Ray run would join "
                         "it, and neither its start-up nor its processes would be measured; stop it (ray stop)")
    work = tempfile.mkdtemp(prefix="bulk-bench-")
    env = dict(os.environ, SPANFLOW_CACHE=os.path.join(work, "cache"), TOKENIZERS_PARALLELISM="false")
    model = a.model or tiny_encoder(os.path.join(work, "encoder"), a.layers, a.hidden)
    warm = os.path.join(work, "warm.parquet")  # the --precision auto verdict, cached before either run
    write_input(warm, 300)
    run([sys.executable, "-m", "spanflow", "embed", "--model", model, "--input", warm, "--column", "text",
         "--precision", a.precision, "--output", os.path.join(work, "warm_out.parquet")], env, a.sample_s, 1)
    try:
        rows = [one_size(int(n), a, model, work, env, r) for n in a.sizes.split(",") for r in range(a.repeats)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    payload = {"description": f"model: {model_name(a)}; `{command()}`\n\n"
                              "whole-process seconds, rows/s and peak memory of the process tree (psutil, summed "
                              "RSS every --sample-s s, summed PSS every --pss-every samples) for `spanflow embed` "
                              "Parquet to Parquet, single process vs a local Ray (`--ray`, its own Ray started "
                              "and timed) on the same machine; ray_overhead = ray_s / single_s; the vectors are "
                              "checked equal bit for bit",
               "model": model_name(a), "command": command(), "ray_args": a.ray_args,
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
               "torch_threads": torch.get_num_threads(), "sample_s": a.sample_s, "pss_every": a.pss_every,
               "repeats": a.repeats}
    write_results(a.out, a.name, payload, rows,
                  ["rows", "repeat", "first", "single_s", "ray_s", "ray_overhead", "single_rows_per_s",
                   "ray_rows_per_s", "single_peak_rss_mib", "ray_peak_rss_mib", "single_peak_pss_mib",
                   "ray_peak_pss_mib", "single_pss_quarters_mib", "ray_pss_quarters_mib", "max_abs_diff"])


if __name__ == "__main__":
    main()
