"""An encoder directory's files as spanflow's plain-PyTorch encoders read and write them:
config.json as attributes, model.safetensors (transformers' names), optional JSON files."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from safetensors.torch import save_file
from torch import nn

WEIGHTS = "model.safetensors"  # an encoder directory's weights, as transformers names them


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
