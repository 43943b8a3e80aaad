"""Read a sentence-transformers directory layout: modules.json, pooling config, max length."""
from __future__ import annotations

import json
import os

from spanflow.atomic import found_dir
from spanflow.errors import ModelDirError
from spanflow.models.encoder import architecture, sequence_classifier

_POOL_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
              "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "lasttoken"}


def _json(path: str) -> dict | list:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{path} is unreadable: {e}") from None


def read_embedding_config(path: str, *, start: bool = False) -> dict:
    """{"encoder_dir", "pooling", "normalize", "max_seq_length", "lowercase"} for an ST or plain HF directory.

    A plain Hugging Face encoder gets mean pooling, no normalisation and its own max length; a
    classifier from elsewhere is refused, unless training `start`s from its encoder.
    """
    if not found_dir(path):
        from spanflow.models.encoder import missing_dir

        raise ModelDirError(missing_dir(path))  # a file, or OUT/model of a run that has saved none yet
    modules_file = os.path.join(path, "modules.json")
    cfg = {"encoder_dir": path, "pooling": "mean", "normalize": False, "max_seq_length": None, "lowercase": False}
    if not start:  # the API's checks; the commands refuse these before any load
        refused = sequence_classifier(path)  # as the commands refuse it, a modules.json beside it or not
        if refused:
            raise ModelDirError(refused)
        head = architecture(path)
        if head.endswith("ForTokenClassification") and not os.path.exists(modules_file):
            raise ModelDirError(f"{path} is a {head}, an NER model (NerModel.load runs it): its encoder's pooled "
                                "vectors ignore its classifier; embeddings come from an encoder or "
                                "sentence-transformers directory")
    if not os.path.exists(modules_file):
        return cfg
    modules = _json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelDirError(f"{modules_file}: expected a list of module objects ({{\"type\": ..., \"path\": ...}})")
    _no_default_prompt(path)
    for mod in modules:
        kind = str(mod.get("type", "")).rsplit(".", 1)[-1]
        mod_dir = os.path.join(path, str(mod.get("path", "")))
        if kind == "Transformer":
            cfg["encoder_dir"] = mod_dir
            sb = os.path.join(mod_dir, "sentence_bert_config.json")
            if os.path.exists(sb):
                sbc = _json(sb)
                sbc = sbc if isinstance(sbc, dict) else {}
                cfg["max_seq_length"] = _max_length(sbc.get("max_seq_length"), sb)
                cfg["lowercase"] = sbc.get("do_lower_case") is True  # the texts lowercased before tokenizing
            tok = os.path.join(mod_dir, "tokenizer_config.json")
            if cfg["max_seq_length"] is None and os.path.exists(tok):  # sentence-transformers 6 keeps it there
                limit = _json(tok).get("model_max_length")
                cfg["max_seq_length"] = limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None
        elif kind == "Pooling":
            pc = _json(os.path.join(mod_dir, "config.json"))
            if "pooling_mode" in pc:  # sentence-transformers 6 names the one mode (a list of one too)
                mode = pc["pooling_mode"]
                mode = mode[0] if isinstance(mode, list) and len(mode) == 1 else mode
                modes = [mode] if isinstance(mode, str) and mode in _POOL_KEYS.values() else []
                asked = repr(mode)
            else:  # earlier ones set a flag for each
                modes = [name for key, name in _POOL_KEYS.items() if pc.get(key)]
                modes += [name for name in ("mean_sqrt_len_tokens", "weightedmean_tokens")
                          if pc.get(f"pooling_mode_{name}")]
                asked = " and ".join(modes) or "no mode"
            if len(modes) != 1 or modes[0] not in _POOL_KEYS.values():
                raise ModelDirError(f"{mod_dir}: pooling {asked}; spanflow pools one of mean, cls, max or lasttoken")
            cfg["pooling"] = modes[0]
        elif kind == "Normalize":
            cfg["normalize"] = True
        else:
            raise ModelDirError(f"{path}: module type {mod.get('type')!r} is not supported "
                                "(supported: Transformer, Pooling, Normalize)")
    if not any(str(m.get("type", "")).endswith("Pooling") for m in modules):  # sentence-transformers refuses it too
        raise ModelDirError(f"{modules_file} names no Pooling module: how token vectors become one is not said")
    return cfg


def _max_length(value, path: str) -> int | None:
    """sentence_bert_config.json's max_seq_length: a positive whole number, or none given."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelDirError(f"{path}: max_seq_length must be a positive whole number, got {value!r}")
    return value


def _no_default_prompt(path: str) -> None:
    """A ModelDirError where config_sentence_transformers.json names a default prompt, which
    sentence-transformers puts before every text and spanflow does not: its vectors would differ."""
    f = os.path.join(path, "config_sentence_transformers.json")
    cfg = _json(f) if os.path.exists(f) else {}
    name = cfg.get("default_prompt_name") if isinstance(cfg, dict) else None
    if name:
        prompt = (cfg.get("prompts") or {}).get(name) if isinstance(cfg.get("prompts"), dict) else None
        raise ModelDirError(f"{f}: default_prompt_name {name!r} puts {prompt!r} before every text in "
                            "sentence-transformers, which spanflow does not do: remove default_prompt_name and put "
                            "the prompt in your texts")


def write_embedding_dir(path: str, *, encoder, tokenizer, pooling: str, normalize: bool, max_length: int,
                        lowercase: bool = False) -> None:
    """A sentence-transformers directory (Transformer at the top, Pooling, optional Normalize) that
    sentence-transformers and spanflow load alike; written aside and renamed into place, a full
    disk told as a WriteError naming `path` (models.directory.write_aside)."""
    from spanflow.models.directory import write_aside

    with write_aside(path) as tmp:
        encoder.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
            os.makedirs(os.path.join(tmp, "2_Normalize"))
        os.makedirs(os.path.join(tmp, "1_Pooling"))
        pool = {"word_embedding_dimension": encoder.config.hidden_size, "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False, **{k: v == pooling for k, v in _POOL_KEYS.items()}}
        for name, obj in (("modules.json", modules), ("sentence_bert_config.json",
                          {"max_seq_length": max_length, "do_lower_case": lowercase}),
                          (os.path.join("1_Pooling", "config.json"), pool)):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=2)
