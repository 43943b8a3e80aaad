"""NER: everything the task owns (model, training, BIO tags, heads, metrics, HF and spaCy interop)."""
from spanflow.tasks.ner.model import NerModel
from spanflow.tasks.ner.train import DEFAULT_HEAD, DEFAULTS, start_model, train_ner

__all__ = ["NerModel", "train_ner", "start_model", "DEFAULTS", "DEFAULT_HEAD"]
