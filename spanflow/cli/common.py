"""Argument groups shared by several subcommands."""
from __future__ import annotations

import argparse

from spanflow.training.precision import PRECISIONS


def add_runtime_args(p: argparse.ArgumentParser, *, max_tokens: int | None) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help="padded tokens per batch (longest x count) [%(default)s; None: 2048 on CPU, "
                        "32768 on GPU]")
    p.add_argument("--precision", choices=PRECISIONS, default="auto", help="[%(default)s]")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps [%(default)s]")
