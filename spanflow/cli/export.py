"""`spanflow export --model DIR [--to hf] --out OUT` (or OUT last)"""
from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    from spanflow.tasks.registry import tasks

    formats = sorted({f for t in tasks() for f in getattr(t, "exports", ())})
    p = sub.add_parser("export", help="write a trained model in another tool's format (hf: a Hugging Face "
                                      "AutoModelForTokenClassification directory)",
                       description="Write a trained model in another tool's format. hf: an NER model as a Hugging "
                                   "Face AutoModelForTokenClassification directory, with its tokenizer and labels.")
    p.add_argument("--model", required=True, help="a spanflow model directory")
    one = formats[0] if len(formats) == 1 else None  # the only format there is needs no asking
    p.add_argument("--to", required=one is None, default=one, choices=formats,
                   help="the format to write (each task says which it writes)" + (f" [{one}]" if one else ""))
    p.add_argument("--lossy", action="store_true",
                   help="export even what the format cannot hold whole (a CRF head: its emission scores only)")
    p.add_argument("out", nargs="?", help="output directory (or --out)")
    p.add_argument("--out", dest="out_flag", metavar="OUT", help="output directory [the positional OUT]")


def run(a: argparse.Namespace) -> int:
    from spanflow.atomic import writing
    from spanflow.tasks.registry import task_of_dir

    a.out = _out(a)
    task = task_of_dir(a.model)
    _check(task, a)  # before the model loads
    model = task.load(a.model, device="cpu", precision="fp32")
    with writing("the exported model", a.out):
        said = lambda line: print(line, file=sys.stderr)  # noqa: E731 - warnings and notes, as every command's
        print(f"wrote {task.export(model, a.to, a.out, lossy=a.lossy, log_fn=said)} ({a.to})")
    return 0


def _out(a: argparse.Namespace) -> str:
    """The output directory, given as the positional OUT or as --out (not two different ones)."""
    import os

    from spanflow.errors import ConfigError

    if a.out and a.out_flag and os.path.realpath(a.out) != os.path.realpath(a.out_flag):
        raise ConfigError(f"two output directories given: {a.out} and --out {a.out_flag}; give one")
    if not (a.out or a.out_flag):
        raise ConfigError("no output directory: give it as --out OUT (or as the last argument)")
    return a.out or a.out_flag


def _check(task, a: argparse.Namespace) -> None:
    """The format against what the task exports, and the output directory against what it would replace."""
    import os

    from spanflow.atomic import check_output_path
    from spanflow.errors import ConfigError
    from spanflow.models.directory import LITTER
    from spanflow.models.encoder import holds_model
    from spanflow.models.files import HF_FILES  # what an export writes: anything else is not one to replace

    exports = getattr(task, "exports", ())
    if not exports:
        instead = getattr(task, "export_instead", "")
        instead = instead(a.model) if callable(instead) else instead
        raise ConfigError(f"{task.name} models have no export format ({a.model} is one)"
                          + (f": {instead}" if instead else ""))
    if a.to not in exports:
        raise ConfigError(f"a model of task {task.name!r} exports to {', '.join(exports)}, not {a.to!r}")
    check_output_path(a.out)  # a device or pipe: refused before the model loads
    out, src = os.path.realpath(a.out), os.path.realpath(a.model)
    if out == src or src.startswith(out + os.sep):
        raise ConfigError(f"{a.out}: the export would replace the model it is made from ({a.model}); give another "
                          "directory")
    if out.startswith(src + os.sep):
        raise ConfigError(f"{a.out} is inside the model it is made from ({a.model}), which it would change; give a "
                          "directory outside it")
    if os.path.isfile(a.out):
        raise ConfigError(f"{a.out} is a file; the export is a directory")
    if os.path.isdir(a.out) and set(os.listdir(a.out)) - LITTER and not _earlier_export(a.out):
        what = "a model or encoder" if holds_model(a.out) else "other files"
        extra = sorted(n for n in os.listdir(a.out) if not HF_FILES.fullmatch(n))
        hf_dir = os.path.exists(os.path.join(a.out, "config.json")) and not os.path.exists(
            os.path.join(a.out, "spanflow.json"))  # an export's kind: what makes it no earlier export is named
        what += f" and files no export writes ({', '.join(extra[:3])})" if extra and hf_dir else ""
        raise ConfigError(f"{a.out} holds {what}, which the export would replace; give a new directory (or "
                          "an earlier export's, holding nothing the export did not write; one made before exports "
                          "were marked with spanflow_words in their config.json is not known as one: remove it "
                          "first)")


def _earlier_export(path: str) -> bool:
    """Whether `path` holds what an earlier `spanflow export` wrote and nothing else: its
    config.json marked with a spanflow_ field, and only the files an export writes (a trained
    model, a model fine-tuned from an export, or a folder of the user's files is never replaced)."""
    import json
    import os

    from spanflow.models.directory import LITTER
    from spanflow.models.files import HF_FILES

    if any(n not in LITTER and (not HF_FILES.fullmatch(n) or not os.path.isfile(os.path.join(path, n)))
           for n in os.listdir(path)):
        return False
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and any(str(k).startswith("spanflow_") for k in cfg)
