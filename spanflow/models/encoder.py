"""Load a local Hugging Face encoder directory, or build `tiny` from scratch.

Only local paths are read: spanflow never fetches weights from a hub.
"""
from __future__ import annotations

import functools
import logging
import json
import os

import torch
from torch import nn

from spanflow.atomic import found_dir
from spanflow.errors import ModelDirError
from spanflow.models.files import config_object

log = logging.getLogger("spanflow")


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def keeps_rng(load):
    """`load`, leaving the caller's random state as it was: building a model draws initial weights
    from torch's generator before the saved ones replace them, and a seeded script would draw
    other numbers after a load than without it."""
    @functools.wraps(load)
    def wrapped(*args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            return load(*args, **kwargs)
    return wrapped


def load_encoder(path: str, *, native: bool = True) -> tuple[nn.Module, object]:
    """(encoder, fast tokenizer) from a local HF or sentence-transformers directory.

    `native`: a BERT encoder and its tokenizer run as models.bert.NativeBert and
    models.tokenizer.FastTokenizer, which start without importing transformers and train
    without a device sync per forward; False: transformers' own classes.
    """
    if not found_dir(path):
        raise ModelDirError(missing_dir(path))
    if not os.path.exists(os.path.join(path, "config.json")):
        raise ModelDirError(not_an_encoder(path))
    config_object(os.path.join(path, "config.json"))  # a broken config is said as one, not as unreadable weights
    require_safetensors(path)
    try:
        from spanflow.models import tokenizer as native_tokenizer
        from spanflow.models.bert import load_native
        from spanflow.models.tiny import is_tiny_dir, load_tiny

        # tiny is plain PyTorch for training and inference alike
        encoder = load_tiny(path) if is_tiny_dir(path) else load_native(path) if native else None
        tokenizer = (native_tokenizer.load(path) if native else None) or load_tokenizer(path)
        encoder = _load_weights(path) if encoder is None else encoder
        refuse_nan(path, encoder.named_parameters())
        return encoder, tokenizer
    except ModelDirError:
        raise
    except Exception as e:  # truncated safetensors, a config without a usable architecture, ...
        raise ModelDirError(f"{path}: the encoder weights are unreadable (truncated or corrupt?): "
                            f"{type(e).__name__}: {str(e)[:200]}") from None


def refuse_nan(path: str, tensors) -> None:
    """A ModelDirError naming the first of the (name, tensor) pairs that holds NaN: a model saved
    from a diverged training (or damaged), whose every output would be NaN or empty, unsaid."""
    import torch

    named = [(name, t) for name, t in tensors if t.is_floating_point()]
    if not named:
        return
    flags = torch.stack([torch.isnan(t).any() for _, t in named])
    if flags.any():  # one host sync for the whole model, not one a tensor
        name = named[int(flags.nonzero()[0])][0]
        raise ModelDirError(f"{path}: its weight {name} holds NaN values: saved from a training that diverged, or "
                            "damaged; train it again (a lower --lr), or use an earlier copy")


def holds_model(path: str) -> bool:
    """A spanflow model (spanflow.json) or an encoder (config.json, or a sentence-transformers modules.json)."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("spanflow.json", "config.json", "modules.json"))


def _unsaved(out: str) -> str | None:
    """Why a training --out folder has no OUT/model yet, and where its last checkpoint's model is."""
    last = os.path.join(out, "checkpoint", "model")
    if not (os.path.isdir(last) and holds_model(last)):
        return None
    return (f"the run in {out} has not saved a model yet, as it stopped early or is still running; its last "
            f"checkpoint's model is {last}, and 'spanflow train ... --out {out} --resume' finishes the run")


def run_hint(out: str) -> str | None:
    """What to load from `out` when it is a training --out folder, or None when it is not one."""
    best = os.path.join(out, "model")
    run_best = os.path.join(os.path.dirname(os.path.normpath(out)), "model")
    if os.path.basename(os.path.normpath(out)) == "checkpoint" and os.path.isdir(run_best) and holds_model(run_best):
        return (f"{out} is a training run's checkpoint, not a model directory: did you mean the run's model, "
                f"{run_best}? (the checkpoint's last weights are {best})")
    if os.path.isdir(best) and holds_model(best):
        return f"{out} is a training output folder, not a model directory: did you mean {best}?"
    unsaved = _unsaved(out)
    return f"{out} is a training output folder, not a model directory; {unsaved}" if unsaved else None


def missing_dir(path: str) -> str:
    """The message for a model directory that is not there (OUT/model of a run that has not saved one says so)."""
    if os.path.isfile(path):
        return not_a_model(path)
    path_ = os.path.normpath(path)
    unsaved = _unsaved(os.path.dirname(path_) or ".") if os.path.basename(path_) == "model" else None
    if path.startswith("~") and os.path.exists(os.path.expanduser(path)):  # --model=~/m: no shell expands it
        return f"model directory not found: {path} (a ~ is not expanded here: give {os.path.expanduser(path)})"
    return f"model directory not found: {path}" + (f"; {unsaved}" if unsaved else _tiny_hint(path))


def _tiny_hint(path: str) -> str:
    """A hint where a missing `path` is, or looks like a slip for, the name 'tiny'."""
    import difflib

    if path == "tiny":  # here only where no training starts
        return "; 'tiny' names an encoder built from scratch when training starts: this needs a trained model directory"
    if os.sep not in path and difflib.get_close_matches(path.lower(), ["tiny"], n=1, cutoff=0.75):
        return "; did you mean 'tiny' (an encoder built from scratch, for training)?"
    return ""


def not_a_model(path: str) -> str:
    """The message for an existing `path` that holds neither a spanflow model nor an encoder."""
    if os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        return f"{path} is a file; a model is a directory" + (f": did you mean {folder}?" if holds_model(folder)
                                                               else "")
    return run_hint(path) or (f"{path} is not a model directory: it has no spanflow.json (a spanflow model) and no "
                               "config.json (a Hugging Face or sentence-transformers encoder)")


def not_an_encoder(path: str) -> str:
    """The message for a directory without config.json, where an encoder directory was needed."""
    if os.path.isfile(os.path.join(path, "spanflow.json")):
        return (f"{path} is a spanflow {_task_in(path)} model, not an encoder directory; its encoder is "
                f"{os.path.join(path, 'encoder')}")
    return run_hint(path) or (f"{path} has no config.json: not a Hugging Face encoder directory (use a local "
                               "encoder directory or a spanflow model directory; 'tiny', a new encoder, only where "
                               "training starts)")


def _task_in(path: str) -> str:
    """The task spanflow.json names, for a message (the loaders check the file itself)."""
    import json

    try:
        with open(os.path.join(path, "spanflow.json"), encoding="utf-8") as f:
            task = json.load(f).get("task")
    except (OSError, ValueError, AttributeError):
        return "(unreadable spanflow.json)"
    return task if isinstance(task, str) else "(no task named)"


def _load_weights(path: str) -> nn.Module:
    quiet_transformers()
    from transformers import AutoModel

    kwargs = dict(local_files_only=True, attn_implementation="sdpa", use_safetensors=True)
    try:
        return _from_pretrained(AutoModel, path, kwargs)
    except ValueError as e:  # an architecture without fused attention (DeBERTa-v2/v3): its own attention
        if "attention implementation" not in str(e) and "attn_implementation" not in str(e):
            raise
        kwargs.pop("attn_implementation")
        return _from_pretrained(AutoModel, path, kwargs)


def _from_pretrained(auto, path: str, kwargs: dict) -> nn.Module:
    # the pooler is unused by token-level heads and mean pooling: left out, or where the checkpoint
    # holds one, kept frozen (DDP and the optimizer skip it), so a save writes it back and the next
    # library to load the directory (sentence-transformers) finds no weight missing
    pooler = _has_pooler(path)
    try:
        model = auto.from_pretrained(path, add_pooling_layer=pooler, **kwargs)
    except TypeError:
        return auto.from_pretrained(path, **kwargs)
    if getattr(model, "pooler", None) is not None:
        model.pooler.requires_grad_(False)
    return model


def _has_pooler(path: str) -> bool:
    """Whether the directory's safetensors weights hold a pooler (read from their headers only)."""
    from safetensors import SafetensorError, safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    try:
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                names = list(json.load(f).get("weight_map", {}))
        else:
            with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
                names = list(f.keys())
    except (OSError, ValueError, AttributeError, SafetensorError):  # missing or damaged: the load says which
        return False
    return any(n.startswith("pooler.") or ".pooler." in n for n in names)


# a tokenizer's vocabulary: without one of these, transformers builds a tokenizer of a few special
# tokens that reads every word as [UNK], and a model runs on it without a word
# (a SentencePiece model is any `*.model`: spiece.model, spm.model, sentencepiece.bpe.model)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


def load_tokenizer(path: str):
    """The fast tokenizer of a local directory (character offsets need one)."""
    if os.path.isdir(path) and not any(n in TOKENIZER_FILES or n.endswith(".model") for n in os.listdir(path)):
        raise ModelDirError(f"{path}: no tokenizer files (tokenizer.json, or vocab.txt and its config): save the "
                            "tokenizer beside the weights (tokenizer.save_pretrained(path)) or copy its files from "
                            "the model it was trained from")
    quiet_transformers()
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # a truncated tokenizer.json fails deep in tokenizers with its own error types
        raise ModelDirError(f"{path}: the tokenizer files are unreadable (truncated or corrupt?): "
                            f"{type(e).__name__}: {str(e)[:200]}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelDirError(f"{path}: a fast tokenizer (tokenizer.json) is needed for character offsets; this one "
                            "is slow-only")
    return tokenizer


def require_special_tokens(tokenizer, path: str, names: tuple[str, ...]) -> None:
    """A ModelDirError where `tokenizer` lacks one of the special tokens `names` a task builds its
    inputs with (a directory without tokenizer_config.json loads tokenizer.json's vocabulary only)."""
    missing = [name.upper() for name in names if getattr(tokenizer, f"{name}_token_id", None) is None]
    if missing:
        names = " or ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
        raise ModelDirError(f"{path}: its tokenizer names no {names} token, which "
                            "every model input starts, ends or is padded with (tokenizer_config.json and "
                            "special_tokens_map.json name them: missing or incomplete?)")


def require_safetensors(path: str) -> None:
    """Weights load from safetensors only: a pickle (pytorch_model.bin) can run code when loaded."""
    if any(f.endswith(".safetensors") for f in os.listdir(path)):
        return
    pickles = [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    if pickles:
        cls = architecture(path)  # its own class: AutoModel would save the encoder alone, without a classifier
        raise ModelDirError(
            f"{path} holds its weights only as {pickles[0]} (a pickle, which spanflow does not load: it can run "
            f"code). Convert it once, where you trust the file: python -c \"from transformers import {cls}; "
            f"{cls}.from_pretrained('{path}').save_pretrained('{path}', safe_serialization=True)\"")
    raise ModelDirError(f"{path} has no model.safetensors")


# classifiers from elsewhere whose outputs no task here runs: their encoder's pooled vectors are no
# sentence embeddings (a cross-encoder's least of all), though training may start from that encoder
SEQUENCE_HEADS = ("ForSequenceClassification", "ForMultipleChoice", "ForQuestionAnswering")


def sequence_classifier(path: str) -> str | None:
    """Why `path` is refused where a model runs, for a classifier of whole texts or pairs from
    elsewhere (config.json's architecture); None for any other directory."""
    head = architecture(path)
    if not head.endswith(SEQUENCE_HEADS):
        return None
    return (f"{path} is a {head} (its config.json says so): a classifier of whole texts or text pairs, such as a "
            "cross-encoder, which spanflow does not run, and its encoder's pooled vectors are no sentence "
            f"embeddings; training can start from its encoder ('spanflow train ner|re|embed --model {path}')")


def architecture(path: str) -> str:
    """The transformers class config.json names (`architectures`), else AutoModel."""
    try:
        archs = config_object(os.path.join(path, "config.json")).get("architectures") or []
    except ModelDirError:  # no config to read: the advice names the generic class
        archs = []
    name = archs[0] if archs and isinstance(archs[0], str) else ""
    return name if name.isidentifier() else "AutoModel"


# model types whose position ids count from padding_idx + 1 (transformers' create_position_ids_from_input_ids)
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer", "data2vec-text",
                           "roberta-prelayernorm", "xlm-roberta-xl", "ibert", "luke", "xmod")


def encoder_max_length(encoder: nn.Module, tokenizer) -> int:
    """Longest input the encoder accepts, special tokens included."""
    cfg = encoder.config
    n = getattr(cfg, "max_position_embeddings", 512)
    if getattr(cfg, "model_type", "") in POSITIONS_AFTER_PADDING:
        pad = getattr(cfg, "pad_token_id", None)
        n -= (pad if isinstance(pad, int) else 1) + 1  # the first padding_idx + 1 positions are never used
    tok_max = getattr(tokenizer, "model_max_length", n) or n
    return int(min(n, tok_max))


WORDPIECE_SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                     "mask_token": "[MASK]"}


def train_wordpiece(texts: list[str], vocab_size: int = 4000):
    """`wordpiece`'s tokenizer as a transformers fast tokenizer (to save with a transformers model)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=_wordpiece_backend(texts, vocab_size), model_max_length=512,
                                   **WORDPIECE_SPECIAL)


def wordpiece(texts: list[str], vocab_size: int = 4000):
    """A BERT-style WordPiece tokenizer fitted to `texts` (models.tokenizer's, without transformers).

    The vocabulary is every character seen (as a word start and as a ##continuation, so
    no seen text maps to [UNK]) plus the most frequent words, ties broken alphabetically.
    It is built here rather than by the library's trainer because that trainer's
    vocabulary differs from run to run, and a resumed or repeated run must rebuild the
    very same tokenizer. It encodes as `train_wordpiece`'s does (tests/test_tiny.py).
    """
    from spanflow.models.tokenizer import from_backend

    return from_backend(_wordpiece_backend(texts, vocab_size), special=dict(WORDPIECE_SPECIAL), model_max_length=512)


def _wordpiece_backend(texts: list[str], vocab_size: int):
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = list(WORDPIECE_SPECIAL.values())
    normalizer = normalizers.BertNormalizer(lowercase=False, handle_chinese_chars=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words: Counter = Counter()
    for t in texts:
        words.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(t)))
    chars = sorted({c for w in words for c in w})
    vocab = specials + chars + ["##" + c for c in chars]
    seen = set(vocab)
    for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=200))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def build_tiny(texts: list[str], *, vocab_size: int = 4000, hidden: int = 256, embedding: int = 128,
               layers: int = 1, bigram_buckets: int | None = None, max_length: int = 512,
               seed: int = 0) -> tuple[nn.Module, object]:
    """A small from-scratch encoder (models/tiny.py) and a WordPiece tokenizer trained on the texts.

    `bigram_buckets` None sizes the bigram table to four times the distinct token bigrams of the
    texts (at most 100003): a table far larger than the data only adds memory.
    """
    from spanflow.models.tiny import TinyModel, tiny_config

    tokenizer = wordpiece(texts, vocab_size)  # without importing transformers: a short run's start
    if bigram_buckets is None:
        bigram_buckets = min(100_003, max(1009, 4 * _distinct_bigrams(tokenizer, texts)))
    cfg = tiny_config(vocab_size=len(tokenizer), embedding_size=embedding, hidden_size=hidden,
                      num_hidden_layers=layers, bigram_buckets=bigram_buckets, pad_token_id=tokenizer.pad_token_id,
                      max_position_embeddings=max_length)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        encoder = TinyModel(cfg)
    return encoder, tokenizer


def _distinct_bigrams(tokenizer, texts: list[str]) -> int:
    ids = tokenizer(list(texts), add_special_tokens=True, return_attention_mask=False)["input_ids"] if texts else []
    return len({pair for row in ids for pair in zip(row, row[1:])})


def start_encoder(source: str, texts: list[str], *, max_length: int | None, seed: int = 0) -> tuple[nn.Module, object, int]:
    """(encoder, tokenizer, max length) to train from: `tiny` built on `texts`, or a local HF directory."""
    if source == "tiny":
        encoder, tokenizer = build_tiny(texts, seed=seed, max_length=max(max_length or 512, 16))
    else:
        encoder, tokenizer = load_encoder(source)
    return encoder, tokenizer, window_limit(source, encoder, tokenizer, max_length)


def window_limit(source: str, encoder: nn.Module, tokenizer, max_length: int | None,
                 trained: int | None = None) -> int:
    """The longest window to train on: `max_length` where given (a ConfigError above what the
    encoder reads), else the length a continued model was trained at, else the encoder's limit."""
    limit = encoder_max_length(encoder, tokenizer)
    if max_length is not None and max_length > limit:  # it was cut to the limit without a word
        from spanflow.errors import ConfigError

        raise ConfigError(f"--max-length {max_length} is above what {source} reads: {limit} tokens (its limit, "
                          "from its config and tokenizer); give at most that, or leave --max-length unset (the model's own "
                          "length where it has one, else this limit)")
    return min(max_length or trained or limit, limit)


def is_tiny(encoder: nn.Module) -> bool:
    """True for the from-scratch `tiny` encoder (continued or new), which trains with its own defaults."""
    from spanflow.models.tiny import MODEL_TYPE

    return getattr(encoder.config, "model_type", None) == MODEL_TYPE


def enable_checkpointing(encoder: nn.Module) -> None:
    """Recompute each layer's activations in backward instead of keeping them (HF encoders, NativeBert)."""
    from spanflow.errors import ConfigError

    if not getattr(encoder, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{type(encoder).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}  # non-reentrant: works under DDP and with inputs that need no grad
    if hasattr(encoder, "activation_checkpointing_enable"):  # transformers >= 5
        encoder.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_checkpointing(encoder: nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in encoder.modules())
