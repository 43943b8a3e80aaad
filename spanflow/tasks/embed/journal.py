"""The files of a resumable `spanflow embed` job, as pydantic schemas: the spec that identifies
the job, `<output>.progress.json` (the job: spec, input fingerprint, record and chunk counts) and
`<output>.progress.rank<r>.json` (a rank's finished chunks, where its parts end, its stats)."""
from __future__ import annotations

import hashlib
import os
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from spanflow.atomic import atomic_open
from spanflow.errors import ConfigError
from spanflow.schemas import NonNegativeInt, PositiveInt, expected, explain, first_field


class EmbedSpec(BaseModel):
    """What to embed and where; the identity of a resumable job."""

    model_config = ConfigDict(extra="forbid")

    input: str
    output: str
    field: str = "text"
    column: int | None = None
    skip_header: bool = False
    chunk_size: int = 8192  # texts read, sorted and written at a time
    dtype: str = "float32"  # npy output: float32 or float16
    model: str = ""


class JobIdentity(EmbedSpec):
    """What a resumed job must share with the interrupted one: the spec, and what its rows depend on."""

    format: Literal["npy", "jsonl"]
    dim: PositiveInt
    world: PositiveInt
    precision: str  # a resumed job must not mix precisions


class Fingerprint(BaseModel):
    """Size, mtime and SHA-256 of a file: what a resumed job checks it is reading the same input."""

    size: NonNegativeInt
    mtime_ns: int
    sha256: str


class Job(BaseModel):
    """`<output>.progress.json`: the job, written by rank 0 before any chunk is embedded."""

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
    """A finished chunk: its rows (JSONL output) and its error records, as byte ranges of the rank's parts."""

    bytes: ByteRange
    errors: ByteRange


class Stats(BaseModel):
    """What a rank (or, summed, the job) has done so far; `seconds` is its embedding time."""

    real_tokens: NonNegativeInt = 0
    padded_tokens: NonNegativeInt = 0
    seconds: Annotated[float, Field(ge=0)] = 0.0
    truncated: NonNegativeInt = 0
    empty: NonNegativeInt = 0
    errors: NonNegativeInt = 0


class RankState(BaseModel):
    """`<output>.progress.rank<r>.json`: a rank's finished chunks, where its parts end, its stats."""

    model_config = ConfigDict(extra="forbid")

    done: dict[Annotated[int, Field(ge=0)], ChunkDone] = Field(default_factory=dict)
    end: NonNegativeInt = 0  # bytes of the rank's part (JSONL output) that belong to finished chunks
    err_end: NonNegativeInt = 0  # the same for its errors part
    stats: Stats = Field(default_factory=Stats)


M = TypeVar("M", bound=BaseModel)


def read_journal(path: str, schema: type[M]) -> M:
    """A journal as `schema`; a ConfigError naming the file and the field at fault otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            return schema.model_validate_json(f.read(), strict=True)
    except OSError as e:
        raise ConfigError(f"{path} is unreadable ({e.strerror}); remove it or drop --resume") from None
    except ValidationError as e:
        what = ("belongs to a job with other settings" if first_field(e) == "spec"
                else "is damaged or was not written by spanflow embed")
        raise ConfigError(f"{path} {what} ({explain(e)}); remove it or drop --resume") from None


def write_journal(path: str, journal: BaseModel) -> None:
    """Replace the journal at `path` in one step (synced: a crash leaves the old one or the new)."""
    with atomic_open(path, "journal", sync=True) as f:
        f.write(journal.model_dump_json())


def fingerprint(path: str) -> Fingerprint:
    """The Fingerprint of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    st = os.stat(path)
    return Fingerprint(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=h.hexdigest())
