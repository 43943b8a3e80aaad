"""Proof of the task interface: tests/textcat_task.py, a task the package does not ship, is
registered and then trained, evaluated, run, tuned and served through the public CLI and
app, without a line of it anywhere in spanflow/."""
import json
import random

import pytest

import textcat_task  # noqa: F401  (registers the task)
from spanflow.cli.main import main
from spanflow.tasks.registry import names

SPORT = "goal match team score coach league striker referee".split()
WEATHER = "rain cloud storm sunny wind forecast snow humid".split()


def examples(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["sport", "weather"])
        words = SPORT if label == "sport" else WEATHER
        out.append((" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + " today", label))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("textcat")
    train = textcat_task.write_examples(d / "train.jsonl", examples(80, 0))
    dev = textcat_task.write_examples(d / "dev.jsonl", examples(30, 1))
    assert main(["train", "textcat", "--train", train, "--dev", dev, "--out", str(d / "run"), "--max-tokens", "256",
                 "--log-every", "0"]) == 0
    return d, train, dev, str(d / "run" / "model")


def test_the_task_is_registered_from_its_own_module():
    assert "textcat" in names()


def test_the_tasks_train_function_refuses_options_of_other_tasks(tmp_path, capsys):
    """Its training takes no train_fields: --stride is no flag of `train textcat`, and the API refuses
    TrainOptions.stride rather than train on without it."""
    from spanflow.errors import ConfigError
    from spanflow.training.options import TrainOptions

    with pytest.raises(ConfigError, match=r"^TrainOptions.stride \(--stride\) applies to NER training; textcat "
                                          r"training would ignore it"):
        textcat_task.train_textcat([("a b", "x")], None, model="tiny", out_dir=str(tmp_path / "o"),
                                   options=TrainOptions(stride=16))
    with pytest.raises(SystemExit):
        main(["train", "textcat", "--train", "t.jsonl", "--out", str(tmp_path / "o"), "--stride", "16"])
    assert "--stride" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_train_evaluate_and_predict_through_the_cli(trained, capsys):
    d, _, dev, model = trained
    capsys.readouterr()
    assert main(["evaluate", "--model", model, "--data", dev, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] >= 0.9  # the words decide the label
    src = d / "in.txt"
    src.write_text("storm rain wind today\ngoal team coach today\n")
    assert main(["predict", "--model", model, "--input", str(src), "--output", str(d / "out.jsonl")]) == 0
    recs = [json.loads(x) for x in (d / "out.jsonl").read_text().splitlines()]
    assert [r["label"] for r in recs] == ["weather", "sport"]


def test_tune_measures_the_task(trained, tmp_path):
    _, _, dev, model = trained
    assert main(["tune", "--task", "textcat", "--mode", "infer", "--model", model, "--data", dev, "--budgets",
                 "256,512", "--max-lengths", "64", "--budget-seconds", "20", "--out", str(tmp_path)]) == 0
    prof = json.loads((tmp_path / "profile.json").read_text())
    assert prof["task"] == "textcat" and {p["max_tokens"] for p in prof["points"]} == {256, 512}
    assert all(p["quality"] >= 0.9 for p in prof["points"])


def test_the_server_serves_the_task(trained):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from spanflow.serving.app import ServeOptions, create_app
    from spanflow.serving.services import load_service

    _, _, _, model = trained
    with TestClient(create_app([load_service(f"cls={model}", device="cpu")], ServeOptions())) as c:
        r = c.post("/v1/classify", json={"texts": ["snow wind cloud today", "coach referee match today"]})
        assert r.status_code == 200
        assert [x["label"] for x in r.json()["results"]] == ["weather", "sport"]
        assert c.get("/ready").json()["models"] == {"cls": "textcat"}
