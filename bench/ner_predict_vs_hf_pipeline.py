"""NER prediction: HF pipeline("token-classification", aggregation_strategy="simple"/"first",
batch_size=32) on the model `spanflow export --to hf` wrote, vs spanflow on the same model and texts,
each precision against its like: spanflow in fp32 against the pipeline (fp32, its default), in
bf16 against the pipeline under torch.autocast(bf16), and spanflow's defaults against both.

Identity is checked on a softmax model only: a CRF model's export drops its transition scores, so
the pipeline would decode other entities by design (docs/ner.md); such a model is refused. Every
text the two tag differently is put in one class: the pipeline's entity starts or ends inside a
whitespace word (it continues words by its tokenizer's marks, not by the model's words), 'simple'
cut a word into subword pieces, or other.

    spanflow train ner --head softmax --model MINILM --train ../shared/data/wnut17/train.conll --out runs/softmax
    python bench/ner_predict_vs_hf_pipeline.py --model runs/softmax/model --data ../shared/data/wnut17/dev.conll

The `spanflow` rows run at --max-tokens (8192 unless given), `spanflow_defaults` at predict's own
defaults (its token budget and --precision auto's choice).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import timed, write_results  # noqa: E402
from spanflow.batching.align import encode_texts  # noqa: E402
from spanflow.batching.batcher import padding_efficiency, token_budget_batches  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.tasks.ner import NerModel  # noqa: E402


def export(model_dir: str, path: str) -> None:
    """The directory `spanflow export --to hf` writes: what a user hands to transformers."""
    from spanflow.cli.main import main as cli

    if cli(["export", "--model", model_dir, "--to", "hf", path]) != 0:
        raise SystemExit(f"spanflow export failed for {model_dir}")


def classify(text: str, hf: list, sf: list) -> str:
    """Why the pipeline's entities differ from spanflow's on one text."""
    extra = set(hf) - set(sf)
    if any(_mid_word(text, x) for x in extra):
        return "pipeline_inside_a_word"
    return "other"


def _spans(doc: list) -> list:
    """A pipeline's entities of one text as spanflow lists them: sorted (start, end, label)."""
    return sorted((d["start"], d["end"], d["entity_group"]) for d in doc)


def _mid_word(text: str, span) -> bool:
    """True when a span starts or ends inside a whitespace-delimited word."""
    s, e = span[0], span[1]
    return (s > 0 and not text[s - 1].isspace()) or (e < len(text) and not text[e].isspace())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a spanflow NER model directory")
    ap.add_argument("--data", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8192, help="the spanflow rows' token budget [%(default)s]")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    from transformers import pipeline

    texts = [e.text for e in read_ner(a.data)]
    sf = NerModel.load(a.model, device="cpu", precision="fp32")
    if sf.head_type == "crf":
        raise SystemExit("a CRF model's export decodes token by token without its transitions: no identity to check "
                         "(train with --head softmax; bench/crf_vs_softmax_predict.py compares the heads)")
    hf_dir = os.path.join(tempfile.mkdtemp(prefix="hf_ner_"), "hf")
    export(a.model, hf_dir)
    pipe = pipeline("token-classification", model=hf_dir, aggregation_strategy="simple", batch_size=32, device=-1)
    first = pipeline("token-classification", model=hf_dir, aggregation_strategy="first", batch_size=32, device=-1)
    torch.set_grad_enabled(False)
    pipe(texts[:64])  # warm-up
    sf.predict(texts[:64])
    t_hf, hf_out = timed(lambda: pipe(texts), a.repeats)
    t_first, first_out = timed(lambda: first(texts), a.repeats)

    def first_bf16():  # the pipeline under bf16 autocast: the like-for-like of spanflow in bf16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return first(texts)

    first_bf16()
    t_first16, first16_out = timed(first_bf16, a.repeats)
    t_sf, sf_out = timed(lambda: sf.predict(texts, max_tokens=a.max_tokens), a.repeats)
    sf16 = NerModel.load(a.model, device="cpu", precision="bf16")
    sf16.predict(texts[:64])
    t_sf16, sf16_out = timed(lambda: sf16.predict(texts, max_tokens=a.max_tokens), a.repeats)
    # what `spanflow predict` runs with no flags: --precision auto's choice, the default token budget
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import task_of_dir

    auto = resolve_runtime(task_of_dir(a.model), a.model, Asked(device="cpu"), texts=texts).precision
    sfd = NerModel.load(a.model, device="cpu", precision=auto)
    sfd.predict(texts[:64])
    t_sfd, _ = timed(lambda: sfd.predict(texts), a.repeats)
    hf_spans = [_spans(doc) for doc in hf_out]
    same = sum(h == s for h, s in zip(hf_spans, sf_out))
    diffs = [(t, h, s) for t, h, s in zip(texts, hf_spans, sf_out) if h != s]
    first_spans = [_spans(doc) for doc in first_out]
    same_first = sum(h == s for h, s in zip(first_spans, sf_out))
    kinds = {}
    for t, h, s_ in zip(texts, first_spans, sf_out):
        if h != s_:
            kinds[classify(t, h, s_)] = kinds.get(classify(t, h, s_), 0) + 1
    unexplained = [(t, h, s_) for t, h, s_ in zip(texts, first_spans, sf_out) if h != s_ and classify(t, h, s_) == "other"]
    lengths = [len(e.ids) + 2 for e in encode_texts(sf.tokenizer, texts)]
    hf_eff = padding_efficiency([list(range(i, min(i + 32, len(texts)))) for i in range(0, len(texts), 32)], lengths)
    sf_eff = padding_efficiency(token_budget_batches(lengths, a.max_tokens, shuffle=False), lengths)
    n_tok = sum(lengths)
    pipeline_s = {"fp32": t_first, "bf16": t_first16}  # what each precision's ratio is against

    def row(run: str, seconds: float, precision: str, eff) -> dict:
        return {"run": run, "precision": precision, "seconds": seconds, "texts_per_s": len(texts) / seconds,
                "real_tokens_per_s": n_tok / seconds, "padding_efficiency": eff,
                "x_pipeline_first_fp32": t_first / seconds, "x_pipeline_first_same_precision": pipeline_s[precision] / seconds}

    rows = [row("hf_pipeline_simple_bs32", t_hf, "fp32", hf_eff), row("hf_pipeline_first_bs32", t_first, "fp32", hf_eff),
            row("hf_pipeline_first_bs32_autocast", t_first16, "bf16", hf_eff),
            row("spanflow", t_sf, "fp32", sf_eff), row("spanflow", t_sf16, "bf16", sf_eff),
            row("spanflow_defaults", t_sfd, auto, None)]
    simple_inside = sum(classify(t, h, s_) == "pipeline_inside_a_word" for t, h, s_ in diffs)
    summary = (f"identical entity lists (fp32) vs pipeline 'first': {same_first}/{len(texts)} texts (the others: "
               f"{', '.join(f'{v} {k}' for k, v in sorted(kinds.items())) or 'none'}); vs 'simple': {same}/{len(texts)} "
               f"({simple_inside} with an entity inside a word, {len(diffs) - simple_inside} other); spanflow bf16 vs "
               f"fp32 identical: {sum(a_ == b for a_, b in zip(sf_out, sf16_out))}/{len(texts)}; the pipeline 'first' under bf16 "
               f"autocast vs fp32 identical: {sum(_spans(x) == _spans(y) for x, y in zip(first16_out, first_out))}/"
               f"{len(texts)}")
    print(summary)
    for t, h, s_ in unexplained[:10]:
        print("DIFF", repr(t[:120]), "\n  hf:", [(t[x:y], lab) for x, y, lab in h], "\n  sf:",
              [(t[x:y], lab) for x, y, lab in s_])
    write_results(a.out, "ner_predict_vs_hf_pipeline",
                  {"description": f"{len(texts)} texts of {a.data}, model {a.model} (words: {sf.words}), exported "
                                  f"with `spanflow export --to hf`, CPU; medians of {a.repeats}; the spanflow rows at "
                                  f"--max-tokens {a.max_tokens}, spanflow_defaults at predict's defaults; x_pipeline_first_fp32: "
                                  "the pipeline 'first' (fp32, its default) in seconds over the run's; "
                                  "x_pipeline_first_same_precision: the same over the pipeline 'first' in the run's "
                                  f"precision (bf16: under autocast). {summary}",
                   "identical_texts": same, "identical_texts_first": same_first, "n_texts": len(texts),
                   "differences_first": kinds, "unexplained_differences": len(unexplained),
                   "differences": [{"text": t, "hf_first": h, "spanflow": s_, "kind": classify(t, h, s_)}
                                   for t, h, s_ in zip(texts, first_spans, sf_out) if h != s_]},
                  rows, ["run", "precision", "seconds", "texts_per_s", "real_tokens_per_s", "padding_efficiency",
                         "x_pipeline_first_fp32", "x_pipeline_first_same_precision"])


if __name__ == "__main__":
    main()
