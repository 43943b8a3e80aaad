"""Self-contained model directories: spanflow.json + encoder/ (HF layout) + head.safetensors.

Loading needs no network and no pickle. Writes go to a temporary sibling directory that
is renamed into place (write_aside), so a crash or a full disk never leaves a half-written
model: the one there before stays, whole.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from safetensors.torch import load_file
from torch import nn

from spanflow.atomic import WRITE_ERRNOS, as_os_error, atomic_dir, found_dir
from spanflow.errors import ConfigError, ModelDirError, WriteError, as_path
from spanflow.models.files import HF_FILES, apply_umask, config_object, write_safetensors
from spanflow.schemas import Names, NonNegativeInt, PositiveInt, expect, explain

FORMAT_VERSION = 2  # 2: "limit" is the longest input a model takes, "max_length" what inference reads
CONFIG = "spanflow.json"
TaskName = expect(Annotated[str, Field(strict=True, min_length=1)], "a task name")
_NAMES, _POSITIVE, _COUNT = TypeAdapter(Names), TypeAdapter(PositiveInt), TypeAdapter(NonNegativeInt)


@contextmanager
def write_aside(path: str, kind: str = "model") -> Iterator[str]:
    """A temporary directory to fill, put in place of `path` when the block ends (atomic_dir).

    A full disk, a quota, a read-only file system or a missing permission met while filling it
    comes out as a WriteError naming `path`, not the temporary file it happened in (removed as the
    error leaves); a Rust library's error for one (safetensors' SafetensorError, tokenizers'
    Exception, which transformers' save_pretrained passes on) as the errno its message reports.
    A model (`kind` "model") is never saved over a file or a directory of other files. Every file and directory in
    it gets the modes of the umask, whichever library wrote it (files.apply_umask)."""
    path = as_path(path, "save")  # save(None): named, not a TypeError from os
    if kind == "model":
        check_model_destination(path)
    try:
        with atomic_dir(path, kind) as tmp:
            yield tmp
            apply_umask(tmp)
    except Exception as e:
        err = as_os_error(e)
        if err is None or err.errno not in WRITE_ERRNOS:
            raise
        raise WriteError(_WHAT.get(kind, kind), path, OSError(err.errno, err.strerror, path)) from e


_WHAT = {"model": "the model", "ckpt": "the checkpoint", "export": "the export"}
_MODEL_FILES = (CONFIG, "config.json", "modules.json")  # spanflow's, Hugging Face's, sentence-transformers'
# what a file browser or a notebook leaves in any folder: no files of the user's to keep
LITTER = frozenset({".DS_Store", ".gitkeep", ".ipynb_checkpoints", "Thumbs.db", "desktop.ini"})
# what a model directory holds beside transformers' files (HF_FILES): spanflow's and sentence-transformers'
_MODEL_NAMES = frozenset({CONFIG, "encoder", "head.safetensors", "pytorch_model.bin", "pytorch_model.bin.index.json",
                          "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                          "data_config.json", "README.md"})
_MODULE = re.compile(r"\d+_[A-Za-z]+")  # sentence-transformers' module folders: 1_Pooling, 2_Normalize, 2_Dense


def is_model_file(name: str) -> bool:
    """Whether a directory entry is one a model directory holds (a file of the user's is not)."""
    return name in _MODEL_NAMES or bool(HF_FILES.fullmatch(name) or _MODULE.fullmatch(name))


def check_destination(path: str, *, what: str, marks: tuple[str, ...], ours) -> None:
    """A ConfigError where writing a `what` (a directory, replaced whole) at `path` would replace what
    is not one: a file, a directory of other files (none of `marks`), or one holding, beside
    `what`, names `ours(name)` does not take (files of the user's). Litter is no file to keep."""
    if os.path.exists(path) and not os.path.isdir(path):  # (a link to nothing is written through)
        raise ConfigError(f"{path} is a file; a {what} is saved as a directory: give another path")
    names = [n for n in os.listdir(path) if n not in LITTER] if os.path.isdir(path) else []
    if names and not any(n in names for n in marks):
        raise ConfigError(f"{path} holds {len(names)} other file(s) (e.g. {sorted(names)[0]}) and no {what}: saving "
                          "there would replace them; give a new or empty directory")
    others = sorted(n for n in names if not ours(n))
    if others:  # a config.json beside files of the user's: the save replaces the directory whole
        raise ConfigError(f"{path} holds a {what} and {len(others)} other file(s) (e.g. {others[0]}): saving there "
                          "would replace them; give a new or empty directory, or move them away")


def check_model_destination(path: str) -> None:
    """A ConfigError where saving a model at `path` would replace what is no model (check_destination)."""
    check_destination(path, what="model", marks=_MODEL_FILES, ours=is_model_file)


def save_model_dir(path: str, *, encoder: nn.Module, tokenizer, head: nn.Module, config: dict) -> None:
    """Write encoder (safetensors), tokenizer files, head weights and config into `path`, aside
    first (write_aside)."""
    with write_aside(path) as tmp:
        enc_dir = os.path.join(tmp, "encoder")
        encoder.save_pretrained(enc_dir, safe_serialization=True)
        tokenizer.save_pretrained(enc_dir)
        state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
        write_safetensors(os.path.join(tmp, "head.safetensors"), state)
        cfg = {"format_version": FORMAT_VERSION, **config}
        with open(os.path.join(tmp, CONFIG), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)


class ModelConfig(BaseModel):
    """The fields every spanflow.json has. The other keys are each task's own (NER: labels, limit,
    max_length, stride, ...; RE: relations, max_length, threshold) and are kept as they are: a task
    reads them with check_names/config_int, or states them in a subclass and reads it with check()."""

    model_config = ConfigDict(extra="allow")

    format_version: PositiveInt = 1  # absent: the first format
    task: TaskName

    @classmethod
    def check(cls, cfg, cfg_path: str):
        """`cfg`, read from the spanflow.json at `cfg_path`, as this schema; a ModelDirError naming
        the file, the key and the value otherwise."""
        try:
            return cls.model_validate(cfg)
        except ValidationError as e:
            raise ModelDirError(f"{cfg_path}: {explain(e)}") from None


def read_model_config(path: str, task: str | None = None) -> dict:
    """spanflow.json of a model directory, checked for existence, format and task."""
    from spanflow.models.encoder import missing_dir, run_hint

    if not found_dir(path):
        raise ModelDirError(missing_dir(path))  # OUT/model of a run that has not saved one says so
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.exists(cfg_path):
        raise ModelDirError(run_hint(path) or f"{path} is not a spanflow model directory (no {CONFIG}); "
                            "train one with 'spanflow train'")
    cfg = config_object(cfg_path)
    common = ModelConfig.check(cfg, cfg_path)
    if common.format_version > FORMAT_VERSION:
        raise ModelDirError(f"{path} was written by a newer spanflow (model format {common.format_version}; this "
                            f"one reads up to {FORMAT_VERSION}): upgrade spanflow to load it")
    if task and common.task != task:
        raise ModelDirError(f"{path} is a {common.task!r} model, but this command needs a {task!r} model")
    return cfg


def load_head_state(path: str) -> dict:
    """The head's tensors from head.safetensors."""
    f = os.path.join(path, "head.safetensors")
    if not os.path.exists(f):
        raise ModelDirError(f"{path} lacks head.safetensors")
    try:
        state = load_file(f)
    except Exception as e:  # safetensors raises its own error type for a truncated or corrupt file
        raise ModelDirError(f"{f} is unreadable (truncated or corrupt?): {str(e)[:200]}") from None
    from spanflow.models.encoder import refuse_nan

    refuse_nan(f, state.items())
    return state


def _config_value(cfg: dict, key: str, path: str, kind: TypeAdapter, default=None):
    """cfg[key] (`default` when absent or null) checked as `kind`, or a ModelDirError naming the
    file, the key and the value."""
    value = default if cfg.get(key) is None else cfg[key]
    try:
        return kind.validate_python(value)
    except ValidationError as e:
        raise ModelDirError(f"{os.path.join(path, CONFIG)}: {key!r} {explain(e)}") from None


def check_names(cfg: dict, key: str, path: str) -> list[str]:
    """cfg[key] as a non-empty list of distinct non-empty strings (labels, relations), or a ModelDirError."""
    return _config_value(cfg, key, path, _NAMES)


def config_int(cfg: dict, key: str, path: str, default: int | None = None) -> int:
    """cfg[key] as a positive integer (`default` when absent or null), or a ModelDirError."""
    return _config_value(cfg, key, path, _POSITIVE, default)


def config_count(cfg: dict, key: str, path: str, default: int | None = None) -> int:
    """cfg[key] as a non-negative integer (a stride of 0 is one), or a ModelDirError."""
    return _config_value(cfg, key, path, _COUNT, default)


def fill_head(head: nn.Module, state: dict, path: str) -> nn.Module:
    """Load head.safetensors into `head`; tensors that do not fit the config are a ModelDirError."""
    try:
        head.load_state_dict(state)
    except RuntimeError as e:
        # the first line only names the head's class: what does not fit is on the next
        raise ModelDirError(f"{path}: head.safetensors does not match {CONFIG} ({' '.join(str(e).split())[:300]})") \
            from None
    return head


def load_model_dir(path: str, task: str, special: tuple[str, ...] = ()) -> tuple[dict, nn.Module, object, dict]:
    """(config, encoder, tokenizer, head tensors) of a spanflow model directory of `task` (the
    encoder as models.encoder.load_encoder loads it, its tokenizer holding the `special` tokens
    the task's inputs are built with)."""
    from spanflow.models.encoder import load_encoder, require_special_tokens

    cfg = read_model_config(path, task=task)
    encoder, tokenizer = load_encoder(os.path.join(path, "encoder"))
    require_special_tokens(tokenizer, os.path.join(path, "encoder"), special)
    return cfg, encoder, tokenizer, load_head_state(path)
