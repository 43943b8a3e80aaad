"""How many model actors a Ray job runs, and what each one holds, from the cluster's nodes.

Every node that runs actors keeps TASK_CPUS free for the read, tokenizing, chunking and
write tasks (each reserves one CPU): actors that took a node's every CPU would leave those
tasks nowhere to run there, and a cluster of one such node would wait for ever.

With GPUs (and --device auto or cuda): one actor per GPU (per `gpus` GPUs when asked), one CPU
each where the node has them to spare, else the node's spare CPUs shared between its actors
(a node of 4 GPUs and 4 CPUs: 0.75 each). Without: actors of up to CPU_ACTOR_THREADS CPUs,
sized from the largest node (workers, not a small head node), as many as fit each node. Any
of the three may be given. The pool starts with the actors that fit the cluster now; it may
shrink to one, and grow to `count` when one is asked (an autoscaling cluster adds nodes for
the actors that wait).

A CPU actor's torch threads are its node's CPUs shared out between the actors there, the
tasks' CPU included (the fewest of any node that holds actors, where nodes differ): the tasks run in short bursts beside the model, so a CPU held for them
alone would sit idle most of the job, and on a 2-CPU machine the one actor would run the
model on half the cores the single-process job has. Given --ray-cpus-per-actor, its threads
are those CPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from spanflow.errors import ConfigError

CPU_ACTOR_THREADS = 4  # torch threads past which one CPU actor gains little: more actors instead
TASK_CPUS = 1.0  # left free on each node that runs actors, for the tasks around them


@dataclass(frozen=True)
class Actors:
    """The model stage's actor pool: how many actors, the CPUs and GPUs each reserves, and how
    many of them fit the cluster as it is now."""

    count: int
    cpus: float
    gpus: float
    fit: int | None = None  # None: all of `count`
    cores: int | None = None  # torch threads per actor; None: its CPUs

    @property
    def initial(self) -> int:
        return max(1, min(self.count, self.fit if self.fit is not None else self.count))

    @property
    def threads(self) -> int:
        """The torch threads of an actor: `cores` where the plan set them, else its CPUs; at least one."""
        return max(1, self.cores if self.cores is not None else int(self.cpus))

    def describe(self) -> str:
        return (f"{self.count} actor{'s' if self.count != 1 else ''} x {self.cpus:g} CPU"
                + (f", {self.gpus:g} GPU" if self.gpus else "")
                + (f", {self.threads} threads" if self.threads != max(1, int(self.cpus)) else ""))


def check_asked(count: int | None, cpus: float | None, gpus: float | None) -> None:
    """A ConfigError for an actor count, or CPUs or GPUs an actor reserves, that no pool can have."""
    for name, value in (("--ray-actors", count), ("--ray-cpus-per-actor", cpus)):
        if value is not None and not 0 < value < math.inf:  # NaN too
            raise ConfigError(f"{name} must be a positive number, got {value}")
    if gpus is not None and not 0 <= gpus < math.inf:
        raise ConfigError(f"--ray-gpus-per-actor must be a number, 0 or more, got {gpus}")


def plan_actors(nodes: list[dict], *, count: int | None = None, cpus: float | None = None,
                gpus: float | None = None, device: str = "auto") -> Actors:
    """The actor pool for `nodes` (each alive node's resources: {"CPU": n, "GPU": n}); `count`,
    `cpus`, `gpus`: what was asked (None: follow the cluster); `device`: the --device asked."""
    check_asked(count, cpus, gpus)
    on_gpu = device == "auto" or device.startswith("cuda")
    total_gpus = sum(n.get("GPU", 0) for n in nodes)
    use_gpus = gpus if gpus is not None else (1.0 if total_gpus and on_gpu else 0.0)
    if use_gpus:
        return _gpu_actors(nodes, count, cpus, use_gpus)
    if device.startswith("cuda"):
        raise ConfigError(f"--device {device}: the Ray cluster has no GPUs now (on an autoscaling cluster, "
                          "--ray-gpus-per-actor 1 --ray-actors N asks for them)")
    return _cpu_actors(nodes, count, cpus)


def _gpu_actors(nodes: list[dict], count: int | None, cpus: float | None, gpus: float) -> Actors:
    hosts = [(n.get("CPU", 0), math.floor(n.get("GPU", 0) / gpus + 1e-9)) for n in nodes]
    hosts = [(c, k) for c, k in hosts if k]
    if not hosts:
        if count is None:
            raise ConfigError(f"--ray-gpus-per-actor {gpus:g}: no node of the Ray cluster has that many GPUs now "
                              "(on an autoscaling cluster, give --ray-actors N: the actors wait for their nodes)")
        return Actors(count, 1.0 if cpus is None else cpus, gpus, fit=0)
    if cpus is None:  # one each, or the spare CPUs of the most crowded node shared out
        cpus = min(1.0, min(max(0.0, c - TASK_CPUS) / k for c, k in hosts))
        cpus = math.floor(cpus * 100) / 100
    fit = sum(k if not cpus else min(k, math.floor((c - TASK_CPUS) / cpus + 1e-9)) for c, k in hosts)
    if fit <= 0:
        raise ConfigError(f"--ray-cpus-per-actor {cpus:g}: no GPU node has that many CPUs beside the "
                          f"{TASK_CPUS:g} its read, tokenizing and write tasks need")
    return Actors(count or fit, cpus, gpus, fit=fit)


def _cpu_actors(nodes: list[dict], count: int | None, cpus: float | None) -> Actors:
    spare = [n.get("CPU", 0) - TASK_CPUS for n in nodes]
    if max(spare, default=0) <= 0:
        raise ConfigError(f"--ray: no node of the Ray cluster has more than {TASK_CPUS:g} CPU, and CPU model actors "
                          f"need CPUs beside the {TASK_CPUS:g} its read, tokenizing and write tasks take; start Ray "
                          "with more (ray start --num-cpus 2: logical CPUs, 2 work on one core)")
    cores = None
    if cpus is None:
        most = max(spare)
        cpus = float(min(CPU_ACTOR_THREADS, math.floor(most))) if most >= 1 else most
        # each node's CPUs over the actors it holds; the fewest of any node with actors, so that
        # no node runs more threads than it has CPUs
        shares = [math.floor((s + TASK_CPUS) / k) for s in spare if (k := math.floor(s / cpus + 1e-9))]
        cores = max(1, min(shares)) if shares else None
    fit = sum(math.floor(s / cpus + 1e-9) for s in spare if s > 0)
    if fit <= 0:
        raise ConfigError(f"--ray-cpus-per-actor {cpus:g}: no node of the Ray cluster has that many CPUs beside "
                          f"the {TASK_CPUS:g} its read, tokenizing and write tasks need")
    return Actors(count or fit, cpus, 0.0, fit=fit, cores=cores)
