"""--report-to: a tiny NER run reports to TensorBoard and MLflow, read back with their own readers."""
import glob
import json
import math
import os

import pytest

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.tasks.ner import train_ner
from spanflow.training import report_to
from spanflow.training.optim import warmup_linear
from spanflow.training.options import TrainOptions


def tiny_run(out, **kw):
    """Two epochs of a tiny model, the loss logged at every step; returns the jsonl report."""
    data = synthetic_ner(40, seed=1, max_clauses=1)
    base = dict(epochs=2, lr=2e-2, max_tokens=512, max_length=64, warmup_ratio=0.05, patience=0, log_every=1,
                seed=0)
    train_ner(data, data[:10], model="tiny", out_dir=str(out), options=TrainOptions(**{**base, **kw}),
              log_fn=lambda s: None)
    return [json.loads(line) for line in open(out / "train_report.jsonl")]


def read_events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def scalars(ea, tag):
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def test_tensorboard_scalars_match_the_report(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    reps = tiny_run(tmp_path, report_to="tensorboard")
    ea = read_events(tmp_path / "runs")
    last = reps[-1]["step"]
    loss = scalars(ea, "train/loss")
    assert [s for s, _ in loss] == list(range(1, last + 1))  # log_every=1: one point per optimizer step
    assert all(math.isfinite(v) and v > 0 for _, v in loss) and loss[-1][1] < loss[0][1]
    # the rate each step trained at: the first step's is the warm-up's first, not the second's
    f = warmup_linear(last, 0.05)
    assert [v for _, v in scalars(ea, "train/lr")] == pytest.approx([2e-2 * f(k) for k in range(last)], rel=1e-5)
    dev = scalars(ea, "dev/f1")
    assert [s for s, _ in dev] == [r["step"] for r in reps]
    assert [v for _, v in dev] == pytest.approx([r["dev_f1"] for r in reps], abs=1e-6)
    for key in ("real_tokens_per_s", "padded_tokens_per_s", "padding_efficiency", "compute_frac"):
        got = scalars(ea, f"epoch/{key}")
        assert [s for s, _ in got] == [r["step"] for r in reps], key
        assert [v for _, v in got] == pytest.approx([r[key] for r in reps], rel=1e-5), key
    best = max(r["dev_f1"] for r in reps)
    assert [v for _, v in scalars(ea, "best/dev_f1")] == pytest.approx([best], abs=1e-6)
    start = HParamsPluginData.FromString(ea.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["seed"].number_value == 0 and hp["max_tokens"].number_value == 512
    assert hp["precision"].string_value == reps[0]["precision"] and hp["report_to"].string_value == "tensorboard"


def backdate(log_dir):
    """Name the one event file in `log_dir` as written long ago: a real resume runs later, and
    TensorBoard reads a directory's files in name (timestamp) order."""
    (path,) = glob.glob(str(log_dir / "events.out.tfevents.*"))
    os.rename(path, log_dir / "events.out.tfevents.0000000001.stopped")


def test_tensorboard_resume_appends_to_the_same_curves(tmp_path):
    pytest.importorskip("tensorboard")
    tiny_run(tmp_path, report_to="tensorboard", max_steps=3)
    backdate(tmp_path / "runs")
    reps = tiny_run(tmp_path, report_to="tensorboard", resume=True)
    assert len(glob.glob(str(tmp_path / "runs" / "events.out.tfevents.*"))) == 2  # the stopped run's file is kept
    steps = [s for s, _ in scalars(read_events(tmp_path / "runs"), "train/loss")]
    assert steps == list(range(1, reps[-1]["step"] + 1))
    tiny_run(tmp_path, report_to="tensorboard", epochs=1)  # a fresh run in the same OUT starts fresh curves
    assert len(glob.glob(str(tmp_path / "runs" / "events.out.tfevents.*"))) == 1
    tiny_run(tmp_path, epochs=1)  # one that reports nowhere leaves no curves of a model no longer there
    assert glob.glob(str(tmp_path / "runs" / "events.out.tfevents.*")) == []


def test_tensorboard_resume_hides_steps_logged_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    stopped = report_to.TensorBoardReporter(str(tmp_path), resumed_step=None, log=lambda s: None)
    for step in range(1, 6):  # checkpointed at step 3, then killed at step 5
        stopped.log_metrics({"train/loss": 1.0}, step)
    stopped.writer.close()
    backdate(tmp_path / "runs")
    resumed = report_to.TensorBoardReporter(str(tmp_path), resumed_step=3, log=lambda s: None)
    for step in range(4, 7):
        resumed.log_metrics({"train/loss": 2.0}, step)
    resumed.close({"best_f1": None, "best_step": None, "global_step": 6, "completed": True})
    assert scalars(read_events(tmp_path / "runs"), "train/loss") == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0),
                                                                      (5, 2.0), (6, 2.0)]


def mlflow_client(uri):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@pytest.fixture
def local_mlflow(monkeypatch):
    for mod in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(mod)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def test_mlflow_params_and_metrics_in_the_local_store(tmp_path, local_mlflow):
    def store_files_open():
        return sum(os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(tmp_path)) for fd in os.listdir("/proc/self/fd"))

    reps = tiny_run(tmp_path, report_to="mlflow")
    if os.path.isdir("/proc/self/fd"):  # the run's store closed with it: a notebook's runs held two files each
        assert store_files_open() == 0
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("spanflow")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["spanflow.completed"] == "true"
    params = run.data.params
    assert params["seed"] == "0" and params["max_tokens"] == "512" and params["epochs"] == "2"
    assert params["precision"] == reps[0]["precision"] and params["device"] == reps[0]["device"]
    assert params["model"] == "tiny" and params["train_items"] == "40"  # runs of other models or data told apart
    best = max(r["dev_f1"] for r in reps)
    assert run.data.metrics["best/dev_f1"] == pytest.approx(best, abs=1e-9)

    def history(key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                  key=lambda m: m.step)]

    assert history("dev/f1") == [(r["step"], pytest.approx(r["dev_f1"], abs=1e-9)) for r in reps]
    assert [v for _, v in history("epoch/padding_efficiency")] == pytest.approx([r["padding_efficiency"]
                                                                                 for r in reps])
    assert [s for s, _ in history("train/loss")] == list(range(1, reps[-1]["step"] + 1))


@pytest.mark.parametrize("raised,status", [(KeyboardInterrupt, "KILLED"), (RuntimeError, "FAILED")])
def test_a_stopped_run_is_killed_in_mlflow_and_a_failed_one_failed(tmp_path, local_mlflow, raised, status):
    from spanflow.training.report_to import MlflowReporter

    rep = MlflowReporter(str(tmp_path), resumed_step=None, log=lambda s: None)
    with pytest.raises(raised):
        try:
            raise raised()
        finally:  # as the training loop closes its reporters
            rep.close(None)
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("spanflow").experiment_id])
    assert run.info.status == status


def test_mlflow_uses_the_tracking_uri_and_experiment_set(tmp_path, local_mlflow, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "ner-runs")
    reps = report_to.build_reporters("mlflow", out_dir=str(tmp_path / "out"), resumed_step=7, log=lambda s: None)
    reps.log_params({"seed": 3, "class_weights": {"PER": 2.0}, "pack": None})
    reps.log_metrics({"train/loss": 0.5, "skipped": None}, step=8)
    reps.close(None)  # a failed run
    client = mlflow_client(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ner-runs").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["spanflow.resumed_from_step"] == "7"
    assert run.data.params == {"seed": "3", "class_weights": '{"PER": 2.0}', "pack": "null"}
    assert run.data.metrics == {"train/loss": 0.5}
    assert not (tmp_path / "out" / "mlruns").exists()


def test_a_log_directory_that_cannot_be_made_is_a_config_error(tmp_path):
    pytest.importorskip("tensorboard")
    (tmp_path / "runs").write_text("")  # a file where OUT/runs goes
    with pytest.raises(ConfigError, match=r"^--report-to tensorboard cannot write .*runs: File exists"):
        report_to.build_reporters("tensorboard", out_dir=str(tmp_path), resumed_step=None, log=lambda s: None)


def test_unknown_reporter_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown reporter 'wandb'; known: tensorboard, mlflow"):
        TrainOptions(report_to="tensorboard,wandb")
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        TrainOptions(report_to="none,mlflow")
    assert TrainOptions().report_to == "none"
    assert TrainOptions(report_to=" TensorBoard , all").report_to == "tensorboard,all"


@pytest.mark.parametrize("name", ["tensorboard", "mlflow"])
def test_a_missing_extra_is_named_before_training(name, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(report_to.importlib.util, "find_spec",
                        lambda mod, *a: None if mod in ("tensorboard", "mlflow") else real(mod, *a))
    with pytest.raises(ConfigError, match=rf"^TrainOptions.report_to='{name}' needs {name}, which is not installed: "
                                          rf"pip install 'spanflow\[{name}\]'"):
        TrainOptions(report_to=name)
    assert report_to.resolve(TrainOptions(report_to="all").report_to) == []  # `all`: only what is installed


def test_a_failing_reporter_is_dropped_and_training_goes_on():
    class Broken:
        calls = 0

        def log_metrics(self, metrics, step):
            Broken.calls += 1
            raise OSError("disk full")

    lines = []
    reps = report_to.Reporters({"broken": Broken()}, log=lines.append)
    reps.log_metrics({"train/loss": 1.0}, step=1)
    reps.log_metrics({"train/loss": 0.9}, step=2)
    assert Broken.calls == 1 and len(lines) == 1 and "reporting to broken failed (OSError: disk full)" in lines[0]


def test_an_embedding_runs_dev_score_is_charted_under_its_own_name(tmp_path):
    pytest.importorskip("tensorboard")
    from spanflow.tasks.embed.pairs import Pair
    from spanflow.tasks.embed.train import train_embedder

    texts = [e.text for e in synthetic_ner(24, seed=3)]
    pairs = [Pair(texts[i], texts[i + 12], (i % 5) / 4) for i in range(12)]
    opts = TrainOptions(epochs=2, lr=3e-3, max_tokens=4096, log_every=0, patience=0, report_to="tensorboard")
    train_embedder(pairs, pairs, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lambda s: None)
    reps = [json.loads(line) for line in open(tmp_path / "train_report.jsonl")]
    ea = read_events(tmp_path / "runs")
    tags = set(ea.Tags()["scalars"])
    assert "dev/f1" not in tags and "best/dev_f1" not in tags  # a Spearman is no F1
    assert [v for _, v in scalars(ea, "dev/spearman")] == pytest.approx([r["dev_f1"] for r in reps], abs=1e-6)
    assert "dev/pearson" in tags and "dev/n" not in tags  # the other scores, not the counts
    best = max(range(len(reps)), key=lambda k: reps[k]["dev_f1"])
    assert scalars(ea, "best/dev_spearman") == [(reps[best]["step"], pytest.approx(reps[best]["dev_f1"], abs=1e-6))]
    assert [v for _, v in scalars(ea, "epoch/wall_s")] == pytest.approx([r["wall_s"] for r in reps], rel=1e-5)


def test_a_ranking_runs_scores_reach_mlflow_under_names_it_takes(tmp_path, local_mlflow):
    """MRR@10's '@' is no character of an MLflow name: the first evaluation dropped the reporter."""
    lines: list[str] = []
    reps = report_to.build_reporters("mlflow", out_dir=str(tmp_path), resumed_step=None, log=lines.append,
                                     metric="MRR@10")
    scores = {"f1": 0.5, "mrr@10": 0.5, "ndcg@10": 0.6, "recall@1": 0.4, "recall@10": 0.9, "n": 12}
    reps.log_metrics(report_to.dev_scalars(scores, "MRR@10"), 1)
    reps.close({"best_f1": 0.5, "best_step": 1, "global_step": 2, "completed": True})
    assert not any("failed" in x for x in lines), lines
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("spanflow").experiment_id])
    assert run.info.status == "FINISHED"
    assert {"dev/mrr_10", "dev/ndcg_10", "dev/recall_1", "dev/recall_10", "best/dev_mrr_10"} <= set(run.data.metrics)
