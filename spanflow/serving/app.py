"""The FastAPI app: routes, limits, auth, and one dynamic batcher per model."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from spanflow.errors import SpanflowError
from spanflow.inference.backend import backend_of, start_backend
from spanflow.inference.heap import settle
from spanflow.monitor.device import GpuUtilSampler
from spanflow.runtime.threads import model_thread
from spanflow.serving.batcher import DynamicBatcher, Overloaded, TooMuchWork
from spanflow.serving.guard import ERROR_SCHEMA, Guard, error_body, route_shown
from spanflow.serving.metrics import ServerMetrics
from spanflow.serving.options import ServeOptions
from spanflow.serving.requests import (InvalidRequest, Limits, RequestBody, body_schema, read_body, request_schema,
                                      response_schema)
from spanflow.serving.services import Service, check_names
from spanflow.tasks.registry import tasks as all_tasks

log = logging.getLogger("spanflow.serve")

# a request of at most this many characters and texts is tokenized and answered on the event
# loop: less work than the two thread hops it saves
# (bench/results/server_overhead_{before,after}.md)
INLINE_CHARS, INLINE_TEXTS = 1024, 16

class HttpError(Exception):
    """An error answer: `status`, a message, and the request field at fault (`param`, as OpenAI names it)."""

    def __init__(self, status: int, message: str, headers: dict | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.param = status, message, headers or {}, param


def create_app(services: list[Service], opts: ServeOptions) -> FastAPI:
    # one batcher per name: a second model of a name would take the first's
    check_names([(s.name, f"the {s.task.name} model") for s in services])
    metrics = ServerMetrics(accelerator=any(s.model.policy.device.type == "cuda" for s in services))
    started = int(time.time())
    state = {"ready": False, "batchers": {}, "warm": {}, "gpu": None}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # large requests are tokenized and answered on one thread of their own, off the event loop
        state["pool"] = ThreadPoolExecutor(1, thread_name_prefix="spanflow-io")
        on_one_thread: list = []  # every model runs on the one model thread: their queues add up
        for s in services:
            # what the queue gives is cut into parts of similar length once a part holds a quarter
            # of the budget (the batcher's default), on a CPU too: smaller parts paid more per call
            # than padding cost them (bench/results/load_test_split_{before,after}.md)
            b = DynamicBatcher(s.run_batch, max_tokens=opts.model_max_tokens.get(s.name, opts.max_tokens),
                               max_wait_ms=opts.max_wait_ms,
                               max_queue_tokens=opts.max_queue_tokens,
                               max_queue_wait_s=opts.max_queue_wait_ms / 1000,
                               per_request=not opts.batching,
                               on_batch=metrics.batch_observer(s.name), peers=on_one_thread)
            b.start()
            state["batchers"][s.name] = b
            units, lengths, _ = s.units(["warm up the model"])
            await b.warm_up(units, lengths)  # first kernels are slow; /ready waits for this
            state["warm"][s.name] = (units, lengths)
        # the models' objects live as long as the server: kept out of the collector's full
        # passes, which otherwise stalled every in-flight request now and then
        settle()
        cuda = [s.model.policy.device for s in services if s.model.policy.device.type == "cuda"]
        state["gpu"] = GpuUtilSampler(cuda[0]) if cuda else None  # NVML, when installed (the gpu extra)
        for s in services:  # a compile runs aside, started once the eager warm-up is done: ready now
            # of several models, each compile line says which it is of
            b = state["batchers"][s.name]
            start_backend(s.model, s.backend, (lambda line, n=s.name: print(f"{n}: {line}")) if len(services) > 1
                          else print,
                          # its calls measured again once compiled, in turn with the batches it serves
                          lambda b=b, w=state["warm"][s.name]: model_thread().submit(b.time_calls, *w, anew=True))
        state["ready"] = True
        yield
        state["ready"] = False  # graceful shutdown: uvicorn stopped accepting; finish what is queued
        for b in state["batchers"].values():
            await b.close()
        state["pool"].shutdown(wait=False)
        if state["gpu"]:
            state["gpu"].close()

    # no redirect from /v1/ner/ to /v1/ner: a 307 with an empty body, which clients posting JSON
    # rarely follow; a 404 naming the routes instead
    app = FastAPI(title="spanflow", lifespan=lifespan, redirect_slashes=False)

    @app.exception_handler(HttpError)
    async def _http_error(request: Request, exc: HttpError):
        return _error(exc.status, exc.message, exc.headers, exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, exc: StarletteHTTPException):
        # unknown paths (404) and wrong methods (405) in the shape of every other error
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path (the router names its first route's: GET, not HEAD)
            methods = {m for r in app.routes if getattr(r, "path", None) == request.url.path
                       for m in getattr(r, "methods", None) or ()}
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"} | (
                {"Allow": ", ".join(sorted(methods))} if methods else {})
        return _error(exc.status_code, _routing_message(request, exc, app, headers, services), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        return _error(422, f"{where or 'request'}: {first.get('msg', 'invalid')}", param=where)

    # HEAD: what load balancers' probes often send; left out of the schema, where it would repeat
    # GET's operation id (a warning at the first /docs)
    @app.head("/health", include_in_schema=False)
    @app.get("/health", openapi_extra={"responses": {"200": _answer("the process answers", STATUS)}})
    async def health():
        return {"status": "ok"}

    @app.head("/ready", include_in_schema=False)
    @app.get("/ready", openapi_extra={"responses": {"200": _answer("the models are loaded and warm (with the key, "
                                                                   "which and their backends)", STATUS),
                                                    "503": ERRORS["5XX"]}})
    async def ready(request: Request):
        if not state["ready"]:  # the server stops: what is queued is finished, nothing new is taken
            raise HttpError(503, "the server is stopping")
        if not getattr(request.state, "keyed", False):  # a probe without the key: ready, and nothing more
            return {"status": "ready"}
        return {"status": "ready", "models": {s.name: s.task.name for s in services},
                "backends": {s.name: backend_of(s.model) for s in services}}

    @app.get("/v1/models", openapi_extra={"responses": {"200": _answer("every served model", MODELS)}})
    async def models():
        """OpenAI's model list: every served model, whatever its task."""
        return {"object": "list", "data": [_model_card(s, started) for s in services]}

    # a served name may hold a slash (org/model=DIR); read from the path, not as an argument, whose
    # check FastAPI would list as a 422 of its own shape (none can fail: any text is a name)
    @app.get("/v1/models/{name:path}", openapi_extra={
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": _answer("the served model", CARD), "404": ERRORS["4XX"]}})
    async def model(request: Request):
        """OpenAI's model retrieval: one served model by name."""
        name = request.path_params["name"]
        for s in services:
            if s.name == name:
                return _model_card(s, started)
        raise HttpError(404, f"no model named {name[:100]!r}; loaded: {[s.name for s in services]}", param="model")

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus():
        for name, b in state["batchers"].items():
            metrics.queue_depth.labels(name).set(b.depth)
            metrics.queue_tokens.labels(name).set(b.queued_tokens)
        for s in services:
            metrics.set_backend(s.name, backend_of(s.model))
        if metrics.gpu_memory is not None:
            metrics.gpu_memory.set(torch.cuda.memory_allocated())
        util = state["gpu"].take() if state["gpu"] else None  # the mean since the last scrape
        if util is not None and metrics.gpu_util is not None:
            metrics.gpu_util.set(util)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    tokenizer = threading.Lock()  # a tokenizer is never entered by two threads at once

    def tokenize(service: Service, texts: list[str]):
        with tokenizer:
            return service.units(texts)

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(state["pool"], fn, *args)

    async def units_of(service: Service, texts: list[str], small: bool):
        """A small request is tokenized on the event loop, where a thread hop would cost more than
        the work, unless the io thread holds the tokenizer; a large one on the io thread."""
        if small and tokenizer.acquire(blocking=False):
            try:
                return service.units(texts)
            finally:
                tokenizer.release()
        return await off_loop(tokenize, service, texts)

    def route(task):
        body_schema(task.request_field)  # built here, not on the first request

        async def handle(request: Request) -> Response:
            with metrics.in_flight.track_inprogress():  # what a drain waits for, as /metrics shows it
                return await answer_to(request)

        async def answer_to(request: Request) -> Response:
            t0 = time.perf_counter()
            body = await _read_body(request, opts.max_request_bytes, opts.read_timeout)
            req = _check_body(body, task.request_field, opts, getattr(task, "request_options", None))
            service = _pick_service(services, task.name, req.model)
            texts = req.texts
            try:
                params = service.params(body)
            except SpanflowError as e:
                raise HttpError(422, str(e), param=getattr(e, "field", None)) from None
            batcher = state["batchers"][service.name]
            try:
                batcher.admit(0)  # shed load before the tokenizer spends time on it
                t1 = time.perf_counter()
                small = len(texts) <= INLINE_TEXTS and sum(map(len, texts)) <= INLINE_CHARS
                units, lengths, ctx = await units_of(service, texts, small)
                t2 = time.perf_counter()
                left = opts.timeout - (time.perf_counter() - t0)  # --timeout counts from the request's start
                if left <= 0:
                    raise asyncio.TimeoutError
                work = batcher.submit(units, lengths, left, whole_s=opts.timeout)  # 413: its size, not the wait
                # a request of several batches is dropped when its client goes (a small one ends within a batch,
                # where watching would cost more than it saves)
                results = await (_unless_gone(request, work) if sum(lengths) > batcher.max_tokens else work)
                t3 = time.perf_counter()
            except Overloaded as e:
                raise HttpError(429, str(e), {"Retry-After": str(e.retry_after)}) from None
            except TooMuchWork as e:
                raise HttpError(413, f"{e} (--timeout)") from None
            except asyncio.TimeoutError:
                raise HttpError(504, f"request not served within {opts.timeout:g}s; its queued work was "
                                     "dropped") from None
            except ClientGone:  # no one reads the answer; the status counts it in /metrics
                return Response(status_code=499)
            answer = lambda: _json(service.respond(texts, units, results, ctx, sum(lengths), params))  # noqa: E731
            response = answer() if small else await off_loop(answer)
            t4 = time.perf_counter()
            for name, seconds in (("read", t1 - t0), ("tokenize", t2 - t1), ("batch", t3 - t2), ("respond", t4 - t3)):
                metrics.phase_of(service.name, name).observe(seconds)
            metrics.served(service.name, t4 - t0, len(texts), sum(lengths))
            return response
        return handle

    for task in {s.task.name: s.task for s in services}.values():
        if task.route:
            body = {"required": True, "content": {"application/json": {"schema": request_schema(task)}}}
            answers = {"200": _answer("one result per text, in order", response_schema(task)), **ERRORS}
            app.post(task.route, openapi_extra={"requestBody": body, "responses": answers})(route(task))

    routes = {getattr(r, "path", "") for r in app.routes}
    app.add_middleware(Guard, api_key=opts.api_key, routes=routes,
                       count=lambda route, status: metrics.requests.labels(route, str(status)).inc())
    return app


def _answer(description: str, schema: dict) -> dict:
    """An answer of /openapi.json: JSON of `schema`."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {"4XX": _answer("said in the message: the request's fault (the field at fault in param), or a load "
                         "the server sheds (429, with Retry-After)", ERROR_SCHEMA),
          "5XX": _answer("the server's: stopping (503), a request not served within --timeout (504), or a fault "
                         "(500)", ERROR_SCHEMA)}
STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
CARD = {"type": "object", "required": ["id", "object", "created", "owned_by", "task"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"}, "task": {"type": "string"}}}
MODELS = {"type": "object", "required": ["object", "data"],  # OpenAI's model list
          "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": CARD}}}


def _model_card(s: Service, created: int) -> dict:
    return {"id": s.name, "object": "model", "created": created, "owned_by": "spanflow", "task": s.task.name}


def _error(status: int, message: str, headers: dict | None = None, param: str | None = None) -> JSONResponse:
    """Every error answer (guard.error_body), `param` the request field at fault."""
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def _routing_message(request: Request, exc, app: FastAPI, headers: dict, services: list[Service]) -> str:
    path = request.url.path[:200]
    if exc.status_code == 405:
        allowed = headers.get("Allow") or headers.get("allow") or ""
        return f"{request.method} is not allowed on {path}" + (f"; it takes {allowed}" if allowed else "")
    unloaded = next((t for t in all_tasks() if t.route == path), None)
    if exc.status_code == 404 and unloaded is not None:  # a task's route, of a task no served model is of
        return (f"no {unloaded.name} model is loaded on this server, so {path} is not served; loaded: "
                + ", ".join(f"{s.name} ({s.task.name})" for s in services))
    if exc.status_code == 404:
        routes = sorted({f"{m} {route_shown(r.path)}" for r in app.routes for m in getattr(r, "methods", None) or ()
                         if m != "HEAD" and not r.path.startswith("/docs/")}, key=lambda x: x.split()[::-1])
        return f"no route {request.method} {path}; the routes are {', '.join(routes)}"
    return str(exc.detail)[:200]


def _json(payload: dict) -> Response:
    """A JSON response; numpy rows (embeddings) are written by orjson when it is installed (the
    serve extra), as float formatting with the standard encoder holds the event loop up on
    large responses. Either way FastAPI's recursive encoder is skipped."""
    try:
        import orjson
    except ImportError:
        return Response(json.dumps(payload, default=_plain, ensure_ascii=False), media_type="application/json")
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def _plain(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


class ClientGone(Exception):
    """The client closed its connection while its request waited: its work was dropped."""


async def _unless_gone(request: Request, work):
    """`work`'s result, unless the client disconnects first: then `work` is cancelled (the batcher
    drops its queued units) and ClientGone raised. After the body, the ASGI server's next
    message is the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself is cancelled (shutdown): so is its work
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request, limit: int, timeout_s: float) -> dict:
    codings = {c.strip() for c in request.headers.get("content-encoding", "").lower().split(",")} - {"", "identity"}
    if codings:  # read as JSON, a compressed body was "malformed JSON: 'utf-8' codec ..."
        raise HttpError(415, f"unsupported Content-Encoding {', '.join(sorted(codings))[:40]!r}: send the JSON body "
                             "uncompressed")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"request body over the {limit}-byte limit (--max-request-bytes)")
    try:
        raw = await asyncio.wait_for(_body(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise HttpError(408, f"request body not received within {timeout_s:g}s", {"Connection": "close"}) from None
    except ClientDisconnect:
        log.debug("client disconnected before sending its whole body")
        raise HttpError(400, "client disconnected") from None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # also too deep nesting and integers over Python's digit limit
        reason = ("nested too deeply" if isinstance(e, RecursionError)
                  else "a number too long to read" if "integer string conversion" in str(e) else str(e)[:200])
        raise HttpError(400, f"malformed JSON: {reason}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body


async def _body(request: Request, limit: int) -> bytes:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise HttpError(413, f"request body over the {limit}-byte limit (--max-request-bytes)")
    return bytes(raw)


def _pick_service(services: list[Service], task: str, name) -> Service:
    """The service a request names; where one model of the task is loaded, it answers any name
    (clients often hard-code a hosted model's name) and the response names the model that ran."""
    of_task = [s for s in services if s.task.name == task]
    if name is not None:
        for s in of_task:
            if s.name == name:
                return s
        other = next((s for s in services if s.name == name), None)
        if other is not None:  # a served model of another task: a mistake, not a hosted model's name
            raise HttpError(422, f"model {name!r} is a model of task {other.task.name!r}; this route runs {task!r} models: "
                                 f"{[s.name for s in of_task]}", param="model")
        if len(of_task) == 1:
            return of_task[0]
        raise HttpError(404, f"no {task} model named {str(name)[:100]!r}; loaded: {[s.name for s in of_task]}",
                        param="model")
    if len(of_task) > 1:  # (a route exists only for a task with a loaded model)
        raise HttpError(422, f"several {task} models are loaded; name one with \"model\": "
                             f"{[s.name for s in of_task]}", param="model")
    return of_task[0]


def _check_body(body: dict, field: str, opts: ServeOptions, options: tuple[str, ...] | None) -> RequestBody:
    """The body against its route's schema (serving/requests.py): a 422 naming the field otherwise."""
    try:
        return read_body(body, field, Limits(opts.max_texts, opts.max_text_chars), options)
    except InvalidRequest as e:
        raise HttpError(422, e.message, param=e.field) from None


def api_key_from_env(explicit: str | None) -> str | None:
    """The key requests must carry: --api-key, else SPANFLOW_API_KEY, else None (no key). An
    empty or blank one (`--api-key "$KEY"` with KEY unset) is refused: it would serve without a
    key, or with a key of spaces, and say nothing."""
    from spanflow.errors import ConfigError

    if explicit is not None:
        if not explicit.strip():
            raise ConfigError("--api-key is empty (a variable that is not set?): give the key, or leave the flag "
                              "out to serve without one")
        return explicit
    env = os.environ.get("SPANFLOW_API_KEY")
    if env is not None and not env.strip():
        raise ConfigError("SPANFLOW_API_KEY is set but empty: give it the key, or unset it to serve without one")
    return env
