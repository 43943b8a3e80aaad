"""`spanflow embed` as a function: stream any input into .npy, JSONL or Parquet, chunk by
chunk, resumable, with bounded memory.

Progress is journaled in `<output>.progress.json` (the job) and
`<output>.progress.chunks.json` (the finished chunks) after each finished chunk, the chunk's
rows synced first, so a killed run resumes at the first unfinished chunk and never
recomputes finished ones. The final files appear only when the job completes.

Where a chunk's rows go while the job runs:

- .npy: pwrite at their offsets into `<output>.partial`, never through a writable memory
  map: a store into a mapped page the file system cannot back (a full disk, a full quota,
  and on copy-on-write or network file systems even a page reserved before) is SIGBUS,
  which kills the process without a word. A write call fails with ENOSPC instead, which
  becomes one `error:` line. The .npy's full size is still reserved up front
  (posix_fallocate) so that a disk too small fails before any embedding, not hours in.
- JSONL: appended to `<output>.part`, renamed onto the output at the end.
- Parquet: a Parquet file of its own, `<output>.chunk<w>.parquet` (inference/journal.py). At the end
  the chunks are copied, in order, into one file beside the output, which is then renamed
  onto it: the disk holds the output twice over for that while.

Removing the journal is the commit point: the job removes it once every final file is in
place, and only then the parts. A kill before that leaves what `--resume` finishes from; a
kill after it leaves parts without a journal, which the next run removes. A part shorter than
its journal says (cut or removed by hand) makes `--resume` a ConfigError, never a file
padded with zeros.

One writer per output: the job holds spanflow.atomic.claim_output(output) for the whole job,
before any work. That lock is what makes the fixed names beside the output safe: only its
holder touches them, and a later `--resume` finds a killed run's files by name, with
nothing to look up.
"""
from __future__ import annotations

import errno
import itertools
import os
import time
from collections import deque
from contextlib import ExitStack

import numpy as np
from tqdm import tqdm

from spanflow.atomic import hold_output, make_output_folder, writing
from spanflow.batching.align import LINE_BREAK
from spanflow.batching.prefetch import read_ahead
from spanflow.data.formats.common import check_exists, invisible, kind_of
from spanflow.data.jsonvalues import json_line
from spanflow.data.records import read_rows, sample_texts, text_place
from spanflow.data.tables import (IPC, PARQUET, carried_schema, check_keep, error_fields, is_table,
                                  output_table, pyarrow, table_ids, table_rows)
from spanflow.errors import ConfigError, DataError, as_log, counted, quote
from spanflow.inference.journal import (assemble, check_unchanged, chunk_part, model_files, refuse_onto_input,
                                        stopped_by_input, weights_digest,
                                        write_chunk)
from spanflow.tasks.embed.journal import (
    ChunkDone,
    EmbedSpec,
    Fingerprint,
    Job,
    JobIdentity,
    JobPaths,
    Progress,
    Stats,
    fingerprint,
    job_paths,
    lay_out_npy,
    npy_offset,
    read_journal,
    write_journal,
)

WHAT = "the embeddings"
RESULT = "embedding"  # the output's column, or JSONL key, of the vectors
JSONL_KEYS = ("id", "line", "row", "error", RESULT)  # a JSONL record's own keys: no kept column may take them


def _out_format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in PARQUET:
        return "parquet"
    kind = kind_of(path)
    if kind in ("npy", "jsonl", "json"):  # .json: JSON Lines, as predict writes it and every job reads it
        return "jsonl" if kind == "json" else kind
    hint = "; Arrow output is written as Parquet: use .parquet" if ext in IPC else ""
    raise ConfigError(f"--output must end in .npy, .jsonl (.ndjson, .json) or .parquet (.pq), got {path!r}{hint}")


def _check_columns(spec: EmbedSpec, fmt: str) -> None:
    """Refuse kept columns the output cannot hold, and columns the input does not have (or of
    the wrong type): each one error, before a model loads."""
    if spec.keep and fmt == "npy":
        raise ConfigError("--keep-columns: a .npy holds only the vectors; use --output NAME.parquet (or .jsonl) "
                          "to carry input columns along")
    if fmt == "jsonl":
        check_keep(spec.keep, JSONL_KEYS, "key")
    else:
        check_keep(spec.keep, ("error", RESULT))
    _rows(spec)  # opens and checks, reads no record
    if fmt == "parquet":
        carried_schema(spec.input, id_column=spec.id_column, keep=spec.keep)


def check_spec(spec: EmbedSpec) -> str:
    """The output format; a ConfigError or DataError for a spec that cannot work, before any work."""
    fmt = _out_format(spec.output)
    refuse_onto_input(spec.input, spec.output)
    if spec.dtype not in ("float32", "float16"):
        raise ConfigError(f"--dtype must be float32 or float16, got {spec.dtype!r}")
    if spec.dtype != "float32" and fmt == "jsonl":  # it would be taken and change nothing
        raise ConfigError(f"--dtype {spec.dtype} sets the vectors of an .npy or .parquet output; JSONL writes them as "
                          "decimal numbers", field="dtype")
    if spec.chunk_size < 1:
        raise ConfigError(f"--chunk-size must be a positive integer, got {spec.chunk_size}")
    if not os.path.exists(spec.input):
        raise DataError("file not found", path=spec.input)
    if fmt == "parquet":
        pyarrow()
    _check_columns(spec, fmt)
    if os.path.isdir(spec.output):
        raise ConfigError(f"--output {spec.output} is a directory; give a file name ending in .{fmt}", field="output")
    _check_side_files(spec, fmt)
    make_output_folder(spec.output, WHAT)
    return fmt


OUTPUT_SUFFIXES = (".npy", ".jsonl", ".ndjson", ".json", ".parquet", ".pq")


def _check_side_files(spec: EmbedSpec, fmt: str) -> None:
    """The side files (OUT.errors.jsonl, and OUT.ids.txt of an .npy) are named by the output's stem:
    one that is the input is a ConfigError (the job would write over what it reads)."""
    P = job_paths(spec.output)
    for side in (P.errors, P.ids) if fmt == "npy" else (P.errors,):
        if os.path.exists(side) and os.path.samefile(side, spec.input):
            raise ConfigError(f"--output {spec.output}: its side file {side} is the input; the job would write over "
                              "what it reads; give the output another name", field="output")


def other_outputs(out: str) -> list[str]:
    """Outputs beside `out` of its stem (vec.parquet beside vec.npy), which share its side files."""
    stem = os.path.splitext(out)[0]
    return [stem + x for x in OUTPUT_SUFFIXES
            if os.path.exists(stem + x) and os.path.abspath(stem + x) != os.path.abspath(out)]


def _rows(spec: EmbedSpec):
    return read_rows(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header,
                     id_column=spec.id_column, keep=spec.keep)


def blank(text: str) -> bool:
    """Whether a text holds nothing to read: white space and invisible format characters (U+200B,
    U+FEFF) only (a WordPiece tokenizer gives it the empty text's vector)."""
    return all(c.isspace() or invisible(c) for c in text)


def _count_and_ids(spec: EmbedSpec, ids_tmp: str | None, log=print, ids_name: str = "") -> int:
    """Count the records (and write their ids, one per line, to `ids_tmp`): a table's count is
    in its metadata and its ids need only its id column; other inputs take one streaming pass.
    An id's line breaks (any that str.splitlines() breaks at) are written as spaces, and said."""
    table = is_table(spec.input)
    if table and ids_tmp is None:
        return table_rows(spec.input)
    ids = table_ids(spec.input, spec.id_column) if table else (r.id for r in _rows(spec))
    if ids_tmp is None:
        return sum(1 for _ in ids)
    n = broken = 0
    # an id may hold what UTF-8 cannot (a lone surrogate from JSON): escaped, never a crash
    with open(ids_tmp, "w", encoding="utf-8", errors="backslashreplace") as f:
        for rid in ids:
            text = "" if rid is None else str(rid)
            line = LINE_BREAK.sub(" ", text)
            broken += line != text
            f.write(line + "\n")
            n += 1
    if broken:
        log(f"note: {counted(broken, 'id')} held line breaks, written as spaces in {ids_name} "
            "(one line per vector); a JSONL or Parquet output keeps ids as they are")
    return n


def _resumed_job(P: JobPaths, ident: JobIdentity, source: Fingerprint) -> Job:
    """The journal of the interrupted job, checked to be this job's, on the same input."""
    job = read_journal(P.journal, Job)
    _same_job(P, job, ident.model_dump(), ident.input, source.size, source.sha256)
    return job


def check_resumable(spec: EmbedSpec) -> None:
    """With --resume, what an interrupted job's journal can be checked against before the model
    loads (its settings, the output's format, the input's size), each a ConfigError as
    _resumed_job says it; the model's dimension and precision, and the input's content, are
    checked once the model has loaded."""
    fmt, P = _out_format(spec.output), job_paths(spec.output)
    if not _resumes(P, fmt):
        return
    job = read_journal(P.journal, Job)
    now = {**spec.model_dump(), "format": fmt, "model_files": model_files(spec.model)}
    if spec.max_length is None:  # the model's own, known once it loads (checked then)
        del now["max_length"]
    _same_job(P, job, now, spec.input, os.path.getsize(spec.input), None)


def _resumes(P: JobPaths, fmt: str) -> bool:
    """Whether a --resume finds an interrupted job to go on with (an npy job needs its partial file,
    unless it was moved into place as the job ended)."""
    return os.path.exists(P.journal) and (fmt != "npy" or os.path.exists(P.partial) or _placing(P))


def _placing(P: JobPaths) -> bool:
    """Whether the job had begun to move its files into place (its progress says so)."""
    try:
        return read_journal(P.progress, Progress).placing
    except (OSError, ConfigError):
        return False


def _same_job(P: JobPaths, job: Job, now: dict, path: str, size: int, sha256: str | None) -> None:
    """A ConfigError where `job` (the journal's) was run with other settings than `now` (a subset
    of its spec's), or on an input of another size or, where `sha256` is given, content."""
    was = job.spec.model_dump()
    for d in (was, now):  # `--column text` of a JSONL input is its default --field text
        if "field" in d:
            d["field"], d["column"] = text_place(path, d["field"], d["column"])
    # a journal of a version that kept no max_length ran at the model's own, and one that kept no
    # digest of the model's files cannot tell: neither is compared. Paths are compared as the files
    # they name (./in.parquet is in.parquet)
    key = next((k for k in now if not _same_value(k, was[k], now[k])
                and not (k in ("max_length", "model_files") and not was[k])
                and not (k == "dtype" and was.get("format") == "jsonl")), None)  # JSONL rows never had one
    if key == "model_files":
        raise ConfigError(f"the model {now.get('model') or '(in memory)'} changed since the interrupted job began "
                          f"({'saved over' if now.get('model') else 'its weights differ'}): its vectors would mix two "
                          "models'; drop --resume to start over")
    if key is not None:
        flag = FLAGS.get(key)
        if isinstance(was[key], bool) and flag:  # a switch: given or left out
            go_on = f"{'give' if was[key] else 'leave out'} {flag} to go on with it, or drop --resume to start over"
        else:
            go_on = (f"give {flag} {was[key]} to go on with it, or drop --resume to start over"
                     if flag and was[key] is not None and (key != "precision" or was[key] in ("fp32", "bf16", "fp16"))
                     else "remove it or drop --resume")
        raise ConfigError(f"{P.journal} belongs to a job with other settings ({key} {was[key]!r} then, "
                          f"{now[key]!r} now); {go_on}")
    check_unchanged(path, job.input, size, sha256, "rows")


# a journaled setting a resume can be told to match, by the flag that sets it
FLAGS = {"max_length": "--max-length", "precision": "--precision", "chunk_size": "--chunk-size", "dtype": "--dtype",
         "field": "--field", "column": "--column", "normalize": "--normalize"}


def _same_value(key: str, was, now) -> bool:
    """Whether a journaled setting is the one given now; paths (absolute in a journal of this
    version, as typed in an earlier one's) as the files they name."""
    if key in ("input", "output", "model") and was and now:
        return os.path.abspath(was) == os.path.abspath(now)
    return was == now


def _open_job(spec: EmbedSpec, fmt: str, ident: JobIdentity, P: JobPaths, dim: int, resume: bool,
              log=print) -> Job:
    """Reuse the journal of an interrupted job, or count the input and lay out the output."""
    source = fingerprint(spec.input)
    if resume and _resumes(P, fmt):
        job = _resumed_job(P, ident, source)
        with writing(WHAT, P.out):
            P.adopt_legacy()
        return job
    if not resume and _resumes(P, fmt):  # said, as training says it: the parts are gone once this run begins
        log(f"note: {P.out} has an interrupted job's parts; this run starts over and replaces them (--resume goes "
            "on with them)")
    P.remove_leftovers()
    try:
        with writing(WHAT, P.out):
            n = _count_and_ids(spec, P.ids_partial if fmt == "npy" else None, log, P.ids)
            job = Job(spec=ident, input=source, n=n, chunks=-(-n // spec.chunk_size))
            if fmt == "npy":
                lay_out_npy(P.partial, n, dim, spec.dtype)
        write_journal(P.journal, job)
    except BaseException:  # nothing to resume yet: give the space back
        P.remove_leftovers()
        raise
    return job


def _progress(P: JobPaths, resume: bool) -> Progress:
    """The finished chunks and where the parts end; a half-written chunk is cut off. A part
    shorter than the journal says is a ConfigError: extending it would fill it with zeros."""
    prog = read_journal(P.progress, Progress) if resume and os.path.exists(P.progress) else Progress()
    if prog.placing:  # its parts may be at their final names already: nothing of them is cut
        return prog
    with writing(WHAT, P.out):
        for f, end in ((P.part, prog.end), (P.errors_part, prog.err_end)):
            size = os.path.getsize(f) if os.path.exists(f) else 0
            if size < end:
                raise ConfigError(f"{f} holds {size} bytes, fewer than the {end} that {P.progress} records as "
                                  "finished: it was cut or removed; drop --resume to start over")
            with open(f, "a+b") as fh:
                fh.truncate(end)
    return prog


def _check_done(P: JobPaths, fmt: str, job: Job, prog: Progress, size: int) -> None:
    """A ConfigError, before any text is embedded, where a file the finished chunks are in is gone
    or cut: an .npy job's ids (written when it began), a Parquet job's parts. (The .npy rows are
    checked as it opens, the JSONL part by _progress.)"""
    if fmt == "npy" and not any(os.path.exists(p) for p in (P.ids_partial, P.ids)):
        raise ConfigError(f"{P.ids_partial}, the ids the job wrote when it began, is gone; drop --resume to start over")
    if fmt != "parquet":
        return
    pa = pyarrow()
    for w in sorted(prog.done):
        path = chunk_part(P.out, w)
        try:
            with pa.parquet.ParquetFile(path) as f:
                whole = f.metadata.num_rows == min(size, job.n - w * size)
        except (OSError, pa.lib.ArrowException):
            whole = False
        if not whole:
            raise ConfigError(f"{path}, a part {P.progress} records as done, is gone or damaged; drop --resume to "
                              "start over")


def embed_file(embedder, spec: EmbedSpec, *, max_tokens: int | None = None, resume: bool = False, force: bool = False,
               calibrate: bool = True, progress: bool = True, log=print) -> dict:
    """Embed every record of spec.input into spec.output; returns the run summary.

    A reduced precision is compared with fp32 on the input first (refused below its gate
    unless `force`); `calibrate=False` skips that where `--precision auto` just checked it.
    With `resume`, a killed run's finished chunks are kept and the rest embedded. A second
    job on the same output stops at once (OutputBusy, naming the first one's pid); a full or
    read-only disk is a WriteError. `spec.max_length`, where given, is the embedder's from here on.
    """
    from spanflow.tasks.inputs import check_max_tokens

    log = as_log(log, "log")  # None: silence, as the training functions' log_fn
    if not isinstance(spec, EmbedSpec):
        raise ConfigError(f"spec takes an EmbedSpec, got {type(spec).__name__} {quote(spec, 60)}")
    check_exists(spec.input)
    check_max_tokens(max_tokens)  # before the job's files are laid out (an .npy's whole size reserved)
    fmt = check_spec(spec)
    if isinstance(embedder, (str, os.PathLike)) or not hasattr(embedder, "dim"):  # a path, or another task's model
        raise ConfigError(f"embedder takes a loaded Embedder (Embedder.load(DIR)), got {type(embedder).__name__} "
                          f"{quote(embedder, 60)}")
    if spec.max_length is not None and spec.max_length != embedder.max_length:
        embedder.set_max_length(spec.max_length)  # a ConfigError above the model's limit
    with ExitStack() as held:
        hold_output(held, spec.output, WHAT)
        types = carried_schema(spec.input, id_column=spec.id_column, keep=spec.keep) if fmt == "parquet" else None
        calibration = None
        if calibrate:
            calibration = embedder.check_precision(sample_texts(spec.input, 256, field=spec.field, column=spec.column,
                                                                skip_header=spec.skip_header), force=force)
        if calibration:
            log(f"{calibration['precision']} vs fp32 on {calibration['n']} input texts: mean cosine "
                f"{calibration['mean_cosine']:.6f}, min {calibration['min_cosine']:.6f}")
        P = job_paths(spec.output)
        job, stats, before = _embed(embedder, spec, fmt, P, resume, types, max_tokens, progress, log)
    secs = max(stats.seconds, 1e-9)
    return {"texts": job.n, "resumed_texts": before, "errors": stats.errors, "truncated": stats.truncated,
            "empty": stats.empty, "real_tokens": stats.real_tokens,
            "padding_efficiency": stats.real_tokens / max(1, stats.padded_tokens),
            # an error record runs no text: its rate is of the texts embedded, as the command's line says
            "texts_per_s": (job.n - stats.errors) / secs, "real_tokens_per_s": stats.real_tokens / secs,
            "seconds": stats.seconds,
            "precision": embedder.precision_name, "calibration": calibration, "output": spec.output,
            "ids": P.ids if fmt == "npy" else None, "errors_file": P.errors if stats.errors else None}


def _embed(embedder, spec: EmbedSpec, fmt: str, P: JobPaths, resume: bool, types, max_tokens, progress,
           log) -> tuple[Job, Stats, int]:
    """Lay out or resume the job, embed its unfinished chunks, assemble the output; (job, its stats
    over every run, the texts done before this run)."""
    # the length texts are cut at as run (the model's own where none was asked): what a resume must match
    # paths as the files they name: a resume from another directory names them otherwise
    paths = {k: os.path.abspath(v) for k, v in (("input", spec.input), ("output", spec.output), ("model", spec.model))
             if v}
    ident = JobIdentity(**{**spec.model_dump(), **paths, "max_length": embedder.max_length}, format=fmt,
                        dim=embedder.dim, precision=embedder.precision_name,
                        model_files=model_files(spec.model) or weights_digest(embedder))
    if resume and not _resumes(P, fmt):  # finished, or never begun: said, as the whole input is embedded again
        log(f"--resume: no interrupted job of {P.out} to go on with; embedding the whole input")
    job = _open_job(spec, fmt, ident, P, embedder.dim, resume, log)
    prog = _progress(P, resume)
    size = spec.chunk_size
    before = sum(min(job.n, (k + 1) * size) - k * size for k in prog.done)
    if prog.placing:  # killed as it moved its files into place: those moves are all that is left
        log(f"resuming: all {counted(len(prog.done), 'chunk')} were done; putting the output in place")
        empty = _ChunkWriter(P, fmt, spec, job, prog, embedder, types).empty() if fmt == "parquet" else None
    else:
        _check_done(P, fmt, job, prog, spec.chunk_size)
        if prog.done:
            log(f"resuming: {counted(len(prog.done), 'chunk')} already done")
        out = _ChunkWriter(P, fmt, spec, job, prog, embedder, types)
        # parts of no chunk done (an .npy's whole reserved file) are removed, the journal first
        with stopped_by_input(lambda: prog.done, lambda: (os.remove(P.journal), P.remove_leftovers())):
            _run_chunks(embedder, spec, job, prog, out, max_tokens, progress)
        empty = out.empty() if fmt == "parquet" else None  # an Arrow table: pyarrow is the parquet extra
    with writing(WHAT, P.out):
        _finish(P, fmt, job, prog, empty)
    return job, prog.stats, before


def _finish(P: JobPaths, fmt: str, job: Job, prog: Progress, empty) -> None:
    """Move the finished files into place, then remove the journal (the commit point), then the
    parts. The journal says first that the moves began (Progress.placing): a kill among them
    leaves some files at their final names, and --resume makes the rest of the moves (renames: the
    disk never holds a JSONL output twice); a full disk while a Parquet output is assembled leaves
    the journal and the parts, and no final file."""
    if not prog.placing:
        prog.placing = True
        write_journal(P.progress, prog)
    if fmt == "parquet":
        assemble(P.out, job.chunks, empty, what=WHAT, kind="embed")
    if prog.stats.errors:
        _move(P.errors_part, P.errors)
    elif os.path.exists(P.errors) and not other_outputs(P.out):
        os.remove(P.errors)  # an older run's: not this output's errors (another output's is kept)
    if fmt == "npy":
        _move(P.ids_partial, P.ids)
        _move(P.partial, P.out)
    elif fmt == "jsonl":
        _move(P.part, P.out)
    os.remove(P.journal)
    P.remove_leftovers()


def _move(src: str, dst: str) -> None:
    """`src` renamed onto `dst`; a `src` gone was moved by the run a resume finishes."""
    if os.path.exists(src):
        os.replace(src, dst)


class _ChunkWriter:
    """Puts finished chunks on disk, synced, then journals them: .npy rows with pwrite at their
    offsets in the partial (see the module's docstring for why not a memory map), JSONL
    records appended to the part, a Parquet chunk as a file of its own; error records go to
    the errors part."""

    def __init__(self, P: JobPaths, fmt: str, spec: EmbedSpec, job: Job, prog: Progress, embedder, types):
        self.P, self.fmt, self.spec, self.prog, self.types = P, fmt, spec, prog, types
        self.embedder, self.dim = embedder, embedder.dim
        self.fd = None
        if fmt == "npy":
            self.offset = npy_offset(P.partial, (job.n, self.dim), spec.dtype)
            self.row_bytes = self.dim * np.dtype(spec.dtype).itemsize
            with writing(WHAT, P.out):
                self.fd = os.open(P.partial, os.O_WRONLY)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def empty(self):
        """A Parquet output's table of no rows (its schema)."""
        return self.table([], np.zeros((0, self.dim), np.float32))

    def table(self, chunk: list, emb: np.ndarray):
        """The Parquet rows of `chunk` (see spanflow.data.tables for the columns)."""
        kept = {k: [r.kept[i] for r in chunk] for i, k in enumerate(self.spec.keep)}
        return output_table(self.embedder, [r.id for r in chunk], [r.text if isinstance(r.text, str) else ""
                                                                   for r in chunk], emb,
                            [r.text if isinstance(r.text, DataError) else None for r in chunk], kept,
                            types=self.types, dtype=self.spec.dtype)

    def store(self, w: int, chunk: list, emb: np.ndarray) -> None:
        """Write chunk `w` (its records and their (len(chunk), dim) embeddings), then journal it."""
        prog, P = self.prog, self.P
        errs = [{"id": r.id} | error_fields(r.text) for r in chunk if isinstance(r.text, DataError)]
        with writing(WHAT, P.out):
            rows = (prog.end, prog.end)
            if self.fmt == "npy":
                self._pwrite_rows(w, chunk, emb)
            elif self.fmt == "parquet":
                write_chunk(P.out, w, self.table(chunk, emb), what=WHAT)
            else:
                rows = _append(P.part, prog.end, [self._record(r, emb[k]) for k, r in enumerate(chunk)])
                prog.end = rows[1]
            errors = _append(P.errors_part, prog.err_end, errs)
        prog.err_end = errors[1]
        prog.done[w] = ChunkDone(bytes=rows, errors=errors)
        write_journal(P.progress, prog)

    def _record(self, r, vector) -> dict:
        rec = {"id": r.id} | dict(zip(self.spec.keep, r.kept))
        if isinstance(r.text, DataError):
            return rec | error_fields(r.text)
        return rec | {RESULT: [round(float(x), 7) for x in vector]}

    def _pwrite_rows(self, w: int, chunk: list, emb: np.ndarray) -> None:
        for k, r in enumerate(chunk):
            if isinstance(r.text, DataError):
                emb[k] = np.nan  # an unreadable record: a NaN row, explained in the errors file
        data = memoryview(np.ascontiguousarray(emb.astype(self.spec.dtype))).cast("B")
        at = self.offset + w * self.spec.chunk_size * self.row_bytes
        while data:
            k = os.pwrite(self.fd, data, at)
            if k == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data, at = data[k:], at + k
        os.fsync(self.fd)  # the rows are on disk before the journal says the chunk is done


def _run_chunks(embedder, spec: EmbedSpec, job: Job, prog: Progress, out: _ChunkWriter, max_tokens,
                progress) -> None:
    """Embed the unfinished chunks, in order; journal each one after its output is on disk."""
    W, st = spec.chunk_size, prog.stats
    todo = [w for w in range(job.chunks) if w not in prog.done]
    # None: tqdm draws only on a terminal; a piped log gets the summary line, not bar frames
    bar = tqdm(total=sum(min(W, job.n - w * W) for w in todo), unit="text", disable=None if progress else True,
               dynamic_ncols=True, mininterval=0.5)
    tokens = [0]

    def on_batch(k, real, padded):
        st.real_tokens += real
        st.padded_tokens += padded
        tokens[0] += real
        bar.update(k)
        bar.set_postfix(tok_s=f"{tokens[0] / max(bar.format_dict['elapsed'], 1e-9):.0f}")

    pending: deque = deque()  # (chunk id, records) read ahead on a thread, awaiting embeddings

    def texts():
        recs, pos = _rows(spec), 0
        for w in todo:  # finished chunks are read past, not tokenized
            chunk = list(itertools.islice(recs, (w - pos) * W, (w - pos + 1) * W))
            pos = w + 1
            if len(chunk) != min(W, job.n - w * W):  # cut or rewritten while read: its rows would be zeros
                raise DataError(f"holds another number of records than when this job began ({job.n}): it changed "
                                "while it was read; run the job again on the finished file", path=spec.input)
            pending.append((w, chunk))
            yield from (r.text if isinstance(r.text, str) else "" for r in chunk)

    embedder.truncated = 0
    t0 = time.perf_counter()
    try:
        for emb in embedder.encode_stream(read_ahead(texts()), chunk_size=W, max_tokens=max_tokens,
                                          on_batch=on_batch, normalize=spec.normalize):
            w, chunk = pending.popleft()
            st.empty += sum(1 for r in chunk if isinstance(r.text, str) and blank(r.text))
            st.truncated += embedder.truncated
            embedder.truncated = 0
            st.errors += sum(1 for r in chunk if isinstance(r.text, DataError))
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
            f.write((json_line(r, ensure_ascii=True) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
        return at, f.tell()
