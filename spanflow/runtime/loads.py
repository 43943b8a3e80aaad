"""The loads of one model directory during one command, so that each model is read once.

`--precision auto` runs the model in fp32 and in a reduced precision before the command
runs it; the command then takes the one that was chosen instead of loading it again. A
model that can make a twin of itself in another precision or quantization without reading
its directory again (an optional `with_precision(precision, quantize)` member of a task
model, as every built-in task has) is loaded once; any other is loaded once per precision.
"""
from __future__ import annotations

from typing import Any


class Loads:
    """Models of one directory, at most one per (device, precision, quantize)."""

    def __init__(self, task: Any, path: str):
        self.task, self.path = task, path
        self.loaded = 0  # calls of task.load: reading the directory
        self._models: dict[tuple, Any] = {}

    def get(self, device: str, precision: str, quantize: str | None = None):
        """The model on `device` in `precision` (resolved) and `quantize`, loaded or derived once."""
        key = (device, precision, quantize)
        if key not in self._models:
            twin = next((m for (d, _, _), m in self._models.items() if d == device and hasattr(m, "with_precision")),
                        None)
            self._models[key] = twin.with_precision(precision, quantize) if twin else self._load(*key)
        return self._models[key]

    def take(self, runtime) -> Any:
        """The model `runtime` (a runtime.resolve.Runtime) chose; the others are let go."""
        model = self.get(runtime.device, runtime.precision, runtime.quantize)
        self._models = {}
        return model

    def _load(self, device: str, precision: str, quantize: str | None):
        self.loaded += 1
        extra = {"quantize": quantize} if quantize else {}  # tasks that do not quantize take no such argument
        return self.task.load(self.path, device=device, precision=precision, **extra)
