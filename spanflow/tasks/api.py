"""Everything a task author imports: the registry, fit(), model directories, encoders, batching.

A new task is one module that defines a model class and a task object (see `Task` and
`TaskModel` in tasks/registry.py) and calls `register()`; tests/textcat_task.py is a
complete example that imports nothing else of spanflow.
"""
from spanflow.batching.batcher import token_budget_batches
from spanflow.batching.collate import SERVE_PAD_MULTIPLE, pad_rows
from spanflow.data.formats.common import parse_json, read_lines
from spanflow.errors import ConfigError, DataError, ModelDirError
from spanflow.models.directory import (
           check_names,
           config_int,
           fill_head,
           load_model_dir,
           save_model_dir,
)
from spanflow.models.encoder import start_encoder
from spanflow.models.linear import full_batches
from spanflow.runtime.budget import infer_tokens
from spanflow.tasks.registry import (
           Task,
           TaskModel,
           Workload,
           check_train_options,
           quality_at_length,
           records_response,
           records_schema,
           register,
)
from spanflow.training.defaults import TaskDefaults, for_encoder
from spanflow.training.distributed import Dist, shard_gather
from spanflow.training.fit import Plan, fit
from spanflow.training.options import TrainOptions
from spanflow.runtime.policy import Policy, resolve_policy
from spanflow.training.setup import Run, is_model_dir

__all__ = ["token_budget_batches", "SERVE_PAD_MULTIPLE", "pad_rows", "parse_json", "read_lines", "ConfigError",
           "DataError", "ModelDirError", "check_names", "config_int", "fill_head", "load_model_dir", "save_model_dir",
           "start_encoder", "full_batches", "infer_tokens", "Task", "TaskModel", "Workload", "check_train_options",
           "quality_at_length", "records_response", "records_schema", "register", "TaskDefaults", "for_encoder", "Dist",
           "shard_gather",
           "Plan", "fit", "TrainOptions", "Policy", "resolve_policy", "Run", "is_model_dir"]
