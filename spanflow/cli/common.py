"""Argument groups shared by several subcommands."""
from __future__ import annotations

import argparse
import functools

from spanflow.training.precision import PRECISIONS

# no abbreviated flags: `train re --head crf` would otherwise be read as --head-lr
Parser = functools.partial(argparse.ArgumentParser, allow_abbrev=False)


INFER_BUDGET = "None: 2048 on CPU, 32768 on GPU"


def add_runtime_args(p: argparse.ArgumentParser, *, max_tokens: int | None, unset: str = INFER_BUDGET) -> None:
    p.add_argument("--max-tokens", default=None if max_tokens is None else str(max_tokens),
                   help="padded tokens per batch (longest x count), or 'auto' (measured once per model and "
                        f"device, then cached) [%(default)s; {unset}]")
    p.add_argument("--profile", default=None, help="a profile.json from 'spanflow tune': use its best token budget")
    p.add_argument("--precision", choices=PRECISIONS, default="auto", help="[%(default)s]")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps [%(default)s]")


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per window, special tokens included (default: the longest window the model "
                        "was trained on, which keeps long documents as accurate as short texts)")
    p.add_argument("--stride", type=int, default=None, help="NER: tokens shared by neighbouring windows "
                                                             "(default: as trained)")

