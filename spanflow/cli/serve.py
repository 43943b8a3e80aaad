"""`spanflow serve --model DIR [--model NAME=DIR ...]`"""
from __future__ import annotations

import argparse
import math
import sys

from spanflow.cli.common import add_budget_args, add_device_arg, add_precision_arg, add_quantize_args
from spanflow.cli.options import add_options, options_from
from spanflow.runtime.backend import BACKENDS
from spanflow.serving.options import ServeOptions


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP with token-budget dynamic batching (extra: serve)",
                       description="Serve one or more models over HTTP (pip install 'spanflow[serve]'). Requests "
                                   "from all clients are batched by token budget; overload is answered with 429 "
                                   "and Retry-After, never a hang. docs/serving.md lists the routes.")
    p.add_argument("--model", action="append", required=True,
                   help="DIR or NAME=DIR (a spanflow model, or an encoder directory for embeddings); repeat for "
                        "several models [NAME: the run's name for OUT/model (runs/ner/model: ner), else the "
                        "directory's]")
    p.add_argument("--host", default="127.0.0.1", help="bind address [%(default)s: loopback only]")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on [%(default)s]")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' [env SPANFLOW_API_KEY; unset: no key asked]")
    add_budget_args(p, job="serve")
    add_options(p, ServeOptions)
    p.add_argument("--no-batching", action="store_true", help="one request per batch (for comparison)")
    add_precision_arg(p)
    add_quantize_args(p, gate="built-in sentences")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="eager PyTorch, or torch.compile after a warm-up at start [auto: compile when batching]")
    add_device_arg(p)


def load_services(a: argparse.Namespace) -> tuple[list, dict[str, int]]:
    """Each --model resolved (runtime/resolve.py), then loaded once: the services and each one's budget."""
    from spanflow.runtime.files import read_profile
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.serving.services import Service, check_names, parse_spec
    from spanflow.tasks.registry import task_of_dir

    profile_task = read_profile(a.profile, mode="infer").task if a.profile else None
    named = [parse_spec(spec) for spec in a.model]
    check_names(named)
    specs = [(name, path, task_of_dir(path)) for name, path in named]
    # --quantize is for the models whose task quantizes; a server of only other models is told so
    quantizes = any(a.quantize in getattr(t, "quantizations", ()) for *_, t in specs) if a.quantize else False
    if profile_task is not None and all(t.name != profile_task for *_, t in specs):  # it would be ignored
        from spanflow.errors import ConfigError

        raise ConfigError(f"profile {a.profile} was measured for task {profile_task!r}, and no --model served is one "
                          f"(they are {', '.join(sorted({repr(t.name) for *_, t in specs}))})")
    services, per_model = [], {}
    for name, path, task in specs:
        loads = Loads(task, path)
        mine = a.profile if profile_task in (None, task.name) else None  # a profile is for one task's models
        quantize = a.quantize if not quantizes or a.quantize in getattr(task, "quantizations", ()) else None
        rt = resolve_runtime(task, path, Asked.from_args(a, profile=mine, quantize=quantize), job="serve",
                             loads=loads, batching=not a.no_batching, name=name)
        services.append(Service(name, task, loads.take(rt), backend=rt.backend))
        per_model[name] = rt.max_tokens
    return services, per_model


def run(a: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401  (serving.address.serve_on runs it)

        from spanflow.serving.app import api_key_from_env, create_app
        from spanflow.serving.guard import deadline_protocol
    except ImportError as e:
        from spanflow.errors import ConfigError

        raise ConfigError(f"serving needs the 'serve' extra (pip install 'spanflow[serve]'): {e}") from None
    from spanflow.runtime.budget import default_budget
    from spanflow.serving.address import listening, serve_on
    from spanflow.serving.options import check_limits

    from spanflow.runtime.threads import on_model_thread

    check_limits(vars(a))
    api_key = api_key_from_env(a.api_key)  # an empty one is refused before any model loads
    with listening(a.host, a.port) as socks:  # a port in use is told now, and held while the models load
        # loaded (and --precision auto checked) on the thread that runs their batches: one OpenMP team
        services, per_model = on_model_thread(load_services, a)
        fallback = default_budget("serve", services[0].model.policy.device)  # every model has its own budget
        opts = options_from(ServeOptions, a, max_tokens=fallback, model_max_tokens=per_model,
                            batching=not a.no_batching, api_key=api_key)
        budgets = ", ".join(f"{s.name} ({s.task.name}, max_tokens {per_model[s.name]})" for s in services)
        port = socks[0].getsockname()[1]  # --port 0: the one the system gave
        host = f"[{a.host}]" if ":" in a.host else a.host  # an IPv6 address is bracketed in a URL
        print(f"serving {budgets} on http://{host}:{port} (batching {'on' if opts.batching else 'off'})",
              flush=True)  # a supervisor's pipe reads the port now
        routes = {s.task.route: s.task.name for s in services if s.task.route}
        print("routes: " + ", ".join(f"POST {r} ({t})" for r, t in routes.items())
              + "; GET /health, /ready, /v1/models, /metrics, /docs", flush=True)
        if not opts.api_key and not _loopback(socks):
            print(f"warning: no --api-key (or SPANFLOW_API_KEY): anyone who reaches {host}:{port} can use "
                  "these models", file=sys.stderr, flush=True)
        serve_on(socks, create_app(services, opts), log_level="warning", http=deadline_protocol(opts.read_timeout),
                 timeout_graceful_shutdown=drain_seconds(opts))
    return 0


def drain_seconds(opts) -> int:
    """How long SIGTERM's drain lets requests in flight end: a body still arriving gets
    --read-timeout to come (then 408), and its work --timeout (then 504); cut shorter, such a
    request was cancelled into a bare 500 and a traceback. Whole seconds, rounded up."""
    return math.ceil(opts.read_timeout + opts.timeout)


def _loopback(socks) -> bool:
    """Whether every socket listens on a loopback address only (127.0.0.0/8, ::1)."""
    import ipaddress

    return all(ipaddress.ip_address(s.getsockname()[0]).is_loopback for s in socks)
