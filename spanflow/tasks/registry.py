"""The one table of trained-model tasks: a model directory's spanflow.json names its task,
this table names the class that loads it. Callers never switch on the task's name."""
from __future__ import annotations

import importlib

from spanflow.errors import ModelDirError

MODELS = {"ner": "spanflow.ner:NerModel", "re": "spanflow.re:ReModel"}


def load_model(path: str, *, device: str = "auto", precision: str = "auto"):
    """A trained spanflow model of whichever task its directory holds."""
    from spanflow.models.directory import read_model_config

    task = read_model_config(path).get("task")
    if task not in MODELS:
        raise ModelDirError(f"{path} is a {task!r} model; this command takes {' or '.join(map(repr, MODELS))} models")
    module, name = MODELS[task].split(":")
    return getattr(importlib.import_module(module), name).load(path, device=device, precision=precision)
