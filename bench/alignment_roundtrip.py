"""Round trip read -> char spans -> subword tokens -> BIO labels -> decoded spans, per file.

Counts the sentences whose decoded spans are identical to the gold spans (traps included).

    python bench/alignment_roundtrip.py ../shared/data/wnut17/train.conll ../shared/data/resume_ner/dev.char.bmes
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_minilm, write_results  # noqa: E402
from spanflow.batching.align import IGNORE, encode_texts  # noqa: E402
from spanflow.tasks.ner.bio import bio_labels, decode_spans  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.tasks.ner.features import bio_label_list  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--model", default=default_minilm(), help="encoder directory whose tokenizer to use")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    rows = []
    for path in a.files:
        ex = read_ner(path)
        id2label = bio_label_list(sorted({lab for e in ex for *_, lab in e.spans}))
        l2i = {lab: i for i, lab in enumerate(id2label)}
        same = spans_ok = 0
        for e, enc in zip(ex, encode_texts(tok, [e.text for e in ex])):
            lab = bio_labels(enc, e.spans, l2i)
            back = decode_spans(enc, [x if x != IGNORE else 0 for x in lab], id2label)
            same += back == sorted(e.spans)
            spans_ok += len(set(back) & set(e.spans))
        n_spans = sum(len(e.spans) for e in ex)
        rows.append({"file": path, "sentences": len(ex), "identical_sentences": same, "spans": n_spans,
                     "identical_spans": spans_ok})
    write_results(a.out, "alignment_roundtrip", {"description": f"tokenizer {a.model}"}, rows,
                  ["file", "sentences", "identical_sentences", "spans", "identical_spans"])


if __name__ == "__main__":
    main()
