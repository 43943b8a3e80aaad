"""spanflow: train, tune, run and serve span models at full accelerator utilization."""
from spanflow.data.examples import NerExample
from spanflow.data.io import read_ner, write_ner
from spanflow.data.records import read_texts
from spanflow.errors import ConfigError, DataError, ModelDirError, SpanflowError
from spanflow.training.options import TrainOptions

__version__ = "0.1.0"

__all__ = ["NerExample", "read_ner", "read_texts", "write_ner", "TrainOptions", "SpanflowError", "DataError",
           "ModelDirError", "ConfigError", "NerModel", "train_ner", "Embedder"]


def __getattr__(name: str):
    # the model API imports transformers; load it only when asked for
    if name in ("NerModel", "train_ner"):
        from spanflow import ner

        return getattr(ner, name)
    if name == "Embedder":
        from spanflow.embedder import Embedder

        return Embedder
    raise AttributeError(name)
