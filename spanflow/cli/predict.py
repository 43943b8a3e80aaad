"""`spanflow predict --model DIR --input F --output F.jsonl|F.parquet`"""
from __future__ import annotations

import argparse
import functools

from spanflow.cli.common import (add_input_args, add_runtime_args, add_window_args, check_window_args, cut_line,
                                 job_status, note_small_budget, rates_said, resume_hint)
from spanflow.ray.cli import add_ray_args, check_ray_args, run_ray


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="run a model on texts: entities, triples or vectors as JSONL or Parquet, "
                                       "in input order",
                       description="Run a model on every record of the input and write one output record per "
                                   "input record, in input order: character-offset entities (NER), triples (RE) "
                                   "or embeddings. An unreadable record becomes an error record, never a gap.")
    p.add_argument("--model", required=True, help="a spanflow model directory, a Hugging Face token-classification "
                                                  "directory (NER), or an encoder directory (embeddings)")
    p.add_argument("--input", required=True, help="plain text (one document per line), JSONL (--field), CSV/TSV "
                                                  "(--column) or Parquet/Arrow (--column NAME)")
    p.add_argument("--output", required=True, help="output JSONL, or .parquet (docs/data-formats.md has its columns)")
    add_input_args(p, kept_into="JSONL or .parquet")
    add_runtime_args(p)
    add_window_args(p)
    p.add_argument("--resume", action="store_true", help="continue a killed run of the same job")
    add_ray_args(p)


def after_stop(a: argparse.Namespace) -> str | None:
    """What a stopped job left to go on from: its journal, which the same command with --resume
    takes up (docs/inference.md)."""
    import os

    from spanflow.inference.predict_journal import PredictPaths

    # beside the output's target where it is a link, as the job writes it
    return resume_hint(a, lambda out: PredictPaths(os.path.realpath(out)).journal, "the last records written")


def run(a: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from spanflow.atomic import hold_output
    from spanflow.cli.common import check_input
    from spanflow.inference.predict_job import WHAT, check_output, output_format
    from spanflow.tasks.registry import task_of_dir

    check_input(a)
    check_ray_args(a)  # before Ray starts or a model loads
    check_window_args(a.model, a.max_length, a.stride)  # before the model loads
    task = task_of_dir(a.model)
    if a.ray is not None:  # its output is a directory of Parquet files, checked there
        s = run_ray(a, task)
        return job_status(a.input, s["rows"], s["errors"])
    check_output(a.output)
    output_format(a.output)
    with ExitStack() as held:
        hold_output(held, a.output, WHAT)  # a second job on this output stops here, before any model loads
        return _run(a, task)


def _run(a: argparse.Namespace, task) -> int:
    from spanflow.data.records import sample_texts
    from spanflow.inference.heap import settle
    from spanflow.inference.predict_job import check_job, predict_file
    from spanflow.errors import counted
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.precision import SAMPLE
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tuning.auto import quick_profile

    check_job(a.input, a.output, field=a.field, column=a.column, skip_header=a.skip_header, id_column=a.id_column,
              keep=a.keep_columns)  # columns, their types and kept names: one error, before a model loads
    loads = Loads(task, a.model)
    texts = sample_texts(a.input, SAMPLE, field=a.field, column=a.column, skip_header=a.skip_header)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=texts, data=a.input, field=a.field, column=a.column,
                         loads=loads,
                         measure=functools.partial(quick_profile, texts=texts or None))  # the input's texts
    model = loads.take(rt)
    model.set_max_length(a.max_length, a.stride)  # None, None: as trained
    settle()
    note_small_budget(model, a.max_tokens, rt.max_tokens)
    stats = predict_file(model, a.input, a.output, field=a.field, column=a.column, skip_header=a.skip_header,
                         id_column=a.id_column, keep=a.keep_columns, max_tokens=rt.max_tokens, resume=a.resume,
                         model_dir=a.model)
    # how fast this run's texts went (a resumed job's: those after the resume), reading and writing included
    ran = stats["texts"] - stats["run_errors"]  # an error record's text is run as "": no text of its own
    rates = (" " + rates_said(ran, stats["seconds"], stats["real_tokens"],
                              stats["real_tokens"] / max(stats["padded_tokens"], 1))) if ran > 0 else ""
    print(f"wrote {counted(stats['records'], 'record')} to {a.output} ({counted(stats['errors'], 'error record')})"
          + rates)
    if stats.get("truncated"):  # a model that reads no windows reads a long text's start only
        print(f"note: {cut_line(model, stats['truncated'])}")
    return job_status(a.input, stats["records"], stats["errors"])
