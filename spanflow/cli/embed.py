"""`spanflow embed --model DIR --input F --output OUT.npy|OUT.jsonl`"""
from __future__ import annotations

import argparse
import json

from spanflow.embedder import EMBED_PRECISIONS


def add_parser(sub) -> None:
    p = sub.add_parser("embed", help="embed texts in bulk (.npy or JSONL output), streaming and resumable",
                       description="Embed every record of the input. Empty or whitespace-only texts get the "
                                   "embedding of an input with only special tokens; unreadable records become "
                                   "NaN rows (.npy) or error records (JSONL) and are listed in OUT.errors.jsonl.")
    p.add_argument("--model", required=True, help="a sentence-transformers or Hugging Face encoder directory")
    p.add_argument("--input", required=True, help="text lines, JSONL (--field) or CSV/TSV (--column)")
    p.add_argument("--output", required=True, help="OUT.npy (plus OUT.ids.txt) or OUT.jsonl")
    p.add_argument("--field", default="text", help="JSONL field with the text [%(default)s]")
    p.add_argument("--column", type=int, default=None, help="CSV/TSV column with the text, from 0 [0]")
    p.add_argument("--skip-header", action="store_true", help="skip the first line/row")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32", help=".npy dtype [%(default)s]")
    p.add_argument("--window", type=int, default=8192, help="texts read, sorted and written at a time")
    p.add_argument("--max-tokens", default=None,
                   help="padded tokens per batch, or 'auto' (measured once, cached) [2048 on CPU, 32768 on GPU]")
    p.add_argument("--profile", default=None, help="a profile.json from 'spanflow tune --task embed --mode infer'")
    p.add_argument("--precision", choices=EMBED_PRECISIONS, default="auto",
                   help="auto, fp32, bf16, fp16 (CUDA) or int8 (CPU dynamic quantization) [%(default)s]")
    p.add_argument("--force", action="store_true", help="accept a reduced precision that fails the cosine check")
    p.add_argument("--device", default="auto")
    p.add_argument("--resume", action="store_true", help="continue a killed run of the same job")


def run(a: argparse.Namespace) -> int:
    import os

    from spanflow.data.records import sample_texts
    from spanflow.embedder import Embedder
    from spanflow.errors import DataError
    from spanflow.inference.auto_precision import SAMPLE, infer_precision
    from spanflow.inference.heap import settle
    from spanflow.inference.embed_job import EmbedSpec, embed_file

    from spanflow.training.distributed import init_from_env
    from spanflow.tuning.auto import resolve_max_tokens

    dist = init_from_env()  # under torchrun each rank embeds its share of the windows
    if not os.path.exists(a.input):
        raise DataError("file not found", path=a.input)
    asked = a.precision
    a.precision = infer_precision(a.precision, a.model, a.device,
                                  sample_texts(a.input, SAMPLE, field=a.field, column=a.column,
                                               skip_header=a.skip_header))

    max_tokens = resolve_max_tokens(a.max_tokens, profile=a.profile, task="embed", mode="infer", model=a.model,
                                    data=a.input, precision=a.precision, device=a.device, field=a.field,
                                    column=a.column)
    emb = Embedder.load(a.model, precision=a.precision, device=a.device)
    settle()
    print(f"device {emb.policy.device}, precision {emb.precision_name}, max length {emb.max_length}, "
          f"dim {emb.dim}")
    spec = EmbedSpec(input=a.input, output=a.output, field=a.field, column=a.column, skip_header=a.skip_header,
                     window=a.window, dtype=a.dtype, model=a.model)
    s = embed_file(emb, spec, max_tokens=max_tokens, resume=a.resume, force=a.force, dist=dist,
                   calibrate=asked != "auto")  # auto's choice was checked on this input just now
    if not dist.is_main:
        return 0
    print(f"embedded {s['texts']} texts in {s['seconds']:.1f}s: {s['texts_per_s']:.0f} texts/s, "
          f"{s['real_tokens_per_s']:.0f} real tokens/s, padding efficiency {s['padding_efficiency']:.3f}; "
          f"{s['truncated']} truncated at {emb.max_length} tokens, {s['empty']} empty, {s['errors']} errors")
    print(json.dumps({k: v for k, v in s.items() if k != "calibration"}))
    return 0
