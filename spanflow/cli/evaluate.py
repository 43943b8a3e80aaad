"""`spanflow evaluate --model DIR --data F [--json]`"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator

from spanflow.cli.common import (add_format_arg, add_runtime_args, add_scheme_arg, add_window_args, check_window_args,
                                 cut_line, note_small_budget)
from spanflow.data.jsonvalues import json_line
from spanflow.errors import counted
from spanflow.monitor.report import clock_time


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="score a model on labelled data",
                       description="Score a trained model on labelled data of its task: entity P/R/F1 per label "
                                   "(NER), triple P/R/F1 per relation (RE), Spearman or MRR@10 (embeddings). "
                                   "Prints a table, or one JSON object with --json.")
    p.add_argument("--model", required=True, help="a spanflow model directory, a Hugging Face token-classification "
                                                  "directory (NER), or an encoder directory (embeddings)")
    p.add_argument("--data", required=True, help="labelled data: NER CoNLL, JSONL or .spacy; RE CasRel JSON or "
                                                 "JSONL; scored pairs, pairs or triplets in CSV, TSV or JSONL "
                                                 "(embeddings)")
    add_format_arg(p)
    add_scheme_arg(p)
    p.add_argument("--columns", default=None,
                   help="embeddings: the columns or JSONL keys of s1, s2 and score, e.g. 0,1,2 (as train embed's "
                        "--columns) [detected]")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_runtime_args(p)
    add_window_args(p)


@contextlib.contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The messages of the warnings logged to "spanflow" inside the block, as a list."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                said.append(record.getMessage())

    handler, log = Keep(), logging.getLogger("spanflow")
    log.addHandler(handler)
    try:
        yield said
    finally:
        log.removeHandler(handler)


TEXT_KEYS = {"text", "id"}  # a record of these holds nothing to score against, whatever the task


def _texts_only(path: str, label_keys: tuple[str, ...]) -> bool:
    """A JSONL file of texts to run a model on, not labelled data (formats.sniff's texts-jsonl for
    its head, then each line): no record holds one of the task's `label_keys`; for a task that
    names none, every record holds a text and an id at most."""
    import json

    from spanflow.data.formats.common import read_lines
    from spanflow.data.formats.sniff import sniff

    def labelled(rec: dict) -> bool:
        return any(k in rec for k in label_keys) if label_keys else bool(set(rec) - TEXT_KEYS)

    kind = sniff(path)
    if kind is None or kind.name != "texts-jsonl":
        return False
    for _, line in read_lines(path):
        try:
            rec = json.loads(line) if line.strip() else {}
        except ValueError:  # the reader says what is wrong with it
            return False
        if not isinstance(rec, dict) or labelled(rec):
            return False
    return True


def run(a: argparse.Namespace) -> int:
    from spanflow.errors import DataError
    from spanflow.inference.heap import settle
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import task_of_dir
    from spanflow.tuning.auto import quick_profile

    check_window_args(a.model, a.max_length, a.stride)  # before the model loads
    task = task_of_dir(a.model)
    _check_read_flags(task, a)
    if a.scheme:
        from spanflow.data.io import refuse_tag_flags

        refuse_tag_flags([a.data], a.format, scheme=a.scheme, strict=False)
    with logged_warnings() as read_said:  # the reader's warnings: on stderr as logged, and in --json's list
        examples = task.read_labelled(a.data, fmt=a.format, scheme=a.scheme, columns=a.columns)
    if not examples:
        raise DataError("holds no examples to evaluate on", path=a.data)
    keys = tuple(getattr(task, "label_keys", ()))
    if _texts_only(a.data, keys):  # a file of texts, as a .txt is refused: before the model loads
        held = " or ".join(f'"{k}"' for k in keys) if keys else 'anything but a "text" and an "id"'
        raise DataError(f"holds texts and no labels (no JSONL record holds {held}): evaluate scores a model against "
                        "labels; spanflow predict runs it on texts", path=a.data)
    loads = Loads(task, a.model)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=_texts(examples),
                         data=a.data, loads=loads, measure=quick_profile)
    model = loads.take(rt)
    model.set_max_length(a.max_length, a.stride)  # None, None: as trained
    settle()
    note_small_budget(model, a.max_tokens, rt.max_tokens)
    cut = getattr(model, "truncated", None)  # a model that reads no windows counts the texts it cuts
    started = time.perf_counter()
    m = model.evaluate(examples, max_tokens=rt.max_tokens)
    seconds = time.perf_counter() - started
    if cut is not None and model.truncated > cut:
        m.setdefault("warnings", []).append(cut_line(model, model.truncated - cut, "scored"))
    if m.get("support") == 0:  # entities or triples: none in the data, so no score can be earned
        m.setdefault("warnings", []).append(f"{a.data} holds no gold entities or triples: recall and F1 are 0 "
                                            "whatever the model finds")
    for w in m.get("warnings", ()):  # on stderr, so that --json's one object stays alone on stdout
        print(f"warning: {w}", file=sys.stderr)
    if read_said:
        m["warnings"] = [*read_said, *m.get("warnings", ())]
    if a.json:
        print(json_line({**m, "seconds": round(seconds, 3)}, ensure_ascii=True))  # an undefined correlation: null
    else:
        print(model.format_metrics(m))
        print(f"scored {counted(len(examples), 'example')} in {clock_time(seconds)} "
              f"({len(examples) / max(seconds, 1e-9):.0f} a second; loading the model and data not counted)")
    return 0


# what each reading flag is for, by read_labelled's parameter: a task whose reader lacks it refuses it
_READ_FLAGS = (("columns", "--columns", "picks the columns of embedding pairs"),
               ("fmt", "--format", "names the format of NER data"),
               ("scheme", "--scheme", "names the tag scheme of NER CoNLL data"))


def _check_read_flags(task, a: argparse.Namespace) -> None:
    """A reading flag the model's task does not read its data with (--columns for NER, --format
    or --scheme for embeddings or RE) is refused, not ignored."""
    import inspect

    from spanflow.errors import ConfigError

    takes = inspect.signature(task.read_labelled).parameters
    given = {"columns": a.columns, "fmt": a.format, "scheme": a.scheme}
    for param, flag, purpose in _READ_FLAGS:
        if given[param] is not None and param not in takes:
            raise ConfigError(f"{flag} {purpose}, which the data of a model of task {task.name!r} does not take")


def _texts(examples: list) -> list[str]:
    """The texts of labelled examples, which --precision auto checks on: an example's `text`, or
    each text of a pair or triplet (its string fields)."""
    import dataclasses

    out = []
    for e in examples:
        text = getattr(e, "text", None)
        if isinstance(text, str):
            out.append(text)
        elif dataclasses.is_dataclass(e):
            out += [v for v in (getattr(e, f.name) for f in dataclasses.fields(e)) if isinstance(v, str)]
    return out
