"""The embedding trainer under faults: a SIGKILL then --resume, bad pair files through the CLI,
and a trained embedder served as it encodes."""
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from spanflow.cli.main import main
from spanflow.tasks.embed import Embedder
from spanflow.tasks.embed.pairs import read_pairs
from spanflow.tasks.embed.train import train_embedder
from spanflow.training.options import TrainOptions

# two words for each concept: a pair's score is how many concepts its sentences share, whichever
# word names them, so a from-scratch model gains dev Spearman by learning which words mean the same
CONCEPTS = [("red", "crimson"), ("dog", "hound"), ("cat", "kitten"), ("big", "large"), ("small", "tiny"),
            ("fast", "quick"), ("house", "home"), ("road", "street"), ("sun", "daylight"), ("river", "stream"),
            ("runs", "sprints"), ("sleeps", "naps"), ("old", "ancient"), ("car", "auto"), ("tree", "oak")]


def write_scored_pairs(path, n: int, seed: int) -> str:
    """A sentence1,sentence2,score CSV of `n` four-word sentence pairs scored 0-4 by shared concepts."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a = rng.sample(range(len(CONCEPTS)), 4)
        keep = rng.randint(0, 4)
        b = a[:keep] + rng.sample([c for c in range(len(CONCEPTS)) if c not in a], 4 - keep)
        rng.shuffle(b)
        rows.append([" ".join(rng.choice(CONCEPTS[c]) for c in side) for side in (a, b)] + [float(keep)])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentence1", "sentence2", "score"])
        w.writerows(rows)
    return str(path)


def params(model_dir) -> dict:
    """The encoder weights of a sentence-transformers directory (Transformer module at the top)."""
    return load_file(os.path.join(model_dir, "model.safetensors"))


def assert_same_weights(a_dir, b_dir) -> None:
    a, b = params(a_dir), params(b_dir)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def last_report(out) -> dict:
    return json.loads((out / "train_report.jsonl").read_text().splitlines()[-1])


def checkpoint_step(out) -> int:
    """The step of the checkpoint a killed run left (a kill between replace_dir's two renames
    leaves it as .checkpoint.replaced, which --resume puts back)."""
    for name in ("checkpoint", ".checkpoint.replaced"):
        state = out / name / "state.json"
        if state.exists():
            return json.loads(state.read_text())["global_step"]
    raise AssertionError(f"no checkpoint in {out}")


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    """A real kill mid-run (after some checkpoint), then --resume: same final weights, same dev Spearman."""
    train = write_scored_pairs(tmp_path / "train.csv", 160, seed=1)  # 8 steps an epoch at 256 tokens
    dev = write_scored_pairs(tmp_path / "dev.csv", 40, seed=2)
    args = ["--train", train, "--dev", dev, "--model", "tiny", "--epochs", "3", "--max-tokens", "256",
            "--save-every", "3", "--seed", "1"]

    def cli(out, *extra, quiet=True):
        pipe = subprocess.DEVNULL if quiet else subprocess.PIPE
        return subprocess.Popen([sys.executable, "-m", "spanflow", "train", "embed", *args, "--out", str(out), *extra],
                                stdout=pipe, stderr=subprocess.STDOUT if not quiet else pipe, text=True)

    full, part = tmp_path / "full", tmp_path / "part"
    done = cli(full, quiet=False)
    log = done.communicate(timeout=300)[0]
    assert done.returncode == 0, log
    proc = cli(part)
    state = part / "checkpoint" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if json.loads(state.read_text())["global_step"] >= 9:
                break
        except (OSError, json.JSONDecodeError, KeyError):  # not written yet, or being replaced
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    total = json.loads((full / "checkpoint" / "state.json").read_text())["global_step"]
    assert total >= 15
    killed_at = checkpoint_step(part)
    assert killed_at < total, "the run finished before it was killed; the test proves nothing"
    resumed = cli(part, "--resume", quiet=False)
    log = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, log
    # it went on from the checkpoint, not from the start (a fresh run with the seed would match too)
    assert re.search(rf"resumed from \S+: epoch \d+, step {killed_at}\b", log), log
    assert_same_weights(full / "checkpoint" / "model", part / "checkpoint" / "model")  # the last step's
    assert_same_weights(full / "model", part / "model")  # the best by dev Spearman
    a, b = last_report(full), last_report(part)
    assert a["dev_metric"] == b["dev_metric"] == "Spearman" and a["epoch"] == b["epoch"] == 3
    assert b["dev_f1"] == pytest.approx(a["dev_f1"], abs=1e-4)


BAD_FILES = {
    "missing_column": ("sentence1,sentence2,score\nred dog,crimson hound,4\nold car,ancient auto\n", 3),
    "score_not_a_number": ("sentence1,sentence2,score\nred dog,crimson hound,high\n", 2),
    "empty_text": ("sentence1,sentence2,score\n,crimson hound,4\nold car,ancient auto,2\n", 2),
    "empty_file": ("", None),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_pair_files_are_one_error_line(case, tmp_path, capsys):
    text, line = BAD_FILES[case]
    bad = tmp_path / f"{case}.csv"
    bad.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["train", "embed", "--train", str(bad), "--model", "tiny", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [s for s in err.splitlines() if s.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    where = f"{bad}:{line}:" if line is not None else f"{bad}:"
    assert where in lines[0], err
    assert "Traceback" not in err
    assert not out.exists()  # a run that fails on its data leaves nothing behind


def test_a_trained_embedder_is_served(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from spanflow.serving.app import ServeOptions, create_app
    from spanflow.serving.services import load_service

    train = read_pairs(write_scored_pairs(tmp_path / "train.csv", 60, seed=3))
    dev = read_pairs(write_scored_pairs(tmp_path / "dev.csv", 20, seed=4))
    out = tmp_path / "out"
    train_embedder(train, dev, model="tiny", out_dir=str(out), options=TrainOptions(epochs=1, log_every=0),
                   log_fn=lambda s: None)
    model_dir = str(out / "model")
    texts = ["red dog runs", "an ancient auto sleeps by the stream"]
    want = Embedder.load(model_dir, precision="fp32", device="cpu")
    services = [load_service(f"emb={model_dir}", precision="fp32", device="cpu")]
    with TestClient(create_app(services, ServeOptions())) as c:
        r = c.post("/v1/embeddings", json={"input": texts, "model": "emb"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    assert got.shape == (2, want.dim)
    ref = want.encode(texts)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert (cos >= 0.9999).all(), cos
