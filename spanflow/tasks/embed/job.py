"""`spanflow embed` as a function: stream any input into .npy or JSONL, chunk by chunk,
resumable, with bounded memory.

Progress is journaled in `<output>.progress.json` after each finished chunk (the
chunk's rows synced first), so a killed run resumes at the first unfinished chunk and
never recomputes finished ones. The final files appear only when the job completes.

Rows reach the .npy with pwrite at their offsets, never through a writable memory map: a
store into a mapped page the file system cannot back (a full disk, a full quota, and on
copy-on-write or network file systems even a page reserved before) is SIGBUS, which kills
the process without a word. A write call fails with ENOSPC instead, which becomes one
`error:` line. The .npy's full size is still reserved up front (posix_fallocate) so that a
disk too small fails before any embedding, not hours in.

One writer per output: rank 0 holds spanflow.atomic.claim_output(output) for the whole job,
before any work, and the other ranks touch no file before rank 0 has it (they wait at the
first barrier). That lock is what makes the fixed names beside the output
(`<output>.partial`, `.progress*.json`, `.part<r>`) safe: only its holder touches them, and a
later `--resume` finds a killed run's files by name, with nothing to look up.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import time
from collections import deque
from contextlib import ExitStack

import numpy as np
from tqdm import tqdm

from spanflow.atomic import hold_output, writing
from spanflow.data.formats.common import kind_of
from spanflow.data.records import read_records, sample_texts
from spanflow.errors import ConfigError, DataError
from spanflow.tasks.embed.journal import (
    ChunkDone,
    EmbedSpec,
    Fingerprint,
    Job,
    JobIdentity,
    JobPaths,
    RankState,
    Stats,
    fingerprint,
    job_paths,
    lay_out_npy,
    npy_offset,
    read_journal,
    write_journal,
)
from spanflow.training.distributed import Dist, barrier

WHAT = "the embeddings"


def _out_format(path: str) -> str:
    kind = kind_of(path)
    if kind in ("npy", "jsonl"):
        return kind
    raise ConfigError(f"--output must end in .npy or .jsonl, got {path!r}")


def _check_spec(spec: EmbedSpec) -> str:
    """The output format; a ConfigError or DataError for a spec that cannot work, before any work."""
    fmt = _out_format(spec.output)
    if spec.dtype not in ("float32", "float16"):
        raise ConfigError(f"--dtype must be float32 or float16, got {spec.dtype!r}")
    if spec.chunk_size < 1:
        raise ConfigError(f"--chunk-size must be a positive integer, got {spec.chunk_size}")
    if not os.path.exists(spec.input):
        raise DataError("file not found", path=spec.input)
    if os.path.isdir(spec.output):
        raise ConfigError(f"--output {spec.output} is a directory; give a file name ending in .{fmt}", field="output")
    with writing(WHAT, spec.output):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(spec.output)), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"--output {spec.output}: a file stands where its directory should be",
                              field="output") from None
    return fmt


def _count_and_ids(spec: EmbedSpec, ids_tmp: str | None) -> int:
    """One streaming pass: count records (and write their ids, one per line)."""
    n = 0
    # an id may hold what UTF-8 cannot (a lone surrogate from JSON): escaped, never a crash
    f = open(ids_tmp, "w", encoding="utf-8", errors="backslashreplace") if ids_tmp else None
    try:
        for rid, _ in read_records(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header):
            n += 1
            if f:
                f.write(rid.replace("\n", " ") + "\n")
    finally:
        if f:
            f.close()
    return n


def _resumed_job(P: JobPaths, ident: JobIdentity, source: Fingerprint) -> Job:
    """The journal of the interrupted job, checked to be this job's, on the same input."""
    job = read_journal(P.journal, Job)
    was, now = job.spec.model_dump(), ident.model_dump()
    if was != now:
        key = next(k for k in now if was[k] != now[k])
        raise ConfigError(f"{P.journal} belongs to a job with other settings ({key} {was[key]!r} then, "
                          f"{now[key]!r} now); remove it or drop --resume")
    if (job.input.size, job.input.sha256) != (source.size, source.sha256):
        change = (f"{job.input.size} -> {source.size} bytes" if job.input.size != source.size
                  else "same size, other content")
        raise ConfigError(f"{ident.input} changed since the interrupted job began ({change}): its finished "
                          "rows would not match the file; drop --resume to start over")
    return job


def _open_job(spec: EmbedSpec, fmt: str, ident: JobIdentity, P: JobPaths, dim: int, resume: bool) -> Job:
    """Rank 0: reuse the journal of an interrupted job, or count the input and lay out the output."""
    source = fingerprint(spec.input)
    if resume and os.path.exists(P.journal) and os.path.exists(P.partial):
        return _resumed_job(P, ident, source)
    for stale in P.leftovers():
        os.remove(stale)
    try:
        with writing(WHAT, P.out):
            n = _count_and_ids(spec, P.ids_partial if fmt == "npy" else None)
            job = Job(spec=ident, input=source, n=n, chunks=-(-n // spec.chunk_size))
            if fmt == "npy":
                lay_out_npy(P.partial, n, dim, spec.dtype)
            else:
                open(P.partial, "w").close()
        write_journal(P.journal, job)
    except BaseException:  # nothing to resume yet: give the space back
        for f in P.leftovers():
            os.remove(f)
        raise
    return job


def _rank_state(P: JobPaths, rank: int, resume: bool) -> RankState:
    """This rank's finished chunks and byte ranges; a half-written chunk is cut off."""
    path = P.rank_journal(rank)
    st = read_journal(path, RankState) if resume and os.path.exists(path) else RankState()
    with writing(WHAT, P.out):
        for f, end in ((P.rank_part(rank), st.end), (P.rank_errors(rank), st.err_end)):
            with open(f, "a+b") as fh:
                fh.truncate(end)
    return st


def embed_file(embedder, spec: EmbedSpec, *, max_tokens: int | None = None, resume: bool = False, force: bool = False,
               calibrate: bool = True, progress: bool = True, log=print, dist: Dist = Dist()) -> dict:
    """Embed every record of spec.input into spec.output; returns the run summary.

    A reduced precision is compared with fp32 on the input first (refused below its gate
    unless `force`); `calibrate=False` skips that where `--precision auto` just checked it.

    Under torchrun each rank embeds the chunks w with w % world == rank; rank 0 lays out
    the output first and assembles it, in input order, once every rank is done. A killed
    rank's unfinished chunks are redone on --resume. A second job on the same output stops
    at once (OutputBusy, naming the first one's pid); a full or read-only disk is a WriteError.
    """
    fmt = _check_spec(spec)
    log = log if dist.is_main else (lambda m: None)
    with ExitStack() as held:
        if dist.is_main:  # for every rank: the others touch no file before rank 0's _open_job
            hold_output(held, spec.output, WHAT)
        calibration = None
        if calibrate:
            calibration = embedder.check_precision(sample_texts(spec.input, 256, field=spec.field, column=spec.column,
                                                                skip_header=spec.skip_header), force=force)
        if calibration:
            log(f"{calibration['precision']} vs fp32 on {calibration['n']} input texts: mean cosine "
                f"{calibration['mean_cosine']:.6f}, min {calibration['min_cosine']:.6f}")
        P = job_paths(spec.output)
        job, stats = _embed(embedder, spec, fmt, P, resume, dist, max_tokens, progress, log)
    secs = max(stats.seconds, 1e-9)
    return {"texts": job.n, "errors": stats.errors, "truncated": stats.truncated, "empty": stats.empty,
            "real_tokens": stats.real_tokens,
            "padding_efficiency": stats.real_tokens / max(1, stats.padded_tokens),
            "texts_per_s": job.n / secs, "real_tokens_per_s": stats.real_tokens / secs, "seconds": secs,
            "precision": embedder.precision_name, "calibration": calibration, "output": spec.output,
            "ids": P.ids if fmt == "npy" else None, "errors_file": P.errors if stats.errors else None}


def _embed(embedder, spec: EmbedSpec, fmt: str, P: JobPaths, resume: bool, dist: Dist, max_tokens, progress,
           log) -> tuple[Job, Stats]:
    """Lay out or resume the job, embed this rank's chunks, assemble (rank 0); (job, stats)."""
    ident = JobIdentity(**spec.model_dump(), format=fmt, dim=embedder.dim, world=dist.world,
                        precision=embedder.precision_name)
    if dist.is_main:
        _open_job(spec, fmt, ident, P, embedder.dim, resume)
    barrier(dist)
    job = read_journal(P.journal, Job)
    rst = _rank_state(P, dist.rank, resume)
    if rst.done:
        log(f"resuming: {len(rst.done)} chunks of this rank already done")
    _run_chunks(embedder, spec, fmt, job, rst, P, dist, max_tokens, progress and dist.is_main)
    barrier(dist)
    if dist.is_main:
        with writing(WHAT, P.out):
            stats = _finish(P, fmt, job, dist)
    else:
        stats = rst.stats
    barrier(dist)
    return job, stats


def _copy_ranges(dst, sources: list[str], ranges: list[tuple[int, tuple[int, int]]]) -> None:
    handles = [open(s, "rb") for s in sources]
    try:
        for r, (a, b) in ranges:
            handles[r].seek(a)
            dst.write(handles[r].read(b - a))
    finally:
        for h in handles:
            h.close()


def _finish(P: JobPaths, fmt: str, job: Job, dist: Dist) -> Stats:
    """Rank 0: assemble parts in chunk order, sum the ranks' stats, move files into place.
    `seconds` is the slowest rank's time: the job's wall time. Everything is assembled aside
    first, so a full disk here leaves the journal and parts for --resume and no final file."""
    states = [read_journal(P.rank_journal(r), RankState) for r in range(dist.world)]
    order = [(w % dist.world, w) for w in range(job.chunks)]
    stats = Stats()
    for st in states:
        for k, v in st.stats:
            setattr(stats, k, max(getattr(stats, k), v) if k == "seconds" else getattr(stats, k) + v)
    if stats.errors:
        with open(P.errors_partial, "wb") as f:
            _copy_ranges(f, [P.rank_errors(r) for r in range(dist.world)],
                         [(r, states[r].done[w].errors) for r, w in order])
    if fmt == "jsonl":
        with open(P.partial, "wb") as f:
            _copy_ranges(f, [P.rank_part(r) for r in range(dist.world)],
                         [(r, states[r].done[w].bytes) for r, w in order])
    if stats.errors:
        os.replace(P.errors_partial, P.errors)
    elif os.path.exists(P.errors):
        os.remove(P.errors)  # an older run's: not this output's errors
    if fmt == "npy":
        older = os.path.splitext(P.out)[0] + ".ids.txt.partial"  # the name a job before this version used
        if not os.path.exists(P.ids_partial) and os.path.exists(older):
            os.replace(older, P.ids_partial)
        if os.path.exists(P.ids_partial):  # absent: a kill after its rename, before the output's
            os.replace(P.ids_partial, P.ids)
    os.replace(P.partial, P.out)
    for r in range(dist.world):
        for f in (P.rank_journal(r), P.rank_part(r), P.rank_errors(r)):
            if os.path.exists(f):
                os.remove(f)
    os.remove(P.journal)
    return stats


class _ChunkWriter:
    """Puts a rank's finished chunks on disk, synced, then journals them: .npy rows with pwrite
    at their offsets in the partial (see the module's docstring for why not a memory map),
    JSONL records appended to the rank's part, error records to its errors part."""

    def __init__(self, P: JobPaths, fmt: str, spec: EmbedSpec, job: Job, rank: int, rst: RankState, dim: int):
        self.P, self.fmt, self.spec, self.rank, self.rst = P, fmt, spec, rank, rst
        self.fd = None
        if fmt == "npy":
            self.offset = npy_offset(P.partial, (job.n, dim), spec.dtype)
            self.row_bytes = dim * np.dtype(spec.dtype).itemsize
            with writing(WHAT, P.out):
                self.fd = os.open(P.partial, os.O_WRONLY)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def store(self, w: int, chunk: list, emb: np.ndarray) -> None:
        """Write chunk `w` (its records and their (len(chunk), dim) embeddings), then journal it."""
        rst, P = self.rst, self.P
        errs = [{"id": rid, "line": t.line, "error": t.reason} for rid, t in chunk if isinstance(t, DataError)]
        with writing(WHAT, P.out):
            rows = (rst.end, rst.end)
            if self.fmt == "npy":
                self._pwrite_rows(w, chunk, emb)
            else:
                rows = _append(P.rank_part(self.rank), rst.end, [
                    {"id": rid, "line": t.line, "error": t.reason} if isinstance(t, DataError)
                    else {"id": rid, "embedding": [round(float(x), 7) for x in emb[k]]}
                    for k, (rid, t) in enumerate(chunk)])
                rst.end = rows[1]
            errors = _append(P.rank_errors(self.rank), rst.err_end, errs)
        rst.err_end = errors[1]
        rst.done[w] = ChunkDone(bytes=rows, errors=errors)
        write_journal(P.rank_journal(self.rank), rst)

    def _pwrite_rows(self, w: int, chunk: list, emb: np.ndarray) -> None:
        for k, (_, t) in enumerate(chunk):
            if isinstance(t, DataError):
                emb[k] = np.nan  # an unreadable record: a NaN row, explained in the errors file
        data = memoryview(np.ascontiguousarray(emb.astype(self.spec.dtype))).cast("B")
        at = self.offset + w * self.spec.chunk_size * self.row_bytes
        while data:
            k = os.pwrite(self.fd, data, at)
            if k == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data, at = data[k:], at + k
        os.fsync(self.fd)  # the rows are on disk before the journal says the chunk is done


def _run_chunks(embedder, spec: EmbedSpec, fmt: str, job: Job, rst: RankState, P: JobPaths, dist: Dist, max_tokens,
                 progress) -> None:
    """Embed this rank's unfinished chunks; journal each one after its output is on disk."""
    W, st = spec.chunk_size, rst.stats
    mine = [w for w in range(job.chunks) if w % dist.world == dist.rank and w not in rst.done]
    bar = tqdm(total=sum(min(W, job.n - w * W) for w in mine), unit="text", disable=not progress,
               dynamic_ncols=True, mininterval=0.5)
    tokens = [0]

    def on_batch(k, real, padded):
        st.real_tokens += real
        st.padded_tokens += padded
        tokens[0] += real
        bar.update(k)
        bar.set_postfix(tok_s=f"{tokens[0] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    pending: deque = deque()  # (chunk id, records) read by the tokenizing thread, awaiting embeddings

    def texts():
        recs = read_records(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header)
        pos = 0
        for w in mine:  # other ranks' chunks and finished ones are skipped, not tokenized
            chunk = list(itertools.islice(recs, (w - pos) * W, (w - pos + 1) * W))
            pos = w + 1
            pending.append((w, chunk))
            yield from (t if isinstance(t, str) else "" for _, t in chunk)

    embedder.truncated = 0
    out = _ChunkWriter(P, fmt, spec, job, dist.rank, rst, embedder.dim)
    t0 = time.perf_counter()
    try:
        for emb in embedder.encode_stream(texts(), chunk_size=W, max_tokens=max_tokens, on_batch=on_batch):
            w, chunk = pending.popleft()
            st.empty += sum(1 for _, t in chunk if isinstance(t, str) and not t.strip())
            st.truncated += embedder.truncated
            embedder.truncated = 0
            st.errors += sum(1 for _, t in chunk if isinstance(t, DataError))
            now = time.perf_counter()
            st.seconds += now - t0
            t0 = now
            out.store(w, chunk, emb)
    finally:
        out.close()
        bar.close()


def _append(path: str, at: int, records: list[dict]) -> tuple[int, int]:
    """Write JSON lines at byte `at` (dropping anything after it); return the byte range."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.truncate()
        for r in records:
            f.write((json.dumps(r) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
        return at, f.tell()
