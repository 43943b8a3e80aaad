"""The files of a resumable `spanflow embed` job: their names (JobPaths), the journal as pydantic
schemas (the spec that identifies the job, `<output>.progress.json`: the job's spec, input
fingerprint, record and chunk counts, and `<output>.progress.chunks.json`: the finished
chunks, where the parts end, the stats so far), and the layout of the .npy being filled.
Reading and writing journals, fingerprints and Parquet parts: spanflow/inference/journal.py,
shared with `spanflow predict`.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import glob
import os
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from numpy.lib import format as npy_format
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from spanflow.errors import ConfigError
from spanflow.inference import journal as shared
from spanflow.inference.journal import Fingerprint, fingerprint, write_journal  # noqa: F401 (the job's names)
from spanflow.schemas import NonNegativeInt, PositiveInt, expected

# a journal of this job: read_journal(path, schema), its messages naming the command
read_journal = functools.partial(shared.read_journal, command="spanflow embed")


class EmbedSpec(BaseModel):
    """What to embed and where; the identity of a resumable job."""

    model_config = ConfigDict(extra="forbid")

    input: str
    output: str
    field: str = "text"
    column: int | str | None = None  # a CSV/TSV index, or a column name (tables, CSV/TSV headers)
    skip_header: bool = False
    id_column: str | None = None
    keep: list[str] = Field(default_factory=list)  # input columns carried into the output
    chunk_size: int = 8192  # texts read, sorted and written at a time
    dtype: str = "float32"  # npy output: float32 or float16
    model: str = ""
    max_length: int | None = None  # tokens a text is cut at (None: the model's own limit)
    normalize: bool = False  # unit-length vectors (a journal of an earlier version: not normalised)


class JobIdentity(EmbedSpec):
    """What a resumed job must share with the interrupted one: the spec, and what its rows depend on."""

    format: Literal["npy", "jsonl", "parquet"]
    dim: PositiveInt
    # jobs of earlier versions could be sharded over ranks: they journaled their world size, and
    # one of a single process (1) still resumes; a sharded one is a job with other settings
    world: Literal[1] = 1
    precision: str  # a resumed job must not mix precisions
    # a digest of the model directory's files (inference/journal.model_files): a model saved
    # over in place is another model, whose vectors must not join the first one's ("": an earlier
    # version's journal, or a model in memory)
    model_files: str = ""


class Job(BaseModel):
    """`<output>.progress.json`: the job, written before any chunk is embedded."""

    model_config = ConfigDict(extra="forbid")

    spec: JobIdentity
    input: Fingerprint
    n: NonNegativeInt  # records in the input
    chunks: NonNegativeInt


def _ordered(r: tuple[int, int]) -> tuple[int, int]:
    if r[0] > r[1]:
        raise expected("a byte range [start, end] with start <= end")
    return r


ByteRange = Annotated[tuple[NonNegativeInt, NonNegativeInt], AfterValidator(_ordered)]


class ChunkDone(BaseModel):
    """A finished chunk: its rows (JSONL output) and its error records, as byte ranges of the parts."""

    bytes: ByteRange
    errors: ByteRange


class Stats(BaseModel):
    """What the job has done so far; `seconds` is its embedding time."""

    real_tokens: NonNegativeInt = 0
    padded_tokens: NonNegativeInt = 0
    seconds: Annotated[float, Field(ge=0)] = 0.0
    truncated: NonNegativeInt = 0
    empty: NonNegativeInt = 0
    errors: NonNegativeInt = 0


class Progress(BaseModel):
    """`<output>.progress.chunks.json`: the finished chunks, where the parts end, the stats."""

    model_config = ConfigDict(extra="forbid")

    done: dict[Annotated[int, Field(ge=0)], ChunkDone] = Field(default_factory=dict)
    end: NonNegativeInt = 0  # bytes of the part (JSONL output) that belong to finished chunks
    err_end: NonNegativeInt = 0  # the same for its errors part
    stats: Stats = Field(default_factory=Stats)
    # every chunk done, the files being moved into place: a kill among the moves leaves some moved,
    # which --resume moves on from (the parts it would check may be at their final names already)
    placing: bool = False


@dataclass
class JobPaths:
    """The files of the job writing `out`."""

    out: str
    partial: str  # the .npy being filled
    journal: str  # the job: spec, record count, chunks
    errors: str
    ids: str

    @property
    def ids_partial(self) -> str:
        return self.out + ".ids.partial"

    @property
    def errors_partial(self) -> str:  # an earlier version's copy of the errors on its way into place
        return self.out + ".errors.partial"

    @property
    def progress(self) -> str:
        return self.out + ".progress.chunks.json"

    @property
    def part(self) -> str:
        """The finished chunks' JSONL records, in order."""
        return self.out + ".part"

    @property
    def errors_part(self) -> str:
        """The finished chunks' error records, in order."""
        return self.out + ".errors.part"

    def legacy(self) -> list[tuple[str, str]]:
        """(name then, name now) of the files a single-process job of an earlier version journaled."""
        return [(f"{self.out}.progress.rank0.json", self.progress), (f"{self.out}.part0", self.part),
                (f"{self.out}.errors.part0", self.errors_part),
                (os.path.splitext(self.out)[0] + ".ids.txt.partial", self.ids_partial)]  # an .npy's ids

    def adopt_legacy(self) -> None:
        """Give an earlier version's files of this job today's names, so that --resume goes on with them."""
        for then, now in self.legacy():
            if os.path.exists(then) and not os.path.exists(now):
                os.replace(then, now)

    def leftovers(self) -> list[str]:
        """What a killed or failed run of this output may have left (a fresh run starts without
        them), each path once: the names of earlier versions' ranks end in a rank number."""
        q = glob.escape(self.out)
        older = [p for pattern in (".progress.rank*.json", ".part[0-9]*", ".errors.part[0-9]*")
                 for p in glob.glob(q + pattern)]
        ours = [p for p in (self.partial, self.ids_partial, self.progress, self.part, self.errors_part,
                            self.errors_partial, self.journal + ".partial", self.progress + ".partial")
                if os.path.exists(p)]
        return list(dict.fromkeys(older + shared.chunk_files(self.out) + ours))

    def remove_leftovers(self) -> None:
        """Remove leftovers(); one already gone is not an error."""
        for p in self.leftovers():
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)


def job_paths(out: str) -> JobPaths:
    """The files of the job writing `out`."""
    stem = os.path.splitext(out)[0]
    return JobPaths(out, out + ".partial", out + ".progress.json", stem + ".errors.jsonl", stem + ".ids.txt")


def reserve(fd: int, size: int) -> None:
    """Give the file `size` bytes of disk now, so that a disk too small is ENOSPC here. Where the
    file system cannot (no fallocate), a sparse size is enough: rows are written with pwrite,
    whose ENOSPC comes later but still as an error, never as a signal."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def lay_out_npy(path: str, n: int, dim: int, dtype: str) -> None:
    """An (n, dim) .npy at `path`: its header, and its rows' space reserved (filled in by pwrite)."""
    header = {"descr": npy_format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n, dim)}
    with open(path, "wb") as f:
        npy_format.write_array_header_1_0(f, header)
        f.flush()
        reserve(f.fileno(), f.tell() + n * dim * np.dtype(dtype).itemsize)


def npy_offset(path: str, shape: tuple[int, int], dtype: str) -> int:
    """Where the rows of the .npy at `path` begin, checked to be the job's shape and dtype."""
    readers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
    try:
        with open(path, "rb") as f:
            got = readers[npy_format.read_magic(f)](f)
            offset = f.tell()
    except (ValueError, KeyError):
        got = None
    if got is None or got[0] != shape or got[1] or got[2] != np.dtype(dtype):
        raise ConfigError(f"{path} is damaged or was not written by this job; remove it or drop --resume")
    need = offset + shape[0] * shape[1] * np.dtype(dtype).itemsize  # laid out whole when the job began
    if os.path.getsize(path) < need:  # cut: writing on would leave finished rows as zeros
        raise ConfigError(f"{path} holds {os.path.getsize(path)} bytes, fewer than the {need} of its {shape[0]} rows: "
                          "it was cut; drop --resume to start over")
    return offset
