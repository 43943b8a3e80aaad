"""What a resumable bulk job (`spanflow predict`, `spanflow embed`) keeps beside its output while
it runs: a journal read and written whole (pydantic schemas, synced and renamed into place), the
input's fingerprint, and for Parquet output one file per finished part, copied into the output at
the end (a Parquet file's footer is written last, so a killed writer's file cannot be appended to).

The names are fixed per output, not per process: `--resume` finds a killed run's files by name.
That is safe because a job holds spanflow.atomic.claim_output(output) the whole time: only the
lock's holder touches them.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from spanflow.atomic import writing
from spanflow.data.tables import parquet_file, parquet_output, pyarrow
from spanflow.errors import ConfigError, DataError
from spanflow.schemas import NonNegativeInt, explain, first_field


class Fingerprint(BaseModel):
    """Size, mtime and SHA-256 of a file: what a resumed job checks it is reading the same input."""

    size: NonNegativeInt
    mtime_ns: int
    sha256: str


def fingerprint(path: str) -> Fingerprint:
    """The Fingerprint of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    st = os.stat(path)
    return Fingerprint(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=h.hexdigest())


def check_unchanged(path: str, was: Fingerprint, size: int, sha256: str | None, what: str) -> None:
    """A ConfigError where the input at `path` is not the one an interrupted job began on: another
    size or, where `sha256` is given, other content (its finished `what` would not match it)."""
    if was.size != size or (sha256 is not None and was.sha256 != sha256):
        change = f"{was.size} -> {size} bytes" if was.size != size else "same size, other content"
        raise ConfigError(f"{path} changed since the interrupted job began ({change}): its finished {what} would not "
                          "match the file; drop --resume to start over")


M = TypeVar("M", bound=BaseModel)


def read_journal(path: str, schema: type[M], command: str) -> M:
    """A journal as `schema`; a ConfigError naming the file and the field at fault otherwise
    (`command`: the one that writes such journals, for the message)."""
    try:
        with open(path, encoding="utf-8") as f:
            return schema.model_validate_json(f.read(), strict=True)
    except OSError as e:
        raise ConfigError(f"{path} is unreadable ({e.strerror}); remove it or drop --resume") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is damaged or was not written by {command} (not UTF-8 text); remove it or drop "
                          "--resume") from None
    except ValidationError as e:
        what = ("belongs to a job with other settings" if first_field(e) == "spec"
                else f"is damaged or was not written by {command}")
        raise ConfigError(f"{path} {what} ({explain(e)}); remove it or drop --resume") from None


def write_journal(path: str, journal: BaseModel) -> None:
    """Replace the journal at `path` in one step (synced: a crash, or a full disk, leaves the old
    one or the new); a full or read-only disk is a WriteError."""
    with writing("the resume journal", path):
        write_synced(path, journal.model_dump_json())


def write_synced(path: str, text: str) -> None:
    """`text` synced at `path + ".partial"`, then renamed onto `path`. A fixed name, not a
    per-process temporary: the job holds its output's lock, and a per-process name would need a
    scan of the directory for stale ones at every write."""
    tmp = path + ".partial"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def chunk_files(out: str) -> list[str]:
    """The part files of `out` there are (whole or being written): those names only, never another
    file that starts like them (`OUT.chunk1.notes`)."""
    pattern = re.compile(re.escape(os.path.basename(out)) + r"\.chunk\d+\.parquet(\.partial)?")
    return [p for p in glob.glob(glob.escape(out) + ".chunk[0-9]*") if pattern.fullmatch(os.path.basename(p))]


def chunk_part(out: str, w: int) -> str:
    """Part `w` of a Parquet output, a Parquet file of its own until the job assembles them."""
    return f"{out}.chunk{w}.parquet"


def chunk_partial(out: str, w: int) -> str:
    """Part `w` being written, renamed onto chunk_part(out, w) when whole (write_chunk)."""
    return chunk_part(out, w) + ".partial"


def write_chunk(out: str, w: int, table, *, what: str) -> None:
    """Part `w`'s rows, synced, at chunk_part(out, w): written under chunk_partial(out, w) and then
    renamed, so that the name holds a whole part or nothing (removed on failure)."""
    tmp = chunk_partial(out, w)
    try:
        with parquet_file(tmp, what=what, shown=out) as f:
            f.write(table)
        os.replace(tmp, chunk_part(out, w))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def assemble(out: str, chunks: int, empty, *, what: str, kind: str) -> None:
    """The `chunks` part files, row group by row group in order, as one file at `out`; `empty`: the
    table of a job with no parts (no rows, but the schema). `kind` names the temporary."""
    pa = pyarrow()
    with parquet_output(out, what=what, kind=kind) as dst:
        if chunks == 0:
            dst.write(empty)
        for w in range(chunks):
            with pa.parquet.ParquetFile(chunk_part(out, w)) as part:
                for g in range(part.num_row_groups):
                    dst.write(part.read_row_group(g))


def model_files(model_dir: str | None) -> str:
    """A digest of a model directory's files (sizes and times): a model saved over in place is
    another model, whose results a resumed job must not mix with the first one's."""
    from spanflow.runtime.cache import model_fingerprint

    if not model_dir:
        return ""
    return hashlib.sha1(model_fingerprint(model_dir).encode()).hexdigest()[:16]


def weights_digest(model) -> str:
    """A digest of a loaded model's weights (its `.module`'s tensors): the model of a job run from
    Python without its directory, which a resume must find the same; "" for a model without one."""
    import torch

    module = getattr(model, "module", None)
    if not isinstance(module, torch.nn.Module):
        return ""
    h = hashlib.sha1()
    for name, t in module.state_dict().items():
        if isinstance(t, torch.Tensor):  # a quantized layer's packed weights are objects: their scales are tensors
            h.update(name.encode())
            h.update(t.detach().float().cpu().numpy().tobytes())
    return "weights:" + h.hexdigest()[:16]


def refuse_onto_input(src: str, dst: str, name: str = "output") -> None:
    """A ConfigError where the output is the input (the same file by any name): the job would write
    over what it reads; `name`: the output as the caller knows it (the command line's --output)."""
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(dst, src):
        raise ConfigError(f"{name} {dst} is the input: the job would write over what it reads; give the output "
                          "another name", field="output")


@contextmanager
def stopped_by_input(done: Callable[[], object], remove: Callable[[], None]) -> Iterator[None]:
    """A job's input that stops reading mid-job (a DataError): what the job had done (`done()`)
    stays for a resume on that same input, marked `kept` for the command line to say; where it had
    done nothing, its parts are of no use to one and `remove()` takes them."""
    try:
        yield
    except DataError as e:
        if done():
            e.kept = True
        else:
            remove()
        raise
