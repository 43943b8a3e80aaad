"""The files of a resumable `spanflow predict` job, beside its output `OUT` while it runs:
`OUT.predict.json`, the journal (the job's settings, its input's fingerprint, how many input
records are done), and what is done: for JSONL, `OUT.partial`, the records in order (synced up to
where the journal says); for Parquet, `OUT.chunk<k>.parquet`, one file per finished row group.
A killed run leaves them; the same command with `--resume` checks the settings and the input,
skips the records done and goes on; without it a new run removes them first. Nothing is at `OUT`
until the job ends.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spanflow.data.records import text_place
from spanflow.errors import ConfigError
from spanflow.inference.journal import (Fingerprint, check_unchanged, chunk_files, fingerprint, read_journal,
                                        write_journal)
from spanflow.schemas import NonNegativeInt

COMMAND = "spanflow predict"


class PredictSpec(BaseModel):
    """What a job is: a resumed one must match it, or its records would mix two jobs' results."""

    model_config = ConfigDict(extra="forbid")

    input: str
    field: str
    column: int | str | None
    skip_header: bool
    id_column: str | None
    keep: list[str]
    format: Literal["jsonl", "parquet"]
    rows_per_group: int
    model: str  # the directory as given, and a digest of its files' sizes and times
    model_files: str
    precision: str
    max_length: int | None
    stride: int | None


class PredictJob(BaseModel):
    """`OUT.predict.json`: the job, and how far it got (rewritten at each synced row group)."""

    model_config = ConfigDict(extra="forbid")

    spec: PredictSpec
    input: Fingerprint
    records: NonNegativeInt = 0  # input records whose output is synced
    errors: NonNegativeInt = 0
    truncated: NonNegativeInt = 0
    end: NonNegativeInt = 0  # JSONL: bytes of OUT.partial that hold those records
    parts: NonNegativeInt = 0  # Parquet: finished part files
    seconds: float = Field(default=0.0, ge=0)


@dataclass
class PredictPaths:
    """The files of the job writing `out`."""

    out: str
    format: str = "jsonl"  # its part files are Parquet output's only

    @property
    def journal(self) -> str:
        return self.out + ".predict.json"

    @property
    def partial(self) -> str:
        return self.out + ".partial"

    def leftovers(self) -> list[str]:
        """What a killed or failed run of this output left: nothing where it left no journal (the
        job writes it first), so a file of the user's that happens to be named so is kept."""
        journals = [p for p in (self.journal, self.journal + ".partial") if os.path.lexists(p)]
        if not journals:
            return []
        parts = chunk_files(self.out) if self.format == "parquet" else []
        return parts + [p for p in (self.partial,) if os.path.lexists(p)] + journals

    def remove_leftovers(self) -> None:
        for p in self.leftovers():
            if os.path.isdir(p) and not os.path.islink(p):
                raise ConfigError(f"{p} is a directory where the job keeps a file of its own; remove it")
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)


def open_job(P: PredictPaths, spec: PredictSpec, src: str, resume: bool, log) -> tuple[PredictJob, str]:
    """The interrupted job's journal, checked against `spec` and the input, where `resume` finds
    one ("resumed"; "placed" where that job had put its output in place, killed as it removed its
    journal and parts: the caller checks every record was done, and has only those to remove);
    else a new job ("new"), its journal written, anything an earlier run left removed."""
    source = fingerprint(src)
    if resume and os.path.exists(P.journal):
        job = read_journal(P.journal, PredictJob, COMMAND)
        _check_same(P, job, spec, src, source)
        if placed(P, job):
            return job, "placed"
        _check_done(P, job)
        return job, "resumed"
    if resume:
        log(f"--resume: no interrupted job of {P.out} to go on with; predicting the whole input")
    elif os.path.exists(P.journal):  # said, as training says it: the parts are gone once this run begins
        log(f"note: {P.out} has an interrupted job's parts; this run starts over and replaces them (--resume goes "
            "on with them)")
    P.remove_leftovers()
    job = PredictJob(spec=spec, input=source)
    write_journal(P.journal, job)
    return job, "new"


def placed(P: PredictPaths, job: PredictJob) -> bool:
    """Whether the output `job` journals is at OUT, its parts (some of them) removed: nothing is at
    OUT until a job ends, and the parts go only after it (a JSONL partial renamed onto OUT, of the
    bytes the journal records; a Parquet output of the records done, a part of it gone)."""
    if not job.records or not os.path.isfile(P.out):
        return False
    if job.spec.format == "jsonl":
        return not os.path.exists(P.partial) and os.path.getsize(P.out) == job.end
    from spanflow.data.tables import pyarrow
    from spanflow.inference.journal import chunk_part

    pa = pyarrow()
    try:
        with pa.parquet.ParquetFile(P.out) as f:
            rows = f.metadata.num_rows
    except (OSError, pa.lib.ArrowException):
        return False
    return rows == job.records and any(not os.path.exists(chunk_part(P.out, k)) for k in range(job.parts))


def _check_same(P: PredictPaths, job: PredictJob, spec: PredictSpec, src: str, source: Fingerprint) -> None:
    was, now = job.spec.model_dump(), spec.model_dump()
    for d in (was, now):  # `--column text` of a JSONL input is its default --field text
        d["field"], d["column"] = text_place(spec.input, d["field"], d["column"])
    key = next((k for k in now if was[k] != now[k]), None)
    if key == "model_files":
        raise ConfigError(f"the model {spec.model or '(in memory)'} changed since the interrupted job began "
                          f"({'saved over' if spec.model else 'its weights differ'}): its results would mix two "
                          "models'; drop --resume to start over")
    if key is not None:
        flag, then = FLAGS.get(key), was[key]
        if flag and isinstance(then, bool):  # a switch: given or left out
            go_on = f"{'give' if then else 'leave out'} {flag} to go on with it"
        elif flag and then not in (None, []):
            go_on = f"give {flag} {','.join(then) if isinstance(then, list) else then} to go on with it"
        elif flag:
            go_on = f"leave out {flag} to go on with it"
        else:
            go_on = "resume with those"
        raise ConfigError(f"{P.journal} belongs to a job with other settings ({key} {then!r} then, "
                          f"{now[key]!r} now); {go_on}, or drop --resume to start over")
    check_unchanged(src, job.input, source.size, source.sha256, "records")


# a journaled setting a resume can be told to match, by the flag that sets it
FLAGS = {"field": "--field", "column": "--column", "skip_header": "--skip-header", "id_column": "--id-column",
         "keep": "--keep-columns", "precision": "--precision", "max_length": "--max-length", "stride": "--stride"}


def _check_done(P: PredictPaths, job: PredictJob) -> None:
    """A ConfigError where what the journal says is done is not there (cut or removed by hand):
    going on would leave a gap in the output."""
    if job.spec.format == "jsonl":
        size = os.path.getsize(P.partial) if os.path.exists(P.partial) else 0
        if size < job.end:
            raise ConfigError(f"{P.partial} holds {size} bytes, fewer than the {job.end} that {P.journal} records "
                              "as done: it was cut or removed; drop --resume to start over")
        return
    from spanflow.inference.journal import chunk_part

    gone = [k for k in range(job.parts) if not os.path.exists(chunk_part(P.out, k))]
    if gone:
        raise ConfigError(f"{chunk_part(P.out, gone[0])}, which {P.journal} records as done, is gone; drop --resume "
                          "to start over")
