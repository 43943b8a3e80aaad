"""The process's heaps: what a job loaded kept out of the garbage collector's full passes, and
freed C-heap memory handed back to the system."""
from __future__ import annotations

import gc
import os


def settle() -> None:
    """Freeze every object alive now (torch, the model, its tokenizer) into the permanent
    generation. Jobs and servers create many small objects per batch (token ids, offsets,
    records), which set off full collections; each of those otherwise walks every object
    that importing torch leaves, a large share of the cost of turning tokenizer output into
    spans. Call it once, after loading, before the work."""
    gc.collect()
    gc.freeze()


def _find_malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


_MALLOC_TRIM = _find_malloc_trim()


def release_freed() -> bool:
    """Hand the pages of blocks freed on the C heap back to the system (glibc's malloc_trim);
    False where the C library cannot. glibc keeps freed blocks for reuse, and a process whose
    large allocations change size from one unit of work to the next (batches of another
    shape, another thread's arena) keeps a little more each time: its resident memory then
    grows with the input, not with the work. It walks every arena, and the pages handed back
    are faulted in again when next used: call it between units of work (a micro-batch), not
    per op, or through GrowthTrim where units are many."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory now less its shared pages (files, shared memory: not the
    heap's), from Linux's /proc/self/statm; None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                    own: str = "/proc/self/cgroup") -> int | None:
    """Memory this process can still take: Linux's MemAvailable, or less where a cgroup limit (a
    container's, a batch scheduler's; v2 or v1, on the process's own group or a parent) leaves
    less; None where nothing can be read. Reclaimable page cache is not counted as used."""
    avail = _mem_available(meminfo)
    for left in _cgroup_room(cgroup, own):
        avail = left if avail is None else min(avail, left)
    return avail


def _mem_available(meminfo: str) -> int | None:
    """MemAvailable in bytes; None where the file or its line cannot be read (not Linux, an old
    kernel): the memory is then unknown, which callers treat as no figure, not as an error."""
    try:
        with open(meminfo, encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


# (folder under the mount, limit file, usage file, the page cache's line in memory.stat)
_CGROUP_FILES = (("", "memory.max", "memory.current", "inactive_file"),
                 ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))


def _cgroup_room(root: str, own: str) -> list[int]:
    """What each memory cgroup limit that applies leaves, v2 and v1: the process's own group's and
    every parent's up to the mount's root (a limit set on a slice or a job holds for the groups
    below it, which read "max")."""
    paths = {"": "/", "memory": "/"}
    try:
        with open(own, encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        for kind in ("", "memory"):
            if len(parts) == 3 and (parts[1] == kind or kind in parts[1].split(",")):
                paths[kind] = parts[2]
    room = []
    for sub, limit_file, used_file, cache_key in _CGROUP_FILES:
        path = paths[sub].strip("/")
        while True:
            folder = os.path.join(root, sub, path)
            left = _room(folder, limit_file, used_file, cache_key)
            if left is not None:
                room.append(left)
            if not path:
                break
            path = os.path.dirname(path)
    return room


def _room(folder: str, limit_file: str, used_file: str, cache_key: str) -> int | None:
    """What one cgroup's memory limit leaves, its reclaimable page cache counted as free; None
    without a limit or its files."""
    try:
        with open(os.path.join(folder, limit_file), encoding="ascii") as f:
            limit = f.read().strip()
        with open(os.path.join(folder, used_file), encoding="ascii") as f:
            used = int(f.read())
        if limit == "max" or int(limit) >= 1 << 60:  # no limit (v1 writes a huge number)
            return None
        return max(0, int(limit) - used + _stat(os.path.join(folder, "memory.stat"), cache_key))
    except (OSError, ValueError):
        return None


def _stat(path: str, key: str) -> int:
    """One counter of a cgroup's memory.stat, 0 when unread."""
    try:
        with open(path, encoding="ascii") as f:
            return next((int(line.split()[1]) for line in f if line.split()[0] == key), 0)
    except (OSError, ValueError, IndexError):
        return 0


class GrowthTrim:
    """release_freed, but only once resident memory has grown `slack` bytes past what it was
    after the last release: memory stays within `slack` of what the work holds, and the cost
    of faulting the released pages in again (on a bulk job's chunks, a measurable share of a
    chunk's time when released after every one: docs/ray.md) is paid once per `slack` of growth."""

    def __init__(self, slack: int = 64 << 20):
        self.slack, self.floor = slack, None

    def __call__(self) -> bool:
        now = resident_bytes()
        if now is not None and self.floor is not None and now < self.floor + self.slack:
            return False
        released = release_freed()
        self.floor = resident_bytes()
        return released
