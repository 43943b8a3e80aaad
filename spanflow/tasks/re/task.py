"""The `re` entry of the task registry: what the CLI, the server and tune ask of relation extraction."""
from __future__ import annotations

from spanflow.errors import counted
from spanflow.tasks.metrics import agreement_f1
from spanflow.tasks.re.features import casrel_loss, make_collate, prepare_features
from spanflow.tasks.re.model import ReModel
from spanflow.tasks.re.train import DEFAULTS as RE_DEFAULTS
from spanflow.tasks.re.train import TRAIN_FIELDS, check_relations, start_model, train_re
from spanflow.tasks.registry import Workload, check_model_for, quality_at_length, records_response, records_schema
from spanflow.training.options import TrainOptions
from spanflow.training.outcome import closing, say_once
from spanflow.runtime.policy import Policy


class ReTask:
    """Relation triples between character spans (CasRel): the `re` entry of the task registry."""

    name, summary, route, request_field, trains = "re", "relation triples (CasRel)", "/v1/relations", "texts", True
    train_defaults = {"": RE_DEFAULTS}  # what --help says an unset --epochs, --lr, ... gets
    train_fields = TRAIN_FIELDS  # TrainOptions fields of some tasks'
    request_options = ()  # a body holds the texts and the model: any other field is refused
    data_help = "CasRel JSON or JSONL relations"
    export_instead = ("other tools have no CasRel head to load it into; run it with 'spanflow predict' or "
                      "'spanflow serve', or from Python (spanflow.tasks.re.ReModel.load)")
    # --precision auto keeps a reduced precision whose triples agree with fp32's to this F1
    agreement_name, precision_gate = "triple F1", 0.98
    dev_metric = "triple F1"  # what --patience counts evaluations without a gain in
    label_keys = ("relations", "triple_list")  # a JSONL record's labels: a file with none is texts (evaluate)

    @staticmethod
    def agreement(ref: list, got: list) -> float:
        return agreement_f1(ref, got)

    def add_train_args(self, p) -> None:
        p.add_argument("--subjects", choices=["all", "sample"], default="all",
                       help="all: train the object stage on every gold subject of a text; sample: on one sampled "
                            "per text and step (the CasRel paper's recipe) [%(default)s]")

    def train_from_args(self, a, options: TrainOptions) -> str:
        from spanflow.data.formats.casrel import read_relations_vocab, vocab_path
        from spanflow.data.io import read_re
        from spanflow.errors import ConfigError, DataError

        check_model_for(a.model, self.name, start=True)  # before the data is read and any model loads
        train = read_re(a.train)
        say_once(_read_line(a.train, train))
        if not any(e.triples for e in train):  # said of the file here; train_re can name none
            unplaced = sum(len(e.unlocated) for e in train)
            raise DataError("holds no triples to train on" + (f": its {unplaced} could not be placed in their texts "
                                                              "(the warning above says why)" if unplaced else ""),
                            path=a.train)
        dev = read_re(a.dev) if a.dev else None
        if dev is not None:
            say_once(_read_line(a.dev, dev))
        relations = read_relations_vocab(a.train)
        if relations is not None:
            try:
                check_relations(train, relations)
            except ConfigError as e:
                raise DataError(f"{e} (the relation list read beside --train)", path=vocab_path(a.train)) from None
            say_once(f"relations: the {len(relations)} of {vocab_path(a.train)}, in its order")
        model = train_re(train, dev, model=a.model, out_dir=a.out, options=options,
                         relations=relations, all_subjects=a.subjects == "all")
        # fit() said where the model is
        return closing(a.out, f"the model extracts {counted(len(model.relations), 'relation')}: "
                              f"{_some(model.relations)}",
                       "spanflow predict --model {model} --input texts.txt --output relations.jsonl")

    def load(self, path: str, *, device: str = "auto", precision: str = "auto") -> ReModel:
        return ReModel.load(path, device=device, precision=precision)

    def read_labelled(self, path: str, **_) -> list:
        return ReModel.read_labelled(path)

    def workload(self, model: str, data: str, *, mode: str, policy: Policy, sample: int, seed: int = 0,
                 field: str = "text", column: int | str | None = None, texts: list[str] | None = None, **_):
        from spanflow.data.examples import ReExample
        from spanflow.data.io import read_re
        from spanflow.data.records import unlabelled_sample

        check_model_for(model, self.name, start=mode == "train")
        if texts is None:  # a table (or, for inference, plain texts): no labels
            texts = unlabelled_sample(data, sample, field=field, column=column, infer=mode == "infer")
        examples = read_re(data)[:sample] if texts is None else [ReExample(t) for t in texts]
        if mode == "train":
            rels = sorted({r for e in examples for _, r, _ in e.triples})
            rm = start_model(model, examples, rels, TrainOptions(seed=seed), policy)
        else:
            rm = ReModel.load(model, device=str(policy.device), precision=policy.name)
        limit = rm.limit

        def features(L):
            return prepare_features(examples, rm.tokenizer, rm.rel2id, max_length=min(L, limit), quiet=True)

        return Workload(rm.module, features, make_collate(rm.tokenizer.pad_token_id or 0, len(rm.relations), seed=seed),
                        casrel_loss, limit,
                        quality_at_length(rm, examples) if mode == "infer" and texts is None else None,
                        length=rm.max_length if mode == "infer" else None,  # what predict reads
                        quality_means="triple F1 on the labelled sample")

    response = staticmethod(records_response)

    def response_schema(self) -> dict:
        """The JSON schema of `response`: predict's records (ReModel.output_record)."""
        where = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
                 "description": "[start, end) character offsets"}
        relation = {"type": "object", "required": ["head", "type", "tail", "head_text", "tail_text"],
                    "properties": {"head": where, "type": {"type": "string"}, "tail": where,
                                   "head_text": {"type": "string"}, "tail_text": {"type": "string"}}}
        return records_schema({"type": "object", "required": ["text", "relations"],
                               "properties": {"text": {"type": "string"},
                                              "relations": {"type": "array", "items": relation}}})


TASK = ReTask()


def _read_line(path: str, examples: list) -> str:
    """What a file held, as `train ner` says it: its texts, their triples and those not placed."""
    unplaced = sum(len(e.unlocated) for e in examples)
    total = sum(len(e.triples) for e in examples) + unplaced
    return (f"read {path}: {counted(len(examples), 'text')}, {counted(total, 'triple')}"
            + (f" ({unplaced} of them gold for scoring only: the warning above says why)" if unplaced else ""))


def _some(names: list[str], shown: int = 8) -> str:
    """The first `shown` names, and how many more (a WebNLG model has hundreds: all are in the
    model's spanflow.json)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more (the model's spanflow.json lists them)" if more > 0 else "")
