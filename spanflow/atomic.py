"""Temporary files and directories for atomic writes (write aside, then rename into place).

Their names carry the writer's pid (`.KIND-PID-XXXX`), so a later run can remove what a
killed run left behind without touching the temporaries of a run still going. They get
the modes a plain open()/mkdir would (the user's umask), not tempfile's private 0600/0700.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_dir(parent: str, kind: str) -> str:
    """A new directory `.KIND-PID-XXXX` in `parent`, mode 0777 less the umask."""
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=parent)
    os.chmod(path, 0o777 & ~_umask())
    return path


def temp_file(parent: str, kind: str, suffix: str = "") -> tuple[int, str]:
    """(fd, path) of a new file `.KIND-PID-XXXX<suffix>` in `parent`, mode 0666 less the umask."""
    fd, path = tempfile.mkstemp(prefix=f".{kind}-{os.getpid()}-", suffix=suffix, dir=parent)
    os.chmod(path, 0o666 & ~_umask())
    return fd, path


def replace_dir(tmp: str, final: str) -> None:
    """Move a finished directory into place, replacing any older one atomically enough:
    the old copy is renamed aside first and removed only once the new one is in place."""
    old = None
    if os.path.exists(final):
        old = final.rstrip("/") + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def recover_dir(final: str) -> None:
    """Finish a replace_dir that was killed between its two renames."""
    old = final.rstrip("/") + ".old"
    if not os.path.exists(final) and os.path.exists(old):
        os.replace(old, final)


@contextmanager
def atomic_dir(path: str, kind: str) -> Iterator[str]:
    """A temporary directory beside `path` to fill; put in place of `path` (replace_dir) when the
    block ends without error, removed otherwise. Stale ones of killed runs are removed first."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    clean_stale(parent, kind)
    tmp = temp_dir(parent, kind)
    try:
        yield tmp
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_path(path: str, kind: str = "write", suffix: str = "") -> Iterator[str]:
    """A temporary path beside `path` to write to; renamed onto `path` when the block ends
    without error, removed otherwise. Stale ones of killed runs are removed first."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    clean_stale(parent, kind)
    fd, tmp = temp_file(parent, kind, suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_open(path: str, kind: str = "write", suffix: str = "", *, sync: bool = False) -> Iterator[IO[str]]:
    """A UTF-8 text file that appears at `path` whole or not at all (see atomic_path)."""
    with atomic_path(path, kind, suffix) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def clean_stale(parent: str, kind: str) -> list[str]:
    """Remove the `.KIND-PID-*` temporaries in `parent` whose process is gone; the removed paths."""
    pattern = re.compile(rf"^\.{re.escape(kind)}-(\d+)-")
    removed = []
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(parent, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                continue
        removed.append(path)
    return removed
