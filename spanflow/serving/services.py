"""A loaded model behind its task's route: the server asks the model (through the task
interface, spanflow/tasks/registry.py) how texts become units, how a batch of units runs,
and how results become a response; it never asks which task it is."""
from __future__ import annotations

import os
from dataclasses import dataclass

from spanflow.errors import ConfigError
from spanflow.tasks.registry import Task, TaskModel, task_of_dir


@dataclass
class Service:
    """A loaded model, its name in requests, and its task."""

    name: str
    task: Task
    model: TaskModel
    backend: str = "eager"  # what runs its encoder once the server is ready (compile: started then, aside)

    def units(self, texts: list[str]):
        """(units, token lengths, context for assemble); run off the event loop."""
        return self.model.units(texts)

    def run_batch(self, units: list) -> list:
        """Runs in the model's worker thread."""
        return self.model.run_batch(units)

    def params(self, body: dict) -> dict:
        """The request's task options, checked (a ConfigError names what is wrong)."""
        read = getattr(self.task, "request_params", None)
        return read(self.model, body) if read else {}

    def respond(self, texts: list[str], units: list, results: list, ctx, tokens: int, params: dict) -> dict:
        """The response body; run off the event loop."""
        return self.task.response(self.model, self.name, texts, self.model.assemble(texts, units, results, ctx),
                                  tokens, params)


def parse_spec(spec: str) -> tuple[str, str]:
    """(name, directory) of NAME=DIR, or of DIR (named after the directory). A name holds no '=';
    a directory may (lr=3e-5/model), and one that exists as given is taken whole."""
    name, eq, path = spec.partition("=")
    if eq and not path and not os.path.isdir(spec):
        from spanflow.errors import ConfigError

        raise ConfigError(f"--model {spec}: no directory after '=' (NAME=DIR)", field="model")
    if eq and not name and not os.path.isdir(spec):
        from spanflow.errors import ConfigError

        raise ConfigError(f"--model {spec}: no name before '=' (NAME=DIR; DIR alone names the model after its "
                          "directory)", field="model")
    if not eq or os.path.isdir(spec):
        name, path = "", spec
    return name or default_name(path), path


def default_name(path: str) -> str:
    """A directory's name; for a trained model (OUT/model, as every run saves it) its run's: runs/ner/model
    is 'ner'."""
    folder = os.path.normpath(os.path.abspath(path))
    base = os.path.basename(folder)
    run = os.path.basename(os.path.dirname(folder))
    return run if base == "model" and run else base


def check_names(specs: list[tuple[str, str]]) -> None:
    """A ConfigError for two models under one name (a request could reach only one of them); `specs`:
    (name, what the model is: its directory)."""
    seen: dict[str, str] = {}
    for name, path in specs:
        if name in seen:
            raise ConfigError(f"two models are named {name!r}, {seen[name]} and {path} (a model without NAME= is "
                              "named after its directory, or a trained one's run): give each a name, --model NAME=DIR")
        seen[name] = path


def load_service(spec: str, *, precision: str = "auto", device: str = "auto") -> Service:
    """NAME=DIR or DIR: a spanflow model of any task, or an encoder directory (served as
    embeddings), loaded once as asked (`spanflow serve` resolves the runtime first, then
    builds its Services from the models that resolution loaded)."""
    name, path = parse_spec(spec)
    task = task_of_dir(path)
    return Service(name, task, task.load(path, device=device, precision=precision))
