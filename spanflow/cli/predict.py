"""`spanflow predict --model DIR --input F --output F.jsonl`"""
from __future__ import annotations

import argparse
import json
import os
from collections import deque

from tqdm import tqdm

from spanflow.atomic import clean_stale, temp_file
from spanflow.cli.common import add_runtime_args, add_window_args
from spanflow.data.formats.common import read_lines
from spanflow.data.io import read_texts
from spanflow.errors import DataError


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="tag texts; writes char-offset spans as JSONL, in input order")
    p.add_argument("--model", required=True, help="a spanflow model directory, or an encoder directory (embeddings)")
    p.add_argument("--input", required=True, help="plain text (one document per line) or JSONL")
    p.add_argument("--output", required=True, help="output JSONL")
    p.add_argument("--field", default="text", help="JSONL field holding the text [%(default)s]")
    add_runtime_args(p, max_tokens=None)
    add_window_args(p)


def predict_file(model, src: str, dst: str, *, field: str = "text", max_tokens: int | None = None,
                 progress: bool = True) -> dict:
    """Tag every record of `src` into `dst` (written to a temp file, then renamed).

    One output line per input line, in order; a bad input record becomes an
    {"line", "error"} record instead of stopping the job.
    """
    total = sum(1 for _ in read_lines(src))
    pending: deque = deque()  # (text, error) in input order; thread-safe append/popleft
    real = [0]

    def texts():
        for item in read_texts(src, field=field, errors="record"):
            if isinstance(item, DataError):
                pending.append(("", item))
                yield ""
            else:
                pending.append((item, None))
                yield item

    bar = tqdm(total=total, unit="text", disable=not progress, dynamic_ncols=True, mininterval=0.5)

    def on_batch(n_texts: int, real_tokens: int, padded: int) -> None:
        real[0] += real_tokens
        if n_texts:
            bar.update(n_texts)
            bar.set_postfix(tok_s=f"{real[0] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    clean_stale(parent, "predict")  # what a run killed by SIGKILL left
    fd, tmp = temp_file(parent, "predict", ".jsonl")
    n = n_err = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for spans in model.predict_stream(texts(), max_tokens=max_tokens, on_batch=on_batch):
                text, err = pending.popleft()
                if err is not None:
                    rec = {"line": err.line, "error": err.reason}
                    n_err += 1
                else:
                    rec = model.output_record(text, spans)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, dst)
    finally:
        bar.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"records": n, "errors": n_err}


def _max_tokens(a: argparse.Namespace) -> int | None:
    from spanflow.tasks.registry import task_of_dir
    from spanflow.tuning.auto import resolve_max_tokens

    return resolve_max_tokens(a.max_tokens, profile=a.profile, task=task_of_dir(a.model).name, mode="infer", model=a.model,
                              data=a.input, precision=a.precision, device=a.device, field=a.field)


def run(a: argparse.Namespace) -> int:
    from spanflow.tasks.registry import load_model

    if not os.path.exists(a.input):
        raise DataError("file not found", path=a.input)
    model = load_model(a.model, device=a.device, precision=a.precision, max_length=a.max_length,
                            stride=a.stride)
    stats = predict_file(model, a.input, a.output, field=a.field, max_tokens=_max_tokens(a))
    print(f"wrote {stats['records']} records to {a.output} ({stats['errors']} error records)")
    return 0
