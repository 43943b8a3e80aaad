"""Long documents keep their accuracy: per-sentence F1 against documents of joined sentences.

Consecutive dev sentences are joined (one space between, or with `--sep newline` a line
break) into documents of 5, 10, 20 and 40 sentences, entity offsets shifted along. Each
document size is scored three ways: the encoder's full window read across line breaks
(what spanflow ran before), the trained window (the longest window the model was trained
on) read across line breaks, and the default: the trained window, each line read on its own
when the model was trained on single-line texts. With spaces between the sentences the
last two are the same.

    python bench/long_documents.py --model runs/wnut/model --data ../shared/data/wnut17/dev.conll

To measure on texts of the training data's own kind (WNUT-17 dev is YouTube comments, its
training data tweets), hold out a share of the training file and train on the rest:

    python bench/split_holdout.py --data ../shared/data/wnut17/train.conll --out runs/ho --seed 0
    spanflow train ner --train runs/ho/train.conll --dev ../shared/data/wnut17/dev.conll --model MINILM --out runs/ho/w
    python bench/long_documents.py --model runs/ho/w/model --data runs/ho/held.conll --name wnut17_heldout_tweets_s0
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results  # noqa: E402
from spanflow.data.examples import NerExample, join_examples  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.tasks.ner import NerModel  # noqa: E402


SEPARATORS = {"space": " ", "newline": "\n"}


def join(examples: list[NerExample], k: int, sep: str = " ") -> list[NerExample]:
    """Documents of k consecutive examples, texts joined by `sep`."""
    return [join_examples(examples[i:i + k], sep) for i in range(0, len(examples), k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--sizes", default="1,5,10,20,40")
    ap.add_argument("--name", default="wnut17")
    ap.add_argument("--sep", choices=list(SEPARATORS), default="space", help="what joins the sentences [space]")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    model = NerModel.load(a.model)
    data = read_ner(a.data)
    trained, full, own_lines = model.max_length, model.limit, model.lines
    configs = (("encoder_window", full, False), ("trained_window", trained, False),
               ("default", trained, own_lines))
    rows = []
    for k in (int(x) for x in a.sizes.split(",")):
        docs = join(data, k, SEPARATORS[a.sep])
        row = {"sentences_per_doc": k, "docs": len(docs)}
        for name, window, lines in configs:
            model.set_max_length(window)
            model.lines = lines
            t = time.perf_counter()
            m = model.evaluate(docs)
            row.update({f"{name}_f1": m["f1"], f"{name}_recall": m["recall"],
                        f"{name}_s": round(time.perf_counter() - t, 2)})
        rows.append(row)
        print(row, flush=True)
    base = rows[0]
    for r in rows:
        r["default_f1_drop"] = round(base["default_f1"] - r["default_f1"], 4)
    names = [n for n, _, _ in configs]
    write_results(a.out, f"long_documents_{a.name}" + ("" if a.sep == "space" else f"_{a.sep}"),
                  {"description": f"{a.name}: the sentences of {os.path.basename(a.data)} joined into documents ({a.sep} "
                                  f"between); exact-span entity F1 "
                                  f"with the encoder's full window ({full} tokens), the trained window ({trained} "
                                  f"tokens) across line breaks, and the default (trained window, "
                                  f"{'each line on its own' if own_lines else 'lines read together'}); "
                                  f"model {os.path.basename(os.path.dirname(a.model.rstrip('/')))}",
                   "args": {"sizes": a.sizes, "name": a.name, "sep": a.sep}},
                  rows, ["sentences_per_doc", "docs"] + [f"{n}_{m}" for n in names for m in ("f1", "recall")]
                  + ["default_f1_drop"] + [f"{n}_s" for n in names])


if __name__ == "__main__":
    main()
