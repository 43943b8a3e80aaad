"""torch.distributed as launched by torchrun: process-group set-up and the few collectives
the loop needs. One process per device; NCCL on CUDA, gloo on CPU."""
from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from spanflow.errors import PeerFailed
from spanflow.runtime import stops
from spanflow.training.outcome import job_rank

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's place in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world() -> int:
    """WORLD_SIZE as torchrun sets it (1 where unset); -1 where it is no number."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return -1


def init_from_env() -> Dist:
    """Join the process group that torchrun describes in the environment, if any (or take the one
    the caller already made)."""
    world = env_world()
    if world == 1 or world == 0:
        return Dist()
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if (world < 0 or missing) and not dist.is_initialized():  # a cluster's or notebook image's stray variable
        from spanflow.errors import ConfigError

        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is set"
                          + (f", but not {', '.join(missing)}, which torchrun sets with it" if missing else "")
                          + ": launch several processes with torchrun or `spanflow train ... --devices N`, or unset "
                          "WORLD_SIZE to train in this one")
    die_with_parent()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and os.environ.get("SPANFLOW_DEVICE", "auto") != "cpu"
    if cuda:
        torch.cuda.set_device(local)  # before the group, so NCCL binds this process to its own GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local)


def die_with_parent() -> None:
    """A SIGTERM to this rank when its launcher (torchrun's agent) dies: a launcher killed with
    SIGKILL, as a scheduler does, left its ranks training on, holding --out's lock. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()  # not 1 as such: a container's entrypoint launcher is pid 1, and alive
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the launcher died before the line above could take effect
        os.kill(os.getpid(), signal.SIGTERM)


def all_sum(values: list[float], d: Dist) -> list[float]:
    """Element-wise sum over ranks (host floats; at epoch ends and log points, not per step)."""
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def gather(obj, d: Dist) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj, d: Dist):
    """Rank 0's `obj` on every rank."""
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def in_turn(fn: Callable[[], object], d: Dist) -> None:
    """fn() on every rank, the ranks of a machine one after another (by local rank; machines
    side by side): for a measurement that the other ranks' work beside it would disturb (two
    ranks timing matmuls on one CPU each read about half its rate). Every rank waits for all
    of a turn's ranks before the next turn."""
    turns = int(os.environ.get("LOCAL_WORLD_SIZE", d.world)) if d.enabled else 1
    for k in range(turns):
        if d.local_rank == k:
            fn()
        if d.enabled:
            dist.barrier()


def on_main(fn: Callable[[], T], d: Dist) -> T | None:
    """fn() on rank 0 alone (a save, a report line), its outcome told to every rank: when it
    raises, rank 0 raises its error and the others PeerFailed, so that no rank is left waiting at
    the next collective for a peer that has left. None on the other ranks."""
    if not d.enabled:
        return fn()
    out, err = None, None
    if d.is_main:
        try:
            out = fn()
        except Exception as e:  # told to the others below, then raised again here
            err = e
    failed = broadcast(None if err is None else str(err), d)
    if err is not None:
        raise err
    if failed is not None:
        raise PeerFailed(f"rank 0 stopped: {failed}")
    return out


def relaunch(argv: list[str], devices: int, after: Callable[[], str | None] = lambda: None) -> int:
    """Run `spanflow <argv>` under torch.distributed.run with `devices` processes on this node;
    0 when all finished; 1, naming them, when ranks were killed by a signal (they said nothing:
    `after()` says how the run goes on, where it can); else the exit code of the first rank that
    failed (its own error line said why)."""
    from torch.distributed import run

    args = ["--nproc-per-node", str(devices), "-m", "spanflow", *argv]
    own = "OMP_NUM_THREADS" not in os.environ  # torchrun's own default is 1 a process, whatever the cores
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if own:  # set for the launch (its processes inherit it), and taken back after: the caller's environment
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // devices))
    elif os.environ["OMP_NUM_THREADS"].isdigit() and int(os.environ["OMP_NUM_THREADS"]) * devices > cores:
        # each process's threads wait on the others' at every op: a run of 2 x 2 threads on 2 cores took many
        # times as long as 2 x 1
        print(f"warning: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} for each of {devices} processes is more "
              f"threads than this machine's {cores} cores: they wait on each other; unset it, and the launcher "
              f"gives each process {max(1, cores // devices)}", file=sys.stderr)
    print(f"launching: torchrun {' '.join(args)} (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})", file=sys.stderr)
    from spanflow.monitor import clock

    began = clock.current()
    if began is not None:  # each rank's closing time line counts from this command's start
        os.environ[clock.ENV] = repr(began)
    os.environ[LAUNCHED] = "1"
    os.environ[ERRORS] = tempfile.mkdtemp(prefix="spanflow-ranks-")
    try:
        with _quiet_launcher():
            return _launch(run, args, after)
    finally:
        if own:
            os.environ.pop("OMP_NUM_THREADS", None)
        os.environ.pop(clock.ENV, None)
        os.environ.pop(LAUNCHED, None)
        shutil.rmtree(os.environ.pop(ERRORS), ignore_errors=True)


# set for the ranks of --devices N's launcher, which says how their run stopped: a rank cannot tell a
# stop its agent passes on from the user's from the one it sends the survivors of a killed rank, and
# rank 0's "terminated" then stood before the launcher's "rank 1 was killed"
LAUNCHED = "SPANFLOW_DEVICES_LAUNCHER"


# where --devices N's ranks leave their error lines (rank 0 prints its own too); the launcher prints
# those of other ranks that rank 0 did not say: an error every rank met (the same data) was printed
# once per rank
ERRORS = "SPANFLOW_DEVICES_ERRORS"


def report_error(line: str, write: Callable[[str], None]) -> None:
    """A rank's `error:` line: written by `write` outside --devices N's launcher, and by rank 0 under
    it; left for the launcher by every rank there."""
    folder, rank = os.environ.get(ERRORS), job_rank()
    if not (folder and os.path.isdir(folder)):  # outside the launcher, or its folder gone: said here
        write(line)
        return
    try:
        with open(os.path.join(folder, f"rank{rank}"), "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(line + "\n")
    except OSError as e:  # not left for the launcher: said here, with why, whatever the rank
        write(f"{line} (rank {rank}; not left for the launcher: {e.strerror or e})")
        return
    if rank == 0:
        write(line)


def _ranks_said(folder: str | None) -> list[str]:
    """The error lines ranks other than 0 left that rank 0 did not say, each once, in rank order."""
    if not folder or not os.path.isdir(folder):
        return []

    def lines(name: str) -> list[str]:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                return f.read().splitlines()
        except OSError:
            return []

    said, out = set(lines("rank0")), []
    ranks = sorted(int(n[4:]) for n in os.listdir(folder) if n.startswith("rank") and n[4:].isdigit())
    for rank in ranks[1:] if ranks and ranks[0] == 0 else ranks:
        for line in lines(f"rank{rank}"):
            if line not in said:
                said.add(line)
                out.append(f"rank {rank}: {line}")
    return out


def stop_said_by_launcher() -> bool:
    """Whether this process is a rank of --devices N's launcher, which says how the run stopped."""
    return os.environ.get(LAUNCHED) == "1"


@contextmanager
def _quiet_launcher() -> Iterator[None]:
    """The failed rank printed why, and a stop is said by rank 0: the launcher's own log of either
    (`Received 15 death signal, shutting down workers`) would be a second, noisier line. torch sets
    each of its launcher's loggers to its own level (LOGLEVEL's, read as each is made), so the
    parent's level alone does not reach them; the levels are the caller's again after the launch."""
    prefix = "torch.distributed.elastic"
    loggers = [logging.getLogger(prefix)] + [lg for name, lg in list(logging.root.manager.loggerDict.items())
                                             if name.startswith(prefix + ".") and isinstance(lg, logging.Logger)]
    levels = [lg.level for lg in loggers]
    own_env = "LOGLEVEL" not in os.environ  # for the loggers made during the launch (a user's setting kept)
    if own_env:
        os.environ["LOGLEVEL"] = "CRITICAL"
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if own_env:
            os.environ.pop("LOGLEVEL", None)


def _launch(run, args: list[str], after: Callable[[], str | None] = lambda: None) -> int:
    """torch.distributed.run with `args`; relaunch's exit code."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    handler = getattr(api, "_terminate_process_handler", None)
    if handler is not None:  # the launcher's handler, which torch installs by this name when it starts
        api._terminate_process_handler = _first_stop_only(handler)
    try:
        run.run(run.parse_args(args))
    except ChildFailedError as e:
        for line in _ranks_said(os.environ.get(ERRORS)):  # before how the run stopped
            print(line, file=sys.stderr)
        killed = sorted((rank, -f.exitcode) for rank, f in e.failures.items() if f.exitcode < 0)
        # the agent stops the survivors of a killed rank with SIGTERM: those are not what failed
        killed = [k for k in killed if k[1] != signal.SIGTERM] or killed
        if killed:  # killed by a signal: nothing of its own was printed (the survivors' line says a peer went)
            print("error: " + ", ".join(f"rank {rank} was killed by signal {sig}" for rank, sig in killed)
                  + (after() or ""), file=sys.stderr)
            return 1
        rank, failure = e.get_first_failure()
        code, hint = failure.exitcode, after() or ""
        # a rank that handled a stop of its own
        stop = next((s for s in (signal.SIGINT, *stops.STOPS) if code == 128 + s), None)
        if stop is not None:
            print(f"error: rank {rank} was stopped by {signal.Signals(stop).name}" + hint, file=sys.stderr)
        elif hint:  # its own error line said why; where the run can go on, from where (the ranks say nothing)
            print(f"the run stopped on rank {rank}'s error" + hint, file=sys.stderr)
        return code or 1
    except SignalException as e:  # a signal to the launcher (TERM, INT, HUP, QUIT): its agent has stopped the ranks
        for line in _ranks_said(os.environ.get(ERRORS)):  # a rank's error as the stop came
            print(line, file=sys.stderr)
        if e.sigval != signal.SIGINT:  # Ctrl-C reached rank 0 too (a terminal's group), which said so
            said = "terminated" if e.sigval == signal.SIGTERM else f"stopped by {signal.Signals(e.sigval).name}"
            print(said + (after() or ""), file=sys.stderr)
        return 128 + int(e.sigval)
    finally:
        if handler is not None:
            api._terminate_process_handler = handler
    return 0


def _first_stop_only(handler):
    """torch's launcher handler for the first stop signal only. It raises on every signal, and one
    raised while its agent waits for the ranks to stop (a second Ctrl-C, a group's TERM then the
    terminal's INT) cut that wait short: the launcher left with the second signal's code, and its
    ranks met their parent's death mid-clean-up. Later signals now leave the wait to finish."""
    def on_stop(signum, frame):
        names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")  # torch's list
        for name in names.split(","):
            if hasattr(signal, name.strip()):
                signal.signal(getattr(signal, name.strip()), _no_op)
        handler(signum, frame)
    return on_stop


def _no_op(signum, frame) -> None:
    """A stop signal after the launcher's first."""


def gather_rows(t: torch.Tensor, d: Dist) -> list[torch.Tensor]:
    """Every rank's (n_r, ...) tensor, in rank order, on every rank; the n_r may differ.
    No gradient flows back through the result: callers take gradients on their own rows."""
    if not d.enabled:
        return [t]
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    counts = [torch.zeros_like(n) for _ in range(d.world)]
    dist.all_gather(counts, n)
    counts = [int(c) for c in counts]
    top = max(counts)
    padded = torch.zeros((top, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[:t.shape[0]] = t.detach()
    out = [torch.empty_like(padded) for _ in range(d.world)]
    dist.all_gather(out, padded)
    return [o[:c] for o, c in zip(out, counts)]


def shard_gather(items: list, fn, d: Dist) -> list:
    """fn(items[rank::world]) on every rank, gathered back into input order on every rank."""
    if not d.enabled:
        return fn(items)
    parts = gather(fn(items[d.rank::d.world]), d)
    out = [None] * len(items)
    for r, part in enumerate(parts):
        out[r::d.world] = part
    return out


def shutdown() -> bool:
    """Leave the process group cleanly: wait for every rank, then tear down (a rank that
    exits while a peer still talks to it can abort in the communication library). True when
    there was a group: the caller should then leave with exit_now()."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()
        return True
    return False


def exit_now(code: int) -> None:
    """End a rank's process without the interpreter's teardown, output flushed first. Gloo's
    worker threads can still hold objects then, and freeing them during finalization aborts
    the process now and then (SIGABRT, "terminate called without an active exception") after
    the work succeeded, which torchrun would report as a failed run."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wrap_ddp(model: torch.nn.Module, d: Dist, device: torch.device, compression: str = "none") -> torch.nn.Module:
    """`model` in DistributedDataParallel under torchrun, else itself; `compression` fp16 halves the
    gradients' all-reduce traffic."""
    if not d.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    if compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)  # halves gradient traffic
    return ddp
