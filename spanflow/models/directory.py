"""Self-contained model directories: spanflow.json + encoder/ (HF layout) + head.safetensors.

Loading needs no network and no pickle. Writes go to a temporary sibling directory that
is renamed into place, so a crash never leaves a half-written model.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from safetensors.torch import load_file, save_file
from torch import nn

from spanflow.atomic import atomic_dir
from spanflow.errors import ModelDirError

FORMAT_VERSION = 1
CONFIG = "spanflow.json"
WEIGHTS = "model.safetensors"  # an encoder directory's weights, as transformers names them


def save_model_dir(path: str, *, encoder: nn.Module, tokenizer, head: nn.Module, config: dict) -> None:
    """Write encoder (safetensors), tokenizer files, head weights and config into `path`."""
    with atomic_dir(path, "model") as tmp:
        enc_dir = os.path.join(tmp, "encoder")
        encoder.save_pretrained(enc_dir, safe_serialization=True)
        tokenizer.save_pretrained(enc_dir)
        state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
        save_file(state, os.path.join(tmp, "head.safetensors"))
        cfg = {"format_version": FORMAT_VERSION, **config}
        with open(os.path.join(tmp, CONFIG), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)


def json_object(path: str) -> dict | None:
    """A JSON file holding an object, or None when it is missing, unreadable or not an object
    (for optional files whose absence leaves the choice to another loader)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


class Config(SimpleNamespace):
    """config.json as attributes, the way encoder code reads a transformers config (for
    spanflow's plain-PyTorch encoders)."""

    def to_dict(self) -> dict:
        return dict(vars(self))


def write_encoder(path: str, module: nn.Module) -> None:
    """config.json (the module's `config.to_dict()`) and model.safetensors: the save_pretrained
    of spanflow's plain-PyTorch encoders."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(module.config.to_dict(), f, indent=2)
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()},
              os.path.join(path, WEIGHTS), metadata={"format": "pt"})


def read_model_config(path: str, task: str | None = None) -> dict:
    """spanflow.json of a model directory, checked for existence and task."""
    if not os.path.isdir(path):
        raise ModelDirError(f"model directory not found: {path}")
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.exists(cfg_path):
        raise ModelDirError(f"{path} is not a spanflow model directory (no {CONFIG}); "
                            "train one with 'spanflow train'")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise ModelDirError(f"{cfg_path} is unreadable: {str(e)[:200]}") from None
    if not isinstance(cfg, dict):
        raise ModelDirError(f"{cfg_path} is not a JSON object")
    version = cfg.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelDirError(f"{cfg_path}: format_version {version!r} is not a version number")
    if version > FORMAT_VERSION:
        raise ModelDirError(f"{path} was written by a newer spanflow (model format {version}; this one reads up "
                            f"to {FORMAT_VERSION}): upgrade spanflow to load it")
    if task and cfg.get("task") != task:
        raise ModelDirError(f"{path} is a {cfg.get('task')!r} model, but this command needs a {task!r} model")
    return cfg


def load_head_state(path: str) -> dict:
    """The head's tensors from head.safetensors."""
    f = os.path.join(path, "head.safetensors")
    if not os.path.exists(f):
        raise ModelDirError(f"{path} lacks head.safetensors")
    try:
        return load_file(f)
    except Exception as e:  # safetensors raises its own error type for a truncated or corrupt file
        raise ModelDirError(f"{f} is unreadable (truncated or corrupt?): {str(e)[:200]}") from None


def check_names(cfg: dict, key: str, path: str) -> list[str]:
    """cfg[key] as a non-empty list of distinct non-empty strings (labels, relations), or a ModelDirError."""
    names = cfg.get(key)
    if not (isinstance(names, list) and names and all(isinstance(x, str) and x for x in names)
            and len(set(names)) == len(names)):
        raise ModelDirError(f"{os.path.join(path, CONFIG)}: {key!r} must be a non-empty list of distinct names, "
                            f"got {str(names)[:200]}")
    return names


def config_int(cfg: dict, key: str, path: str, default: int | None = None) -> int:
    """cfg[key] as a positive integer (`default` when absent or null), or a ModelDirError."""
    v = default if cfg.get(key) is None else cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ModelDirError(f"{os.path.join(path, CONFIG)}: {key!r} must be a positive integer, got {str(v)[:50]}")
    return v


def fill_head(head: nn.Module, state: dict, path: str) -> nn.Module:
    """Load head.safetensors into `head`; tensors that do not fit the config are a ModelDirError."""
    try:
        head.load_state_dict(state)
    except RuntimeError as e:
        raise ModelDirError(f"{path}: head.safetensors does not match {CONFIG} ({str(e).splitlines()[0][:200]})") \
            from None
    return head


def load_model_dir(path: str, task: str, *, native: bool = True) -> tuple[dict, nn.Module, object, dict]:
    """(config, encoder, tokenizer, head tensors) of a spanflow model directory of `task`
    (`native`: see models.encoder.load_encoder)."""
    from spanflow.models.encoder import load_encoder

    cfg = read_model_config(path, task=task)
    encoder, tokenizer = load_encoder(os.path.join(path, "encoder"), native=native)
    return cfg, encoder, tokenizer, load_head_state(path)
