"""Relation extraction (CasRel): model, training, features, the cascade head, metrics."""
from spanflow.tasks.re.model import ReModel
from spanflow.tasks.re.train import DEFAULTS, train_re

__all__ = ["ReModel", "train_re", "DEFAULTS"]
