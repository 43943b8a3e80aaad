"""Handing freed C-heap memory back to the system: release_freed and GrowthTrim."""
from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from spanflow.inference import heap


def _libc():
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    if lib is None or not hasattr(lib, "malloc_trim"):
        pytest.skip("not glibc: no malloc_trim")
    lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    lib.free.argtypes = [ctypes.c_void_p]
    return lib


def test_release_freed_hands_back_freed_blocks_the_heap_would_keep():
    libc = _libc()
    # 3000 blocks of 48 KB (below glibc's mmap threshold: on the heap itself), each written;
    # every 50th is kept, so the heap cannot shrink from its top and keeps the freed ones
    blocks = [libc.malloc(48 << 10) for _ in range(3000)]
    for b in blocks:
        ctypes.memset(b, 1, 48 << 10)
    kept = blocks[49::50]
    for i, b in enumerate(blocks):
        if i % 50 != 49:
            libc.free(b)
    try:
        before = heap.resident_bytes()
        assert heap.release_freed() is True
        after = heap.resident_bytes()
        freed = 2940 * 48 << 10
        assert before - after > freed // 2, (before, after)  # most of the ~138 MB freed is handed back
    finally:
        for b in kept:
            libc.free(b)


def test_growth_trim_releases_only_after_growing_its_slack(monkeypatch):
    rss, released = [100], []
    monkeypatch.setattr(heap, "resident_bytes", lambda: rss[0])
    monkeypatch.setattr(heap, "release_freed", lambda: released.append(rss[0]) or True)
    trim = heap.GrowthTrim(slack=10)
    assert trim() and released == [100]  # the first call sets the floor
    rss[0] = 109
    assert not trim() and released == [100]  # within the slack
    rss[0] = 110
    assert trim() and released == [100, 110]
    rss[0] = 115  # the new floor is 110
    assert not trim() and len(released) == 2
    rss[0] = 121
    assert trim() and len(released) == 3


def test_growth_trim_releases_every_time_where_memory_cannot_be_read(monkeypatch):
    released = []
    monkeypatch.setattr(heap, "resident_bytes", lambda: None)
    monkeypatch.setattr(heap, "release_freed", lambda: released.append(1) or True)
    trim = heap.GrowthTrim()
    trim(), trim()
    assert len(released) == 2


def test_available_memory_is_the_systems_or_a_cgroups_if_less(tmp_path):
    """MemAvailable, or what a cgroup limit leaves (v2 or v1; the process's own group or the
    mount's root), reclaimable page cache not counted as used."""
    from spanflow.inference.heap import available_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    root, own = tmp_path / "cgroup", tmp_path / "own"
    root.mkdir()
    own.write_text("0::/job/step\n")
    system = 20000000 * 1024

    def group(folder, limit, used, stat=""):
        """A cgroup folder: v2's files under the mount, v1's under memory/."""
        folder.mkdir(parents=True, exist_ok=True)
        v1 = "memory" in folder.relative_to(root).parts[:1]
        (folder / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(f"{limit}\n")
        (folder / ("memory.usage_in_bytes" if v1 else "memory.current")).write_text(f"{used}\n")
        (folder / "memory.stat").write_text(stat)

    assert available_bytes(str(meminfo), str(root), str(own)) == system  # no cgroup files: the system's
    group(root / "job" / "step", "max", 123)
    assert available_bytes(str(meminfo), str(root), str(own)) == system  # no limit
    group(root / "job" / "step", 8 * 2**30, 3 * 2**30, f"anon 5\ninactive_file {2**30}\n")
    assert available_bytes(str(meminfo), str(root), str(own)) == 6 * 2**30  # 8 GiB, 3 used of which 1 cache
    assert available_bytes(str(tmp_path / "none"), str(root), str(own)) == 6 * 2**30
    group(root / "job" / "step", "max", 2**30)  # the limit on the parent (a job, a slice): the leaf reads max
    group(root / "job", 4 * 2**30, 3 * 2**30)
    assert available_bytes(str(meminfo), str(root), str(own)) == 2**30
    own.write_text("garbage\n4:cpu,memory:/batch/42\n3:cpu,cpuacct:/\n")  # cgroup v1, controllers combined
    group(root / "memory" / "batch" / "42", 4 * 2**30, 2**30, f"cache 9\ntotal_inactive_file {2**29}\n")
    assert available_bytes(str(meminfo), str(root), str(own)) == 3 * 2**30 + 2**29
    group(root / "memory" / "batch" / "42", 9223372036854771712, 2**30)
    assert available_bytes(str(tmp_path / "none"), str(root), str(own)) is None  # v1's "no limit"
    (root / "memory" / "batch" / "42" / "memory.limit_in_bytes").write_text("")  # unreadable: no limit known
    assert available_bytes(str(tmp_path / "none"), str(root), str(own)) is None
    assert available_bytes(str(tmp_path / "none"), str(tmp_path / "none"), str(tmp_path / "none")) is None
