"""Hugging Face token-classification directories, in and out.

In: a directory written by `AutoModelForTokenClassification.save_pretrained` (config.json with
`id2label` in BIO, IOB1 or BIOES/BILOU, fast tokenizer files beside it) runs as a spanflow
NER model. Its classifier keeps its own label ids; each id is read as the BIO tag it stands
for (S-/U- as B-, E-/L- as I-), which decodes every well-formed sequence of any scheme exactly
(a malformed one, `E-PER E-PER`, reads as one entity where the CoNLL reader finds two). To continue training,
the classifier is carried over onto spanflow's BIO label rows.

Out: `export_hf` writes a directory that `transformers.pipeline("token-classification")` loads.
The words a model labels (tasks.ner.words) go into config.json as `spanflow_words` and
`spanflow_word_split`, which spanflow reads back and the pipeline ignores.
"""
from __future__ import annotations

import json
import logging
import os

from torch import nn

from spanflow.errors import ConfigError, ModelDirError

log = logging.getLogger("spanflow")

# the BIO tag each scheme's prefix stands for
PREFIX_TO_BIO = {"B": "B", "I": "I", "S": "B", "U": "B", "E": "I", "L": "I"}


def token_classification_config(path: str) -> dict | None:
    """config.json of a Hugging Face token-classification directory, or None when it is not one."""
    f = os.path.join(path, "config.json")
    if os.path.exists(os.path.join(path, "spanflow.json")) or not os.path.isfile(f):
        return None
    try:
        with open(f, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None
    archs = cfg.get("architectures") or [] if isinstance(cfg, dict) else []
    return cfg if any(str(a).endswith("ForTokenClassification") for a in archs) else None


def bio_tags(path: str, id2label: dict | None) -> list[str]:
    """The BIO tag of each label id ("O", "B-X", "I-X"), from `id2label` in any of the schemes."""
    if not isinstance(id2label, dict) or not id2label:
        raise ModelDirError(f"{path}/config.json has no id2label: the labels of its classifier are unknown")
    try:
        ids = sorted(id2label, key=int)
    except (TypeError, ValueError):
        raise ModelDirError(f"{path}/config.json: id2label keys must be label ids") from None
    if [int(k) for k in ids] != list(range(len(ids))):  # read by position, a gap would give outputs the wrong names
        raise ModelDirError(f"{path}/config.json: id2label's ids are {', '.join(map(str, ids[:10]))}; they must be "
                            f"0 to {len(ids) - 1}, one per output of the classifier")
    names = [id2label[k] for k in ids]
    tags = []
    for name in names:
        name = str(name)
        prefix, sep, typ = name.partition("-")
        if name == "O":
            tags.append("O")
        elif sep and prefix.upper() in PREFIX_TO_BIO and typ:
            tags.append(f"{PREFIX_TO_BIO[prefix.upper()]}-{typ}")
        else:
            raise ModelDirError(f"{path}/config.json: label {name[:50]!r} is not O or B-/I-/E-/S-/L-/U- plus a type "
                                f"(labels: {', '.join(map(str, names[:8]))}); give id2label in a BIO-like scheme")
    return tags


def load_token_classifier(path: str):
    """(encoder, tokenizer, classifier nn.Linear, BIO tag per label id) from a HF directory."""
    from transformers import AutoModelForTokenClassification

    from spanflow.models.encoder import (
        load_tokenizer,
        quiet_transformers,
        refuse_nan,
        require_safetensors,
        require_special_tokens,
    )
    from spanflow.tasks.ner.tagging import SPECIAL_TOKENS

    quiet_transformers()
    cfg = token_classification_config(path)
    if cfg is None:
        raise ModelDirError(f"{path} is not a Hugging Face token-classification directory (config.json names no "
                            "...ForTokenClassification architecture)")
    tags = bio_tags(path, cfg.get("id2label"))
    tokenizer = load_tokenizer(path)
    require_special_tokens(tokenizer, path, SPECIAL_TOKENS)
    require_safetensors(path)
    outputs = _classifier_outputs(path)
    if outputs is not None and outputs != len(tags):  # said here: transformers refers to a report it never shows
        raise ModelDirError(f"{path}/config.json: id2label names {len(tags)} label{'s' * (len(tags) != 1)}, but the "
                            f"classifier's weights have {outputs} outputs; id2label (and num_labels) must name "
                            "one label per output")
    try:
        full = AutoModelForTokenClassification.from_pretrained(path, local_files_only=True, use_safetensors=True)
    except Exception as e:  # an architecture transformers lacks, truncated weights, ...
        raise ModelDirError(f"{path}: the token-classification model does not load ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None
    refuse_nan(path, full.named_parameters())
    classifier = getattr(full, "classifier", None)
    if not isinstance(classifier, nn.Linear) or classifier.out_features != len(tags):
        raise ModelDirError(f"{path}: expected a linear `classifier` with {len(tags)} outputs on the encoder")
    between = layers_between(full)
    if between:  # run without them, its logits would be another model's
        raise ModelDirError(f"{path}: {type(full).__name__} has layers between its encoder and its classifier "
                            f"({', '.join(between)}), which spanflow does not run; only an encoder and a linear "
                            "classifier load as an NER model")
    return getattr(full, full.base_model_prefix), tokenizer, classifier, tags


def layers_between(full) -> list[str]:
    """The names of a token-classification model's layers with weights other than its encoder and
    its `classifier` (ModernBERT's `head`: a dense layer and a norm before the classifier)."""
    return [name for name, m in full.named_children() if name not in (full.base_model_prefix, "classifier")
            and any(True for _ in m.parameters())]


def _classifier_outputs(path: str) -> int | None:
    """Rows of the classifier's weight in a single model.safetensors (read from its header), or
    None where that file or the weight is not there (sharded weights: transformers checks)."""
    from safetensors import safe_open

    f = os.path.join(path, "model.safetensors")
    if not os.path.isfile(f):
        return None
    try:
        with safe_open(f, framework="pt") as st:
            key = next((k for k in st.keys() if k == "classifier.weight" or k.endswith(".classifier.weight")), None)
            return None if key is None else int(st.get_slice(key).get_shape()[0])
    except Exception:  # an unreadable file: loading it says so
        return None


def bio_rows(tags: list[str], bio: list[str]) -> list[int]:
    """For each BIO label, the label id of the source classifier to copy its row from: the one
    that reads as it, else the other tag of its type (an IOB1 classifier has I-X and no B-X: its
    I-X row starts entities, as B-X does)."""
    rows = []
    for t in bio:
        other = {"B": "I", "I": "B"}.get(t[:1], "") + t[1:] if t != "O" else t
        same = [i for i, s in enumerate(tags) if s == t] or [i for i, s in enumerate(tags) if s == other]
        if not same:
            raise ConfigError(f"the model has no label that reads as {t}")
        rows.append(same[0])
    return rows


def select_rows(linear: nn.Linear, rows: list[int]) -> nn.Linear:
    """A linear layer with the given output rows of `linear`, in that order."""
    out = nn.Linear(linear.in_features, len(rows))
    out.weight.data.copy_(linear.weight.data[rows])
    out.bias.data.copy_(linear.bias.data[rows])
    return out


def export_hf(model, out: str, *, lossy: bool = False, log_fn=print) -> str:
    """Write `model` (a NerModel on a Hugging Face encoder) as an AutoModelForTokenClassification
    directory. A CRF head is refused unless `lossy`: its emission scores alone, decoded token by
    token, tag far more entities than its Viterbi decoding does (docs/ner.md)."""
    import torch
    from transformers import AutoModelForTokenClassification

    from spanflow.models.directory import write_aside
    from spanflow.models.encoder import is_tiny, quiet_transformers

    encoder = model.module.encoder
    if is_tiny(encoder):
        raise ConfigError("a `tiny` model has no Hugging Face architecture to export to; train on a Hugging Face "
                          "encoder (--model DIR) to export")
    if model.head_type == "crf":
        if not lossy:
            raise ConfigError("this model has a CRF head, whose transition scores a token-classification model "
                              "cannot hold: decoded by its emission scores alone it tags other entities than "
                              "spanflow does. Train with --head softmax to export it whole, or pass --lossy to "
                              "export the emission scores anyway")
        log_fn("warning: the CRF's transition scores are left out; the export decodes each token by its own "
               "emission scores (argmax), so its entities differ from spanflow's Viterbi decoding")
    cfg = hf_config(encoder.config)
    cfg.id2label = dict(enumerate(model.id2label))
    cfg.label2id = {t: i for i, t in enumerate(model.id2label)}
    # kept for spanflow, which reads the directory back with the same words (and knows it for its own
    # export, which a later export may replace); the pipeline ignores it
    for key in [k for k in cfg.to_dict() if k.startswith("spanflow_")]:  # an earlier export's, carried through
        delattr(cfg, key)
    cfg.spanflow_words, cfg.spanflow_word_split = model.words, model.word_split
    # and how it reads text, so that spanflow runs the export as it ran the model
    cfg.spanflow_max_length, cfg.spanflow_stride, cfg.spanflow_lines = model.max_length, model.stride, model.lines
    if model.word_edges:
        cfg.spanflow_word_edges = model.word_edges
    if model.head_type == "crf":
        cfg.spanflow_lossy_crf = True  # said again when spanflow runs the export
    if model.words == "whitespace":
        log_fn("note: this model labels whitespace-separated words; transformers' pipeline starts a word at every "
               "word of its tokenizer (after each punctuation mark inside a word too: `Berners-Lee`, a URL), so its "
               "entities can start or end inside a whitespace token; spanflow reads this directory back with the "
               "model's words (docs/ner.md)")
    quiet_transformers()  # no progress bar of its writing shards among the command's lines
    full = AutoModelForTokenClassification.from_config(cfg)
    between = layers_between(full)
    if between:  # they would be written with random weights, and the export run through them
        raise ConfigError(f"{type(full).__name__} has layers between its encoder and its classifier "
                          f"({', '.join(between)}) that this model has no weights for; it cannot be exported to it")
    missing, _ = getattr(full, full.base_model_prefix).load_state_dict(encoder.state_dict(), strict=False)
    if missing:
        raise ConfigError(f"the encoder's weights do not fill {type(full).__name__}: missing {missing[:3]}")
    with torch.no_grad():
        full.classifier.weight.copy_(model.module.head.proj.weight)
        full.classifier.bias.copy_(model.module.head.proj.bias)
    with write_aside(out, "export") as tmp:  # files get the umask's modes, a full disk names `out`
        full.save_pretrained(tmp, safe_serialization=True)
        model.tokenizer.save_pretrained(tmp)
    return out


def hf_config(config):
    """A transformers config of the encoder's own, or one built from a native encoder's."""
    import copy

    from transformers import AutoConfig

    if hasattr(config, "to_diff_dict"):  # already a transformers config
        return copy.deepcopy(config)
    d = config.to_dict()
    return AutoConfig.for_model(d.pop("model_type"), **d)
