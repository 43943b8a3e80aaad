"""Thin command-line views: each subcommand parses arguments and calls a plain function."""
import sys


def entry() -> int:
    """The `spanflow` command: main() once its modules are imported. A Ctrl-C while they import
    (about a second, torch's included) is said as one at any other time, not as a traceback."""
    try:
        from spanflow.cli.main import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return main()
