"""The training loop every task reuses: token-budget batches, accumulation, precision,
clipping, warmup + linear decay, evaluation, early stopping, checkpoints and reports."""
from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from spanflow.atomic import atomic_open, recover_dir, writing
from spanflow.errors import DataError, PeerFailed, counted
from spanflow.batching.prefetch import prefetch
from spanflow.monitor.report import Meter, measure_peak, mfu_precision, train_flops_per_token
from spanflow.training.checkpoint import (check_checkpoint, has_checkpoint, load_checkpoint, run_identity,
                                          save_checkpoint)
from spanflow.training.distributed import Dist, all_sum, broadcast, gather, in_turn, on_main, wrap_ddp
from spanflow.training.optim import build_optimizer, sparse_tables, warmup_linear
from spanflow.training.plan import epoch_plan
from spanflow.training.row_adamw import catch_up, paid
from spanflow.training.options import TrainOptions
from spanflow.training.progress import (check_finite, check_logged_loss, elapsed_left, learning_check, loss_window,
                                        lr_now, progress_bar, report_period, window_loss)
from spanflow.runtime import stops
from spanflow.runtime.policy import Policy
from spanflow.training.report_to import Reporters, build_reporters, dev_scalars, drop_curves
from spanflow.training.resume import (check_epochs_left, check_resume_agrees, check_steps_left, resumed_at,
                                      trim_report)
from spanflow.training.state import LoopState, TaskHooks
from spanflow.training.step import forward_backward, optimizer_step


def train_loop(model: nn.Module, items: list, hooks: TaskHooks, *, opts: TrainOptions, policy: Policy,
               out_dir: str, log: Callable[[str], None] = print, dist: Dist = Dist(),
               plan_world: int | None = None, weights: list[float] | None = None, origin: str | None = None) -> dict:
    """Train `model` on `items` (windows with len()); return a summary with the best dev F1.

    Under torchrun (`dist.world > 1`) the model runs in DDP; rank 0 alone evaluates and
    writes checkpoints, reports and models. `plan_world` (tests) plans batches for that
    many ranks while running as one process, to check DDP against single-process training.
    `weights` (one per item) turn on weighted sampling of each epoch's items. `origin`: the model
    the run started from, as given; a checkpoint records it, and a resume of another is refused.
    `opts.report_to` also sends the run's options, its scalars (loss and lr per logged step,
    dev metrics per evaluation, the throughput report per epoch) and the best dev F1 to
    TensorBoard / MLflow (training/report_to.py says where, and what a resumed run does).
    """
    world = plan_world or dist.world
    lengths = [len(it) for it in items]
    targets = [hooks.targets(it) for it in items] if hooks.targets else None
    per_epoch = [len(epoch_plan(lengths, opts, e, world, weights, hooks.min_update)) for e in range(opts.epochs)]
    r = _start(model, items, hooks, opts=opts, policy=policy, out_dir=out_dir, log=log, dist=dist,
               total_steps=sum(per_epoch), origin=origin)
    r.recent = deque(maxlen=loss_window(opts.log_every, per_epoch[0] if per_epoch else 1))
    # a resume: the loss window as the stop left it (a checkpoint of an earlier version kept it only
    # before the learning check's first window filled), so step and epoch lines read as an unbroken run's
    for v in r.st.pop("window", None) or r.st.pop("first_window", None) or []:
        r.recent.append(torch.tensor(v if dist.is_main else 0.0, device=policy.device))  # each rank holds a share
    summed, r.n_running = r.st.pop("running", None) or (0.0, 0)  # the next step line's steps before the stop
    r.running += summed if dist.is_main else 0.0
    model.train()
    r.clock = (time.perf_counter(), r.st["global_step"])
    r.bar = progress_bar(r)
    final = None  # the summary the reporters close with; None when training failed
    try:
        while r.st["epoch"] < opts.epochs and not r.st["stopped"]:
            epoch = r.st["epoch"]
            plan = epoch_plan(lengths, opts, epoch, world, weights, hooks.min_update)[r.st["step_in_epoch"]:]
            mine, stride = (dist.rank, dist.world) if plan_world is None else (0, 1)
            groups = (_collate_step(step[mine::stride], sum(targets[i] for mb in step for i in mb) if targets
                                    else None, items, hooks.collate, pin=policy.device.type == "cuda")
                      for step in plan)
            if not _run_steps(r, groups, epoch, per_epoch[epoch]):
                catch_up(r.optimizer)  # the model handed back holds every update its rows were owed
                final = _summary(r, completed=False)
                return final
            rep = _close_period(r.meter, dist)  # the next period's clock leaves this evaluation out
            check_finite(r)  # a diverged run ends here, before its weights are evaluated or checkpointed
            if r.st["stopped"] and r.st["step_in_epoch"] < per_epoch[epoch]:
                # an --eval-every evaluation stopped the run mid-epoch: the epoch is not done, and a
                # resume with more patience runs its remaining steps
                with r.meter.excluded():
                    report_period(r, epoch, rep, r.st.get("last_f1"), partial=True, early_stop=True)
                    learning_check(r, r.st.get("last_f1"), left=0, stopped=True)  # the run ends here
                    _checkpoint(r)
                break
            f1 = _evaluate(r) if opts.eval_every is None else r.st.get("last_f1")
            with r.meter.excluded():  # and the epoch's report and checkpoint
                report_period(r, epoch, rep, f1)
                # --patience may have ended the run at this evaluation: then no epochs are left to learn in
                learning_check(r, f1, left=0 if r.st["stopped"] else opts.epochs - epoch - 1, stopped=r.st["stopped"])
                r.st["epoch"], r.st["step_in_epoch"] = epoch + 1, 0
                _checkpoint(r)
            if plan and r.st["global_step"] == opts.max_steps and r.st["epoch"] < opts.epochs and not r.st["stopped"]:
                # --max-steps at an epoch's last step, trained by this run (a resume from there with the same
                # --max-steps trains on): the epoch closed as any does (evaluated, reported, checkpointed),
                # then the run stops, epochs left
                catch_up(r.optimizer)
                final = {**_summary(r, completed=False), "epoch": r.st["epoch"]}
                return final
        if (opts.eval_every and hooks.evaluate is not None and r.st.get("last_eval_step") != r.st["global_step"]
                and not r.st["stopped"]):
            f1 = _evaluate(r)  # the steps after the last --eval-every (all of them, in a run shorter than it)
            if f1 is not None:  # rank 0's (the others' log says nothing)
                r.log(f"step {r.st['global_step']} (the last): dev {hooks.metric} {f1:.4f}")
            _checkpoint(r)  # a resume with more epochs starts from what this evaluation kept
        catch_up(r.optimizer)  # the model handed back holds every update its rows were owed
        final = _summary(r, completed=True)
    finally:
        sparse_tables(model, policy.device, enable=False)  # the model handed back trains with any optimizer
        r.meter.close()
        r.reporters.close(final)
        if r.bar is not None:
            r.bar.close()
    # stopped at the last epoch's end: the run simply ended; inside it (--eval-every), steps were left
    if r.st["stopped"] and r.st["epoch"] < opts.epochs:
        where = (f"epoch {r.st['epoch']}" if not r.st["step_in_epoch"]
                 else f"step {r.st['global_step']} (epoch {r.st['epoch'] + 1})")
        # the evaluations without gain (a resume under a smaller --patience may count more than it)
        log(f"early stop after {where}: dev {hooks.metric} did not improve for "
            f"{counted(r.st['bad_evals'], 'evaluation')} (--patience {opts.patience})")
    if final["best_f1"] is None:  # no dev score picked a model (no --dev, or a finished run resumed): the last
        with _spent(r, "saving"), stops.held():  # held around on_main: every rank has its answer first
            on_main(lambda: _save(hooks, "the model", os.path.join(out_dir, "model")), dist)
        final["seconds"] = _seconds(r)
    return final


def _summary(r: LoopState, completed: bool) -> dict:
    """What the run left: its best dev score and step, its last step and epoch, and whether it ran to
    the end (False: stopped by max_steps, with only the checkpoint's model from this run)."""
    return {"best_f1": r.st["best_f1"], "best_step": r.st.get("best_step"), "global_step": r.st["global_step"],
            "epoch": r.st["epoch"] + (0 if completed else 1), "completed": completed,
            "best_precision": r.st.get("best_precision"), "seconds": _seconds(r)}


def _seconds(r: LoopState) -> dict:
    """This process's time in the loop, and the evaluations' and saves' shares of it."""
    return {"loop": time.perf_counter() - r.clock[0], **r.spent}


def _check_ranks_agree(identity: dict, model: nn.Module, dist: Dist) -> None:
    """Every process of a run trains one model on one dataset: a node that read another copy of
    the data (other texts, other lines) or built another model from it (a `tiny` vocabulary, a
    label set) trained on silently, or met DDP's traceback. Rank 0 says which rank differs, in
    what; the others stop quietly (PeerFailed). Same lengths with other labels go unseen."""
    if not dist.enabled:
        return
    mine = {"data": (identity["items"], identity["tokens"], identity["digest"]),
            "model": [tuple(p.shape) for p in model.parameters()]}
    every = gather(mine, dist)
    odd = next((k for k, other in enumerate(every) if other != every[0]), None)
    if odd is None:
        return
    if not dist.is_main:
        raise PeerFailed("the processes differ in their data or model; rank 0 says how")
    first, other = every[0], every[odd]
    if other["data"][:2] != first["data"][:2]:
        what = (f"training data of {other['data'][0]} items, {other['data'][1]} tokens against rank 0's "
                f"{first['data'][0]}, {first['data'][1]}")
    elif other["data"] != first["data"]:
        what = f"training data of other lengths (as many items and tokens as rank 0's, {first['data'][0]} and " \
               f"{first['data'][1]}, in other texts)"
    else:
        what = (f"a model of {len(other['model'])} parameter tensors of other sizes (built from other data: a tiny "
                "vocabulary, a label set)")
    raise DataError(f"rank {odd} has {what}: every process of a run must read the same training data (on several "
                    "machines, the same file on each)")


def _start(model: nn.Module, items: list, hooks: TaskHooks, *, opts: TrainOptions, policy: Policy, out_dir: str,
           log: Callable[[str], None], dist: Dist, total_steps: int, origin: str | None = None) -> LoopState:
    """Optimizer, schedule, scaler and state: fresh, or restored from the checkpoint."""
    device = policy.device
    optimizer = build_optimizer(model, opts, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(total_steps, opts.warmup_ratio))
    scaler = torch.amp.GradScaler("cuda") if policy.use_scaler else None
    os.makedirs(out_dir, exist_ok=True)
    identity = run_identity(items, opts, origin, processes=dist.world, course=hooks.course)
    st = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best_f1": None, "best_step": None, "bad_evals": 0,
          "stopped": False, "first_loss": None, "run": identity, "precision": policy.name, "epochs": opts.epochs}
    _check_ranks_agree(identity, model, dist)  # before DDP, whose own check is a traceback of parameter sizes
    r = LoopState(model, wrap_ddp(model, dist, device, opts.grad_compression), items, hooks, opts, policy, dist,
                  log, optimizer, scheduler, scaler, None, st, out_dir, total_steps, torch.zeros((), device=device))
    on_main(lambda: recover_dir(os.path.join(out_dir, "model")), dist)  # a run killed between its two renames
    if opts.resume:
        check_checkpoint(r.ckpt_dir)  # a part missing: refused, not started over and replaced
    resumed = opts.resume and has_checkpoint(r.ckpt_dir)
    if resumed:
        r.st = load_checkpoint(r.ckpt_dir, optimizer=optimizer, scheduler=scheduler, scaler=scaler, rank=dist.rank,
                               identity=identity)
        r.st["run"] = identity
        was = r.st.get("precision")
        if was is not None and was != policy.name:  # allowed (another machine, say), but the steps so far were not
            log(f"note: the checkpoint's {r.st['global_step']} steps were trained in {was}; this run goes on in "
                f"{policy.name}, and its scores are of a model trained in both")
        r.st["precision"] = policy.name
        # --patience may change on resume: an early stop is decided again by the one given now, also
        # for a run that was cut off before the evaluations without gain reached the old one
        r.st["stopped"] = bool(opts.patience and r.st["bad_evals"] >= opts.patience)
        check_steps_left(r, opts, r.st)
        check_epochs_left(r, opts, r.st)
        if r.st.get("epochs", opts.epochs) != opts.epochs:  # allowed; the schedule's change is said
            log(f"note: the checkpoint's run had --epochs {r.st['epochs']}, this one {opts.epochs}: the learning "
                f"rate's decay now runs to the end of epoch {opts.epochs} from step {r.st['global_step']}")
            rate_anew(optimizer, scheduler)
        r.st["epochs"] = opts.epochs
        log(f"resumed from {r.ckpt_dir}: " + resumed_at(r.st, opts))
        # lines past the checkpoint are reported again by this run
        on_main(lambda: trim_report(r.report_path, r.st), dist)
    else:
        if opts.resume:  # a retry after a stop before the first checkpoint: goes on, and says what it replaces
            kept = os.path.join(out_dir, "model")
            log(f"no checkpoint in {r.ckpt_dir}; starting from the beginning"
                + (f" (warning: {kept}, a model saved with no checkpoint beside it (an earlier run's, or the "
                   "stopped run's before its first checkpoint), is replaced at this run's first save; its "
                   "train_report.jsonl goes now)"
                   if os.path.isdir(kept) else ""))
        # a fresh run starts a fresh report, and an earlier run's checkpoint goes now: left beside
        # this run's first models, a --resume after a stop would take that run's state for this one's
        on_main(lambda: (_remove(r.report_path), _remove_tree(r.ckpt_dir), drop_curves(out_dir)), dist)
    if opts.resume:
        check_resume_agrees(r, bool(resumed), dist)
    r.reporters = build_reporters(opts.report_to, out_dir=out_dir, resumed_step=r.st["global_step"] if resumed
                                  else None, log=log, metric=hooks.metric) if dist.is_main else Reporters()
    params = {**opts.to_dict(hooks.option_fields), **_course_params(hooks.course), "dev_metric": hooks.metric, "precision": policy.name,
              "device": str(device),
              "processes": dist.world, "model": origin, "train_items": len(items)}
    r.reporters.log_params(params)
    on_main(lambda: _write_params(out_dir, params), dist)  # what ran, resolved, beside the report
    mean_len = sum(len(it) for it in items) / max(1, len(items))
    basis = mfu_precision(model, device, policy.name)
    if device.type == "cpu":  # a CPU's peak is measured (a GPU's is its datasheet's): ranks side by side read a share
        in_turn(lambda: measure_peak(device, basis), dist)
    r.meter = Meter(device, basis, flops_per_token=train_flops_per_token(model, mean_len))  # the clock starts
    return r


def rate_anew(optimizer, scheduler) -> None:
    """Each group's rate from the schedule of this run's length at the step the checkpoint reached:
    the checkpoint's optimizer holds the rate of its own run's schedule (0 at its end), which the
    next step would train at."""
    for group, base, fn in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _run_steps(r: LoopState, groups, epoch: int, epoch_steps: int) -> bool:
    """Train over the epoch's remaining steps (of its `epoch_steps`); False when max_steps stopped the
    run inside it (at its last step, the epoch closes first: True)."""
    opts, st, meter = r.opts, r.st, r.meter
    wait_start = time.perf_counter()
    for micro in prefetch(groups):
        t_data = time.perf_counter()
        meter.add_time("data_wait", t_data - wait_start)
        meter.begin_step()
        if r.hooks.step is not None:
            loss = r.hooks.step(r.ddp, micro, r.policy, r.scaler, meter, r.dist.world)
        else:
            loss = forward_backward(r.ddp, micro, r.hooks.loss_fn, r.policy, r.scaler, meter, r.dist.world)
        r.running += loss
        r.n_running += 1
        r.recent.append(loss.detach())
        if st.get("first_loss") is None and len(r.recent) == r.recent.maxlen:
            st["first_loss"] = window_loss(r)  # host sync, once per run: the baseline of learning_check
        t_comp = time.perf_counter()
        meter.add_time("compute", t_comp - t_data)
        meter.end_phase("compute")
        lr_used = lr_now(r)  # this step's rate: the schedule moves on in the optimizer step
        optimizer_step(r.model, r.optimizer, r.scheduler, r.scaler, opts.max_grad_norm)
        meter.add_time("optimizer", time.perf_counter() - t_comp)
        meter.end_phase("optimizer")
        meter.steps += 1
        st["step_in_epoch"] += 1
        st["global_step"] += 1
        gs = st["global_step"]
        if r.bar is not None:
            r.bar.update(1)
        r.bar_tokens += sum(b["real_tokens"] for b in micro if b["weight"])  # this rank's: summed at log points
        if opts.log_every and gs % opts.log_every == 0:
            # host sync, log points only; each rank holds its share of the global loss: their sum is the loss,
            # and the sum of their tokens the whole job's, which the bar's rate is of
            loss_now, job_tokens = all_sum([r.running.item() / r.n_running, float(r.bar_tokens)], r.dist)
            if r.dist.is_main:
                _log_step(r, gs, loss_now, lr_used, job_tokens)
            check_logged_loss(r, loss_now)  # every rank holds the same sum: all stop together
            r.running.zero_()
            r.n_running = 0
        if opts.eval_every and gs % opts.eval_every == 0:
            check_finite(r)  # a diverged model scores 0, not NaN: it would be kept as the first best
            f1 = _evaluate(r)
            if f1 is not None:  # without --dev (warned about at the start) there is nothing to say
                r.log(f"step {gs}: dev {r.hooks.metric} {f1:.4f}")
            if st["stopped"]:
                return True
        inside = gs == opts.max_steps and st["step_in_epoch"] < epoch_steps  # not its last step: no epoch close
        if (opts.save_every and gs % opts.save_every == 0) or inside:
            check_finite(r)  # diverged weights never replace the last checkpoint a resume would start from
            with meter.timed("save"):  # the period's time, as a real run pays it: its own share of the split
                _checkpoint(r)
        if inside:
            # the partial epoch too, with the dev score of these weights where one was taken at this step
            # (the best so far is another model's)
            report_period(r, epoch, _close_period(meter, r.dist),
                          st.get("last_f1") if st.get("last_eval_step") == gs else None, partial=True)
            return False
        wait_start = time.perf_counter()
    return True


def _log_step(r: LoopState, gs: int, loss_now: float, lr: float, tokens: float) -> None:
    """Step `gs`'s loss and the rate it trained at (--lr as the schedule stood), printed and reported
    alike; the bar's rate is of the `tokens` every rank trained on since it began."""
    if r.bar is not None:
        tok_s = tokens / max(r.bar.format_dict["elapsed"], 1e-9)
        r.bar.set_postfix(loss=f"{loss_now:.4f}", tok_s=f"{tok_s:.0f}", refresh=False)
    else:
        r.log(f"step {gs}/{r.last_step} loss {loss_now:.4f} lr {lr:.2e} | " + elapsed_left(r, gs))
    r.reporters.log_metrics({"train/loss": loss_now, "train/lr": lr}, gs)


@contextmanager
def _spent(r: LoopState, what: str) -> Iterator[None]:
    """Count the time inside toward `what` of the run's closing time line (fit.time_line)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        r.spent[what] += time.perf_counter() - t


def _checkpoint(r: LoopState) -> None:
    with _spent(r, "saving"):
        _write_checkpoint(r)


def _write_checkpoint(r: LoopState) -> None:
    rngs = gather(torch.get_rng_state(), r.dist)  # every rank's dropout stream, for an exact resume
    if r.recent:  # the loss window, and the learning check's first one while it fills
        r.st["window"] = all_sum([float(x) for x in r.recent], r.dist)  # host syncs, at checkpoints only
    if r.n_running:  # the steps since the last step line: the next one averages them with the resumed run's
        r.st["running"] = [all_sum([float(r.running)], r.dist)[0], r.n_running]

    def save_model(path: str) -> None:  # a model to run as it is; the optimizer's state keeps the table as it stands
        with paid(r.optimizer):
            r.hooks.save_model(path)

    with stops.held():  # a stop inside it ends the run as it is done: the steps since the last one are kept
        on_main(lambda: save_checkpoint(r.ckpt_dir, save_model=save_model, optimizer=r.optimizer,
                                        scheduler=r.scheduler, scaler=r.scaler, state=r.st, rng_states=rngs), r.dist)
    r.st.pop("window", None)
    r.st.pop("running", None)


def _evaluate(r: LoopState) -> float | None:
    """Dev F1; rank 0 keeps the best model and decides early stopping, the others follow."""
    if r.hooks.evaluate is None:
        return None
    st = r.st
    catch_up(r.optimizer)  # the model evaluated (and kept if best) holds every update its rows were owed
    with r.meter.excluded():  # the period counts training (and its checkpoints) only; a best model's save is
        r.model.eval()        # the evaluation's (at an epoch's end no period is open to take it)
        with _spent(r, "evaluation"):
            metrics = r.hooks.evaluate(r.model)  # every rank takes part: evaluation is sharded and gathered
        r.model.train()
        f1 = metrics["f1"]
        st["last_f1"], st["last_eval_step"] = f1, st["global_step"]  # the epoch line's figure under --eval-every
        on_main(lambda: _keep_best(r, metrics), r.dist)
    f1, st["best_f1"], st["bad_evals"], st["stopped"] = broadcast(
        (f1, st["best_f1"], st["bad_evals"], st["stopped"]), r.dist)
    return f1


def _keep_best(r: LoopState, metrics: dict) -> None:
    """Rank 0: log the dev metrics; save a new best model, or count an evaluation without gain."""
    st, f1 = r.st, metrics["f1"]
    r.reporters.log_metrics(dev_scalars(metrics, r.hooks.metric), st["global_step"])
    better = f1 == f1 and (st["best_f1"] is None or f1 > st["best_f1"])  # NaN (a diverged model) is never the best
    # nothing scored yet: the later model, trained longer, is kept (its loss fell, and "train longer" should
    # hand back what trained longer); it is no gain, so --patience still counts it
    unscored = f1 == 0 and st["best_f1"] == 0
    if better or unscored:
        st["best_f1"], st["best_step"] = f1, st["global_step"]
        st["best_precision"] = r.policy.name  # a resume in another precision: the best was scored in this one
        with _spent(r, "saving"):
            _save(r.hooks, "the best model", os.path.join(r.out_dir, "model"))  # a full disk: the last best stays
    if better:
        st["bad_evals"] = 0
    else:
        st["bad_evals"] += 1
        if r.opts.patience and st["bad_evals"] >= r.opts.patience:
            st["stopped"] = True


OPTIONS_FILE = "train_options.json"


def _course_params(course: dict | None) -> dict:
    """The task's own settings (its loss, the kind of data it is fed, --subjects: TaskHooks.course) as
    run parameters, named as their flags without dashes: runs that differ in them tell apart."""
    return {k.lstrip("-").replace("-", "_").replace(" ", "_"): v for k, v in (course or {}).items()}


def _write_params(out_dir: str, params: dict) -> None:
    """OUT/train_options.json: the run's options as they took effect (every default filled in), its
    precision, device, processes, starting model and item count; a resumed run writes its own."""
    path = os.path.join(out_dir, OPTIONS_FILE)
    with writing("the run's options", path), atomic_open(path, "report") as f:
        json.dump(params, f, indent=2, ensure_ascii=False, default=str)
        f.write("\n")


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)


def _remove_tree(path: str) -> None:
    """An earlier run's checkpoint gone, and the copy a save killed mid-way left aside with it (it
    would come back in its place); through a link, the target's contents, the link kept."""
    recover_dir(path)
    if os.path.islink(path):  # written through, as every save writes through a link
        target = os.path.realpath(path)
        for name in os.listdir(target) if os.path.isdir(target) else ():
            entry = os.path.join(target, name)
            shutil.rmtree(entry) if os.path.isdir(entry) and not os.path.islink(entry) else os.remove(entry)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _save(hooks: TaskHooks, what: str, path: str) -> None:
    with stops.held(), writing(what, path):  # a stop inside a save ends the run as the save is done
        hooks.save_model(path)  # inside a caller's held(), the stop is raised where that one ends


def _close_period(meter: Meter, dist: Dist) -> dict:
    """The meter's report with tokens summed over all ranks and the largest rank's memory peak (the
    step-time split stays rank 0's: every rank waits for the others at each all-reduce)."""
    meter.real, meter.padded = (int(x) for x in all_sum([meter.real, meter.padded], dist))
    rep = meter.report(devices=dist.world)
    if dist.enabled:
        rep["peak_memory_bytes"] = max(gather(rep["peak_memory_bytes"], dist))
    return rep


def _collate_step(micro_batches: list[list[int]], n_global: int | None, items: list, collate, *,
                  pin: bool = False) -> list[dict]:
    """Collate this rank's micro-batches of a step. An empty one (a short tail) becomes a
    one-item stand-in whose loss is zeroed: the rank still joins every all-reduce. `pin`: the
    tensors in page-locked memory (for a GPU), so that the step's non-blocking copies overlap
    the compute before them; done here, in the collating thread."""
    out = []
    for mb in micro_batches:
        b = collate([items[i] for i in (mb or [0])])
        if pin:
            b = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in b.items()}
        b["weight"] = 1.0 if mb else 0.0
        b["n_global"] = n_global
        out.append(b)
    return out
