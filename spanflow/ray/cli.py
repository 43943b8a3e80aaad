"""The --ray flags of `spanflow predict` and `spanflow embed`, and the job they start (docs/ray.md).

Imports nothing heavy: Ray is imported when a job runs.
"""
from __future__ import annotations

import argparse
import os

from spanflow.errors import ConfigError


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Data (many GPUs or machines; see docs/ray.md)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the job on Ray Data; --output is then a directory of Parquet files. No ADDRESS: "
                        "RAY_ADDRESS or a cluster started on this machine, else a Ray started for the job; "
                        "an ADDRESS (host:6379, ray://host:10001, auto) joins that cluster "
                        "[off: this process runs the job]")
    g.add_argument("--ray-actors", type=int, default=None, metavar="N",
                   help="model actors at most; the pool starts with those that fit the cluster now [one "
                        "per GPU; without GPUs, as many CPU actors as fit]")
    g.add_argument("--ray-cpus-per-actor", type=float, default=None, metavar="X",
                   help="CPUs each model actor reserves, its torch threads [1 with a GPU, else up to 4, "
                        "their threads sharing out all of the node's CPUs]")
    g.add_argument("--ray-gpus-per-actor", type=float, default=None, metavar="X",
                   help="GPUs each model actor reserves, e.g. 0.5 for two actors on a GPU [1 where "
                        "the cluster has GPUs]")


RAY_FLAGS = {"ray_actors": "--ray-actors", "ray_cpus_per_actor": "--ray-cpus-per-actor",
             "ray_gpus_per_actor": "--ray-gpus-per-actor"}


def check_ray_args(a: argparse.Namespace) -> None:
    """The --ray-* flags checked before Ray starts or a model loads: each applies with --ray only
    (without it, the job ran in this process and the flag did nothing), and each within its range."""
    given = [flag for dest, flag in RAY_FLAGS.items() if getattr(a, dest, None) is not None]
    if given and a.ray is None:
        raise ConfigError(f"{given[0]} applies to a job on Ray Data: add --ray (or drop {given[0]}; without --ray "
                          "this process runs the job)")
    from spanflow.ray.resources import check_asked

    check_asked(a.ray_actors, a.ray_cpus_per_actor, a.ray_gpus_per_actor)


def _keep(value) -> tuple[str, ...]:
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(k.strip() for k in items if k.strip())


def _chunk(a: argparse.Namespace, default: int) -> int:
    given = getattr(a, "chunk_size", None)  # embed's --chunk-size; predict has the models' own
    return default if given is None else given


def job_from_args(a: argparse.Namespace, task):
    """The RayJob that `spanflow predict/embed ... --ray` runs."""
    from spanflow.ray.job import DEFAULT_BATCH_ROWS, RayJob
    from spanflow.ray.source import Source
    from spanflow.runtime.resolve import Asked

    if getattr(a, "resume", False):
        raise ConfigError("--resume is for the single-process job; under --ray a failed worker's blocks are run "
                          "again by Ray, and a job that stops writes nothing at --output: run it again")
    src = Source(path=a.input, column=getattr(a, "column", None), field=getattr(a, "field", "text"),
                 skip_header=getattr(a, "skip_header", False), id_column=getattr(a, "id_column", None),
                 keep=_keep(getattr(a, "keep_columns", None)))
    opts = {"dtype": a.dtype} if getattr(a, "dtype", None) else {}
    if getattr(a, "normalize", False):  # embed's unit-length vectors: made so as they are written
        opts["normalize"] = True
    return RayJob(model=a.model, source=src, output=a.output, task=task.name, asked=Asked.from_args(a),
                  address=a.ray, actors=a.ray_actors, cpus_per_actor=a.ray_cpus_per_actor,
                  gpus_per_actor=a.ray_gpus_per_actor, batch_rows=_chunk(a, DEFAULT_BATCH_ROWS),
                  max_length=getattr(a, "max_length", None), stride=getattr(a, "stride", None), opts=opts)


# names of one file, which a directory of Parquet files would only pass for (.parquet may name either)
FILE_NAMES = (".npy", ".jsonl", ".ndjson", ".json", ".txt", ".csv", ".tsv", ".arrow", ".feather")


def check_ray_output(output: str, source: str | None = None) -> None:
    """Under --ray the output is a directory of Parquet files: a name the single-process job
    writes as one file (OUT.npy, OUT.jsonl) is refused before Ray starts, not made a directory;
    so is one inside the input directory `source`, whose files (subdirectories' too) are read."""
    ext = os.path.splitext(output.rstrip("/"))[1].lower()
    if ext in FILE_NAMES:
        raise ConfigError(f"--output {output}: under --ray the output is a directory of Parquet files, not one {ext} "
                          "file; name a directory (e.g. out/ or out.parquet), or drop --ray", field="output")
    if source and "://" not in source and "://" not in output and os.path.isdir(source):
        inside = os.path.commonpath([os.path.realpath(source), os.path.realpath(output)]) == os.path.realpath(source)
        if inside:
            raise ConfigError(f"--output {output} is inside the input directory {source}, whose files are all read: "
                              "the next run would read this output as input; write it elsewhere", field="output")


def run_ray(a: argparse.Namespace, task) -> dict:
    """Run the command's job on Ray; print one summary line; its summary."""
    from spanflow.ray.job import run_job

    check_ray_output(a.output, a.input)
    summary = run_job(job_from_args(a, task))
    print(summary_line(summary))
    return summary


def summary_line(s: dict) -> str:
    """The line a Ray job ends with: rows from its files, tokens from its actors, and whose time."""
    from spanflow.monitor.report import rate_text

    pe = "n/a" if s["padding_efficiency"] is None else f"{s['padding_efficiency']:.3f}"
    files = len(s["files"])
    return (f"wrote {s['rows']} rows ({s['errors']} error rows) to {s['output']} in {s['seconds']:.1f}s "
            f"(actors starting included; {s['startup_seconds']:.1f}s before, joining Ray and planning): "
            f"{rate_text(s['rows_per_s'])} rows/s, {rate_text(s['real_tokens_per_s'])} real tokens/s, padding "
            f"efficiency {pe}, "
            f"{s['truncated']} truncated; {files} Parquet file{'s' if files != 1 else ''}, {s['actors']}")
