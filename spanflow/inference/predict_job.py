"""`spanflow predict` as a function: any task's model over a file of texts, streamed in input
order into JSONL (written aside, then renamed into place).

One writer per output: the job holds spanflow.atomic.claim_output(dst) from before it reads
the input until the file is in place, so a second job on the same output stops at once,
naming the first one's pid, instead of the two racing to rename their files onto it.
"""
from __future__ import annotations

import json
import os
from collections import deque
from contextlib import ExitStack

from tqdm import tqdm

from spanflow.atomic import atomic_open, hold_output, writing
from spanflow.data.formats.common import read_lines_or_errors
from spanflow.data.records import read_texts
from spanflow.errors import ConfigError, DataError

WHAT = "the predictions"


def check_output(dst: str, what: str = WHAT) -> None:
    """Refuse an output path that cannot become a file (a directory, or a file where its directory
    should be) with one clear error, before any work; `what` the output is, for a write error."""
    if os.path.isdir(dst):
        raise ConfigError(f"--output {dst} is a directory; give a file name", field="output")
    with writing(what, dst):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"--output {dst}: a file stands where its directory should be", field="output") from None


def predict_file(model, src: str, dst: str, *, field: str = "text", column: int | None = None,
                 skip_header: bool = False, max_tokens: int | None = None, progress: bool = True) -> dict:
    """Tag every record of `src` into `dst` (written to a temp file, then renamed).

    One output line per input line, in order; a bad input record becomes an
    {"line", "error"} record instead of stopping the job. A second job on `dst` is OutputBusy;
    a full or read-only disk is a WriteError, with nothing left at `dst`.
    """
    check_output(dst)
    with ExitStack() as held:
        hold_output(held, dst, WHAT)
        total = sum(1 for _ in read_lines_or_errors(src))  # a bad line is a record too
        # None: tqdm draws only on a terminal; a log file gets the summary line, not bar frames
        bar = tqdm(total=total, unit="text", disable=None if progress else True, dynamic_ncols=True, mininterval=0.5)
        try:
            return _write(model, src, dst, bar, field=field, column=column, skip_header=skip_header,
                          max_tokens=max_tokens)
        finally:
            bar.close()


def _write(model, src: str, dst: str, bar, *, field: str, column: int | None, skip_header: bool,
           max_tokens: int | None) -> dict:
    pending: deque = deque()  # (text, error) in input order; thread-safe append/popleft
    real = [0]

    def texts():
        for item in read_texts(src, field=field, column=column, skip_header=skip_header, errors="record"):
            if isinstance(item, DataError):
                pending.append(("", item))
                yield ""
            else:
                pending.append((item, None))
                yield item

    def on_batch(n_texts: int, real_tokens: int, padded: int) -> None:
        real[0] += real_tokens
        if n_texts:
            bar.update(n_texts)
            bar.set_postfix(tok_s=f"{real[0] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    n = n_err = 0
    # the input was opened and read through once already (the count): an OSError in here is the
    # output's. atomic_open also removes what a run killed by SIGKILL left.
    with writing(WHAT, dst), atomic_open(dst, "predict", ".jsonl") as f:
        for spans in model.predict_stream(texts(), max_tokens=max_tokens, on_batch=on_batch):
            text, err = pending.popleft()
            if err is not None:
                rec = {"line": err.line, "error": err.reason}
                n_err += 1
            else:
                rec = model.output_record(text, spans)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return {"records": n, "errors": n_err}
