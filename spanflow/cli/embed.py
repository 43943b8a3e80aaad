"""`spanflow embed --model DIR --input F --output OUT.npy|OUT.jsonl`"""
from __future__ import annotations

import argparse
import json

from spanflow.cli.common import add_precision_arg, add_quantize_args
from spanflow.runtime.budget import describe_budget


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
    p.add_argument("--chunk-size", type=int, default=8192, help="texts read, sorted and written at a time")
    p.add_argument("--max-tokens", default=None,
                   help=f"padded tokens per batch, or 'auto' (measured once, cached) [{describe_budget('infer')}]")
    p.add_argument("--profile", default=None, help="a profile.json from 'spanflow tune --task embed --mode infer'")
    add_precision_arg(p)
    add_quantize_args(p, gate="a sample of the input", forced="a reduced precision or an int8 quantization")
    p.add_argument("--device", default="auto")
    p.add_argument("--resume", action="store_true", help="continue a killed run of the same job")


def run(a: argparse.Namespace) -> int:
    import os
    from contextlib import ExitStack

    from spanflow.atomic import hold_output
    from spanflow.errors import DataError
    from spanflow.inference.predict_job import check_output
    from spanflow.tasks.embed.job import WHAT
    from spanflow.training.distributed import init_from_env

    dist = init_from_env()  # under torchrun each rank embeds its share of the chunks
    if not os.path.exists(a.input):
        raise DataError("file not found", path=a.input)
    with ExitStack() as held:
        if dist.is_main:  # a second job on this output stops here, before any model loads (the job nests)
            check_output(a.output, WHAT)
            hold_output(held, a.output, WHAT)
        return _run(a, dist)


def _run(a: argparse.Namespace, dist) -> int:
    from spanflow.data.records import sample_texts
    from spanflow.inference.heap import settle
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.precision import SAMPLE
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.embed.job import EmbedSpec, embed_file
    from spanflow.tasks.registry import get
    from spanflow.tuning.auto import quick_profile

    task = get("embed")
    loads = Loads(task, a.model)
    texts = sample_texts(a.input, SAMPLE, field=a.field, column=a.column, skip_header=a.skip_header)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=texts, data=a.input, field=a.field,
                         column=a.column, loads=loads, measure=quick_profile)
    emb = loads.take(rt)
    settle()
    print(f"device {emb.policy.device}, precision {emb.policy.name}"
          + (f", quantize {emb.quantize}" if emb.quantize else "") + f", max length {emb.max_length}, dim {emb.dim}")
    spec = EmbedSpec(input=a.input, output=a.output, field=a.field, column=a.column, skip_header=a.skip_header,
                     chunk_size=a.chunk_size, dtype=a.dtype, model=a.model)
    # auto's choice and a quantization were checked against fp32 on this input just now
    checked = a.precision == "auto" or rt.quantize is not None
    s = embed_file(emb, spec, max_tokens=rt.max_tokens, resume=a.resume, force=a.force, dist=dist,
                   calibrate=not checked)
    if not dist.is_main:
        return 0
    print(f"embedded {s['texts']} texts in {s['seconds']:.1f}s: {s['texts_per_s']:.0f} texts/s, "
          f"{s['real_tokens_per_s']:.0f} real tokens/s, padding efficiency {s['padding_efficiency']:.3f}; "
          f"{s['truncated']} truncated at {emb.max_length} tokens, {s['empty']} empty, {s['errors']} errors")
    print(json.dumps({k: v for k, v in s.items() if k != "calibration"}))
    return 0
