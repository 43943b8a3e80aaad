"""`--max-tokens auto` when no profile is cached: a short tune sweep (up to about 30 s), whose
profile spanflow/runtime/resolve.py then caches for this model and device."""
from __future__ import annotations

import shutil
import tempfile


def quick_profile(*, task: str, model: str, data: str, mode: str, precision: str, quantize: str | None = None,
                  device: str = "auto", field: str = "text", column: int | None = None,
                  texts: list[str] | None = None) -> dict:
    """The profile of a short sweep of `model` on `data` in the resolved `precision` and
    `quantize` (no plot, no backend comparison); on `texts` instead, where given (the input sample
    of predict or embed, read with its --field, --column and --skip-header)."""
    from spanflow.errors import ConfigError
    from spanflow.tuning.tune import NoBestPoint, tune

    tmp = tempfile.mkdtemp(prefix="spanflow-tune-")
    try:
        # force: the command asking has gated its quantization already (and may have been told --force)
        return tune(task=task, model=model, data=data, mode=mode, budget_seconds=30, sample=256, precision=precision,
                    quantize=quantize, force=True, device=device, out=tmp, field=field, column=column, plot=False,
                    backends=False, log_fn=lambda s: None, texts=texts)
    except NoBestPoint as e:  # its temporary profile is no file to name
        raise ConfigError(f"max_tokens auto: {e.reason}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
