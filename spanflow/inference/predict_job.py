"""`spanflow predict` as a function: any task's model over a file of texts, streamed in input
order into JSONL (written aside, then renamed into place)."""
from __future__ import annotations

import json
from collections import deque

from tqdm import tqdm

from spanflow.atomic import atomic_open
from spanflow.data.formats.common import read_lines
from spanflow.data.records import read_texts
from spanflow.errors import DataError


def predict_file(model, src: str, dst: str, *, field: str = "text", column: int | None = None,
                 skip_header: bool = False, max_tokens: int | None = None, progress: bool = True) -> dict:
    """Tag every record of `src` into `dst` (written to a temp file, then renamed).

    One output line per input line, in order; a bad input record becomes an
    {"line", "error"} record instead of stopping the job.
    """
    total = sum(1 for _ in read_lines(src))
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

    # None: tqdm draws only on a terminal; a log file gets the summary line, not bar frames
    bar = tqdm(total=total, unit="text", disable=None if progress else True, dynamic_ncols=True, mininterval=0.5)

    def on_batch(n_texts: int, real_tokens: int, padded: int) -> None:
        real[0] += real_tokens
        if n_texts:
            bar.update(n_texts)
            bar.set_postfix(tok_s=f"{real[0] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    n = n_err = 0
    try:
        with atomic_open(dst, "predict", ".jsonl") as f:  # also removes what a run killed by SIGKILL left
            for spans in model.predict_stream(texts(), max_tokens=max_tokens, on_batch=on_batch):
                text, err = pending.popleft()
                if err is not None:
                    rec = {"line": err.line, "error": err.reason}
                    n_err += 1
                else:
                    rec = model.output_record(text, spans)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
    finally:
        bar.close()
    return {"records": n, "errors": n_err}
