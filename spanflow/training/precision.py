"""The precision and device policy training and the tasks run under. It is decided in
spanflow/runtime/policy.py (runtime choices sit below training); this module is the name
the training code and the tasks import it by."""
from __future__ import annotations

from spanflow.runtime.policy import PRECISIONS, Policy, cpu_has_bf16, pick_device, resolve_policy

__all__ = ["PRECISIONS", "Policy", "cpu_has_bf16", "pick_device", "resolve_policy"]
