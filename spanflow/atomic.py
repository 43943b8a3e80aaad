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
