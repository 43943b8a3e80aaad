"""Argument groups shared by several subcommands."""
from __future__ import annotations

import argparse
import functools

from spanflow.runtime.budget import describe_budget
from spanflow.runtime.policy import INT8_MIN_COSINE, PRECISIONS

# no abbreviated flags: `train re --head crf` would otherwise be read as --head-lr
Parser = functools.partial(argparse.ArgumentParser, allow_abbrev=False)


INFER_BUDGET = f"None: {describe_budget('infer')}"
PRECISION_HELP = f"{', '.join(PRECISIONS)} (int8 is --quantize) [%(default)s]"


def add_runtime_args(p: argparse.ArgumentParser, *, max_tokens: int | None, unset: str = INFER_BUDGET) -> None:
    p.add_argument("--max-tokens", default=None if max_tokens is None else str(max_tokens),
                   help="padded tokens per batch (longest x count), or 'auto' (measured once per model and "
                        f"device, then cached) [%(default)s; {unset}]")
    p.add_argument("--profile", default=None, help="a profile.json from 'spanflow tune': use its best token budget")
    add_precision_arg(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps [%(default)s]")


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    """--precision, checked when the runtime is resolved: `--precision int8` is answered with a
    line that names --quantize, not with argparse's list of choices."""
    p.add_argument("--precision", default="auto", metavar="{" + ",".join(PRECISIONS) + "}", help=PRECISION_HELP)


def add_quantize_args(p: argparse.ArgumentParser, *, gate: str, forced: str = "an int8 quantization") -> None:
    """--quantize int8 and --force: CPU dynamic quantization of an embedding model, refused when
    its mean cosine to fp32 on `gate` is below its gate, unless --force (which runs `forced`)."""
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="int8: CPU dynamic quantization of an embedding model's Linear layers, checked against "
                        f"fp32 on {gate} and refused below a mean cosine of {INT8_MIN_COSINE} [none]")
    p.add_argument("--force", action="store_true", help=f"run {forced} that fails its cosine check against fp32")


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per window, special tokens included (default: the longest window the model "
                        "was trained on, which keeps long documents as accurate as short texts)")
    p.add_argument("--stride", type=int, default=None, help="NER: tokens shared by neighbouring windows "
                                                             "(default: as trained)")
