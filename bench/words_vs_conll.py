"""Plain-text predict against evaluate on CoNLL tokens: F1, entities cut inside whitespace tokens,
and the spaCy component against predict.

The texts of a CoNLL file are its tokens joined by single spaces. Each row predicts on them and
scores exact spans against the file's gold entities:

- `evaluate`: the file's tokens given as words (what `spanflow evaluate` does);
- `predict`: plain text cut into the model's own words (`words` in spanflow.json);
- `predict_tokenizer_words`: plain text on the tokenizer's words (a model saved before the key);
- `spacy` / `spacy_tokenizer_words`: the spanflow_ner component in `spacy.blank(--lang)` on the
  same texts, each against the predict row of the same words (`agree_with_predict`, texts with
  identical entities, entities expanded to spaCy tokens or left out as overlapping);
- `file`: the entities of a `spanflow predict` output given with --predictions.

    spanflow train ner --train ../shared/data/wnut17/train.conll --dev ../shared/data/wnut17/dev.conll \\
        --model MINILM --out runs/wnut_words
    python bench/words_vs_conll.py --model runs/wnut_words/model --data ../shared/data/wnut17/dev.conll
    spanflow train ner --train ../shared/data/resume_ner/train.char.bmes --out runs/resume
    python bench/words_vs_conll.py --model runs/resume/model --data ../shared/data/resume_ner/dev.char.bmes \
        --no-spacy --name resume_ner
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.tasks.metrics import agreement_f1, span_prf  # noqa: E402
from spanflow.tasks.ner import NerModel  # noqa: E402
from spanflow.tasks.ner.words import TOKENIZER, whitespace_words  # noqa: E402


def inside(texts: list[str], preds: list[list]) -> int:
    """Entities that start or end inside a whitespace token (a Chinese or Japanese character is a
    token of its own, as in CoNLL's character-level sentences, which are joined without spaces)."""
    n = 0
    for text, spans in zip(texts, preds):
        words = whitespace_words(text, {"chars": True})
        starts, ends = {a for a, _ in words}, {b for _, b in words}
        n += sum(s not in starts or e not in ends for s, e, _ in spans)
    return n


def row(name: str, gold: list, texts: list[str], preds: list, ref: list | None = None, **extra) -> dict:
    m = span_prf(gold, preds)
    out = {"run": name, "entities": sum(map(len, preds)), "f1": round(m["f1"], 4),
           "precision": round(m["precision"], 4), "recall": round(m["recall"], 4),
           "inside_whitespace_tokens": inside(texts, preds)}
    if ref is not None:
        out["agree_with_predict"] = round(agreement_f1(ref, preds), 4)
        out["texts_same_as_predict"] = sum(sorted(a) == sorted(b) for a, b in zip(ref, preds))
    print(out, flush=True)
    return {**out, **extra}


def spacy_runs(a, gold: list, texts: list[str], refs: dict) -> list[dict]:
    """The spaCy component on the model's words, then on the tokenizer's."""
    import spacy

    nlp = spacy.blank(a.lang)
    comp = nlp.add_pipe("spanflow_ner", config={"model": a.model, "precision": a.precision})
    rows = []
    for name, words in (("spacy", comp.model.words), ("spacy_tokenizer_words", TOKENIZER)):
        comp.model.words, comp.expanded, comp.overlapping = words, 0, 0
        preds = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in nlp.pipe(texts, batch_size=256)]
        rows.append(row(name, gold, texts, preds, refs[words], expanded=comp.expanded,
                        overlapping=comp.overlapping))
    return rows


def read_predictions(path: str) -> list[list]:
    with open(path, encoding="utf-8") as f:
        return [[(x["start"], x["end"], x["label"]) for x in json.loads(line)["entities"]] for line in f]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="a CoNLL (or .spacy) file with gold entities")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--lang", default="en", help="the spaCy language of spacy.blank [en]")
    ap.add_argument("--no-spacy", action="store_true")
    ap.add_argument("--predictions", help="a `spanflow predict` output on the same texts, scored too")
    ap.add_argument("--name", default="wnut17")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    model = NerModel.load(a.model, precision=a.precision)
    own = model.words
    chars = bool((model.word_edges or {}).get("chars"))
    data = read_ner(a.data)
    texts, gold = [e.text for e in data], [e.spans for e in data]
    rows = [row("evaluate", gold, texts, model.predict(texts, words=[e.words for e in data]))]
    refs = {own: model.predict(texts)}
    rows.append(row("predict", gold, texts, refs[own]))
    model.words = TOKENIZER
    refs[TOKENIZER] = model.predict(texts)
    rows.append(row("predict_tokenizer_words", gold, texts, refs[TOKENIZER], refs[own]))
    if not a.no_spacy:
        rows += spacy_runs(a, gold, texts, refs)
    if a.predictions:
        rows.append(row("file", gold, texts, read_predictions(a.predictions), refs[own]))
    cols = ["run", "entities", "f1", "precision", "recall", "inside_whitespace_tokens", "agree_with_predict",
            "texts_same_as_predict", "expanded", "overlapping"]
    write_results(a.out, f"words_vs_conll_{a.name}",
                  {"description": f"{a.name}: {os.path.basename(a.data)} as plain text (its tokens joined by spaces, a "
                                  "character-level sentence's without) against its tokens; exact-span entity F1; "
                                  f"model words: {own}{' cut into Chinese and Japanese characters' * chars}",
                   "args": {"model": a.model, "data": a.data, "precision": a.precision, "lang": a.lang}},
                  rows, cols)


if __name__ == "__main__":
    main()
