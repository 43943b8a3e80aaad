"""Training reports where users look: TensorBoard and MLflow, beside OUT/train_report.jsonl.

`--report-to` is a comma list, as in Hugging Face Trainer: `none` (the default), `tensorboard`,
`mlflow`, or `all` for every one installed. Each reporter takes the run's options once
(`log_params`), scalars at a global step (`log_metrics`) and the best model's figures at the end
(`close`). Only rank 0 reports under torchrun; the loop builds no reporter on the other ranks.

- TensorBoard writes event files to OUT/runs (`tensorboard --logdir OUT/runs`). A fresh run
  (with --report-to or without) removes the event files a previous run left there, as it does
  OUT/train_report.jsonl; a resumed
  run (--resume) appends to the same directory and hides what the stopped run logged after its
  checkpoint (SummaryWriter's purge_step), so each curve reads as one run.
- MLflow logs to MLFLOW_TRACKING_URI when set, else to a SQLite store under OUT/mlruns
  (`mlflow ui --backend-store-uri sqlite:///OUT/mlruns/mlflow.db`), in the experiment
  MLFLOW_EXPERIMENT_NAME (default `spanflow`). A resumed run starts a new MLflow run, tagged
  `spanflow.resumed_from_step`.

A reporter that fails mid-run prints one warning and is dropped: reporting never stops training.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Protocol

from spanflow.errors import ConfigError

REPORTERS = ("tensorboard", "mlflow")
INSTALL = {name: f"pip install 'spanflow[{name}]'" for name in REPORTERS}
EXPERIMENT = "spanflow"
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow stores that need SQLAlchemy + Alembic


class Reporter(Protocol):
    def log_params(self, params: dict) -> None: ...

    def log_metrics(self, metrics: dict, step: int) -> None: ...

    def close(self, final: dict | None) -> None:
        """`final`: the loop's summary (best_f1, best_step, global_step, completed); None when training failed."""


def drop_curves(out_dir: str) -> None:
    """Remove the TensorBoard event files an earlier run left in OUT/runs: a fresh run starts fresh
    curves whether or not it reports to TensorBoard itself (curves of a model no longer in OUT,
    beside a new train_report.jsonl, would be read as this run's). MLflow keeps its runs apart."""
    for path in glob.glob(os.path.join(out_dir, "runs", "events.out.tfevents.*")):
        os.remove(path)


def dev_key(metric: str) -> str:
    """The dashboards' name of a score: `f1`, `spearman`, `mrr_10` (MLflow takes letters, digits,
    `_`, `-`, `.`, `/` and spaces in a name, and refused `mrr@10`, dropping the reporter)."""
    return re.sub(r"[^\w.\-/ ]", "_", metric.lower().replace(" ", "_"))


def dev_scalars(metrics: dict, metric: str) -> dict:
    """An evaluation's scores (its floats, not its counts) as `dev/NAME` scalars: evaluate's `f1` is
    the task's score whatever it is (an embedding model's Spearman), and is charted under that name."""
    out = {f"dev/{dev_key(k)}": v for k, v in metrics.items() if isinstance(v, float) and k != "f1"}
    return {f"dev/{dev_key(metric)}": metrics["f1"], **out}


def parse_report_to(value: str | list | tuple | None) -> str:
    """The canonical comma list of a --report-to value; ConfigError naming an unknown reporter."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    names = list(dict.fromkeys(str(v).strip().lower() for v in items if str(v).strip())) or ["none"]
    unknown = [n for n in names if n not in (*REPORTERS, "all", "none")]
    if unknown:
        raise ConfigError(f"--report-to: unknown reporter {unknown[0]!r}; known: {', '.join(REPORTERS)} "
                          "(or 'all', 'none')")
    if "none" in names and len(names) > 1:
        raise ConfigError(f"--report-to: 'none' cannot be combined with {', '.join(n for n in names if n != 'none')}")
    return ",".join(names)


def missing_modules(name: str) -> list[str]:
    """The Python packages reporter `name` needs that are not installed (found, not imported)."""
    need = {"tensorboard": ["tensorboard"], "mlflow": ["mlflow"]}[name]
    if name == "mlflow" and _tracking_uri(None).split(":", 1)[0].split("+")[0] in _DB_SCHEMES:
        need += ["sqlalchemy", "alembic"]
    return [m for m in need if importlib.util.find_spec(m) is None]


def check_installed(report_to: str) -> None:
    """ConfigError, before any training, for a reporter asked by name that is not installed."""
    for name in report_to.split(","):
        if name in REPORTERS and missing_modules(name):
            raise ConfigError(f"--report-to {name} needs {', '.join(missing_modules(name))}, which is not "
                              f"installed: {INSTALL[name]}")


def resolve(report_to: str) -> list[str]:
    """The reporters to build: those named, or for `all` every one installed."""
    names = report_to.split(",")
    if "all" in names:
        return [n for n in REPORTERS if not missing_modules(n)]
    return [n for n in names if n in REPORTERS]


class Reporters:
    """Every reporter of the run behind the one interface; a failing one is dropped with a warning."""

    def __init__(self, reporters: dict[str, Reporter] | None = None, log: Callable[[str], None] = print,
                 metric: str = "F1"):
        self.reporters, self.log, self.key = dict(reporters or {}), log, dev_key(metric)

    def _each(self, method: str, *args) -> None:
        for name, rep in list(self.reporters.items()):
            try:
                getattr(rep, method)(*args)
            except Exception as e:  # a tracking server gone away must not end hours of training
                self.reporters.pop(name)
                self.log(f"warning: reporting to {name} failed ({type(e).__name__}: {str(e)[:200]}); "
                         "training goes on without it")

    def log_params(self, params: dict) -> None:
        self._each("log_params", params)

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.reporters:
            self._each("log_metrics", {k: float(v) for k, v in metrics.items() if _is_number(v)}, step)

    def close(self, final: dict | None) -> None:
        self._each("close", None if final is None else {**final, "key": self.key})


def build_reporters(report_to: str, *, out_dir: str, resumed_step: int | None,
                    log: Callable[[str], None] = print, metric: str = "F1") -> Reporters:
    """The reporters `report_to` asks for, started; `resumed_step` is the checkpoint's global step
    when the run resumes, else None."""
    check_installed(report_to)
    names = resolve(report_to)
    if "all" in report_to.split(",") and not names:
        log(f"--report-to all: none of {', '.join(REPORTERS)} is installed; only OUT/train_report.jsonl is written")
    built = Reporters({}, log, metric)
    try:
        for name in names:
            built.reporters[name] = (TensorBoardReporter if name == "tensorboard" else MlflowReporter)(
                out_dir, resumed_step=resumed_step, log=log)
    except ConfigError:
        built.close(None)  # the ones already started
        raise
    return built


class TensorBoardReporter:
    """Scalars and the run's options (the HParams tab) in OUT/runs."""

    def __init__(self, out_dir: str, *, resumed_step: int | None, log: Callable[[str], None] = print):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(f"--report-to tensorboard cannot start ({e}): {INSTALL['tensorboard']}") from None
        self.log_dir = os.path.join(out_dir, "runs")  # a fresh run's loop removed the curves there (drop_curves)
        purge = resumed_step + 1 if resumed_step is not None else None  # steps up to the checkpoint's stay
        try:
            self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=purge)
        except OSError as e:  # a file where OUT/runs should be, a read-only OUT, a full disk
            raise ConfigError(f"--report-to tensorboard cannot write {self.log_dir}: "
                              f"{e.strerror or e.__class__.__name__}") from None
        log(f"reporting to TensorBoard: tensorboard --logdir {self.log_dir}")

    def log_params(self, params: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        key = dev_key(params.get("dev_metric", "F1"))
        exp, start, self._end = hparams(_flat(params), {f"dev/{key}": 0.0, f"best/dev_{key}": 0.0})
        self.writer.file_writer.add_summary(exp)
        self.writer.file_writer.add_summary(start)

    def log_metrics(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, final: dict | None) -> None:
        if final is not None:
            if final.get("best_f1") is not None:
                self.writer.add_scalar(f"best/dev_{final['key']}", final["best_f1"], _best_step(final))
            if getattr(self, "_end", None) is not None:
                self.writer.file_writer.add_summary(self._end)  # the HParams tab marks the run done
        self.writer.close()


class MlflowReporter:
    """Params, metric histories and the best model's figures in one MLflow run."""

    def __init__(self, out_dir: str, *, resumed_step: int | None, log: Callable[[str], None] = print):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ConfigError(f"--report-to mlflow cannot start ({e}): {INSTALL['mlflow']}") from None
        local = os.path.join(os.path.abspath(out_dir), "mlruns")
        own = not os.environ.get("MLFLOW_TRACKING_URI")  # the local store, under OUT
        self.uri = _tracking_uri(local)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        tags = {"spanflow.out_dir": os.path.abspath(out_dir)}
        if resumed_step is not None:
            tags["spanflow.resumed_from_step"] = str(resumed_step)
        try:
            if own:
                os.makedirs(local, exist_ok=True)
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(  # artifacts beside the store
                name, artifact_location=os.path.join(local, "artifacts") if own else None)
            run = self.client.create_run(exp_id, run_name=os.path.basename(os.path.abspath(out_dir)), tags=tags)
        except Exception as e:  # a URI mlflow cannot open, a server that does not answer
            raise ConfigError(f"--report-to mlflow: cannot start a run at {self.uri} ({type(e).__name__}: "
                              f"{str(e)[:300]})") from None
        self.run_id, self.own = run.info.run_id, own
        log(f"reporting to MLflow: run {self.run_id} in experiment {name!r} at {self.uri}")

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in _flat(params).items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, final: dict | None) -> None:
        try:
            self._close(final)
        finally:
            self._release()

    def _release(self) -> None:
        """Close the connections to the SQLite store this run made under OUT: MLflow keeps its engine,
        and a process that trains many times (a notebook) held two files open per run."""
        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        engine = getattr(store, "engine", None)
        if self.own and engine is not None:
            engine.dispose()

    def _close(self, final: dict | None) -> None:
        if final is None:  # training raised; a stop (Ctrl-C, SIGTERM: cli.main.Terminated) is no failure
            stopped = isinstance(sys.exc_info()[1], KeyboardInterrupt)
            self.client.set_terminated(self.run_id, "KILLED" if stopped else "FAILED")
            return
        best = {f"best/dev_{final['key']}": final.get("best_f1"), "best/step": final.get("best_step")}
        if final.get("best_f1") is not None:  # at the best's step, as TensorBoard charts it
            self.log_metrics({k: float(v) for k, v in best.items() if v is not None}, _best_step(final))
        self.client.set_tag(self.run_id, "spanflow.completed", str(bool(final.get("completed"))).lower())
        self.client.set_terminated(self.run_id, "FINISHED")


def _best_step(final: dict) -> int:
    return final.get("best_step") or final["global_step"]


def _tracking_uri(local_dir: str | None) -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store in `local_dir` (MLflow 3 no longer opens a bare
    ./mlruns directory store without an opt-in)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{os.path.join(local_dir or 'mlruns', 'mlflow.db')}"


def _flat(params: dict) -> dict:
    """Params as the scalars both stores take: numbers, bools and strings as they are, the rest as text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
            for k, v in params.items()}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
