"""`spanflow tune` as a function: sweep, pick, write profile.json (+ plot)."""
from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import time
from collections.abc import Callable

from spanflow.atomic import make_dirs
from spanflow.batching.align import MIN_LENGTH
from spanflow.batching.batcher import token_budget_batches
from spanflow.errors import ConfigError, ModelDirError, as_log, counted, quote
from spanflow.runtime.cache import cpu_description, device_name
from spanflow.runtime.files import write_profile
from spanflow.runtime.policy import resolve_policy
from spanflow.runtime.resolve import Asked, resolve_runtime
from spanflow.tuning.measures import measure_of
from spanflow.tuning.sweep import (QUALITY_TOLERANCE, eligible, geometric, is_oom, pick_best, quality_floor, sweep,
                                   within_noise)
from spanflow.tuning.timing import BACKEND_REPEATS, TimeBudget, compile_fits, plan_time

MODES = ("train", "infer")


class NoBestPoint(ConfigError):
    """A sweep in which no point met the limits; `reason` says which, and the closest measured."""

    def __init__(self, reason: str, path: str):
        super().__init__(f"{reason}; {path} not written")
        self.reason = reason


def tune(*, task: str, model: str, data: str, mode: str | None = None, max_lengths: list[int] | None = None,
         budgets: list[int] | None = None, max_memory_gb: float | None = None, latency_slo_ms: float | None = None,
         budget_seconds: float = 120, sample: int = 512, precision: str = "auto", quantize: str | None = None,
         force: bool = False, device: str = "auto", out: str | None = None, field: str = "text",
         column: int | None = None, plot: bool = True, repeats: int = 2, backends: bool = True,
         log_fn: Callable[[str], None] | None = print, started: float | None = None, texts: list[str] | None = None,
         clock: Callable[[], float] = time.perf_counter) -> dict:
    """Measure, choose the best point, write `<out>/profile.json`; return the profile.
    `mode` None: infer for a trained model of `task` (what the commands that run it will run),
    else the task's first tune mode (train, or infer for a task that does not train). Device, precision and
    quantization are resolved first, as the command that runs the model resolves them
    (runtime/resolve.py): the profile is measured in what inference will run. In infer mode
    with `backends`, also the encoder compiled against eager at the best point
    (inference.backend.compare_backends): what `serve --profile` runs with `--backend auto`.
    `budget_seconds` holds all of it from `started` (time.time(); None: now), as tuning/timing.py
    says: the sweep's runs get what the set-up leaves. `texts` (infer mode): the sample to measure
    on instead of reading `data`, for a command whose input holds texts only (no quality column).
    `clock` reads every time the budget holds: the set-up, each run's steps, the deadline."""
    from spanflow.tasks.registry import check_model_for, get

    check_types(max_lengths=max_lengths, budgets=budgets, sample=sample, repeats=repeats,
                budget_seconds=budget_seconds, max_memory_gb=max_memory_gb, latency_slo_ms=latency_slo_ms)
    log_fn = as_log(log_fn)  # None: quiet, as the train functions take it
    now = clock()  # `started` is a wall-clock reading (the process's start), put on `clock`
    budget = TimeBudget(budget_seconds, now if started is None else now - (time.time() - started), clock=clock)

    t = get(task)  # a task that tunes only some modes says which (tune_modes); the first is the default
    modes = getattr(t, "tune_modes", ("train", "infer") if t.trains else ("infer",))
    if mode is None:
        _check_own_task(model, task)
    mode = mode or ("infer" if "infer" in modes and _trained(model, task) else modes[0])
    if mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}")
    short = [L for L in max_lengths or () if L < MIN_LENGTH]
    if short:
        raise ConfigError(f"--max-lengths must each be >= {MIN_LENGTH}, got {', '.join(map(str, short))}")
    check_ranges(budgets=budgets, sample=sample, repeats=repeats, budget_seconds=budget_seconds,
                 max_memory_gb=max_memory_gb, latency_slo_ms=latency_slo_ms)
    if quantize and mode == "train":  # training updates fp32 weights: there is no quantized training to measure
        raise ConfigError(f"--quantize {quantize} is for inference (--mode infer); training runs in a precision "
                          "(--precision)")
    check_model_for(model, task, start=mode == "train")  # before any model loads
    if out:  # a file in the way, or a directory this process cannot write, is told now, not after the sweep
        make_dirs(out)
        if not os.access(out, os.W_OK | os.X_OK):
            raise ConfigError(f"--out {out}: not writable by this user")
    from spanflow.data.io import check_output_file

    # a directory of that name would stop the write after the sweep: told now
    for name in ("profile.json", "profile.png")[:2 if plot else 1]:
        check_output_file(os.path.join(out or ".", name))
    rt = resolve_runtime(get(task), model, Asked(device=device, precision=precision, quantize=quantize, force=force),
                         job="train" if mode == "train" else "infer", sweeps=True, log=log_fn)
    policy = resolve_policy(rt.precision, rt.device)
    extra = {"quantize": rt.quantize} if rt.quantize else {}  # only tasks that quantize take it
    if texts is not None and mode == "infer":
        extra["texts"] = texts
    w = get(task).workload(model, data, mode=mode, policy=policy, precision=rt.precision, sample=sample, field=field,
                           column=column, **extra)
    w.items_at = functools.lru_cache(maxsize=None)(w.items_at)  # tokenized once a length: here and in measure
    measure, limit = measure_of(w, mode=mode, policy=policy, clock=clock), w.limit
    long = [L for L in max_lengths or () if L > limit]
    if long:  # measured at the limit instead, the profile would name a length no run can take
        raise ConfigError(f"--max-lengths must each be at most the model's limit {limit}, got "
                          f"{', '.join(map(str, long))}")
    if max_lengths:
        lengths = sorted(set(max_lengths))
    elif mode == "train" and w.length is None:  # training reads each text whole up to the limit: the longest
        lengths = [max((len(x) for x in w.items_at(limit)), default=limit)]  # of the sample bounds a batch
    else:
        lengths = [min(w.length or limit, limit)]
    lo = max(256, min(lengths))  # a long-context encoder's one sequence may exceed the usual top budget
    top = 16384 if policy.device.type == "cpu" else 262144
    budgets = sorted(set(budgets)) if budgets else geometric(lo, max(lo, top))  # a budget given twice is one point
    below = [b for b in budgets if b < lengths[0]]  # one whole sequence must fit a batch
    if len(below) == len(budgets):
        raise ConfigError(f"--budgets {','.join(map(str, budgets))}: each is below the max length {lengths[0]}, and "
                          f"a batch holds at least one whole sequence; give budgets of {lengths[0]} or more")
    if below:
        log_fn(f"budgets below the max length {lengths[0]} are not measured: {', '.join(map(str, below))}")
    items = w.items_at(lengths[-1])  # at the longest length swept: the largest batches
    # the first budget whose batches (as the sweep makes them) are the whole sample in one: each larger
    # one runs that same batch, and its speed would differ by noise alone
    one = next((b for b in budgets if _one_batch_tokens(items, b, mode)), None)
    if one is not None and one < budgets[-1]:
        log_fn(f"budgets above {one} run the whole sample in one batch, as {one} does: not measured: "
               f"{', '.join(str(b) for b in budgets if b > one)} (a larger --sample, or more data, measures them)")
        budgets = [b for b in budgets if b <= one]

    # the runtime line above said why this precision; a policy rebuilt from its name would say "as asked"
    log_fn(f"tuning {task} {mode} on {counted(len(items), 'input')} of {data} (its first {sample} texts at most), "
           f"{dataclasses.replace(policy, why='').describe(training=mode == 'train')}")
    _warm_up(measure, w, budgets, lengths, mode, log_fn)
    runs = sum(b >= L for L in lengths for b in budgets) * max(1, repeats)
    plan = plan_time(budget, runs, compare=mode == "infer" and backends, log=log_fn)
    points = sweep(lambda b, L: measure(b, L, plan.per_run), budgets, lengths, log_fn=log_fn, repeats=repeats,
                   deadline=plan.deadline, per_run=plan.per_run, clock=clock)
    limits = {"max_memory_bytes": int(max_memory_gb * 2**30) if max_memory_gb else None,
              "latency_slo_ms": latency_slo_ms, "min_quality": quality_floor(points)}
    best = pick_best(points, **limits)
    where = os.path.realpath(model) if os.path.exists(model) else model  # a run from elsewhere reads it the same
    profile = {"device": device_name(policy.device),
               "cpu": cpu_description() if policy.device.type == "cpu" else None, "model": where, "task": task, "mode": mode,
               "precision": policy.name, "quantize": rt.quantize,
               "limits": {"max_memory_gb": max_memory_gb, "latency_slo_ms": latency_slo_ms},
               "best": best.to_dict() if best else None, "points": [p.to_dict() for p in points]}
    if best and plan.compare and compile_fits(budget, log_fn):
        from spanflow.inference.backend import compare_backends

        profile["backend"] = compare_backends(w.module, lambda: measure(best.max_tokens, best.max_length,
                                                                        plan.per_run), log_fn,
                                              repeats=BACKEND_REPEATS)
    out_dir = out or "."
    path = os.path.join(out_dir, "profile.json")
    log_fn(format_table(profile))
    if best is None:  # a profile no command can run: an earlier one at `path` stays
        raise NoBestPoint(_missed(points, max_memory_gb, latency_slo_ms), path)
    png, failed = None, None
    if plot:  # drawn before the profile is written: a stop while it draws leaves the earlier pair as it was
        from spanflow.tuning.plot import plot_profile

        try:
            png = plot_profile(profile, os.path.join(out_dir, "profile.png"))
        except Exception as e:  # noqa: BLE001 - a picture that cannot be drawn (or saved) costs no profile
            failed = f"{type(e).__name__}: {str(e)[:200]}"
    write_profile(path, profile)
    once = [p for p in eligible(points, **limits) if p.spread is None]
    if once:  # no spread to tell noise by: the best among them may be the luckiest run
        why = "--repeats 1" if repeats <= 1 else "the --budget-seconds held no second run"
        log_fn(f"note: {counted(len(once), 'point')} measured once ({why}) carry no spread: their speeds may differ "
               "by noise alone; --repeats 2 or more, with the --budget-seconds to hold them, measures each point again")
    near = within_noise(best, eligible(points, **limits))
    if near:
        log_fn(f"within noise: {_named(near, len(lengths) > 1)}, whose runs reach the best's (or its spread): "
               f"these runs do not tell them apart in speed (--repeats {2 * max(1, repeats)} measures each point "
               "more times, with the --budget-seconds to hold them)")
    held = _one_batch_tokens(w.items_at(best.max_length), best.max_tokens, mode)
    if held and best.max_tokens > 2 * held:  # what this sample measured says little of batches that much larger
        log_fn(f"note: max_tokens {best.max_tokens} ran the whole sample in one batch of {held} padded tokens: on more "
               f"data its batches grow toward {best.max_tokens}, whose speed and memory were not measured (a larger "
               "--sample measures them)")
    if any(p.quality is not None for p in points):
        log_fn(f"quality: {w.quality_means}, read at that max length; a shorter length is picked for speed "
               f"only within {QUALITY_TOLERANCE} of the best")
    log_fn(f"profile: {path}; run it with --profile {path} ("
           + ("spanflow train" if mode == "train" else "the commands that run this model: "
              f"{', '.join(dict.fromkeys((getattr(t, 'bulk_command', 'predict'), 'predict')))}, evaluate, serve") + ")")
    # a profile sets the token budget only: the length swept for is the command's to give, where it is
    # not what the command reads anyway (the model's own length, else the encoder's limit)
    if max_lengths and best.max_length != min(w.length or limit, limit):
        log_fn(f"the best point reads {best.max_length} tokens a text: add --max-length {best.max_length} to that "
               "command (the profile sets the token budget only)"
               + ("; serve reads the model's own length" if mode != "train" else ""))
    if plot:
        log_fn(f"plot: {png}" if png else f"plot failed ({failed}); the profile is written" if failed
               else "plot skipped: install matplotlib (pip install 'spanflow[plot]')")
    log_fn(f"tune took {budget.spent():.1f} s of --budget-seconds {budget_seconds:g}")
    return profile


def _one_batch_tokens(items, max_tokens: int, mode: str) -> int | None:
    """The padded tokens (longest x count) of the sample's one batch where `max_tokens` makes the
    whole sample one batch, as the sweep batches it; else None."""
    sizes = [len(x) for x in items]
    if not sizes or len(token_budget_batches(sizes, max_tokens, shuffle=mode == "train")) != 1:
        return None
    return max(sizes) * len(sizes)


def check_types(**values) -> None:
    """A ConfigError naming an argument of the wrong type: lists of whole numbers (`max_lengths`,
    `budgets`), whole numbers (`sample`, `repeats`), numbers (the rest; None where unset)."""
    for name, v in values.items():
        if name in ("max_lengths", "budgets"):
            ok = v is None or (isinstance(v, (list, tuple)) and all(_whole(x) for x in v))
            want = "a list of whole numbers"
        elif name in ("sample", "repeats"):
            ok, want = _whole(v), "a whole number"
        else:
            ok = (v is None and name != "budget_seconds") or (isinstance(v, numbers.Real) and not isinstance(v, bool))
            want = "a number"
        if not ok:
            raise ConfigError(f"{name} takes {want}, got {type(v).__name__} {quote(v, 40)}", field=name)


def _whole(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_ranges(*, budgets: list[int] | None, sample: int, repeats: int, budget_seconds: float,
                 max_memory_gb: float | None, latency_slo_ms: float | None) -> None:
    """A ConfigError for a value tune cannot measure with, before any model loads."""
    bad = [f"--budgets must each be >= 1, got {','.join(map(str, budgets))}" if budgets and min(budgets) < 1 else "",
           f"--sample must be >= 1, got {sample}" if sample < 1 else "",
           f"--repeats must be >= 1, got {repeats}" if repeats < 1 else "",
           f"--budget-seconds must be > 0, got {budget_seconds:g}" if not budget_seconds > 0 else "",
           f"--max-memory must be > 0 GiB, got {max_memory_gb:g}" if max_memory_gb is not None
           and not max_memory_gb > 0 else "",
           f"--latency-slo must be > 0 ms, got {latency_slo_ms:g}" if latency_slo_ms is not None
           and not latency_slo_ms > 0 else ""]
    if any(bad):
        raise ConfigError(next(b for b in bad if b))


def _missed(points: list, max_memory_gb: float | None, latency_slo_ms: float | None) -> str:
    """Why no point was picked: the limits, and the best each measured point came to."""
    ran = [p for p in points if not p.oom]
    if not ran:
        return "no point ran: each was out of memory"
    if pick_best(ran, max_memory_bytes=int(max_memory_gb * 2**30) if max_memory_gb else None,
                 latency_slo_ms=latency_slo_ms):  # within the limits, but not the quality
        return f"no point within the limits kept the quality within {QUALITY_TOLERANCE} of the best"
    limits = [f"--max-memory {max_memory_gb:g} GiB (the least used: {min(p.peak_memory_bytes for p in ran) / 2**30:.2f}"
              " GiB)" if max_memory_gb else "",
              f"--latency-slo {latency_slo_ms:g} ms (the lowest p95: {min(p.latency_p95_ms for p in ran):.1f} ms)"
              if latency_slo_ms else ""]
    return "no point met " + " and ".join(x for x in limits if x)


def trained_task(path: str) -> str | None:
    """The task of the trained model at `path` (its own spanflow.json's, or a classifier from elsewhere
    a task claims); None for an encoder to train from, or 'tiny'. A path that holds no model is
    registry.task_of_dir's ModelDirError."""
    from spanflow.tasks.registry import ENCODER_TASK, task_of_dir

    if path == "tiny":
        return None
    held = task_of_dir(path, start=True)
    return held.name if held.name != ENCODER_TASK or os.path.exists(os.path.join(path, "spanflow.json")) else None


def _check_own_task(path: str, task: str) -> None:
    """A spanflow model of another task, without --mode: tuned as its own task, or training `task` from
    its encoder is meant; either way not the training from it the model check would speak of."""
    try:
        held = trained_task(path) if os.path.isfile(os.path.join(path, "spanflow.json")) else None
    except ModelDirError:
        return  # the model check says why
    if held and held != task:
        raise ModelDirError(f"{path} is a model of task {held!r} (its spanflow.json says so), not {task!r}: tune "
                            f"measures it as {held!r} (--task {held}, or no --task); --model "
                            f"{os.path.join(path, 'encoder')} --mode train measures training {task!r} from its "
                            "encoder")


def _trained(path: str, task: str) -> bool:
    """Whether `path` holds a trained model of `task`; False where it holds no model (the model check
    says why)."""
    try:
        return os.path.isdir(path) and trained_task(path) == task
    except ModelDirError:
        return False


def _warm_up(measure, w, budgets: list[int], lengths: list[int], mode: str, log_fn: Callable[[str], None]) -> None:
    """One discarded run first (the first kernels of a process are slow to start), and inferring,
    the quality at each length (once per length, whatever the budget): both before the sweep's
    time is shared out, so that its runs are all alike."""
    fitting = [b for b in budgets if b >= lengths[0]]
    if fitting:
        try:
            measure(min(fitting), lengths[0], 0.5)
        except Exception as e:  # noqa: BLE001 - out of memory is for the sweep to record; the rest re-raises
            if not is_oom(e):
                raise
            log_fn(f"warm-up ran out of memory at max_tokens {min(fitting)}; the sweep will record it")
    if mode == "infer" and w.quality:
        for L in lengths:
            w.quality(L)


def _named(points: list, lengths: bool) -> str:
    return ", ".join(f"max_tokens {p.max_tokens}" + (f" at max_length {p.max_length}" if lengths else "")
                     + f" ({p.real_tokens_per_s:.0f} tok/s)" for p in points)


def format_table(profile: dict) -> str:
    rows = [f"{'max_tokens':>10} {'max_len':>7} {'real tok/s':>10} {'spread':>6} {'pad eff':>7} {'p50 ms':>8} "
            f"{'p95 ms':>8} {'peak MiB':>9} {'quality':>8}"]
    best = profile.get("best") or {}
    for p in profile["points"]:
        mark = " <- best" if (p["max_tokens"], p["max_length"]) == (best.get("max_tokens"), best.get("max_length")) else ""
        if p["oom"]:
            rows.append(f"{p['max_tokens']:>10} {p['max_length']:>7} {'out of memory':>10}")
            continue
        q = f"{p['quality']:.4f}" if p["quality"] is not None else "-"
        spread = f"{p['spread']:.0%}" if p.get("spread") is not None else "-"
        rows.append(f"{p['max_tokens']:>10} {p['max_length']:>7} {p['real_tokens_per_s']:>10.0f} {spread:>6} "
                    f"{p['padding_efficiency']:>7.3f} {p['latency_p50_ms']:>8.1f} {p['latency_p95_ms']:>8.1f} "
                    f"{p['peak_memory_bytes'] / 2**20:>9.0f} {q:>8}{mark}")
    return "\n".join(rows)
