"""Which backend the encoder runs on: eager PyTorch, or compiled with torch.compile.

Compiling costs a long pause at start-up and then runs token-budget batches faster; a
one-off job never earns the compile time back, a server does (docs/defaults.md has the
figures). `auto` therefore compiles for a batching server and stays eager elsewhere.
How either runs is spanflow/inference/backend.py.
"""
from __future__ import annotations

from spanflow.errors import ConfigError

BACKENDS = ("auto", "eager", "compile")


def choose_backend(asked: str, *, batching: bool, measured: str | None = None) -> str:
    """The backend to run: as asked; for `auto` the one `spanflow tune --mode infer` measured
    faster (`measured`, from its profile) in a batching server, else compile where batches
    are large and the process lives long enough (a batching server), eager otherwise."""
    if asked not in BACKENDS:
        raise ConfigError(f"unknown backend {asked!r}; expected one of {', '.join(BACKENDS)}")
    if asked != "auto":
        return asked
    if not batching:
        return "eager"
    return measured if measured in ("eager", "compile") else "compile"
