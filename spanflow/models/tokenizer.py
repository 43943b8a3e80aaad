"""A directory's tokenizer.json run by the tokenizers library, without importing transformers.

Inference asks little of a tokenizer: ids with character offsets and word ids, the ids of
[CLS], [SEP] and [PAD], and the longest input. Importing transformers for that costs a
short job about a second; this adapter gives the same encodings (tests/test_bert_native.py
compares them with transformers' tokenizer) for BERT-style directories, and `load`
returns None for anything it does not cover, which then loads through transformers.
"""
from __future__ import annotations

import json
import os

from spanflow.models.files import json_object

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
NO_LIMIT = int(1e30)  # transformers' "no model_max_length" marker
# tokenizer classes whose whole behaviour is their tokenizer.json (the last two: a
# tokenizers pipeline saved as is, as spanflow's own WordPiece for `tiny` is)
CLASSES = ("BertTokenizer", "BertTokenizerFast", "PreTrainedTokenizerFast", "TokenizersBackend")


class Batch(dict):
    """`input_ids` and `offset_mapping` lists, and each text's word ids."""

    def __init__(self, encodings: list, offsets: bool):
        super().__init__(input_ids=[e.ids for e in encodings])
        if offsets:
            self["offset_mapping"] = [e.offsets for e in encodings]
        self._encodings = encodings

    def word_ids(self, i: int) -> list[int | None]:
        return self._encodings[i].word_ids


class FastTokenizer:
    """The subset of a transformers fast tokenizer that spanflow's inference uses."""

    is_fast = True

    def __init__(self, backend, *, special: dict[str, str], model_max_length: int, files: dict[str, bytes]):
        backend.no_truncation()
        backend.no_padding()
        self.backend_tokenizer, self.model_max_length = backend, model_max_length
        self._files = files  # what save_pretrained writes: a loaded tokenizer's files as they were at load
        ids = {k: backend.token_to_id(v) for k, v in special.items()}
        self.cls_token_id, self.sep_token_id, self.pad_token_id = ids["cls_token"], ids["sep_token"], ids["pad_token"]
        self.unk_token_id = ids.get("unk_token")  # None where the vocabulary has no unknown token

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, texts: list[str] | str, *, add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False, **_) -> Batch | dict:
        """A batch of texts, or one text as transformers gives it (lists of that text alone)."""
        if isinstance(texts, str):
            one = self([texts], add_special_tokens=add_special_tokens, return_offsets_mapping=return_offsets_mapping)
            return {k: v[0] for k, v in one.items()}
        return Batch(self.backend_tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens),
                     return_offsets_mapping)

    def save_pretrained(self, path: str) -> None:
        """The source directory's tokenizer files, as they were when it loaded."""
        os.makedirs(path, exist_ok=True)
        for name, data in self._files.items():
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)


def _content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def load(path: str) -> FastTokenizer | None:
    """The directory's BERT-style tokenizer (tokenizer.json with [CLS]/[SEP]/[PAD] known to
    its vocabulary), or None to leave it to transformers."""
    from tokenizers import Tokenizer

    cfg = {**(json_object(os.path.join(path, "special_tokens_map.json")) or {}),
           **(json_object(os.path.join(path, "tokenizer_config.json")) or {})}
    if cfg.get("tokenizer_class") not in CLASSES:
        return None
    special = {k: _content(cfg.get(k)) for k in ("cls_token", "sep_token", "pad_token")}
    if None in special.values() or not os.path.exists(os.path.join(path, "tokenizer.json")):
        return None
    try:
        backend = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    except Exception:  # noqa: BLE001 - tokenizers raises plain Exception; transformers reports it in its own words
        return None
    if any(backend.token_to_id(t) is None for t in special.values()):
        return None
    _bert_settings(backend, cfg)
    if _content(cfg.get("unk_token")):
        special["unk_token"] = _content(cfg.get("unk_token"))
    limit = cfg.get("model_max_length")
    # the source's files as they are now: a model saved later (training saves its best model for
    # minutes or hours) never depends on the source directory still being there
    files = {}
    for name in FILES:
        if os.path.exists(os.path.join(path, name)):
            with open(os.path.join(path, name), "rb") as f:
                files[name] = f.read()
    return FastTokenizer(backend, special=special, files=files,
                         model_max_length=limit if isinstance(limit, int) and limit > 0 else NO_LIMIT)


# tokenizer_config.json's keys for a BERT tokenizer's normalizer, and BertNormalizer's names for them
BERT_KEYS = {"do_lower_case": "lowercase", "strip_accents": "strip_accents",
             "tokenize_chinese_chars": "handle_chinese_chars"}


def _bert_settings(backend, cfg: dict) -> None:
    """A BertTokenizer's normalizer as tokenizer_config.json sets it: transformers builds it from
    do_lower_case, strip_accents and tokenize_chinese_chars there, over what tokenizer.json says
    (a cased model whose config says so, saved with a lowercasing tokenizer.json). Unlike
    transformers, a key the config lacks keeps tokenizer.json's setting rather than the class's
    default (do_lower_case true would lowercase a cased model's text)."""
    from tokenizers import normalizers

    given = {BERT_KEYS[k]: v for k, v in cfg.items()  # strip_accents alone may be null: "as lowercase says"
             if k in BERT_KEYS and (isinstance(v, bool) or (v is None and k == "strip_accents"))}
    if cfg.get("tokenizer_class") not in ("BertTokenizer", "BertTokenizerFast") or not given:
        return
    now = json.loads(backend.to_str()).get("normalizer") or {}
    if now.get("type") != "BertNormalizer":
        return
    settings = {k: now.get(k) for k in ("clean_text", "handle_chinese_chars", "strip_accents", "lowercase")}
    if {**settings, **given} != settings:
        backend.normalizer = normalizers.BertNormalizer(**{**settings, **given})


def from_backend(backend, *, special: dict[str, str], model_max_length: int) -> FastTokenizer:
    """A tokenizer built in this process (`tiny`'s WordPiece: a backend with no truncation or
    padding set), with the files that `load` and transformers' fast tokenizer read back. `special`
    maps cls_token, sep_token, pad_token, unk_token and mask_token to their tokens, which the
    backend's vocabulary holds."""
    backend.add_special_tokens(list(special.values()))  # a literal "[SEP]" in a text is the token, as in transformers
    config = {"backend": "tokenizers", "tokenizer_class": "PreTrainedTokenizerFast", **special,
              "model_max_length": model_max_length}
    files = {"tokenizer.json": backend.to_str().encode(),
             "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True).encode()}
    return FastTokenizer(backend, special=special, files=files, model_max_length=model_max_length)
