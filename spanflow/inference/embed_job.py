"""`spanflow embed` as a function: stream any input into .npy (memory-mapped) or JSONL,
window by window, resumable, with bounded memory.

Progress is journaled in `<output>.progress.json` after each finished window (the
window's rows flushed first), so a killed run resumes at the first unfinished window and
never recomputes finished ones. The final files appear only when the job completes.
"""
from __future__ import annotations

import itertools
import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
from numpy.lib.format import open_memmap
from tqdm import tqdm

from spanflow.data.records import read_records
from spanflow.errors import ConfigError, DataError


@dataclass
class EmbedSpec:
    """What to embed and where; the identity of a resumable job."""

    input: str
    output: str
    field: str = "text"
    column: int | None = None
    skip_header: bool = False
    window: int = 8192
    dtype: str = "float32"  # npy output: float32 or float16
    model: str = ""


def _out_format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return "npy"
    if ext in (".jsonl", ".ndjson"):
        return "jsonl"
    raise ConfigError(f"--output must end in .npy or .jsonl, got {path!r}")


def _write_json_atomic(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _count_and_ids(spec: EmbedSpec, ids_tmp: str | None) -> int:
    """One streaming pass: count records (and write their ids, one per line)."""
    n = 0
    f = open(ids_tmp, "w", encoding="utf-8") if ids_tmp else None
    try:
        for rid, _ in read_records(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header):
            n += 1
            if f:
                f.write(rid.replace("\n", " ") + "\n")
    finally:
        if f:
            f.close()
    return n


def _sample(spec: EmbedSpec, k: int) -> list[str]:
    recs = read_records(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header)
    return [t for _, t in itertools.islice(recs, k * 2) if isinstance(t, str) and t.strip()][:k]


def embed_file(embedder, spec: EmbedSpec, *, max_tokens: int | None = None, resume: bool = False, force: bool = False,
               progress: bool = True, log=print) -> dict:
    """Embed every record of spec.input into spec.output; returns the run summary."""
    fmt = _out_format(spec.output)
    if spec.dtype not in ("float32", "float16"):
        raise ConfigError(f"--dtype must be float32 or float16, got {spec.dtype!r}")
    if not os.path.exists(spec.input):
        raise DataError("file not found", path=spec.input)
    calibration = embedder.check_precision(_sample(spec, 256), force=force)
    if calibration:
        log(f"{calibration['precision']} vs fp32 on {calibration['n']} input texts: mean cosine "
            f"{calibration['mean_cosine']:.6f}, min {calibration['min_cosine']:.6f}")
    out = spec.output
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    partial, journal = out + ".partial", out + ".progress.json"
    errors_path = os.path.splitext(out)[0] + ".errors.jsonl"
    ids_path = os.path.splitext(out)[0] + ".ids.txt"
    ident = {**asdict(spec), "format": fmt, "dim": embedder.dim}
    state = None
    if resume and os.path.exists(journal) and os.path.exists(partial):
        with open(journal, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("spec") != ident:
            raise ConfigError(f"{journal} belongs to a job with other settings; remove it or drop --resume")
        log(f"resuming: {state['windows_done']} of {state['windows']} windows already done")
    if state is None:
        n = _count_and_ids(spec, ids_path + ".partial" if fmt == "npy" else None)
        state = {"spec": ident, "n": n, "windows": -(-n // spec.window), "windows_done": 0, "bytes": 0,
                 "errors_bytes": 0, "stats": {"real_tokens": 0, "padded_tokens": 0, "seconds": 0.0,
                                              "truncated": 0, "empty": 0, "errors": 0}}
        if fmt == "npy":
            open_memmap(partial, mode="w+", dtype=spec.dtype, shape=(n, embedder.dim)).flush()
        else:
            open(partial, "w").close()
        open(errors_path, "w").close()
        _write_json_atomic(journal, state)
    _run_windows(embedder, spec, fmt, state, partial, journal, errors_path, max_tokens, progress)
    if fmt == "npy":
        os.replace(ids_path + ".partial", ids_path)
    os.replace(partial, out)
    os.remove(journal)
    st = state["stats"]
    if not st["errors"]:
        os.remove(errors_path)
    secs = max(st["seconds"], 1e-9)
    summary = {"texts": state["n"], "errors": st["errors"], "truncated": st["truncated"], "empty": st["empty"],
               "real_tokens": st["real_tokens"], "padding_efficiency": st["real_tokens"] / max(1, st["padded_tokens"]),
               "texts_per_s": state["n"] / secs, "real_tokens_per_s": st["real_tokens"] / secs, "seconds": secs,
               "precision": embedder.precision_name, "calibration": calibration, "output": out,
               "ids": ids_path if fmt == "npy" else None,
               "errors_file": errors_path if st["errors"] else None}
    return summary


def _run_windows(embedder, spec, fmt, state, partial, journal, errors_path, max_tokens, progress) -> None:
    n, W, st = state["n"], spec.window, state["stats"]
    done = state["windows_done"]
    recs = read_records(spec.input, field=spec.field, column=spec.column, skip_header=spec.skip_header)
    recs = itertools.islice(recs, done * W, None)  # finished windows are skipped, not recomputed
    bar = tqdm(total=n, initial=min(n, done * W), unit="text", disable=not progress, dynamic_ncols=True,
               mininterval=0.5)
    tokens = [0]

    def on_batch(k, real, padded):
        st["real_tokens"] += real
        st["padded_tokens"] += padded
        tokens[0] += real
        bar.update(k)
        el = max(bar.format_dict["elapsed"], 1e-9)
        bar.set_postfix(tok_s=f"{tokens[0] / el:.0f}")

    embedder.truncated = 0
    pending: deque = deque()  # windows read by the tokenizing thread, awaiting their embeddings

    def texts():
        for _ in range(done, state["windows"]):
            window = list(itertools.islice(recs, W))
            pending.append(window)
            yield from (t if isinstance(t, str) else "" for _, t in window)

    t0 = time.perf_counter()
    stream = embedder.encode_stream(texts(), window=W, max_tokens=max_tokens, on_batch=on_batch)
    for w, emb in zip(range(done, state["windows"]), stream):
        window = pending.popleft()
        st["empty"] += sum(1 for _, t in window if isinstance(t, str) and not t.strip())
        errs = [(rid, t) for rid, t in window if isinstance(t, DataError)]
        st["truncated"] += embedder.truncated
        embedder.truncated = 0
        start = w * W
        if fmt == "npy":
            for k, (_, t) in enumerate(window):
                if isinstance(t, DataError):
                    emb[k] = np.nan  # an unreadable record: a NaN row, explained in the errors file
            # map the file for this window only: pages of a map held open for the whole run
            # would count in the process's memory and grow with the input
            mm = open_memmap(partial, mode="r+")
            mm[start:start + len(window)] = emb.astype(spec.dtype)
            mm.flush()
            del mm
        else:
            with open(partial, "r+", encoding="utf-8") as f:
                f.seek(state["bytes"])
                f.truncate()
                for k, (rid, t) in enumerate(window):
                    rec = ({"id": rid, "line": t.line, "error": t.reason} if isinstance(t, DataError)
                           else {"id": rid, "embedding": [round(float(x), 7) for x in emb[k]]})
                    f.write(json.dumps(rec) + "\n")
                state["bytes"] = f.tell()
        with open(errors_path, "r+", encoding="utf-8") as f:
            f.seek(state["errors_bytes"])
            f.truncate()
            for rid, e in errs:
                f.write(json.dumps({"id": rid, "line": e.line, "error": e.reason}) + "\n")
            state["errors_bytes"] = f.tell()
        st["errors"] += len(errs)
        now = time.perf_counter()
        st["seconds"] += now - t0
        t0 = now
        state["windows_done"] = w + 1
        _write_json_atomic(journal, state)
    bar.close()
