"""The server's options: one dataclass, the source of `spanflow serve`'s flags (no web
framework imported, so the CLI can build its parser without the serve extra)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from spanflow.runtime.budget import default_budget
from spanflow.runtime.policy import pick_device
from spanflow.training.options import opt


def _default_budget() -> int:
    return default_budget("serve", pick_device())


@dataclass
class ServeOptions:
    """How the server batches and what it accepts; `spanflow serve` makes a flag of each documented field."""

    # a runtime flag of its own (a number, 'auto' or --profile); unset: the budget table's, for the device
    max_tokens: int = field(default_factory=_default_budget)
    model_max_tokens: dict[str, int] = field(default_factory=dict)  # per served model, where measured
    max_wait_ms: float = opt(2.0, "longest a request waits for a batch to fill; under load batches also form "
                                  "while the model is busy")
    max_queue_tokens: int = opt(1 << 18, "queued tokens beyond which requests larger than one batch get 429 with "
                                          "Retry-After (a small one is held by the queue wait bound)")
    max_queue_wait_ms: float = opt(1000.0, "429 with Retry-After when the queued work would take longer than this "
                                           "to start, at the measured rate")
    max_request_bytes: int = opt(1 << 20, "larger bodies get 413")
    max_texts: int = opt(256, "texts per request (422 beyond)")
    max_text_chars: int = opt(100_000, "characters per text (422 beyond)")
    timeout: float = opt(30.0, "seconds before a request's waiting work is dropped (504)")
    read_timeout: float = opt(10.0, "seconds a client has to start a request (then the connection closes) or "
                                    "to send its body (408, and the connection closes)")
    batching: bool = True  # --no-batching turns it off (for comparison)
    api_key: str | None = None  # --api-key or SPANFLOW_API_KEY


# the limits a request is measured against: each must let some request through
POSITIVE = ("max_queue_tokens", "max_queue_wait_ms", "max_request_bytes", "max_texts", "max_text_chars", "timeout",
            "read_timeout")


def check_limits(values: dict) -> None:
    """A ConfigError for a limit that would refuse every request (or a negative wait), before any
    model loads; `values`: the parsed flags by field name."""
    from spanflow.errors import ConfigError

    for name in POSITIVE:
        if not values[name] > 0:  # NaN too
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {values[name]}: every request "
                              "would be refused")
    if not values["max_wait_ms"] >= 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {values['max_wait_ms']}")
    for name in ("max_wait_ms", "timeout", "read_timeout"):
        # a wait of inf never ends (a batcher asleep for good, a stop that never drains); a bound of inf
        # (--max-queue-wait-ms, --max-texts) is no bound, and may stay
        if values[name] == math.inf:
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got inf")
