"""`spanflow` entry point: dispatch to subcommands; user errors become one line and exit 2."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from spanflow.cli import convert, demo, doctor, embed, evaluate, export, predict, serve, train, tune
from spanflow.cli.common import Parser
from spanflow.errors import SpanflowError

COMMANDS = {"train": train, "evaluate": evaluate, "predict": predict, "embed": embed, "serve": serve, "tune": tune,
            "doctor": doctor, "convert": convert, "export": export, "demo": demo}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="spanflow", description="Train, evaluate and run span models at full speed.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, mod in COMMANDS.items():
        mod.add_parser(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every command cleans up the same way."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)  # serve's uvicorn installs its own to drain requests
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # for commands that re-launch themselves (train --devices N)
    try:
        rc = COMMANDS[args.command].run(args) or 0
        if args.command in ("train", "embed"):
            from spanflow.training.distributed import exit_now, shutdown

            if shutdown():  # under torchrun: every rank leaves the group together, then the process
                exit_now(rc)
        return rc
    except SpanflowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
