"""Read a sentence-transformers directory layout: modules.json, pooling config, max length."""
from __future__ import annotations

import json
import os

from spanflow.errors import ModelDirError

_POOL_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
              "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "lasttoken"}


def _json(path: str) -> dict | list:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{path} is unreadable: {e}") from None


def read_embedding_config(path: str) -> dict:
    """{"encoder_dir", "pooling", "normalize", "max_seq_length"} for an ST or plain HF directory.

    A plain Hugging Face encoder gets mean pooling, no normalisation and its own max length.
    """
    if not os.path.isdir(path):
        raise ModelDirError(f"model directory not found: {path}")
    modules_file = os.path.join(path, "modules.json")
    if not os.path.exists(modules_file):
        return {"encoder_dir": path, "pooling": "mean", "normalize": False, "max_seq_length": None}
    cfg = {"encoder_dir": path, "pooling": "mean", "normalize": False, "max_seq_length": None}
    for mod in _json(modules_file):
        kind = mod.get("type", "").rsplit(".", 1)[-1]
        mod_dir = os.path.join(path, mod.get("path", ""))
        if kind == "Transformer":
            cfg["encoder_dir"] = mod_dir
            sb = os.path.join(mod_dir, "sentence_bert_config.json")
            if os.path.exists(sb):
                cfg["max_seq_length"] = _json(sb).get("max_seq_length")
        elif kind == "Pooling":
            pc = _json(os.path.join(mod_dir, "config.json"))
            modes = [name for key, name in _POOL_KEYS.items() if pc.get(key)]
            if pc.get("pooling_mode_mean_sqrt_len_tokens") or len(modes) != 1:
                raise ModelDirError(f"{mod_dir}: only one of mean, cls, max or last-token pooling is supported")
            cfg["pooling"] = modes[0]
        elif kind == "Normalize":
            cfg["normalize"] = True
        else:
            raise ModelDirError(f"{path}: module type {mod.get('type')!r} is not supported "
                                "(supported: Transformer, Pooling, Normalize)")
    return cfg
