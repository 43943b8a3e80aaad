"""A Parquet output of `spanflow embed` while its job runs: each finished chunk is a Parquet
file of its own beside the output, `<output>.chunk<w>.parquet` (a Parquet file's footer is
written last, so a killed writer's file cannot be appended to), and at the end the chunks are
copied, row group by row group and in order, into one file that is renamed onto the output.

The names are fixed, not per process: the job holds the output's lock (job.py), so only it
touches them, and a later `--resume` finds them by name.
"""
from __future__ import annotations

import os

from spanflow.data.tables import parquet_file, parquet_output, pyarrow
from spanflow.tasks.embed.journal import JobPaths


def write_chunk(P: JobPaths, w: int, table, *, what: str) -> None:
    """Chunk `w`'s rows, synced, at P.chunk_part(w): written under P.chunk_partial(w) and then
    renamed, so that the name holds a whole chunk or nothing (removed on failure)."""
    tmp = P.chunk_partial(w)
    try:
        with parquet_file(tmp, what=what, shown=P.out) as f:
            f.write(table)
        os.replace(tmp, P.chunk_part(w))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def assemble(P: JobPaths, chunks: int, empty, *, what: str) -> None:
    """The `chunks` chunk files, row group by row group in order, as one file at the output;
    `empty`: the table of a job with no chunks (no rows, but the schema)."""
    pa = pyarrow()
    with parquet_output(P.out, what=what, kind="embed") as dst:
        if chunks == 0:
            dst.write(empty)
        for w in range(chunks):
            with pa.parquet.ParquetFile(P.chunk_part(w)) as part:
                for g in range(part.num_row_groups):
                    dst.write(part.read_row_group(g))
