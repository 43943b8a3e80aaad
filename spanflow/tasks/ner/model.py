"""NerModel: an encoder with a tagging head; load, predict, evaluate, save."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from spanflow.batching.align import (
    check_window,
    encode_texts,
    merge_windows,
    windows_for,
)
from spanflow.batching.collate import SERVE_PAD_MULTIPLE
from spanflow.batching.prefetch import chunked
from spanflow.data.examples import NerExample, Span, check_examples
from spanflow.errors import ConfigError, ModelDirError, as_path
from spanflow.models.directory import (
    check_names,
    config_count,
    config_int,
    fill_head,
    load_model_dir,
    save_model_dir,
)
from spanflow.models.encoder import encoder_max_length, keeps_rng
from spanflow.runtime.budget import infer_tokens
from spanflow.runtime.precision import load_auto
from spanflow.tasks.metrics import format_table, span_prf, with_unknown, with_warning
from spanflow.tasks.ner.bio import bio_labels, decode_spans
from spanflow.tasks.ner.features import bio_label_list, moved_spans
from spanflow.tasks.ner.heads import HEAD_TYPES, EncoderWithHead, make_tagging_head
from spanflow.tasks.ner.hf import (
    bio_rows,
    load_token_classifier,
    select_rows,
    token_classification_config,
)
from spanflow.tasks.inputs import check_max_tokens, text_list, text_stream
from spanflow.tasks.ner.tagging import SPECIAL_TOKENS, paired, tag_texts, tag_windows, text_words, word_starts
from spanflow.tasks.ner.words import PUNCTUATION, TOKENIZER, config_split, config_words, splitter, valid_edges
from spanflow.tasks.registry import autocast_twin, get as get_task
from spanflow.training.distributed import Dist, shard_gather
from spanflow.runtime.policy import Policy, resolve_policy

if TYPE_CHECKING:
    import pyarrow as pa


log = logging.getLogger("spanflow")
DEFAULT_STRIDE = 32  # tokens shared by neighbouring windows of a long text
CHECK_CHUNK = 4096  # examples evaluate's span check tokenizes at a time


class NerModel:
    """An encoder with a token-tagging head (softmax or CRF), its tokenizer and label set."""

    task = "ner"

    def __init__(self, *, encoder, tokenizer, labels: list[str], limit: int, stride: int = DEFAULT_STRIDE,
                 head=None, head_type: str = "softmax", policy: Policy | None = None, max_length: int | None = None,
                 id2label: list[str] | None = None, lines: bool = True, words: str = TOKENIZER,
                 word_edges: dict | None = None, word_split: str = PUNCTUATION):
        self.tokenizer = tokenizer
        self.labels = sorted(labels)
        # the BIO tag of each output of the head: spanflow's own order, or an imported classifier's
        self.id2label = list(id2label) if id2label else bio_label_list(self.labels)
        # limit: the longest window training may cut (the encoder's limit or --max-length);
        # max_length: the window inference reads, as long as the longest training window rather
        # than the limit, so long documents are read in pieces of the length the model learned from
        self.limit, self.stride, self.head_type = limit, stride, head_type
        self.max_length = min(max_length or limit, limit)
        # a model trained on single-line texts reads each line of an input on its own
        self.lines = lines
        # how plain text is cut into the words labels sit on (tasks.ner.words): the training data's own
        # kind of tokens when they came as whitespace-separated tokens, else the tokenizer's words
        self.words = words
        self.word_edges = word_edges  # whitespace words: the punctuation cut off their ends (words.edge_rules)
        self.word_split = word_split  # tokenizer words: cut at ideographs, and at punctuation or not (words.SPLITS)
        head = head or make_tagging_head(head_type, hidden_size=encoder.config.hidden_size, id2label=self.id2label)
        self.module = EncoderWithHead(encoder, head)
        self.policy = policy or resolve_policy()
        self.module.to(self.policy.device).eval()  # inference mode until a training loop says otherwise

    @classmethod
    @keeps_rng
    def load(cls, path: str, *, device: str = "auto", precision: str = "auto") -> "NerModel":
        """Load a spanflow NER model directory, or a Hugging Face token-classification directory
        (no network, no pickle). precision "auto" picks what `--precision auto` picks
        (runtime.precision.load_auto); "fp32" skips the check."""
        path = as_path(path, "NerModel.load")
        if precision == "auto":
            return load_auto(get_task(cls.task), path, device=device)
        if token_classification_config(path) is not None:
            return cls.from_hf(path, device=device, precision=precision)
        cfg, encoder, tokenizer, head_state = load_model_dir(path, "ner", SPECIAL_TOKENS)
        labels, head_type = check_names(cfg, "labels", path), cfg.get("head", "softmax")
        if head_type not in HEAD_TYPES:
            raise ModelDirError(f"{path}: unknown head {str(head_type)[:50]!r}; this spanflow knows "
                                f"{', '.join(HEAD_TYPES)}")
        id2label = _id2label(cfg, labels, path)
        head = make_tagging_head(head_type, hidden_size=encoder.config.hidden_size, id2label=id2label)
        # format 1 had no "limit": its "max_length" was the limit, "window" (when present) the length read
        old = "limit" not in cfg
        limit = config_int(cfg, "max_length" if old else "limit", path)
        return cls(encoder=encoder, tokenizer=tokenizer, labels=labels, limit=limit,
                   stride=config_count(cfg, "stride", path, DEFAULT_STRIDE), head=fill_head(head, head_state, path),
                   head_type=head_type, policy=resolve_policy(precision, device),
                   max_length=config_int(cfg, "window" if old else "max_length", path, limit), id2label=id2label,
                   lines=_flag(cfg, "lines", path, True), words=config_words(cfg, path),
                   word_edges=_edges(cfg.get("word_edges"), path, "word_edges in spanflow.json"),
                   word_split=config_split(cfg.get("word_split"), path, "word_split in spanflow.json"))

    @classmethod
    @keeps_rng
    def from_hf(cls, path: str, *, device: str = "auto", precision: str = "auto", bio: bool = False) -> "NerModel":
        """A Hugging Face AutoModelForTokenClassification directory as a softmax NER model: its own
        label ids (any BIO-like scheme) for inference, or, with `bio`, its classifier carried over
        onto spanflow's BIO label rows (to continue training)."""
        path = as_path(path, "from_hf")
        encoder, tokenizer, classifier, tags = load_token_classifier(path)
        hf = token_classification_config(path)  # a spanflow export's spanflow_ keys: how the model read text
        words = config_words({"words": hf.get("spanflow_words")}, path)
        edges = _edges(hf.get("spanflow_word_edges"), path, "spanflow_word_edges in config.json")
        # a spanflow export without the key reads text as the model it came from did; another
        # classifier's words are cut as spanflow cuts them now
        split = hf.get("spanflow_word_split", None if "spanflow_words" in hf else PUNCTUATION)
        split = config_split(split, path, "spanflow_word_split in config.json")
        if hf.get("spanflow_lossy_crf"):
            log.warning("%s is a lossy export of a CRF model: each token is decoded by its own scores (argmax), so "
                        "its entities differ from the CRF model's", path)
        labels = sorted({t[2:] for t in tags if t != "O"})
        id2label = bio_label_list(labels) if bio else tags
        head = make_tagging_head("softmax", hidden_size=encoder.config.hidden_size, id2label=id2label)
        if bio:
            classifier = select_rows(classifier, bio_rows(tags, id2label))
        head.proj.load_state_dict(classifier.state_dict())
        limit = encoder_max_length(encoder, tokenizer)
        return cls(encoder=encoder, tokenizer=tokenizer, labels=labels, limit=limit, head=head,
                   head_type="softmax", policy=resolve_policy(precision, device), id2label=id2label, words=words,
                   word_edges=edges, word_split=split, max_length=config_int(hf, "spanflow_max_length", path, limit),
                   stride=config_count(hf, "spanflow_stride", path, DEFAULT_STRIDE),
                   lines=hf.get("spanflow_lines", True) is not False)

    def save(self, path: str) -> None:
        """Write a self-contained model directory."""
        save_model_dir(path, encoder=self.module.encoder, tokenizer=self.tokenizer, head=self.module.head,
                       config={"task": "ner", "labels": self.labels, "limit": self.limit,
                               "max_length": self.max_length, "stride": self.stride, "lines": self.lines,
                               "words": self.words, **({"word_edges": self.word_edges} if self.word_edges else {}),
                               "word_split": self.word_split,
                               "tag_scheme": "bio", "head": self.head_type,
                               **({} if self.id2label == bio_label_list(self.labels) else {"id2label": self.id2label})})

    @property
    def cuts_punctuation(self) -> bool:
        """Whether the tokenizer's words are cut at punctuation too (words.SPLITS)."""
        return self.word_split == PUNCTUATION

    def with_precision(self, precision: str, quantize: str | None = None) -> "NerModel":
        """This model in another precision, sharing its weights (see tasks.registry.autocast_twin)."""
        return autocast_twin(self, precision, quantize)

    def set_max_length(self, max_length: int | None = None, stride: int | None = None) -> None:
        """Read windows of `max_length` tokens (special tokens included, at most the limit), overlapping
        by `stride`; None keeps the current value. A kept overlap need not fit a shorter window:
        batching.align.make_windows overlaps by at most half a window."""
        max_length = self.max_length if max_length is None else max_length
        self.max_length, _ = check_window(max_length, 0 if stride is None else stride, self.limit)
        if stride is not None:
            self.stride = stride

    def predict_stream(self, texts: Iterable[str], *, max_tokens: int | None = None,
                       on_batch: Callable | None = None, words: Iterable | None = None,
                       chunk_size: int = 8192) -> Iterator[list[Span]]:
        """Spans for each text, in order, with bounded memory for inputs of any size, `chunk_size`
        texts at a time (the first spans come after a chunk and the next are read); `words`:
        each text's own tokens as char offsets (or None), which spans then start and end on. A text
        without them is cut into the model's words (`self.words`: whitespace tokens or the tokenizer's)."""
        return self._tag(text_stream(texts), max_tokens, on_batch, words, chunk_size)

    def _tag(self, texts: Iterable[str], max_tokens: int | None, on_batch: Callable | None,
             words: Iterable | None, chunk_size: int = 8192) -> Iterator[list[Span]]:
        max_tokens = check_max_tokens(max_tokens) or infer_tokens(self.policy.device)
        return tag_texts(self.module, self.tokenizer, texts, id2label=self.id2label, max_length=self.max_length,
                         stride=self.stride, max_tokens=max(max_tokens, self.max_length), policy=self.policy,
                         chunk_size=chunk_size,
                         on_batch=on_batch, words=words, lines=self.lines, split=splitter(self.words, self.word_edges),
                         cut_punctuation=self.cuts_punctuation)

    def predict(self, texts: list[str] | str, *, max_tokens: int | None = None,
                words: list | None = None) -> list[list[Span]] | list[Span]:
        """Character-offset (start, end, label) spans for each text (`words`: see predict_stream);
        one string: its spans alone (`words` then that text's words)."""
        texts, one = text_list(texts, "predict")
        if words is not None and one:
            words = [words]
        if words is not None and not isinstance(words, (str, bytes, dict)) and isinstance(words, Iterable):
            words = list(words)
            if len(words) != len(texts):
                raise ConfigError(f"words has {len(words)} items for {len(texts)} texts: one per text (None: the "
                                  "model's own words)")
        spans = list(self._tag(texts, max_tokens, None, words))
        return spans[0] if one else spans

    @staticmethod
    def read_labelled(path: str, *, fmt: str | None = None, scheme: str | None = None) -> list[NerExample]:
        """Labelled NER data (CoNLL, JSONL or DocBin) for evaluate."""
        from spanflow.data.io import read_ner

        return read_ner(path, fmt=fmt, scheme=scheme)

    @staticmethod
    def format_metrics(m: dict) -> str:
        """The evaluate table: P/R/F1 per label and overall."""
        return format_table(m)

    @staticmethod
    def output_record(text: str, spans: list[Span]) -> dict:
        """The record of one text, from predict, the server and the API alike."""
        return {"text": text, "entities": [{"start": s, "end": e, "label": lab, "text": text[s:e]}
                                           for s, e, lab in spans]}

    @staticmethod
    def arrow_results(texts: list[str], results: list, **_) -> pa.Table:
        """The `entities` column of a Parquet/Arrow output: list<struct<start: int32, end: int32,
        label: string, text: string>>, one row per text, null where the result is None."""
        import pyarrow as pa

        entity = pa.struct([("start", pa.int32()), ("end", pa.int32()), ("label", pa.string()), ("text", pa.string())])
        rows = [None if spans is None else [{"start": s, "end": e, "label": lab, "text": text[s:e]}
                                            for s, e, lab in spans] for text, spans in zip(texts, results)]
        return pa.table({"entities": pa.array(rows, type=pa.list_(entity))})

    def units(self, texts: list[str], words: list | None = None) -> tuple[list, list[int], list]:
        """(windows with their word starts, window lengths, encodings): the server's units
        (`words`: see predict_stream)."""
        encs = self._encode(texts, words)
        wins = windows_for(encs, max_length=self.max_length, stride=self.stride, cls_id=self.tokenizer.cls_token_id,
                           sep_id=self.tokenizer.sep_token_id, lines=self.lines)
        return [(w, word_starts(encs, w)) for w in wins], [len(w) for w in wins], encs

    def _encode(self, texts: list[str], words: list | None):
        """The texts' encodings, cut into the model's words (`words`: each text's own, or None)."""
        pairs = list(paired(texts, words))
        return encode_texts(self.tokenizer, texts, text_words(pairs, splitter(self.words, self.word_edges)),
                            cut_punctuation=self.cuts_punctuation)

    def run_batch(self, units: list) -> list:
        """Label ids of each window (a CRF head decodes over its word starts)."""
        return tag_windows(self.module, [w for w, _ in units], [f for _, f in units], self.tokenizer.pad_token_id,
                           self.policy, SERVE_PAD_MULTIPLE, self.limit)

    def assemble(self, texts: list[str], units: list, results: list, encs) -> list[list[Span]]:
        """Each text's spans from its windows' labels."""
        per_text: list[list] = [[] for _ in texts]
        for (w, _), pred in zip(units, results):
            per_text[w.example].append((w.start, w.end, pred))
        return [decode_spans(enc, merge_windows(len(enc.ids), per_text[i]), self.id2label) if enc.ids else []
                for i, enc in enumerate(encs)]

    def evaluate(self, examples: list[NerExample], *, max_tokens: int | None = None, dist: Dist = Dist(),
                 check_spans: bool = True) -> dict:
        """Entity-level exact-span P/R/F1, overall and per label (sharded over ranks under torchrun);
        `check_spans`: also warn of gold entities off the model's words (training's scoring of each
        epoch, which said them at its start, leaves it out: it would tokenize the dev data again)."""
        check_examples(examples, NerExample, "examples", empty="there is nothing to score")
        pred = shard_gather(examples, lambda ex: self.predict([e.text for e in ex], max_tokens=max_tokens,
                                                              words=[e.words for e in ex]), dist)
        m = with_unknown(span_prf([e.spans for e in examples], pred), self.labels,
                         {lab for e in examples for _, _, lab in e.spans}, "labels")
        return with_warning(m, self._off_words(examples) if check_spans else None)

    def _off_words(self, examples: list[NerExample]) -> str | None:
        """A warning where gold entities do not start and end on the words this model tags (a span
        with a space at its edge, one that cuts a word): no prediction can match them."""
        label2id = {t: i for i, t in enumerate(bio_label_list(sorted({s[2] for e in examples for s in e.spans})))}
        moved, first = 0, None
        for part in chunked(examples, CHECK_CHUNK):  # a chunk at a time: its memory, not the file's
            encs = self._encode([e.text for e in part], [e.words for e in part])
            n, said = moved_spans(part, encs, [bio_labels(enc, e.spans, label2id) for enc, e in zip(encs, part)],
                                  label2id, "can only be found as")
            moved, first = moved + n, first or said
        if not moved:
            return None
        total = sum(len(e.spans) for e in examples)
        return (f"{moved} of the data's {total} gold entities do not start and end on the words the model tags, so "
                f"no prediction can match them and each counts as a miss; the first: {first}")


def _id2label(cfg: dict, labels: list[str], path: str) -> list[str]:
    """The classifier's BIO tag per output: spanflow.json's id2label (a classifier imported from
    Hugging Face keeps its own order), each O or B-/I- plus one of its labels; else spanflow's order."""
    if cfg.get("id2label") is None:
        return bio_label_list(labels)
    tags = check_names(cfg, "id2label", path)
    bad = next((t for t in tags if t != "O" and not (t[:2] in ("B-", "I-") and t[2:] in labels)), None)
    if bad is not None:
        raise ModelDirError(f"{path}: id2label in spanflow.json holds {bad[:50]!r}, which is not O or B-/I- plus one "
                            f"of its labels ({', '.join(labels[:8])})")
    return tags


def _flag(cfg: dict, key: str, path: str, default: bool) -> bool:
    """cfg[key] as true or false (`default` when absent), or a ModelDirError ("false" is no false)."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ModelDirError(f"{path}: {key} in spanflow.json must be true or false, got {str(value)[:50]!r}")
    return value


def _edges(edges, path: str, where: str) -> dict | None:
    """A model directory's word edges (words.edge_rules' shape), or None where it has none."""
    if edges is not None and not valid_edges(edges):
        raise ModelDirError(f'{path}: {where} is not {{"start": "...", "end": "...", "whole": [...], '
                            f'"chars": true or false}}')
    return edges
