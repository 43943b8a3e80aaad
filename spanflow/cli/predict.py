"""`spanflow predict --model DIR --input F --output F.jsonl`"""
from __future__ import annotations

import argparse
import os


from spanflow.cli.common import add_runtime_args, add_window_args
from spanflow.errors import DataError


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="tag texts; writes char-offset spans as JSONL, in input order")
    p.add_argument("--model", required=True, help="a spanflow model directory, or an encoder directory (embeddings)")
    p.add_argument("--input", required=True, help="plain text (one document per line), JSONL (--field) or CSV/TSV "
                                                  "(--column)")
    p.add_argument("--output", required=True, help="output JSONL")
    p.add_argument("--field", default="text", help="JSONL field holding the text [%(default)s]")
    p.add_argument("--column", type=int, default=None, help="CSV/TSV column holding the text, from 0 [0]")
    p.add_argument("--skip-header", action="store_true", help="skip the first line/row")
    add_runtime_args(p, max_tokens=None)
    add_window_args(p)


def run(a: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from spanflow.atomic import hold_output
    from spanflow.inference.predict_job import WHAT, check_output
    from spanflow.tasks.registry import task_of_dir

    if not os.path.exists(a.input):
        raise DataError("file not found", path=a.input)
    check_output(a.output)
    with ExitStack() as held:
        hold_output(held, a.output, WHAT)  # a second job on this output stops here, before any model loads
        return _run(a, task_of_dir(a.model))


def _run(a: argparse.Namespace, task) -> int:
    from spanflow.data.records import sample_texts
    from spanflow.inference.heap import settle
    from spanflow.inference.predict_job import predict_file
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.precision import SAMPLE
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tuning.auto import quick_profile

    loads = Loads(task, a.model)
    texts = sample_texts(a.input, SAMPLE, field=a.field, column=a.column, skip_header=a.skip_header)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=texts, data=a.input, field=a.field, column=a.column,
                         loads=loads, measure=quick_profile)
    model = loads.take(rt)
    model.set_max_length(a.max_length, a.stride)  # None, None: as trained
    settle()
    stats = predict_file(model, a.input, a.output, field=a.field, column=a.column, skip_header=a.skip_header,
                         max_tokens=rt.max_tokens)
    print(f"wrote {stats['records']} records to {a.output} ({stats['errors']} error records)")
    return 0
