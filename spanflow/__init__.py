"""spanflow: train, tune, run and serve span models at full accelerator utilization."""
from spanflow.data.examples import NerExample, ReExample
from spanflow.data.io import read_ner, read_re, write_ner
from spanflow.data.records import read_texts
from spanflow.errors import ConfigError, DataError, ModelDirError, SpanflowError, WriteError
from spanflow.training.options import TrainOptions

__version__ = "0.1.0"

__all__ = ["NerExample", "ReExample", "read_ner", "read_re", "read_texts", "write_ner", "TrainOptions", "SpanflowError",
           "DataError", "ModelDirError", "ConfigError", "WriteError", "NerModel", "train_ner", "ReModel", "train_re",
           "Embedder", "train_embedder", "EmbedTraining", "read_pairs", "Pair"]
_MODELS = {"NerModel": "spanflow.tasks.ner", "train_ner": "spanflow.tasks.ner", "ReModel": "spanflow.tasks.re",
           "train_re": "spanflow.tasks.re", "Embedder": "spanflow.tasks.embed",
           "train_embedder": "spanflow.tasks.embed.train", "EmbedTraining": "spanflow.tasks.embed.train",
           "read_pairs": "spanflow.tasks.embed.pairs", "Pair": "spanflow.tasks.embed.pairs"}


def __getattr__(name: str):
    # the model API imports torch; load it only when asked for
    if name in _MODELS:
        import importlib

        return getattr(importlib.import_module(_MODELS[name]), name)
    raise AttributeError(f"module 'spanflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too, so a notebook's completion offers them
    return sorted(set(globals()) | set(__all__))
