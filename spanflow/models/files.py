"""An encoder directory's files as spanflow's plain-PyTorch encoders read and write them:
config.json as attributes, model.safetensors (transformers' names), optional JSON files; and
how a write that meets a full disk is told as the OSError it is."""
from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

WEIGHTS = "model.safetensors"  # an encoder directory's weights, as transformers names them
# what transformers' save_pretrained and a tokenizer's write at the top of a directory
HF_FILES = re.compile(r"config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|"
                      r"tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(txt|json)|"
                      r"merges\.txt|[\w.-]*\.model|chat_template\.jinja")


def json_object(path: str) -> dict | None:
    """A JSON file holding an object, or None when it is missing, unreadable or not an object
    (for optional files whose absence leaves the choice to another loader)."""
    from spanflow.errors import ModelDirError

    try:
        return config_object(path)
    except ModelDirError:
        return None


def config_object(path: str) -> dict:
    """A required JSON file holding an object (a model's config.json or spanflow.json); a
    ModelDirError naming the file, and the line JSON stopped at, otherwise."""
    from spanflow.errors import ModelDirError, quote

    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise ModelDirError(f"{path} is unreadable: {str(e)[:200]}") from None
    if not isinstance(d, dict):
        raise ModelDirError(f"{path}: must be a JSON object, got {quote(d, 60)}")
    return d


class Config(SimpleNamespace):
    """config.json as attributes, the way encoder code reads a transformers config (for
    spanflow's plain-PyTorch encoders)."""

    def to_dict(self) -> dict:
        return dict(vars(self))


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """`tensors` as a safetensors file at `path`.

    Serialised to bytes by safetensors and written here, with Python's own file write, so that a
    full disk (or a quota, or a read-only file system) raises the OSError it is, errno and all;
    safetensors' save_file raises a SafetensorError that carries the errno only in its message.
    The cost is the serialised copy held while it is written: the size of the weights (a few MB
    for `tiny`, 440 MB for a BERT-base in fp32), freed at once, beside a training run that holds
    the weights, their gradients and two optimizer moments already."""
    from safetensors.torch import save

    data = save(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)


def umask() -> int:
    """The process's umask (read by setting it and setting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: str) -> None:
    """Give every file under `root` mode 0666 and every directory 0777, less the umask: what a plain
    open() or mkdir() makes. Libraries that write through a private temporary file (safetensors'
    save_file, which transformers' save_pretrained calls) leave their files 0600."""
    mask = umask()
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o666 & ~mask)


def write_encoder(path: str, module: nn.Module) -> None:
    """config.json (the module's `config.to_dict()`) and model.safetensors: the save_pretrained
    of spanflow's plain-PyTorch encoders, with the tensors it keeps unused (`kept`: a pooler)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(module.config.to_dict(), f, indent=2)
    tensors = {**getattr(module, "kept", {}), **module.state_dict()}
    write_safetensors(os.path.join(path, WEIGHTS), {k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                      metadata={"format": "pt"})
