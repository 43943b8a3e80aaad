"""The one table of tasks. A task is an object with the members of `Task` below; the CLI, the
server, `tune` and bulk prediction look tasks up here and never switch on a task's name.

A model directory's spanflow.json names its task; a directory without one is a plain
encoder, served and run as the `embed` task. A new task is one module that defines a Task
and calls `register()` (or is listed in BUILTIN): no other file changes.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from spanflow.errors import ConfigError, ModelDirError

BUILTIN = {"ner": "spanflow.tasks.ner.task:TASK", "re": "spanflow.tasks.re.task:TASK",
           "embed": "spanflow.tasks.embed.task:TASK"}
ENCODER_TASK = "embed"  # what a directory without spanflow.json holds
_TASKS: dict[str, Any] = dict(BUILTIN)


@dataclass
class Workload:
    """A task's model and data as the tuning tools run them, task-blind."""

    module: Any  # nn.Module: forward(input_ids, attention_mask); loss_fn(module, batch) in training
    items_at: Callable[[int], list]  # the sample's items (len() = tokens) at a max length
    collate: Callable[[list], dict]  # items -> a batch dict with input_ids, attention_mask and the loop's counts
    loss_fn: Callable | None  # summed loss of a batch (training)
    limit: int  # the longest max length the model takes
    quality: Callable[[int], float] | None = None  # inference: quality of results at a max length
    length: int | None = None  # the max length the model's runs read unless told (None: the limit)
    quality_means: str = "the task's evaluate score on the labelled sample"  # tune's legend for `quality`
    counts: Callable[[list], list[int]] | None = None  # items -> the tokens each adds to the sample's (None: len)


class TaskModel(Protocol):
    """A loaded model of some task, as predict, evaluate and the server use it."""

    task: str
    policy: Any  # training.precision.Policy: device and precision

    def units(self, texts: list[str]) -> tuple[list, list[int], Any]:
        """Texts -> (units to batch, each unit's token length, context for assemble)."""

    def run_batch(self, units: list) -> list:
        """One result per unit; runs on the model's thread."""

    def assemble(self, texts: list[str], units: list, results: list, ctx: Any) -> list:
        """Per-text results in the task's record format (the same as predict's records)."""

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None,
                       on_batch: Callable | None = None) -> Iterator:
        """Per-text results in input order, bounded memory (bulk predict)."""

    def output_record(self, text: str, result: Any) -> dict:
        """The JSON record of one text: the line predict writes, the item the server returns."""

    def arrow_results(self, texts: list[str], results: list, **opts) -> Any:
        """The results as the task's columns of a Parquet output (a pyarrow.Table, one row per
        text, null where a result is None; data/tables.py has the columns). A model without it
        writes JSONL only: a Parquet output is a ConfigError before any work."""

    def evaluate(self, examples: list, *, max_tokens: int | None = None, check_spans: bool = True) -> dict:
        """Metrics on labelled examples, with at least "f1"; `check_spans` False leaves out the
        check of gold spans against the model's words (training's scoring of each epoch)."""

    def format_metrics(self, m: dict) -> str:
        """The evaluate table."""

    max_length: int  # tokens per model input at inference, special tokens included

    def set_max_length(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Read inputs of at most `max_length` tokens (NER: windows overlapping by `stride`);
        None keeps the current value."""


class Task(Protocol):
    """What a task gives the rest of spanflow."""

    name: str
    summary: str  # one line for --help
    route: str | None  # the server's POST route (None: not served)
    request_field: str  # the request's JSON field that holds the texts

    def add_train_args(self, p: argparse.ArgumentParser) -> None:
        """The task's own `spanflow train TASK` flags."""

    def train_from_args(self, a: argparse.Namespace, options) -> str:
        """Read --train/--dev, train into --out; return the lines printed at the end ("" for none:
        training/outcome.closing)."""

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> TaskModel:
        """The trained model in `path`."""

    def read_labelled(self, path: str, **fmt) -> list:
        """Labelled examples from a file (evaluate, tune)."""

    def workload(self, model: str, data: str, *, mode: str, policy, precision: str, sample: int,
                 field: str = "text", column: int | None = None, seed: int = 0,
                 texts: list[str] | None = None) -> Workload:
        """What tune and doctor run: the module and a sample of `data` as batches (mode "train": the
        model training would start from; "infer": the trained model in `model`). `texts`: inference's
        sample given instead of reading `data` (an inference command's input: no labels)."""

    trains: bool  # whether `spanflow train TASK` exists

    # optional members: claims(path) -> bool, for directories without spanflow.json that the task
    # loads (checked before they are taken for encoders); request_params(model, body) -> dict for
    # the server, reading the body's `request_options` (the names of the fields it takes beyond the
    # texts and the model; where given, a body with another field is refused) and request_schema()
    # -> dict, their JSON schema properties (the server's /openapi.json); response_schema() -> dict,
    # the JSON schema of `response` (/openapi.json's 200 answer); export(model, to,
    # out, log_fn) and `exports`, the formats `spanflow export` writes
    # (`export_instead`: for a task with none, what to do instead, said by `spanflow export`: a
    # string, or a function of the model's path);
    # `bulk_command`, the command that runs the task's models over a file (default "predict");
    # `train_fields`, the TrainOptions fields of some tasks' (metadata "some") that its training takes;
    # `quantizations`, the --quantize values its models take; `tune_modes`, the modes `tune` runs
    # (the first its default); `agreement`, `agreement_name` and `precision_gate`, --precision auto's
    # check; `train_defaults`, `dev_metric` and `train_budget_note`, what `train TASK --help` says;
    # `data_help`, the formats its training data comes in, for the help of `train TASK --train`;
    # `label_keys`, the keys a JSONL record of its labelled data holds them under (evaluate tells a
    # file with none of them as texts; without it, records of a text and an id at most are)

    def response(self, model: TaskModel, name: str, texts: list[str], results: list, tokens: int,
                 params: dict) -> dict:
        """The HTTP response body for one request: `results` from model.assemble, `tokens` its units'
        total, `params` what the task's optional `request_params(model, body)` made of the request's
        other fields (a ConfigError there is a 422)."""


def records_response(model: TaskModel, name: str, texts: list[str], results: list, tokens: int = 0,
                     params: dict | None = None) -> dict:
    """The response most tasks give: `{"model", "results"}`, one predict record per text."""
    return {"model": name, "results": [model.output_record(t, r) for t, r in zip(texts, results)]}


def records_schema(record: dict) -> dict:
    """The JSON schema of `records_response` (the server's /openapi.json), `record` one text's."""
    return {"type": "object", "required": ["model", "results"],
            "properties": {"model": {"type": "string", "description": "the served model's name"},
                           "results": {"type": "array", "items": record, "description": "one record per text, "
                                       "in the request's order"}}}


def register(task: Task) -> None:
    """Add (or replace) a task under task.name."""
    _TASKS[task.name] = task


def get(name: str) -> Task:
    """The task called `name`; a ConfigError naming the known ones otherwise."""
    entry = _TASKS.get(name)
    if entry is None:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = _TASKS[name] = getattr(importlib.import_module(module), attr)
    return entry


def names() -> list[str]:
    return list(_TASKS)


def tasks() -> list[Task]:
    return [get(n) for n in names()]


def takes(task: str, field: str) -> bool:
    """Whether `task`'s training takes TrainOptions `field`: a field of every task's, or one of some
    tasks' (its "some" metadata) that the task's `train_fields` names."""
    from spanflow.training.options import TrainOptions

    some = next(f for f in dataclasses.fields(TrainOptions) if f.name == field).metadata.get("some")
    return not some or field in getattr(get(task), "train_fields", ())


def check_train_options(options, task: str) -> None:
    """A ConfigError where `options` is neither a TrainOptions nor None, or sets a field that `task`'s
    training does not take (it would be ignored), naming the tasks that take it."""
    from spanflow.training.options import TrainOptions, check_options

    check_options(options)
    for f in dataclasses.fields(TrainOptions) if options is not None else ():
        if getattr(options, f.name) != f.default and not takes(task, f.name):
            owners = [t.name.upper() for t in tasks() if f.name in getattr(t, "train_fields", ())]
            raise ConfigError(f"TrainOptions.{f.name} (--{f.name.replace('_', '-')}) applies to "
                              f"{' and '.join(owners)} training; {task} training would ignore it", field=f.name)


def task_of_dir(path: str, *, start: bool = False) -> Task:
    """The task a model directory holds: spanflow.json's "task", or ENCODER_TASK for a plain encoder.
    A path that holds neither (a training --out folder, a file) is a ModelDirError saying what it is,
    as is (unless training `start`s from its encoder) a sequence classifier from elsewhere."""
    from spanflow.atomic import found_dir
    from spanflow.models.directory import CONFIG, read_model_config
    from spanflow.models.encoder import holds_model, missing_dir, not_a_model, sequence_classifier

    if not found_dir(path) or not holds_model(path):
        raise ModelDirError(not_a_model(path) if os.path.exists(path) else missing_dir(path))
    if not os.path.exists(os.path.join(path, CONFIG)):
        for task in tasks():  # a directory from elsewhere that a task knows (a HF token classifier)
            if getattr(task, "claims", None) and task.claims(path):
                return task
        refused = None if start else sequence_classifier(path)
        if refused:
            raise ModelDirError(refused)
        return get(ENCODER_TASK)
    task = read_model_config(path).get("task")
    if task not in _TASKS:
        raise ModelDirError(f"{path} is a {task!r} model; this spanflow knows {', '.join(map(repr, names()))}")
    return get(task)


def check_model_for(path: str, task: str, *, start: bool = False) -> Task:
    """What `path` holds, checked to suit `task` before any model loads: a model of `task`, or
    (`start`: training starts there) an encoder directory or 'tiny'. An embedding model is an
    encoder directory. A spanflow model of another task is a ModelDirError naming its encoder."""
    if start and path == "tiny":  # built from scratch, whatever a ./tiny folder holds (training's own rule)
        return get(task)
    if path == "tiny" and not os.path.exists(path):
        raise ModelDirError(f"'tiny' is an encoder built from scratch when training starts; this needs a trained "
                            f"{task!r} model directory (train one with 'spanflow train {task} --model tiny')"
                            if task != ENCODER_TASK else "'tiny' is for training ('spanflow train embed', or tune's "
                            "--mode train); embeddings come from an encoder or sentence-transformers directory")
    held = task_of_dir(path, start=start)
    own = os.path.exists(os.path.join(path, "spanflow.json"))
    if not own and task == ENCODER_TASK and held.name != ENCODER_TASK and not start:
        # a classifier from elsewhere (a HF token classifier): its encoder's pooled vectors ignore the classifier
        raise ModelDirError(f"{path} is a {held.name!r} model from elsewhere (its config.json names a classifier); "
                            "embeddings come from an encoder or sentence-transformers directory; "
                            f"'spanflow predict' runs it as {held.name!r}")
    if held.name == task or (not own and (start or task == ENCODER_TASK)):
        return held
    if not own:  # an encoder (or a classifier from elsewhere) where a trained model is needed
        raise ModelDirError(f"{path} is an encoder directory, not a spanflow {task!r} model: train one with "
                            f"'spanflow train {task} --model {path}'")
    wanted = (f"training {task!r} starts from an encoder directory, 'tiny', or a {task!r} model to train further"
              if start else f"this needs a {task!r} model" if task != ENCODER_TASK
              else "embeddings come from an encoder or sentence-transformers directory")
    raise ModelDirError(f"{path} is a model of task {held.name!r} (its spanflow.json says so); {wanted}; its encoder is "
                        f"{os.path.join(path, 'encoder')}")


def quality_at_length(model: TaskModel, examples: list) -> Callable[[int], float]:
    """quality(L) for tune: F1 on labelled `examples` with the model reading at most L tokens (cached)."""
    import functools

    keep = model.max_length

    @functools.lru_cache(maxsize=None)
    def quality(L: int) -> float:
        model.set_max_length(L)
        try:
            return model.evaluate(examples)["f1"]
        finally:
            model.set_max_length(keep)

    return quality


def autocast_twin(model: TaskModel, precision: str, quantize: str | None = None):
    """`model` in another precision, sharing its weights: for a task model whose fp32 weights
    autocast casts per batch, the twin runs as a fresh load in that precision would, without
    reading the directory again (the optional `with_precision` member of a task model)."""
    import copy

    from spanflow.runtime.policy import resolve_policy, twin_precision

    if quantize:
        raise ConfigError(f"--quantize {quantize} applies to embedding models, not {model.task} models")
    twin = copy.copy(model)
    twin.policy = resolve_policy(twin_precision(precision), str(model.policy.device))
    return twin
