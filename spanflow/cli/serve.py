"""`spanflow serve --model DIR [--model NAME=DIR ...]`"""
from __future__ import annotations

import argparse

from spanflow.cli.options import add_options, options_from
from spanflow.inference.backend import BACKENDS, choose_backend, use_backend
from spanflow.serving.options import ServeOptions


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP with token-budget dynamic batching (extra: serve)")
    p.add_argument("--model", action="append", required=True, help="DIR or NAME=DIR; repeat for several models")
    p.add_argument("--host", default="127.0.0.1", help="bind address [%(default)s: loopback only]")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or env SPANFLOW_API_KEY)")
    p.add_argument("--max-tokens", default=None, help="padded tokens per batch, or 'auto' [4096]")
    p.add_argument("--profile", default=None, help="profile.json from 'spanflow tune --mode infer'")
    add_options(p, ServeOptions)
    p.add_argument("--no-batching", action="store_true", help="one request per batch (for comparison)")
    p.add_argument("--precision", default="auto")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="eager PyTorch, or torch.compile after a warm-up at start [auto: compile when batching]")
    p.add_argument("--device", default="auto")


def run(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from spanflow.serving.app import api_key_from_env, create_app
        from spanflow.serving.guard import deadline_protocol
    except ImportError as e:
        from spanflow.errors import ConfigError

        raise ConfigError(f"serving needs the 'serve' extra (pip install 'spanflow[serve]'): {e}") from None
    from spanflow.serving.services import load_service
    from spanflow.tuning.auto import resolve_max_tokens
    from spanflow.tuning.profile import read_profile

    from spanflow.inference.auto_precision import infer_precision

    # auto: a reduced precision where it agrees with fp32 (checked once per model: cached)
    services = [load_service(m, precision=infer_precision(a.precision, m.rpartition("=")[2], a.device),
                             device=a.device) for m in a.model]
    measured = read_profile(a.profile, mode="infer") if a.profile else {}
    profile_task = measured.get("task")
    for s in services:  # --backend auto: the backend the profile measured faster, for its task's models
        mine = measured.get("backend", {}).get("best") if profile_task == s.task.name else None
        use_backend(s.model, choose_backend(a.backend, batching=not a.no_batching, measured=mine))
    max_tokens, per_model = ServeOptions.max_tokens, {}
    for spec, s in zip(a.model, services):  # each model its own measured budget, where there is one
        profile = a.profile if profile_task in (None, s.task.name) else None  # a profile is for one task
        n = resolve_max_tokens(a.max_tokens, profile=profile, task=s.task.name, mode="infer",
                               model=spec.rpartition("=")[2], data=None, precision=a.precision, device=a.device)
        if n:
            per_model[s.name] = n
    opts = options_from(ServeOptions, a, max_tokens=max_tokens, model_max_tokens=per_model,
                        batching=not a.no_batching, api_key=api_key_from_env(a.api_key))
    budgets = ", ".join(f"{s.name} ({s.task.name}, max_tokens {per_model.get(s.name, max_tokens)})" for s in services)
    print(f"serving {budgets} on http://{a.host}:{a.port} (batching {'on' if opts.batching else 'off'})")
    uvicorn.run(create_app(services, opts), host=a.host, port=a.port, log_level="warning",
                http=deadline_protocol(opts.read_timeout), timeout_graceful_shutdown=int(opts.timeout))
    return 0
