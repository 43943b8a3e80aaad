"""Typed errors. The CLI turns any SpanflowError into a one-line message and exit code 2."""
from __future__ import annotations


QUOTE_CHARS = 200


def quote(value, limit: int = QUOTE_CHARS) -> str:
    """repr(value) cut to about `limit` characters: messages quote bad input, never all of it."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun`, plural unless n is one: "1 column", "3 columns" (`plural` where it is not
    `noun` + s: "1 entity", "2 entities")."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


class SpanflowError(Exception):
    """Base class for every user-facing error spanflow raises."""


class DataError(SpanflowError):
    """Bad input data; names the file and line (or record) at fault. `kept`: a bulk job it stopped
    kept what it had done, for a resume on the same input (the command line says so)."""

    kept = False

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path, self.line, self.reason = path, line, message
        where = ""
        if path is not None:
            shown = path if path else "'' (an empty path)"  # not ": file not found", which names nothing
            where = f"{shown}:{line}: " if line is not None else f"{shown}: "
        super().__init__(where + message)


class ModelDirError(SpanflowError):
    """A model directory is missing, incomplete, or of another task."""


class ConfigError(SpanflowError):
    """An option value that cannot work (e.g. bf16 asked on a device without it); `field`: the
    request or file field it is in, where there is one (the server's `param`); `cli`: the message
    as the command line says it, where it differs (flags, not the Python API's field names)."""

    def __init__(self, message: str = "", *, field: str | None = None, cli: str | None = None):
        super().__init__(message)
        self.field, self.cli = field, cli


class WriteError(SpanflowError):
    """An output could not be written: no space (ENOSPC, EDQUOT), a read-only file system (EROFS),
    no permission (EACCES, EPERM). Names the path and what was being written; whatever was being
    written is left aside, never half-written at its final path."""

    def __init__(self, what: str, path: str, err: OSError):
        self.what, self.path, self.errno, self.err = what, path, err.errno, err
        super().__init__(f"cannot write {what} to {path}: {err.strerror or err}")


class PeerFailed(SpanflowError):
    """Another process of the job (rank 0 under torchrun) stopped with an error it has already
    reported; this one stops too, without a second message."""

    quiet = True


def as_path(value, what: str) -> str:
    """`value` as a path string; a ConfigError naming `what` (the argument) where it is no path
    (None, a number): the Python API's mistake is told, not a TypeError from os."""
    import os

    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise ConfigError(f"{what} takes a path, got {type(value).__name__} {quote(value, 60)}")


def as_log(value, what: str = "log_fn"):
    """`value` as a function a run's lines go to: None is quiet; a ConfigError naming `what` (the
    argument) where it is none (a str given for a file name, say), not a TypeError at the run's first line."""
    if value is None:
        return _quiet
    if callable(value):
        return value
    raise ConfigError(f"{what} takes a function of one line (None: quiet), got {type(value).__name__} "
                      f"{quote(value, 60)}", field=what)


def _quiet(line: str) -> None:
    pass
