"""A bulk job on Ray Data: any task's model over an input, into a directory of Parquet files.

    read (tasks)  ->  tokenize (CPU tasks, for GPU actors where the model allows)  ->  chunks
    (exact row ranges)  ->  model (one actor per GPU, or CPU actors)  ->  write_parquet (tasks)

The stages stream: blocks flow on while later ones are read. The output is checked before
any work (spanflow.ray.output). The input is cut into chunks of `batch_rows` rows counted
from its first row, the single-process job's chunks (Ray Data's strict streaming
repartition, in input order), and each chunk is one model call, sorted and cut into
token-budget batches as the single-process job cuts it: the files hold what the
single-process `--output x.parquet` holds, value for value (data.tables.output_table makes
both), in input order (Ray Data's preserve_order). A task that fails is run again, and a
model actor that dies is restarted with its chunks run again (Ray Data's defaults); a
chunk's file is written once the chunk is done, so rows are neither lost nor written twice.
An error raised in a worker reaches the caller as the error it is (a SpanflowError or an
OSError), naming the worker, not as Ray's wrapped traceback.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from spanflow.atomic import hold_output
from spanflow.errors import ConfigError, DataError, SpanflowError
from spanflow.ray import source as S
from spanflow.ray.output import WHAT, check_target, part_names, staged, write_empty, write_manifest, written
from spanflow.ray.resources import TASK_CPUS, Actors, plan_actors
from spanflow.ray.stages import ModelStage, StageSpec, Tally, measured_budget, tokenize
from spanflow.runtime.resolve import Asked

# rows per model call, a single-process chunk: NER's tag_texts and RE's predict_stream cut
# their input into chunks of 8192 and 4096 texts, so chunks of 8192 rows are theirs exactly
DEFAULT_BATCH_ROWS = 8192
RAY_NEEDED = (2, 60)  # strict streaming repartition, label selectors: what the job is built on
# rows a chunk may hold: Ray's Parquet writer (pyarrow's write_dataset on threads, order not
# kept) cuts a larger block into batches of this many and may write them in any order
MAX_BATCH_ROWS = 131_072
# Ray Data's warning when the cluster's CPUs are all held at the moment a dataset starts ("The
# Dataset job will hang unless more CPUs are freed up"): on a Ray of the job's own (--ray local)
# its plan leaves its tasks CPUs, and a probe or the last job's actor holding them then is gone
# a moment later
NO_CPUS_NOW = "does not have any available CPUs"
MEMBERS_WAIT = 3.0  # seconds a failed or stopped job waits for its tally to name the model actors
HELD_MAX = 50  # Ray Data error records held for the terminal (see _held_errors)
MODEL_ENV = {"RAY_worker_niceness": "0"}  # the model actors' priority (see _model_stages)


@dataclass(frozen=True)
class RayJob:
    """What a Ray job runs: `model` over `source` into the directory `output`."""

    model: str  # a model directory at the same path on every node
    source: S.Source
    output: str
    task: str | None = None  # the registry name; None: the model directory's task
    asked: Asked = field(default_factory=Asked)
    address: str = "local"  # "local": ray.init() (RAY_ADDRESS, a cluster on this machine, else a new one)
    actors: int | None = None  # None: follow the cluster (spanflow.ray.resources)
    cpus_per_actor: float | None = None
    gpus_per_actor: float | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS  # the single-process job's chunk size (embed: --chunk-size)
    max_length: int | None = None
    stride: int | None = None
    opts: dict = field(default_factory=dict)  # for the task's arrow_results (dtype=...)
    # tokenizing as a CPU stage of its own (a model with a pretokenizer); None: where the actors
    # have GPUs. CPU actors tokenize their chunks themselves: a tokenizing process beside them
    # takes cores from their OpenMP threads, which then wait on each other (docs/ray.md)
    tokenize_apart: bool | None = None


def ray_module():
    """The ray module; a ConfigError naming the extra to install when it is missing or too old."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ConfigError("--ray needs Ray Data: pip install 'spanflow[ray]'") from None
    have = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
    if have < RAY_NEEDED:
        raise ConfigError(f"--ray needs Ray {'.'.join(map(str, RAY_NEEDED))} or later, this is Ray {ray.__version__}: "
                          "pip install -U 'spanflow[ray]'")
    return ray


@contextmanager
def connected(address: str) -> Iterator[object]:
    """Ray, joined (or started) for the job and left at its end; a Ray already up is used as it is."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    answering(address)
    import signal
    import threading

    ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        # the driver's own INFO lines ("Started a local Ray instance") off the terminal, as Ray Data's
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 logging_level=logging.WARNING)
        if ours is not None:  # ray.init puts its own in (a stack dump, exit 15): SIGTERM ends the job as Ctrl-C
            signal.signal(signal.SIGTERM, ours)
    except (ConnectionError, ValueError) as e:  # no cluster there; an address Ray cannot parse
        raise ConfigError(f"--ray {address}: cannot join the Ray cluster ({e})") from None
    except RuntimeError as e:
        if "Version mismatch" not in str(e):  # a cluster of another Ray or Python version: the user's to fix
            raise
        raise ConfigError(f"--ray {address}: {e}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


# HOST:PORT, ray://HOST:PORT, [IPv6]:PORT; a bare IPv6 address (its port not told apart) is left to Ray
_HOST_PORT = re.compile(r"^(?:ray://)?(?:\[([^\]\s]+)\]|([^:/\s\[\]]+)):(\d+)$")


def answering(address: str, timeout: float = 5.0) -> None:
    """A ConfigError at once where nothing answers at a HOST:PORT address; ray.init would retry
    it for a minute or more before saying so. Other addresses ("local", "auto") pass."""
    import socket

    m = _HOST_PORT.match(address.strip())
    if not m:
        return
    host, port = m.group(1) or m.group(2), int(m.group(3))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError(f"--ray {address}: nothing answers at {where} ({why}); is the "
                          "cluster's head up (`ray start --head`), and is this its address?") from None


def run_job(job: RayJob, *, stage=ModelStage, measure=None, log=print) -> dict:
    """Run `job`; the summary (rows, errors, seconds, rows and real tokens per second, padding
    efficiency, truncated, output, files, actors). `stage`: the actor class that runs the model
    (ModelStage, or one that wraps it); `measure`: what `--max-tokens auto` measures with
    (tuning.auto.quick_profile)."""
    began = time.perf_counter()
    src = job.source
    if not 1 <= job.batch_rows <= MAX_BATCH_ROWS:
        raise ConfigError(f"--chunk-size under --ray is a whole number from 1 to {MAX_BATCH_ROWS}, got "
                          f"{job.batch_rows}: Ray's Parquet writer keeps the order of a chunk's rows up to "
                          f"{MAX_BATCH_ROWS}")
    if not S.is_remote(src.path) and not os.path.exists(src.path):
        raise DataError("file not found", path=src.path)
    target = check_target(job.output)
    with ExitStack() as held:
        if target.local:
            hold_output(held, target.path, WHAT)  # a second job on this output stops here
        plan = _plan(job)  # the input's columns and the output's schema: checked before Ray starts
        _check_chunk_bytes(plan.schema, job.batch_rows)
        # on a cluster of others' work the warning may be true: said there, as Ray says it
        with connected(job.address) as ray, _job_context(ray), _held_errors(job.address == "local") as ray_errors:
            try:
                return _run(ray, job, plan, target, stage, measure, log, began)
            except ray.exceptions.RayError as e:
                failed = worker_error(e)
                if failed is e:
                    raise
            ray_errors.clear()  # Ray Data's tracebacks of it: its one line says what there is to say
            raise failed  # here, not in the handler: it does not carry Ray's wrapper along


def worker_error(e: BaseException) -> BaseException:
    """The SpanflowError or OSError a Ray error was caused by (its message naming the worker
    that raised it), found through Ray's wrappers; `e` itself where there is none."""
    import ray

    where, seen, todo = None, set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, ray.exceptions.RayTaskError) and where is None:
            where = _worker_of(x)
        if isinstance(x, (SpanflowError, OSError)) and not isinstance(x, ray.exceptions.RayError):
            if isinstance(x, SpanflowError) and x.args:
                # its own line only: Ray Data adds lines on its retries to the error's message
                line = str(x.args[0]).split("\n", 1)[0]
                x.args = (f"{line} (in the Ray worker {where})" if where else line,)
            return x
        todo += [getattr(x, "cause", None), x.__cause__, x.__context__]
    return e


_WORKER = re.compile(r"ray::(\S+) \(pid=(\d+), ip=([^,)]+)")  # how a RayTaskError's message names its worker


def _worker_of(e: BaseException) -> str | None:
    """"NAME, pid N on IP" of the worker a RayTaskError came from (Ray's copy of one that is
    also its cause's type keeps only the message that says so)."""
    m = _WORKER.search(re.sub(r"\x1b\[[0-9;]*m", "", str(e)))  # without its terminal colours
    return f"{m.group(1)}, pid {m.group(2)} on {m.group(3)}" if m else None


@dataclass
class _Plan:
    """What the driver settles before the cluster does any work."""

    task: object
    probe: object  # the model, loaded here on CPU: the output's schema, and the tokenizer
    pieces: list[S.Piece] | None  # the Parquet row groups the cluster reads; None: the driver's node reads
    types: object  # pyarrow.Schema of the output's id and kept columns
    schema: object  # pyarrow.Schema of the output
    total: int | None  # rows in all (Parquet: from the footers; else counted as they are read)


def _plan(job: RayJob) -> _Plan:
    from spanflow.data.tables import output_schema
    from spanflow.tasks.registry import get, task_of_dir

    task = get(job.task) if job.task else task_of_dir(job.model)
    src = job.source
    if S.is_parquet_input(src.path):  # every footer read: a column a file lacks is an error now
        pieces, types, total = S.plan_parquet(src.for_workers())
    else:
        S.check_records(src)
        pieces, types, total = None, S.driver_types(src), None
    probe = task.load(job.model, device="cpu", precision="fp32")
    probe.set_max_length(job.max_length, job.stride)
    schema = output_schema(probe, types, **job.opts)  # a kept column named like a result column: refused now
    return _Plan(task, probe, pieces, types, schema, total)


def _run(ray, job: RayJob, plan: _Plan, target, stage, measure, log, began: float) -> dict:
    from spanflow.runtime.precision import SAMPLE

    actors = plan_actors([n["Resources"] for n in ray.nodes() if n["Alive"]], count=job.actors,
                         cpus=job.cpus_per_actor, gpus=job.gpus_per_actor, device=job.asked.device)
    if not actors.gpus and job.asked.device == "auto":
        log("ray: no GPU in the Ray cluster now: the model runs in CPU actors (--device cuda with "
            "--ray-gpus-per-actor 1 --ray-actors N waits for GPU nodes instead)")
    src = job.source.for_workers()
    sample = S.sample_texts(src, plan.pieces, SAMPLE)
    asked = _settle_budget(ray, job, plan, actors, sample, measure, log)
    tally = ray.remote(num_cpus=0)(Tally).remote()
    spec = StageSpec(task=plan.task.name, model=os.path.abspath(job.model), asked=asked, types=plan.types,
                     threads=actors.threads, sample=sample, max_length=job.max_length, stride=job.stride,
                     opts=dict(job.opts), tally=tally)
    try:
        return _pipeline(ray, job, plan, target, stage, spec, actors, src, log, began)
    except BaseException:
        # Ray Data lets a failed pipeline's actors go only once nothing holds it (the error's
        # frames hold it: a notebook's last traceback, a test's captured logs), and until then
        # they keep their CPUs and GPUs: a next job would wait for them
        for actor in _members(ray, tally):
            ray.kill(actor)
        raise
    finally:
        ray.kill(tally)


def _members(ray, tally) -> list:
    """The job's model actors, as the tally knows them; none where it does not answer within
    MEMBERS_WAIT seconds: a SIGTERM to the process group (timeout, a scheduler's kill) ends a
    local Ray's own processes too, and a wait on them would hold the job's stop for a minute."""
    try:
        return ray.get(tally.members.remote(), timeout=MEMBERS_WAIT)
    except ray.exceptions.RayError:  # GetTimeoutError too: the actors went with their cluster
        return []


def _pipeline(ray, job: RayJob, plan: _Plan, target, stage, spec: StageSpec, actors: Actors, src: S.Source,
              log, began: float) -> dict:
    """Read, tokenize, chunk, run and write; the summary, once the output is in place."""
    apart = job.tokenize_apart if job.tokenize_apart is not None else bool(actors.gpus)
    pre = plan.probe.pretokenizer() if apart and callable(getattr(plan.probe, "pretokenizer", None)) else None
    log(f"ray: {'%d rows' % plan.total if plan.total is not None else 'input read on this node'}, chunks of "
        f"{job.batch_rows}, {actors.describe()}, tokenizing {'in CPU tasks' if pre else 'in the model actors'}")
    t0 = time.perf_counter()
    with staged(target) as where:
        ds = _read(ray, plan, src, job.batch_rows)
        if ds is not None:
            ds = _model_stages(ray, ds, pre, stage, spec, actors, job.batch_rows)
            ds.write_parquet(where, filename_provider=part_names(), ray_remote_args={"num_cpus": TASK_CPUS})
        got, figures = written(where), ray.get(spec.tally.total.remote())
        total = plan.total if plan.total is not None else figures["rows"]
        if got["rows"] != total:
            raise ConfigError(f"{total} rows read but {got['rows']} written under {job.output}: is it on a file "
                              "system that every node of the cluster shares (or an object store URI)?")
        if not got["files"]:  # an empty input: one file with the schema, as the single-process job writes
            write_empty(where, plan.schema)
            got = written(where)
        summary = _summary(got, figures, time.perf_counter() - t0, t0 - began, spec.asked, actors, job)
        write_manifest(where, {**{k: v for k, v in summary.items() if k != "output"}, "task": plan.task.name,
                               "model": os.path.abspath(job.model), "input": _where(job.source.path)})
    return summary


def _summary(got: dict, figures: dict, secs: float, startup: float, asked: Asked, actors: Actors,
             job: RayJob) -> dict:
    """What the job did: rows from the files; tokens and truncation from the actors' tally.
    `seconds` is the pipeline's (actors starting and loading the model included);
    `startup_seconds` what came before it (Ray started or joined, the plan, the budget)."""
    real, padded = figures["real_tokens"], figures["padded_tokens"]
    secs = max(secs, 1e-9)
    return {**got, "seconds": secs, "startup_seconds": startup, "rows_per_s": got["rows"] / secs,
            "real_tokens": real, "padded_tokens": padded, "real_tokens_per_s": real / secs,
            "padding_efficiency": real / padded if padded else None, "truncated": figures["truncated"],
            "max_tokens": figures["max_tokens"] if figures.get("max_tokens") is not None else _number(asked.max_tokens),
            "output": job.output, "actors": actors.describe()}


def _check_chunk_bytes(schema, rows: int) -> None:
    """A ConfigError, before any work, where the output's fixed-width columns alone (vectors) make
    a chunk Ray Data would cut into blocks, whose order its Parquet writer does not keep."""
    from spanflow.ray.stages import block_limit

    width = sum(_fixed_bytes(f.type) for f in schema)
    limit = block_limit()
    if limit and width and rows * width >= limit:
        most = max(1, math.ceil(limit / width) - 1)
        raise ConfigError(f"--chunk-size {rows}: a chunk's output would be {rows * width / 2**20:.0f} MiB of "
                          f"vectors, over the {limit / 2**20:.0f} MiB Ray Data keeps in one block (and so in order "
                          f"in its file): give --chunk-size {most} or less")


def _fixed_bytes(t) -> int:
    """Bytes a row of an Arrow type takes where it is fixed (a fixed-size list of numbers, a number); else 0."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(t):
        return t.list_size * _fixed_bytes(t.value_type)
    return t.bit_width // 8 if pa.types.is_integer(t) or pa.types.is_floating(t) else 0


def _number(budget) -> int | None:
    """A budget as the manifest keeps it: the number a flag gave (as text or not), or None ("auto", unset)."""
    if isinstance(budget, int):
        return budget
    return int(budget) if isinstance(budget, str) and budget.isdigit() else None


def _where(path: str) -> str:
    """A path as the manifest keeps it: absolute, to be read from anywhere later (a URI as given)."""
    return path if S.is_remote(path) else os.path.abspath(path)


def _actor_asked(asked: Asked, task) -> Asked:
    """The runtime flags as each actor resolves them: its GPU is its cuda:0, and a --profile
    (a file on this machine) is read here, its token budget passed on unless --max-tokens gives
    a number, which wins, as everywhere."""
    if asked.profile:
        from spanflow.runtime.files import read_profile

        best = read_profile(asked.profile, task=task.name, mode="infer").best.max_tokens
        keep = asked.max_tokens not in (None, "auto")
        asked = dataclasses.replace(asked, max_tokens=asked.max_tokens if keep else best, profile=None)
    return dataclasses.replace(asked, device="cuda" if asked.device.startswith("cuda") else asked.device)


def _settle_budget(ray, job: RayJob, plan: _Plan, actors: Actors, sample: list, measure, log) -> Asked:
    """The runtime every actor is asked for; `--max-tokens auto` measured once, by a task with a
    model actor's resources (on the node and device an actor would have), for all of them."""
    asked = _actor_asked(job.asked, plan.task)
    if asked.max_tokens != "auto":
        return asked
    if not sample:
        log("ray: max_tokens auto: no input text to measure on; the default for the actors' device")
        return dataclasses.replace(asked, max_tokens=None)
    probe = ray.remote(num_cpus=actors.cpus, num_gpus=actors.gpus, max_calls=1)(measured_budget)
    n = ray.get(probe.remote(plan.task.name, os.path.abspath(job.model), asked, sample, measure))
    log(f"ray: max_tokens {n}, settled once for every actor")
    return dataclasses.replace(asked, max_tokens=n)


def _read(ray, plan: _Plan, src: S.Source, rows: int):
    """The read stage: tasks over the Parquet row groups, or one task on this node for an input
    only it can open; None for a Parquet input with no rows."""
    if plan.pieces is not None:
        if not plan.total:
            return None
        tasks = S.pack(plan.pieces, rows)
        items = [{"task": k} for k in range(len(tasks))]
        return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            S.read_task, batch_size=1, batch_format="pyarrow",
            fn_kwargs={"tasks": tasks, "src": src, "types": plan.types})
    # no CPU reserved: it must run on this node whatever the actors hold there, and the
    # tokenizing after it, of other resources, is not fused into it but spread over the cluster
    here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()}
    return ray.data.from_items([{"task": 0}]).map_batches(
        S.read_records, batch_size=1, batch_format="pyarrow", fn_kwargs={"src": src, "rows": rows, "types": plan.types},
        num_cpus=0, label_selector=here)


def _model_stages(ray, ds, pre, stage, spec: StageSpec, actors: Actors, rows: int):
    """The tokenizing stage (where `pre` is given), the chunks, and the model actors, after `ds`."""
    if pre is not None:
        ds = ds.map_batches(tokenize, batch_format="pyarrow", fn_kwargs={"pre": pre}, num_cpus=TASK_CPUS)
    # blocks of exactly `rows` rows from the first (the last one shorter): each one chunk of
    # the single-process job, and one model call (batch_size) below
    ds = ds.repartition(target_num_rows_per_block=rows, strict=True)
    pool = ray.data.ActorPoolStrategy(min_size=1, max_size=actors.count, initial_size=actors.initial)
    # Ray runs its workers at nice 15 and itself (and this driver) at 0: on a busy CPU node any
    # of its own wake-ups would preempt one of the model's threads and stall the rest of its
    # team; the model actors run at Ray's priority instead, the reading and writing stay below
    return ds.map_batches(stage, fn_constructor_kwargs={"spec": spec}, batch_size=rows, batch_format="pyarrow",
                          compute=pool, num_cpus=actors.cpus, num_gpus=actors.gpus or None,
                          runtime_env={"env_vars": dict(MODEL_ENV)})


class _Held(list):
    """Error records, the first HELD_MAX of them; past that only counted: a job failing and
    retrying for hours keeps little. Each terminal handler asks about the same record: kept once."""

    more, last = 0, None  # last: the record the handlers are asked about now

    def keep(self, record: logging.LogRecord) -> None:
        if record is self.last:
            return
        self.last = record
        if len(self) < HELD_MAX:
            self.append(record)
        else:
            self.more += 1

    def clear(self) -> None:
        super().clear()
        self.more = 0


@contextmanager
def _held_errors(quiet_cpus: bool = True) -> Iterator[list]:
    """Ray Data's error records for the terminal, held back while the job runs and printed at
    its end, unless the caller clears what it is given: a job failing with a SpanflowError
    or an OSError raises it as itself, and Ray Data's tracebacks of it (one calling it "internal
    code" that should be reported to Ray) would bury its one line. Its INFO records (the plan,
    the progress every few seconds: 30 lines for a job of seconds) stay off the terminal, whose
    job lines are the actors' and the summary. Its log file keeps them all."""
    held = _Held()

    class Hold(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno < logging.ERROR:
                return record.levelno >= logging.WARNING and not (quiet_cpus and NO_CPUS_NOW in record.getMessage())
            held.keep(record)
            return False

    hold = Hold()
    logger = logging.getLogger("ray.data")
    terminal = [h for h in logger.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    for h in terminal:
        h.addFilter(hold)
    try:
        yield held
    finally:
        for h in terminal:
            h.removeFilter(hold)
        if held and held.more:
            held.append(logging.makeLogRecord({"name": logger.name, "levelno": logging.ERROR, "levelname": "ERROR",
                                               "msg": f"... and {held.more} more error records (Ray Data's log "
                                                      "file has them)"}))
        for record in held:
            for h in terminal:
                h.handle(record)


@contextmanager
def _job_context(ray) -> Iterator[None]:
    """Datasets made in the block keep input order, and a worker's error is raised as itself,
    not wrapped in Ray Data's UserCodeException (whose message has only its traceback); a
    dataset copies the context it is made in."""
    ctx = ray.data.DataContext.get_current()
    was = ctx.execution_options.preserve_order, ctx.raise_original_map_exception
    ctx.execution_options.preserve_order, ctx.raise_original_map_exception = True, True
    try:
        yield
    finally:
        ctx.execution_options.preserve_order, ctx.raise_original_map_exception = was
