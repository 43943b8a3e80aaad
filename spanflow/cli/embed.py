"""`spanflow embed --model DIR --input F --output OUT.npy|OUT.jsonl|OUT.parquet`"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from spanflow.cli.common import (
    add_budget_args,
    add_device_arg,
    add_input_args,
    add_precision_arg,
    add_quantize_args,
    note_small_budget,
    rates_said,
    resume_hint,
    job_status,
)
from spanflow.ray.cli import add_ray_args, check_ray_args, run_ray


def add_parser(sub) -> None:
    p = sub.add_parser("embed", help="embed texts in bulk (.npy, JSONL or Parquet output), streaming and resumable",
                       description="Embed every record of the input. Empty or whitespace-only texts get the "
                                   "embedding of an input with only special tokens; unreadable records become "
                                   "NaN rows (.npy), error records (JSONL) or rows with a null embedding and "
                                   "their error (Parquet), and are listed in OUT.errors.jsonl.")
    p.add_argument("--model", required=True, help="a sentence-transformers or Hugging Face encoder directory")
    p.add_argument("--input", required=True, help="text lines, JSONL (--field), CSV/TSV (--column) or Parquet/Arrow "
                                                  "(--column NAME)")
    p.add_argument("--output", required=True, help="OUT.npy (plus OUT.ids.txt), OUT.jsonl or OUT.parquet")
    add_input_args(p, kept_into=".parquet or .jsonl; a .npy holds only vectors")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help=".npy and Parquet vector type [%(default)s]")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per text, special tokens included; longer texts are cut there (counted as "
                        "truncated) [the model's max_seq_length]")
    p.add_argument("--normalize", action="store_true",
                   help="unit-length vectors (cosine is then the dot product), as sentence-transformers' "
                        "normalize_embeddings [off: as the model makes them; a model with a Normalize module "
                        "makes them unit-length already]")
    p.add_argument("--chunk-size", type=int, default=8192,
                   help="texts read, sorted and written at a time (a Parquet row group) [%(default)s]")
    add_budget_args(p, job="infer")
    add_precision_arg(p)
    add_quantize_args(p, gate="a sample of the input", forced="a reduced precision or an int8 quantization")
    add_device_arg(p)
    p.add_argument("--resume", action="store_true", help="continue a killed run of the same job")
    add_ray_args(p)


def after_stop(a: argparse.Namespace) -> str | None:
    """What a stopped job left to go on from: its journal, which the same command with --resume
    takes up (docs/embeddings.md)."""
    from spanflow.tasks.embed.journal import job_paths

    return resume_hint(a, lambda out: job_paths(out).journal, "the last chunk written")


def run(a: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from spanflow.atomic import hold_output
    from spanflow.batching.align import check_window_floor
    from spanflow.cli.common import check_input
    from spanflow.inference.predict_job import check_output
    from spanflow.tasks.embed.job import WHAT
    from spanflow.tasks.registry import check_model_for, get

    check_ray_args(a)  # before Ray starts or a model loads
    check_model_for(a.model, "embed")  # a model of another task is named, before any model loads
    check_window_floor(a.max_length, None)  # the model's own limit is checked once it is loaded
    check_input(a)
    if a.ray is not None:  # its output is a directory of Parquet files, checked there
        s = run_ray(a, get("embed"))
        return job_status(a.input, s["rows"], s["errors"])
    check_output(a.output, WHAT)
    with ExitStack() as held:
        hold_output(held, a.output, WHAT)  # a second job on this output stops here, before any model loads
        return _run(a)


def _run(a: argparse.Namespace) -> int:
    from spanflow.data.records import sample_texts
    from spanflow.inference.heap import settle
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.precision import SAMPLE
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.embed.job import EmbedSpec, check_resumable, check_spec, embed_file, other_outputs
    from spanflow.tasks.embed.journal import job_paths
    from spanflow.tasks.registry import get
    from spanflow.tuning.auto import quick_profile

    spec = EmbedSpec(input=a.input, output=a.output, field=a.field, column=a.column, skip_header=a.skip_header,
                     id_column=a.id_column, keep=a.keep_columns, chunk_size=a.chunk_size, dtype=a.dtype, model=a.model,
                     max_length=a.max_length, normalize=a.normalize)
    check_spec(spec)  # formats, columns and kept columns: one error before a model loads
    if a.resume:
        check_resumable(spec)  # another job's journal, or a changed input, told before the model loads
    task = get("embed")
    loads = Loads(task, a.model)
    texts = sample_texts(a.input, SAMPLE, field=a.field, column=a.column, skip_header=a.skip_header)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=texts, data=a.input, field=a.field,
                         column=a.column, loads=loads,
                         measure=functools.partial(quick_profile, texts=texts or None))  # the input's texts
    emb = loads.take(rt)
    emb.set_max_length(a.max_length)  # None: the model's own
    settle()
    note_small_budget(emb, a.max_tokens, rt.max_tokens)
    print(f"device {emb.policy.device}, precision {emb.policy.name}"
          + (f", quantize {emb.quantize}" if emb.quantize else "") + f", max length {emb.max_length}, dim {emb.dim}"
          + (", unit-length vectors (--normalize)" if a.normalize else ""))
    # auto's choice and a quantization were checked against fp32 on this input just now
    checked = a.precision == "auto" or rt.quantize is not None
    s = embed_file(emb, spec, max_tokens=rt.max_tokens, resume=a.resume, force=a.force, calibrate=not checked)
    # an error record runs no text of its own: the rates are of the texts embedded
    rates = rates_said(s["texts"] - s["errors"], s["seconds"], s["real_tokens"], s["padding_efficiency"])  # texts_per_s's
    # a resumed job's figures are the whole job's, over its runs: its seconds are their embedding time
    before = s["resumed_texts"]
    resumed = f" ({before} of them before --resume; rates over the job's runs)" if before else ""
    print(f"embedded {s['texts']} texts{resumed} {rates}; {s['truncated']} truncated at {emb.max_length} tokens, "
          f"{s['empty']} empty, {s['errors']} errors")
    print(json.dumps({k: v for k, v in s.items() if k != "calibration"}))
    errors = job_paths(a.output).errors
    if not s["errors"] and os.path.exists(errors):  # kept as another output's of this stem (v.parquet's)
        print(f"note: {errors} is not this output's (it had no errors): it lists the errors of another output of "
              f"its name, {', '.join(other_outputs(a.output))}", file=sys.stderr)
    return job_status(a.input, s["texts"], s["errors"])
