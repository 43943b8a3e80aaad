"""The `ner` entry of the task registry: what the CLI, the server and tune ask of NER."""
from __future__ import annotations

from spanflow.batching.align import own_tokens
from spanflow.data.io import FORMAT_HELP, NER_FORMATS, STRICT_HELP
from spanflow.data.schemes import SCHEMES
from spanflow.errors import counted
from spanflow.tasks.metrics import agreement_f1
from spanflow.tasks.ner.features import make_collate, ner_loss, prepare_windows
from spanflow.tasks.ner.heads import HEAD_TYPES
from spanflow.tasks.ner.hf import token_classification_config
from spanflow.tasks.ner.model import NerModel
from spanflow.tasks.ner.train import DEFAULTS as NER_DEFAULTS
from spanflow.tasks.ner.train import TRAIN_FIELDS, start_model, train_ner
from spanflow.tasks.registry import Workload, check_model_for, quality_at_length, records_response, records_schema
from spanflow.training.options import TrainOptions
from spanflow.training.outcome import closing, say_once
from spanflow.runtime.policy import Policy


class NerTask:
    """Named entities as character-offset spans: the `ner` entry of the task registry."""

    name, summary, route, request_field, trains = "ner", "named entities (spans)", "/v1/ner", "texts", True
    train_defaults = {"": NER_DEFAULTS}  # what --help says an unset --epochs, --lr, ... gets
    train_fields = TRAIN_FIELDS  # the TrainOptions fields of some tasks' that its training takes
    request_options = ()  # a body holds the texts and the model: any other field is refused
    exports = ("hf",)
    data_help = "CoNLL columns, JSONL spans or a spaCy .spacy file"
    # --precision auto keeps a reduced precision whose entities agree with fp32's to this F1
    agreement_name, precision_gate = "entity F1", 0.98
    dev_metric = "entity F1"  # what --patience counts evaluations without a gain in
    label_keys = ("entities", "spans")  # a JSONL record's labels: a file with none is texts (evaluate)

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return agreement_f1(ref, got)

    def claims(self, path: str) -> bool:
        """A Hugging Face token-classification directory runs as an NER model."""
        return token_classification_config(path) is not None

    def export(self, model: NerModel, to: str, out: str, *, lossy: bool = False, log_fn=print) -> str:
        from spanflow.tasks.ner.hf import (
            export_hf,  # imports transformers: only when exporting
        )

        return export_hf(model, out, lossy=lossy, log_fn=log_fn)

    def add_train_args(self, p) -> None:
        p.add_argument("--format", choices=NER_FORMATS, default=None,
                       help=FORMAT_HELP)
        p.add_argument("--scheme", type=str.lower, choices=SCHEMES, default=None,
                       help="tag scheme of CoNLL input, any case [detected from the tags]")
        p.add_argument("--strict", action="store_true", help=STRICT_HELP)
        p.add_argument("--head", choices=list(HEAD_TYPES), default=None,
                       help="crf: a BIO-constrained CRF with Viterbi decoding; softmax: a per-token softmax "
                            "[crf for a new model, softmax if --label-smoothing or --class-weights is given; "
                            "a spanflow model keeps its head]")

    def train_from_args(self, a, options: TrainOptions) -> str:
        from spanflow.data.io import read_ner, refuse_tag_flags

        check_model_for(a.model, self.name, start=True)  # before the data is read and any model loads
        refuse_tag_flags([a.train, a.dev], a.format, scheme=a.scheme, strict=a.strict)
        train = read_ner(a.train, fmt=a.format, scheme=a.scheme, strict=a.strict, log_fn=say_once)
        if not any(e.spans for e in train):  # said of the file here; train_ner can name none
            from spanflow.errors import DataError

            raise DataError(f"holds no entities to train on ({counted(len(train), 'text')}, every token outside "
                            "any entity)", path=a.train)
        dev = read_ner(a.dev, fmt=a.format, scheme=a.scheme, strict=a.strict, log_fn=say_once) if a.dev else None
        model = train_ner(train, dev, model=a.model, out_dir=a.out, options=options, head=a.head)
        # fit() said where the model is
        return closing(a.out, f"the model tags {counted(len(model.labels), 'label')}: {', '.join(model.labels)}",
                       "spanflow predict --model {model} --input texts.txt --output spans.jsonl")

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> NerModel:
        return NerModel.load(path, device=device, precision=precision)

    def read_labelled(self, path: str, *, fmt: str | None = None, scheme: str | None = None, **_) -> list:
        return NerModel.read_labelled(path, fmt=fmt, scheme=scheme)

    def workload(self, model: str, data: str, *, mode: str, policy: Policy, sample: int, seed: int = 0,
                 field: str = "text", column: int | str | None = None, texts: list[str] | None = None, **_):
        from spanflow.data.examples import NerExample
        from spanflow.data.io import read_ner
        from spanflow.data.records import unlabelled_sample

        check_model_for(model, self.name, start=mode == "train")
        if texts is None:  # a table (or, for inference, plain texts): no labels
            texts = unlabelled_sample(data, sample, field=field, column=column, infer=mode == "infer")
        examples = read_ner(data)[:sample] if texts is None else [NerExample(t) for t in texts]
        labels = sorted({lab for e in examples for *_, lab in e.spans})
        if mode == "train":
            nm = start_model(model, examples, labels, TrainOptions(max_tokens=10**9, seed=seed), policy)
        else:
            nm = NerModel.load(model, device=str(policy.device), precision=policy.name)
        l2i = {lab: i for i, lab in enumerate(nm.id2label)}
        limit = nm.limit

        def windows(L):
            return prepare_windows(examples, nm.tokenizer, l2i, max_length=min(L, limit), stride=nm.stride,
                                   lines=nm.lines)

        return Workload(nm.module, windows, make_collate(nm.tokenizer.pad_token_id), ner_loss, limit,
                        quality_at_length(nm, examples) if mode == "infer" and texts is None else None,
                        length=nm.max_length if mode == "infer" else None,  # predict's windows
                        quality_means="entity F1 on the labelled sample",
                        counts=own_tokens)  # short windows overlap: their repeated tokens are no speed

    response = staticmethod(records_response)

    def response_schema(self) -> dict:
        """The JSON schema of `response`: predict's records (NerModel.output_record)."""
        span = {"type": "object", "required": ["start", "end", "label", "text"],
                "properties": {"start": {"type": "integer", "description": "character offset, inclusive"},
                               "end": {"type": "integer", "description": "character offset, exclusive"},
                               "label": {"type": "string"}, "text": {"type": "string"}}}
        return records_schema({"type": "object", "required": ["text", "entities"],
                               "properties": {"text": {"type": "string"},
                                              "entities": {"type": "array", "items": span}}})


TASK = NerTask()
