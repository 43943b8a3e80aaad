"""`spanflow predict` as a function: any task's model over a file of texts, streamed in input
order into JSONL or Parquet (written aside, then renamed into place), resumable.

Parquet output (spanflow.data.tables has its columns) is written a row group at a time as
predictions arrive, each a part file, so memory stays bounded; its file appears at the output
when complete. What a killed run leaves, and how a resumed one goes on: predict_journal.py.

One writer per output: the job holds spanflow.atomic.claim_output(dst) from before it reads
the input until the file is in place, so a second job on the same output stops at once,
naming the first one's pid, instead of the two racing to rename their files onto it.
"""
from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

from tqdm import tqdm

from spanflow.atomic import clean_stale, hold_output, make_output_folder, writing
from spanflow.batching.prefetch import read_ahead
from spanflow.data.formats.common import check_exists, kind_of, read_lines_or_errors
from spanflow.data.jsonvalues import json_line
from spanflow.data.records import Column, read_rows
from spanflow.data.tables import (
    IPC,
    carried_schema,
    check_keep,
    error_fields,
    is_table,
    output_schema,
    output_table,
    table_rows,
)
from spanflow.errors import ConfigError, DataError, as_log, as_path, quote
from spanflow.inference.journal import (assemble, chunk_part, model_files, refuse_onto_input, stopped_by_input,
                                        weights_digest, write_chunk,
                                        write_journal)
from spanflow.inference.predict_journal import PredictJob, PredictPaths, PredictSpec, open_job

WHAT = "the predictions"
ROWS = 8192  # rows per Parquet row group
OUTPUTS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
JSONL_KEYS = ("id", "line", "row", "error")  # a JSONL record's own keys, beside its task's


def output_format(dst: str) -> str:
    """jsonl or parquet, as the output's extension says (OUTPUTS); any other is a ConfigError
    naming those predict writes."""
    ext = os.path.splitext(dst)[1].lower()
    if ext not in OUTPUTS:
        hint = "; Arrow output is written as Parquet" if ext in IPC else ""
        raise ConfigError(f"--output {dst}: predict writes JSONL (.jsonl, .ndjson, .json) or Parquet (.parquet, "
                          f".pq){hint}", field="output")
    return OUTPUTS[ext]


def check_output(dst: str, what: str = WHAT) -> None:
    """Refuse an output path that cannot become a file (a directory, or a file where its directory
    should be) with one clear error, before any work; `what` the output is, for a write error."""
    if os.path.isdir(dst):
        raise ConfigError(f"--output {dst} is a directory; give a file name", field="output")
    make_output_folder(dst, what)


def check_job(src: str, dst: str, *, field: str = "text", column: Column | None = None, skip_header: bool = False,
              id_column: str | None = None, keep: Sequence[str] = ()) -> tuple[str, Any]:
    """What a job can be refused for before its model loads, each fault one error: the output's
    name, the input's columns (read_rows), kept columns named twice or like the output's own
    id, error, line and row. Returns (format, the carried types of a Parquet output, else None)."""
    check_output(dst)
    fmt = output_format(dst)
    refuse_onto_input(src, dst)
    read_rows(src, field=field, column=column, skip_header=skip_header, id_column=id_column, keep=keep)
    if fmt == "jsonl":
        check_keep(keep, JSONL_KEYS, "key")
        return fmt, None
    return fmt, carried_schema(src, id_column=id_column, keep=keep)


def _check_model(model, dst: str, fmt: str, keep: Sequence[str], types) -> None:
    """What the model decides, before any work: the keys or columns of its results, which no
    kept column may take, and for Parquet its arrow_results."""
    if fmt == "jsonl":
        check_keep(keep, (*JSONL_KEYS, *model.output_record("", [])), "key")
        return
    if not callable(getattr(model, "arrow_results", None)):
        raise ConfigError(f"--output {dst}: {getattr(model, 'task', 'this')} models have no Parquet form of their "
                          "results (arrow_results); write JSONL", field="output")
    output_schema(model, types)


def predict_file(model, src: str, dst: str, *, field: str = "text", column: Column | None = None,
                 skip_header: bool = False, id_column: str | None = None, keep: Sequence[str] = (),
                 max_tokens: int | None = None, progress: bool = True, rows_per_group: int = ROWS,
                 resume: bool = False, model_dir: str | None = None, log=print) -> dict:
    """Tag every record of `src` into `dst` (nothing is at `dst` until the job ends).

    One output record per input record, in order; a bad input record becomes an error record
    ({"line" or, for a table, "row", and "error"} in JSONL, a null result and its `error` in
    Parquet) instead of stopping the job. `id_column` and `keep` carry input columns into each
    record (in JSONL: "id" only with `id_column`, the value Parquet's id column holds; values
    JSON has no form for as data.tables.json_value gives them). check_job's faults, and the
    model's own (_check_model), are raised before any record is read. A second job on `dst` is
    OutputBusy; a full or read-only disk is a WriteError, with nothing left at `dst`.

    The job is synced every `rows_per_group` records (predict_journal.py): a killed run is gone on
    with by the same call with `resume`, which checks the settings, the input and the model
    (`model_dir`, the directory `model` was loaded from) and skips the records done.
    """
    from spanflow.tasks.inputs import check_max_tokens

    src, dst, log = as_path(src, "src"), as_path(dst, "dst"), as_log(log, "log")  # None: silence, as training's log_fn
    if not callable(getattr(model, "predict_stream", None)):  # a path given for the model, say
        raise ConfigError(f"model takes a loaded model (NerModel.load(DIR), ReModel.load(DIR)), got "
                          f"{type(model).__name__} {quote(model, 60)}")
    check_exists(src)
    check_max_tokens(max_tokens)  # before the job's files are laid out
    if isinstance(rows_per_group, bool) or not isinstance(rows_per_group, int) or rows_per_group < 1:
        raise ConfigError(f"rows_per_group must be a whole number >= 1, got {rows_per_group!r:.60}")
    fmt, types = check_job(src, dst, field=field, column=column, skip_header=skip_header, id_column=id_column,
                           keep=keep)
    _check_model(model, dst, fmt, keep, types)
    spec = PredictSpec(input=os.path.abspath(src), field=field, column=column, skip_header=skip_header,
                       id_column=id_column, keep=list(keep), format=fmt, rows_per_group=rows_per_group,
                       model=os.path.abspath(model_dir) if model_dir else "", model_files=model_files(model_dir) or weights_digest(model),
                       precision=str(getattr(model, "precision_name", None)
                                     or getattr(getattr(model, "policy", None), "name", "")),
                       max_length=getattr(model, "max_length", None), stride=getattr(model, "stride", None))
    with ExitStack() as held:
        hold_output(held, dst, WHAT)
        clean_stale(os.path.dirname(os.path.abspath(dst)), "predict")  # a killed run's temporary of the last step
        P = PredictPaths(os.path.realpath(dst), fmt)  # a link is written through: its target replaced, the link kept
        with writing(WHAT, dst):
            job, state = open_job(P, spec, src, resume, log)
        with stopped_by_input(lambda: job.records, P.remove_leftovers):
            rows = itertools.islice(read_rows(src, field=field, column=column, skip_header=skip_header,
                                              id_column=id_column, keep=keep, ids=fmt == "parquet"),
                                    job.records, None)  # a JSONL output holds ids only from --id-column
            total = _records(src, field=field, column=column, skip_header=skip_header, id_column=id_column, keep=keep)
            if job.records > total or (state == "placed" and job.records < total):  # a journal edited by hand: going on
                raise ConfigError(f"{P.journal} records {job.records} records as done, but {src} holds {total}; remove "
                                  "it or drop --resume to start over")  # would write a short or doubled output
            errors0 = job.errors
            if state == "placed":  # the job had ended, killed as it removed its journal: nothing is left to predict
                log(f"--resume: the job had ended: {P.out} holds all {total} records; its journal is removed")
                P.remove_leftovers()
                return {"records": job.records, "errors": job.errors, "run_errors": 0, "seconds": 0.0, "texts": 0,
                        "real_tokens": 0, "padded_tokens": 0}
            if state == "resumed":
                log(f"--resume: {job.records} records of {P.out} were done; "
                    + (f"predicting from record {job.records + 1}" if job.records < total
                       else "that is all of them: putting the output in place"))
            # None: tqdm draws only on a terminal; a log file gets the summary line, not bar frames
            bar = tqdm(total=total, initial=job.records, unit="text", disable=None if progress else True,
                       dynamic_ncols=True, mininterval=0.5)
            tally = {"texts": 0, "real_tokens": 0, "padded_tokens": 0}
            started = time.perf_counter()
            try:
                preds = _predictions(model, rows, bar, max_tokens, tally)
                done = _Done(P, job, model)
                if fmt == "parquet":
                    _write_parquet(model, preds, done, keep, types, rows_per_group)
                else:
                    _write_jsonl(model, preds, done, keep, with_id=id_column is not None, every=rows_per_group)
                P.remove_leftovers()  # the output is in place: the journal has nothing left to resume
                stats = {"records": job.records, "errors": job.errors, "run_errors": job.errors - errors0,
                         "seconds": time.perf_counter() - started, **tally}
                if getattr(model, "truncated", None) is not None:
                    stats["truncated"] = job.truncated
                return stats
            finally:
                bar.close()


class _Done:
    """Records whose output is written and synced: counted into the journal, rewritten at each sync."""

    def __init__(self, P: PredictPaths, job: PredictJob, model):
        self.P, self.job, self.model = P, job, model
        self.cut0 = getattr(model, "truncated", None)  # a model that cuts long texts counts them
        self.truncated0 = job.truncated
        self.records = self.errors = 0  # since the last sync

    def add(self, record) -> None:
        self.records += 1
        self.errors += isinstance(record.text, DataError)

    def sync(self, *, end: int | None = None, parts: int | None = None) -> None:
        job = self.job
        job.records += self.records
        job.errors += self.errors
        self.records = self.errors = 0
        if self.cut0 is not None:
            job.truncated = self.truncated0 + self.model.truncated - self.cut0
        if end is not None:
            job.end = end
        if parts is not None:
            job.parts = parts
        write_journal(self.P.journal, job)


def _predictions(model, rows: Iterable, bar, max_tokens: int | None, tally: dict) -> Iterator[tuple]:
    """(record, result) in input order; an unreadable record is predicted as "" (its result unused).
    `tally` counts the texts run and their real and padded tokens."""
    pending: deque = deque()  # records in input order, read ahead on a thread; thread-safe append/popleft

    def texts():
        for r in rows:
            pending.append(r)
            yield r.text if isinstance(r.text, str) else ""

    def on_batch(n_texts: int, real_tokens: int, padded: int) -> None:
        tally["texts"] += n_texts
        tally["real_tokens"] += real_tokens
        tally["padded_tokens"] += padded
        if n_texts:
            bar.update(n_texts)
            bar.set_postfix(tok_s=f"{tally['real_tokens'] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    for result in model.predict_stream(read_ahead(texts()), max_tokens=max_tokens, on_batch=on_batch):
        yield pending.popleft(), result


def _write_jsonl(model, preds: Iterable[tuple], done: _Done, keep: Sequence[str], *, with_id: bool,
                 every: int) -> None:
    """The records after those done, appended to OUT.partial (cut back to where the journal says
    the done ones end), synced every `every` records; renamed onto the output at the end."""
    P = done.P
    # the input was opened and read through once already (the count): an OSError in here is the output's
    with writing(WHAT, P.out):
        with _open_partial(P.partial) as f:
            f.truncate(done.job.end)  # a record half-written when the run was killed
            f.seek(done.job.end)
            for r, result in preds:
                err = r.text if isinstance(r.text, DataError) else None
                rec = ({"id": r.id} if with_id else {}) | dict(zip(keep, r.kept))
                rec |= error_fields(err) if err is not None else model.output_record(r.text, result)
                f.write((json_line(rec) + "\n").encode("utf-8"))
                done.add(r)
                if done.records == every:
                    _sync(f, done)
            _sync(f, done)
        os.replace(P.partial, P.out)


def _open_partial(path: str):
    """The partial file to go on writing (made where missing), for reading and writing bytes."""
    return os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), "r+b")


def _sync(f, done: _Done) -> None:
    f.flush()
    os.fsync(f.fileno())
    done.sync(end=f.tell())


def _table(model, batch: list[tuple], keep: Sequence[str], types):
    recs = [r for r, _ in batch]
    kept = {k: [r.kept[i] for r in recs] for i, k in enumerate(keep)}
    return output_table(model, [r.id for r in recs], [r.text if isinstance(r.text, str) else "" for r in recs],
                        [res for _, res in batch], [r.text if isinstance(r.text, DataError) else None for r in recs],
                        kept, types=types)


def _write_parquet(model, preds: Iterable[tuple], done: _Done, keep: Sequence[str], types, every: int) -> None:
    """Each `every` records after those done, one part file (a row group), synced and journaled;
    at the end the parts, in order, as the output."""
    batch: list[tuple] = []
    parts = done.job.parts
    _check_parts(done.P.out, parts, every, done.job.records, _table(model, [], keep, types).schema)

    def flush() -> None:
        nonlocal batch, parts
        write_chunk(done.P.out, parts, _table(model, batch, keep, types), what=WHAT)
        parts += 1
        for r, _ in batch:
            done.add(r)
        done.sync(parts=parts)
        batch = []

    for item in preds:
        batch.append(item)
        if len(batch) == every:
            flush()
    if batch:
        flush()
    assemble(done.P.out, parts, _table(model, [], keep, types), what=WHAT, kind="predict")


def _check_parts(out: str, parts: int, rows: int, records: int, schema) -> None:
    """A ConfigError, before any record is predicted, for a finished part that cannot be
    assembled: cut (no footer), or of another job (other rows or columns). Each part holds `rows`
    records but the last, which holds the rest of the `records` done: a job killed after its
    input's short last part was journaled, while the parts were assembled, goes on from there."""
    from spanflow.data.tables import pyarrow

    pa = pyarrow()
    for k in range(parts):
        path = chunk_part(out, k)
        want = rows if k < parts - 1 else records - rows * (parts - 1)
        try:
            with pa.parquet.ParquetFile(path) as f:
                ok = 0 < want <= rows and f.metadata.num_rows == want and f.schema_arrow.equals(schema)
        except (OSError, pa.lib.ArrowException):
            ok = False
        if not ok:
            raise ConfigError(f"{path}, a part the journal records as done, is damaged or of another job; drop "
                              "--resume to start over")


def _records(src: str, **reading) -> int:
    """How many records `src` holds, as read_rows reads them: a table's from its metadata; a CSV's
    or TSV's by reading them (a header row is none, and a quoted cell may span lines); else its
    lines (a bad line is a record too)."""
    if is_table(src):
        return table_rows(src)
    if kind_of(src) in ("csv", "tsv"):
        return sum(1 for _ in read_rows(src, **reading))
    return sum(1 for _ in read_lines_or_errors(src))
