"""Where a Ray job's files go: a directory of Parquet files, checked (and, on a file system,
claimed) before any work, and a manifest, `_spanflow.json`, written once every row is.

Part files are named `part-NNNNNNNNN-WRITE-0.parquet` by the index of their write task
(part_names);
read in name order, which is what pyarrow.dataset, DuckDB's read_parquet('DIR/*.parquet') and
Ray's read_parquet do, their rows are in input order. Names starting with _ are left out by
those readers.

A path (local, or a file system every node mounts): the files are written into
`.NAME.ray-HOST-PID-XXXX` beside it, renamed onto the path when the job is complete, so a
failed job leaves nothing at --output. Those names say whose they are: a later job on the
same output (holding its lock) removes only this output's leftovers of jobs that ran on its
own machine and are gone, never a live job's on another machine of a shared file system.
An existing directory must be empty or hold exactly an earlier spanflow Ray job's output
(its manifest and the files it lists), which the new job replaces whole when it completes,
moving it aside (`.NAME.ray-HOST-PID-old`) first; a directory holding anything else is
refused, never emptied. A URI (s3://, gs://, ...): object stores have no rename, so the files
are written in place; it must be absent or empty, and the manifest, written last, marks the
output complete.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from spanflow.atomic import make_output_folder, writing
from spanflow.data.tables import pyarrow
from spanflow.errors import ConfigError
from spanflow.ray.source import filesystem, footers, is_remote, parquet_files, reaching

MANIFEST = "_spanflow.json"
FORMAT = "spanflow-ray-output.v1"  # the manifest's "format": what marks a directory as this job's
KEYS = ("format", "rows", "errors", "files", "task", "model", "input")  # a manifest has at least these
WHAT = "the Ray job's output"
ERROR_COLUMN = "error"


@dataclass(frozen=True)
class Target:
    path: str  # absolute for a path; a URI as given
    local: bool


def check_target(path: str) -> Target:
    """The output `path`, refused (ConfigError) where the job could not write it whole."""
    if is_remote(path):
        import pyarrow.fs as pafs

        fs, where = filesystem(path)
        with reaching(path):
            info = fs.get_file_info(where)
            taken = info.type.name == "File" or (info.type.name == "Directory"
                                                 and fs.get_file_info(pafs.FileSelector(where)))
        if taken:
            raise ConfigError(f"--output {path} exists: under --ray it names a new (or empty) prefix for Parquet "
                              "files, and an object store cannot replace one whole", field="output")
        return Target(path, False)
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise ConfigError(f"--output {path} is a file; under --ray it names a directory of Parquet files",
                          field="output")
    _check_replaceable(full, path)
    make_output_folder(path, WHAT)
    return Target(full, True)


def _check_replaceable(full: str, shown: str) -> None:
    """An existing directory must be empty, or hold exactly an earlier job's output."""
    if not os.path.isdir(full) or not os.listdir(full):
        return
    listed = earlier_output(full)
    if listed is None:
        raise ConfigError(f"--output {shown} holds files that no spanflow Ray job wrote; give a new or empty "
                          "directory", field="output")
    others = sorted(set(os.listdir(full)) - listed)
    if others:
        raise ConfigError(f"--output {shown} holds an earlier spanflow Ray job's output and other files too "
                          f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); remove them, or give "
                          "another directory", field="output")


def earlier_output(path: str) -> set[str] | None:
    """The names an earlier job's output at `path` consists of (its manifest and the files it
    lists); None where `path` holds no manifest of this job's format."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or any(k not in m for k in KEYS) or m["format"] != FORMAT:
        return None
    files = m["files"]
    if not isinstance(files, list) or not all(isinstance(n, str) and "/" not in n for n in files):
        return None
    return {MANIFEST, *files}


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _prefix(name: str) -> str:
    return f".{name}.ray-{_host()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def clean_stale(path: str) -> list[str]:
    """Remove what jobs on this output that ran on this machine and are gone left beside it
    (their staging directories); an earlier output one moved aside and never replaced goes
    back in place. Call it holding the output's lock. The paths removed or restored."""
    parent, name = os.path.split(path)
    pattern = re.compile(rf"^{re.escape(_prefix(name))}(\d+)-(.+)$")
    done = []
    for entry in sorted(os.listdir(parent)):
        m = pattern.match(entry)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        where = os.path.join(parent, entry)
        if m.group(2) == "old" and not os.path.exists(path):
            os.replace(where, path)  # killed between its two renames: the earlier output comes back
        else:
            shutil.rmtree(where, ignore_errors=True)
        done.append(where)
    return done


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def staged(target: Target) -> Iterator[str]:
    """Where the job writes: beside a path, put in its place when the block ends without
    error (removed otherwise); a URI itself. Call it holding the output's lock."""
    if not target.local:
        yield target.path
        return
    parent, name = os.path.split(target.path)
    with writing(WHAT, target.path):
        clean_stale(target.path)
        tmp = tempfile.mkdtemp(prefix=f"{_prefix(name)}{os.getpid()}-", dir=parent)
        os.chmod(tmp, 0o777 & ~_umask())
    kept = False
    try:
        yield tmp
        with writing(WHAT, target.path):
            try:
                _replace(tmp, target.path)
            except ConfigError as e:  # files put at the output during the job: the job's own is kept, not lost
                beside = f"{target.path}.new-{os.getpid()}"  # no staging name: a later job's clean-up keeps it
                os.replace(tmp, beside)
                kept = True
                raise ConfigError(f"{str(e).split(';')[0]}, put there while the job ran: it was left as it is, and "
                                  f"this job's output is kept at {beside} (move it where it should be)",
                                  field="output") from None
    finally:
        if not kept:
            shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: str, path: str) -> None:
    """`tmp` put at `path`; an earlier output there moved aside first, and removed once the new one
    is in place. Checked again first: files added to it meanwhile are refused, not removed."""
    if not os.path.lexists(path):
        try:
            os.replace(tmp, path)
        except OSError as e:  # a directory made there since the check above, files in it
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise ConfigError(f"--output {path} holds files that no spanflow Ray job wrote; give a new or empty "
                              "directory", field="output") from None
        return
    if not os.path.isdir(path):  # a file put there: not ours to move aside
        raise ConfigError(f"--output {path} is a file; under --ray it names a directory of Parquet files",
                          field="output")
    _check_replaceable(path, path)
    parent, name = os.path.split(path)
    aside = os.path.join(parent, f"{_prefix(name)}{os.getpid()}-old")
    os.replace(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside, ignore_errors=True)


def written(where: str) -> dict:
    """What the Parquet files in `where` hold: rows, error rows, and the files in order, from
    their footers (the error column's null count), without reading their rows."""
    pa = pyarrow()
    fs, files = parquet_files(where, required=False)
    rows = errors = 0
    for f, meta in zip(files, footers(fs, files)):
        rows += meta.num_rows
        errors += _errors(pa, fs, f, meta)
    return {"rows": rows, "errors": errors, "files": [f.rsplit("/", 1)[-1] for f in files]}


def _errors(pa, fs, path: str, meta) -> int:
    """A file's error rows: its rows less the error column's nulls, from the row groups'
    statistics (read from the column itself where a writer left them out)."""
    leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]  # Parquet's flat columns
    at = leaves.index(ERROR_COLUMN)
    nulls = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        stats = group.column(at).statistics
        if stats is None or not stats.has_null_count:
            with fs.open_input_file(path) as f:
                return meta.num_rows - pa.parquet.read_table(f, columns=[ERROR_COLUMN]).column(0).null_count
        nulls += stats.null_count
    return meta.num_rows - nulls


def write_empty(where: str, schema) -> None:
    """One Parquet file with no rows and the output's `schema`, as the single-process job
    writes for an empty input."""
    pa = pyarrow()
    fs, base = filesystem(where)
    with writing(WHAT, where), fs.open_output_stream(f"{base.rstrip('/')}/{part_name(0)}.parquet") as f:
        pa.parquet.write_table(schema.empty_table(), f)


def write_manifest(where: str, manifest: dict) -> None:
    """`_spanflow.json` in `where`: what the job wrote, and from what."""
    fs, base = filesystem(where)
    with writing(WHAT, where), fs.open_output_stream(f"{base.rstrip('/')}/{MANIFEST}") as f:
        f.write((json.dumps({"format": FORMAT, **manifest}, indent=1) + "\n").encode())


def part_name(index: int, tag: str = "") -> str:
    """The name of the file of write task `index`, `tag` (its write's id) after it: nine digits,
    so that name order is task order for any job (Ray's own names have six, and sort out of
    order past a million tasks); Ray adds `-0.parquet`."""
    return f"part-{index:09d}" + (f"-{tag}" if tag else "")


def part_names():
    """A Ray Data FilenameProvider naming each write task's file part_name(task index, write
    id): the same name when the task runs again, so a rerun replaces a half-written file."""
    from ray.data.datasource import FilenameProvider

    class PartNames(FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return part_name(task_index, write_uuid)

    return PartNames()
