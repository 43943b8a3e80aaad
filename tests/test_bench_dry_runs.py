"""The benchmark scripts CI cannot time still run: bench/gpu_check.sh --dry-run (the roofline
jobs, a few steps each) on this machine's CPU, with a from-scratch model and synthetic data, and
bench/train_step_profile.py, bench/step_levers.py, bench/tiny_recurrence.py,
bench/device_step_profile.py and bench/crf_likelihood.py on short runs; bench/time_to_accuracy.py
on retrieval pairs that bench/ranking_qa.py writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_roofline_row(tmp_path):
    env = dict(os.environ, PY=sys.executable, MODEL="tiny", DATA=str(tmp_path / "no-data"), TMPDIR=str(tmp_path))
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu_check.sh"), "--dry-run"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    wrote = [line.split("wrote ", 1)[1] for line in p.stdout.splitlines() if line.startswith("wrote ")]
    assert wrote and all(w.startswith(str(tmp_path)) for w in wrote)  # a dry run writes nothing into bench/results
    assert [os.path.basename(w) for w in wrote] == ["gpu_check.md", "device_step_profile.md"]  # the step profile too
    rows = json.load(open(wrote[0].removesuffix(".md") + ".json"))["rows"]
    jobs = [r["job"] for r in rows]
    assert jobs[:6] == ["train NER", "train relations", "train embeddings", "embed", "predict NER",
                        "predict relations"] and jobs[6].startswith("serve embed")
    for r in rows[:6]:
        assert r["real_tokens_per_s"] > 0 and 0 < r["padding_efficiency"] <= 1, r
        assert r["mfu"] is None or r["mfu"] > 0, r
        assert r["command"].startswith("spanflow "), r
    assert rows[6]["real_tokens_per_s"] > 0


@pytest.mark.slow
def test_train_step_profile_splits_a_step_by_kind(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "train_step_profile.py"), "--passes", "1",
                        "--precision", "fp32", "--out", str(tmp_path), "--name", "profile"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.load(open(tmp_path / "profile.json"))
    shares = {r["kind"]: r["share"] for r in result["rows"]}
    assert max(shares, key=shares.get) == "matrix products", shares  # a step's products outweigh any other kind
    assert shares["dropout masks"] > 0 and shares["optimizer and gradient norm"] > 0, shares
    profiled = sum(r["ms_per_step"] for r in result["rows"])
    # per step: the operators' time of a profiled step within the wall time of that step (the same
    # passes, so a machine busy elsewhere slows both alike)
    assert 0.5 < profiled / result["profiled_step_ms"] < 1.5, (profiled, result["profiled_step_ms"])
    assert 0 < result["optimizer_ms"] < result["step_ms"] and 0 < result["mfu"] < 1.5, result


@pytest.mark.slow
def test_step_levers_measures_each_lever_where_it_reaches(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "step_levers.py"), "--passes", "1",
                        "--precision", "fp32", "--levers", "bool_masks", "--out", str(tmp_path),
                        "--name", "levers"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["lever"]: r for r in json.load(open(tmp_path / "levers.json"))["rows"]}
    assert set(rows) == {"bool_masks"}
    r = rows["bool_masks"]
    # every dropout of MiniLM's shape went through the lever: the embeddings' and three per layer
    assert r["patched_calls_per_step"] == 1 + 3 * 6, r
    assert r["pairs"] == 4 and r["ratio"] > 0 and r["base_ms_per_1k_tokens"] > 0, r


def test_step_levers_refuses_a_lever_it_does_not_know():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "step_levers.py"), "--levers", "fused_everything"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown levers ['fused_everything']" in p.stderr, p.stderr[-2000:]


def test_tiny_recurrence_bench_compares_the_two_recurrences(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "tiny_recurrence.py"), "--lengths", "8,16",
                        "--steps", "1", "--out", str(tmp_path), "--name", "rec"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.load(open(tmp_path / "rec.json"))["rows"]
    assert [r["row_tokens"] for r in rows] == [8, 16] and [r["rows"] for r in rows] == [128, 64]
    for r in rows:  # the same outputs, both timed
        assert float(r["max_abs_diff"]) < 1e-4 and r["packed_ms"] > 0 and r["padded_ms"] > 0, r


@pytest.mark.parametrize("task", ["ner", "re"])
def test_device_step_profile_splits_the_loops_steps_into_host_and_device(tmp_path, task):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "device_step_profile.py"), "--task", task,
                        "--model", "tiny", "--skip", "2", "--steps", "3", "--out", str(tmp_path), "--name", "dsp"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.load(open(tmp_path / "dsp.json"))
    assert result["task"] == task and f"spanflow train {task}`" in result["description"], result
    assert result["profiled_steps"] == 3 and result["step_ms"] > 0 and result["aten_calls_per_step"] > 10, result
    assert 0 < result["host_ms_per_step"] < 10 * result["step_ms"], result  # per step, as the step is timed
    # kernel time only where there is an accelerator to run kernels
    assert (result["device_busy_ms_per_step"] is None) == (not torch.cuda.is_available()), result
    host = [r for r in result["rows"] if r["side"] == "host"]
    assert host and all(r["ms_per_step"] > 0 for r in host)
    assert [r["ms_per_step"] for r in host] == sorted((r["ms_per_step"] for r in host), reverse=True)


def test_roofline_runs_the_other_jobs_past_a_failed_one_and_exits_non_zero(tmp_path):
    # one device run shows every fault: a job that fails leaves the others' rows, and the run fails
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "roofline.py"), "--dry-run", "--model", "tiny",
                        "--ner", str(tmp_path / "missing.conll"), "--jobs", "train-ner,train-re"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "1 job(s) failed: train-ner" in p.stderr, p.stderr[-3000:]
    assert "roofline job train-ner failed" in p.stderr and "missing.conll" in p.stderr
    wrote = [line.split("wrote ", 1)[1] for line in p.stdout.splitlines() if line.startswith("wrote ")]
    rows = json.load(open(wrote[0].removesuffix(".md") + ".json"))["rows"]
    assert [r["job"] for r in rows] == ["train relations"]


def test_compile_train_step_runs_the_modes_it_is_given_on_this_device(tmp_path):
    bench = os.path.join(ROOT, "bench", "compile_train_step.py")
    p = subprocess.run([sys.executable, bench, "--modes", "eager", "--repeats", "1", "--passes", "1",
                        "--precision", "fp32", "--out", str(tmp_path), "--name", "c"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.load(open(tmp_path / "c.json"))
    assert result["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert [r["mode"] for r in result["rows"]] == ["eager"] and result["rows"][0]["step_ms"] > 0
    p = subprocess.run([sys.executable, bench, "--modes", "compile_dynamic"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "include it" in p.stderr  # nothing to compare with
    if not torch.cuda.is_available():  # inductor would skip the graphs without a word
        p = subprocess.run([sys.executable, bench, "--modes", "eager,compile_cudagraphs"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "needs a CUDA device" in p.stderr


def test_crf_likelihood_bench_compares_the_three_ways(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "crf_likelihood.py"), "--rows", "4", "--tokens",
                        "24", "--words", "12", "--passes", "2", "--out", str(tmp_path), "--name", "crf"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["way"]: r for r in json.load(open(tmp_path / "crf.json"))["rows"]}
    assert set(rows) == {"autograd", "closed_form", "words"}
    assert all(r["grad_diff"] < 1e-4 and r["loss_rel_diff"] < 1e-5 and r["ms"] > 0 for r in rows.values()), rows
    # fewer operators a position than autograd's recursion, and fewer positions over the words
    assert rows["words"]["aten_ops"] < rows["closed_form"]["aten_ops"] < rows["autograd"]["aten_ops"], rows


def _qa_data(folder, n: int) -> None:
    """A CasRel file pair whose triples ranking_qa.py turns into question -> passage pairs."""
    folder.mkdir()
    for part, count in (("train", n), ("dev", n // 3)):
        data = [{"text": f"Port {i} airport serves the town of Vale {i} in region {i % 5} .",
                 "triple_list": [[f"Port_{i}", "cityServed", f"Vale_{i}"], [f"Port_{i}", "regionName", f"R{i % 5}"]]}
                for i in range(count)]
        (folder / f"{part}_triples.json").write_text(json.dumps(data))


def test_time_to_accuracy_scores_pairs_without_scores_by_retrieval(tmp_path):
    _qa_data(tmp_path / "webnlg", 48)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ranking_qa.py"), "--data", str(tmp_path / "webnlg"),
                        "--write-pairs", str(tmp_path / "qa")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    pairs = [json.loads(x) for x in open(tmp_path / "qa" / "train.jsonl")]
    assert len(pairs) == 96 and pairs[0] == {"query": "Port 0 city served",
                                             "positive": "Port 0 airport serves the town of Vale 0 in region 0 ."}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "time_to_accuracy.py"), "--task", "embed",
                        "--train", str(tmp_path / "qa" / "train.jsonl"), "--dev", str(tmp_path / "qa" / "dev.jsonl"),
                        "--runs", "spanflow", "--model", "tiny", "--epochs", "1", "--out", str(tmp_path),
                        "--name", "qa"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.load(open(tmp_path / "time_to_accuracy_qa.json"))
    assert result["metric"] == "MRR@10" and "dev MRR@10" in result["description"]
    assert 0 < result["rows"][0]["final_f1"] <= 1
    md = open(tmp_path / "time_to_accuracy_qa.md").read()
    assert "| final_mrr@10 |" in md and "| dev MRR@10 |" in md and "Spearman" not in md


def test_time_to_accuracy_counts_sentence_transformers_padding_over_its_masks_only():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        from time_to_accuracy import st_padding_efficiency
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))

    class Trainer:  # two batches of the shape sentence-transformers' collator gives: each column padded on its own
        def get_train_dataloader(self):
            return [{"anchor_input_ids": torch.ones(2, 3), "anchor_attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
                     "positive_attention_mask": torch.tensor([[1, 1], [1, 1]])},
                    {"anchor_attention_mask": torch.tensor([[1, 1]]), "positive_attention_mask": torch.tensor([[1, 0]]),
                     "label": torch.tensor([0.5])}]

    assert st_padding_efficiency(Trainer()) == (3 + 4 + 2 + 1) / (6 + 4 + 2 + 2)


def test_results_name_no_path_of_this_machine():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from common import anonymise

    assert anonymise("--server-tree /tmp/before --out /home/u/runs/out.json") == "--server-tree before --out runs/out.json"
    assert anonymise("s3://bucket/entities/ http://127.0.0.1:8080/v1/ner ../data/wnut/a.csv") == \
        "s3://bucket/entities/ http://127.0.0.1:8080/v1/ner ../data/wnut/a.csv"  # URLs and relative paths kept
