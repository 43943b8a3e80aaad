"""`spanflow` entry point: dispatch to subcommands.

Exit codes: 0 done; 2 a user error, told in one `error: ...` line: any SpanflowError (bad input,
options or model directory, an output that cannot be written), and also a full disk, a quota, a
read-only file system or a missing permission that reaches here unwrapped (an OSError, or a Rust
library's error reporting one). Those exit 2 like the WriteError of the writes that name what they
were writing, because they are the same fault: the same full disk gives the same exit whichever write
met it, and it is the user's to fix (free space, another --out), not a bug to report. 1: stdout was
closed by its reader (`spanflow evaluate --json | head -c 10`), quietly, as Python's documentation
of SIGPIPE recommends; also a training process whose peer in the job (torchrun) stopped, and a
`predict` or `embed` whose every record was an error record (it ran; no result came of it). 130:
Ctrl-C; 143: SIGTERM (129 SIGHUP, 131 SIGQUIT, which stop a command the same way). Any other
error is a bug and keeps its traceback.

Under torchrun a signal reaches every rank, and a stopped peer every survivor: rank 0 alone
says so, in one line (under --devices N, its launcher does: training/distributed.py).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading

from spanflow import __version__
from spanflow.cli import convert, demo, doctor, embed, evaluate, export, predict, serve, train, tune
from spanflow.cli.common import Parser
from spanflow.errors import SpanflowError, WriteError
from spanflow.runtime import stops
from spanflow.runtime.stops import STOPS  # each ends a command as SIGTERM does: its lock released, its hint said
from spanflow.training.outcome import job_rank, torchrun_world

COMMANDS = {"train": train, "evaluate": evaluate, "predict": predict, "embed": embed, "serve": serve, "tune": tune,
            "doctor": doctor, "convert": convert, "export": export, "demo": demo}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="spanflow", description="Train, tune, run and serve NER, relation-extraction and "
                                            "sentence-embedding models at full speed.")
    p.add_argument("--version", action="version", version=f"spanflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, mod in COMMANDS.items():
        mod.add_parser(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP, SIGQUIT), raised like Ctrl-C so that every command cleans up the same
    way; the exit code is 128 + `signum`."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__()
        self.signum = signum


def _on_sigterm(signum, frame):
    if stops.held_back(signum):  # inside a save: raised as it ends
        return
    raise Terminated(signum)


def _on_stop(signum, frame):
    """The command line's handler of Ctrl-C and the stops: later ones are ignored from here on, as
    this one unwinds through the commands' clean-up (a terminal and a scheduler send them to every
    process, and a second one raised inside a clean-up, leaving a lock or a temporary behind). One
    that arrives during a save is raised as the save ends (runtime/stops.py)."""
    if stops.held_back(signum):
        return
    for sig in (signal.SIGINT, *STOPS):  # a handler that does nothing, not SIG_IGN: a signal that arrived
        # with this one is run after it, and CPython raises OSError ("Signal 15 ignored due to race
        # condition") for one whose handler became SIG_IGN in between (two Ctrl-C's, a group's TERM)
        signal.signal(sig, _ignore)
    _stopped.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


_stopped: list[int] = []  # the stop signals _on_stop raised, in order


def _ignore(signum, frame) -> None:
    """A stop signal after the first: nothing to do, the first one's unwinding goes on."""


def _on_unraisable(hook):
    """sys.unraisablehook: a stop raised where Python cannot raise (a weakref callback or __del__,
    as torch.compile runs many) is printed and dropped, and the stop signals stay ignored: the command
    would run on, deaf to Ctrl-C. The stop is raised again instead, about 10 ms later."""
    def on(u) -> None:
        if (isinstance(u.exc_value, KeyboardInterrupt) and _stopped and hasattr(signal, "setitimer")
                and threading.current_thread() is threading.main_thread()):  # signal.signal's thread
            signum = _stopped[-1]
            # a timer's signal lands after this hook and its callback have returned: _on_stop raises the
            # stop where the main thread then is (inside another such callback, this hook arms it again)
            signal.signal(signal.SIGALRM, lambda *_: _on_stop(signum, None))
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        hook(u)
    on.spanflow = True
    return on


def _install_handlers(entry: bool) -> None:
    """_on_stop for the command line (`entry`); a program or a test that calls main() keeps its
    own handlers but SIGTERM's, which stops a command as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        return
    if entry:
        for sig in (signal.SIGINT, *STOPS):  # serve's uvicorn installs its own for SIGTERM and SIGINT, to drain
            signal.signal(sig, _on_stop)
        if not getattr(sys.unraisablehook, "spanflow", False):  # once, however often main() runs
            sys.unraisablehook = _on_unraisable(sys.unraisablehook)
    else:
        signal.signal(signal.SIGTERM, _on_sigterm)


SHARDED = ("train",)  # the commands that run under torchrun, each rank its share of one job

# how a collective fails when a peer of the job has gone (gloo's TCP pairs, NCCL's watchdog)
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited",
             "NCCL communicator was aborted")


def _say(line: str) -> None:
    """A stop line, from rank 0 alone: every rank of a job meets the same signal or lost peer."""
    if job_rank() == 0:
        _err(line)


def _err(line: str) -> None:
    """`line` on stderr in one write: unbuffered (PYTHONUNBUFFERED, as containers set it), print writes the
    text and its newline apart, and the lines of ranks printing at once ran together on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _rank_err(line: str) -> None:
    """An error line: under --devices N, left for the launcher, which says each once (rank 0's here)."""
    from spanflow.training.distributed import report_error

    report_error(line, _err)


def _launcher_says() -> bool:
    """Whether --devices N's launcher says how this rank's run stopped (a stop signal, a rank killed)."""
    from spanflow.training.distributed import stop_said_by_launcher

    return stop_said_by_launcher()


def _peer_lost(e: BaseException) -> bool:
    """Whether `e` is a collective that failed because another process of the job has gone."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or not isinstance(e, RuntimeError):
        return False
    return any(p in str(e) for p in PEER_LOST)  # other backend errors keep their traceback: a bug or the device's


def write_error_line(e: BaseException) -> str | None:
    """The `error:` line of an unwrapped write fault (full disk, quota, read-only, no permission),
    or None when `e` is not one."""
    from spanflow.atomic import WRITE_ERRNOS
    from spanflow.atomic import as_os_error

    err = as_os_error(e)
    if err is None or err.errno not in WRITE_ERRNOS:
        return None
    # EACCES/EPERM also come from opening an input to read: "access", not "write"
    verb = "access" if err.errno in (errno.EACCES, errno.EPERM) else "write"
    where = f" ({err.filename})" if err.filename else ""
    return f"error: cannot {verb}: {err.strerror or os.strerror(err.errno)}{where}"


def _stdout_gone() -> int:
    """stdout's reader left (`| head`): point stdout at /dev/null, so that the interpreter's last
    flush does not fail again with "Exception ignored ... BrokenPipeError", and exit 1."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (replaced by a caller): swap the object
        sys.stdout = open(os.devnull, "w")
    return 1


def _leave_group(rc: int) -> int:
    """Under torchrun, a rank that stops with an error ends its process at once: leaving the group
    would wait for peers that may never get there, and the interpreter's teardown with gloo's
    threads still running can abort the process (training/distributed.exit_now)."""
    dist = sys.modules.get("torch.distributed")  # not imported: no group (and no torch import for an error line)
    if dist is not None and dist.is_available() and dist.is_initialized():
        from spanflow.training.distributed import exit_now

        exit_now(rc)
    return rc


def _after_stop(args) -> str:
    """How a stopped command goes on, where it left something to go on from (its after_stop); ""
    where it cannot tell, and on ranks other than 0, whose lines are not said: a hint never stands
    between a signal and the exit. A stop signal that arrives while it is read (torchrun's agent
    ending the survivors of a lost peer) ends the hint, not the command's own ending."""
    then = getattr(COMMANDS[args.command], "after_stop", None)
    if then is None or job_rank() != 0:
        return ""
    try:
        return then(args) or ""
    except BaseException:
        return ""


def _leave_now(rc: int, entry: bool) -> int:
    """rc; or, where the model thread still runs the work the signal interrupted (a load or a
    compile, tens of seconds), the process ends now: exiting normally would wait for that work.
    Nothing it writes is at a final path until renamed there (atomic.py). `entry`: main() is the
    process's command line (not a call from a program or a test, whose process goes on)."""
    from spanflow.inference.backend import compiling
    from spanflow.runtime.threads import model_thread_busy

    if entry and (model_thread_busy() or compiling()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


class _LowerLevel(logging.Formatter):
    """`warning: ...`: a logged line in the form of the lines the commands print."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


def main(argv: list[str] | None = None) -> int:
    from spanflow.monitor import clock

    with clock.command(process=argv is None):  # a training run's time line counts from here (the process's start)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: a program that set up logging keeps its own
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_LowerLevel())
        if job_rank() != 0:  # under torchrun every rank reads the same data: its warnings are rank 0's to say
            handler.setLevel(logging.ERROR)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    entry = argv is None
    _install_handlers(entry)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)  # imports every command's module: a second or so
    except Terminated as e:  # a KeyboardInterrupt of its own: first
        _say("terminated")
        return 128 + e.signum
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    args.argv = argv  # for commands that re-launch themselves (train --devices N)
    if torchrun_world() > 1 and args.command not in SHARDED:
        # every rank would run the whole job: the same output written by each, a table printed twice
        spread = " (to spread it over devices or machines: --ray, docs/ray.md)" if hasattr(args, "ray") else ""
        _say(f"error: spanflow {args.command} runs as one process, not once per torchrun rank; only spanflow "
             f"train is sharded over ranks{spread}")
        return 2
    try:
        rc = COMMANDS[args.command].run(args) or 0
        sys.stdout.flush()  # here, so that a reader gone before the last line is a BrokenPipeError caught below
        if args.command in ("train", "embed"):
            from spanflow.training.distributed import exit_now, shutdown

            if shutdown():  # under torchrun: every rank leaves the group together, then the process
                exit_now(rc)
        return rc
    except SpanflowError as e:
        if not getattr(e, "quiet", False):
            said = getattr(e, "cli", None) or e  # a ConfigError of the API's options: in the flags' words
            hint = ""
            # a bulk job stopped by a full disk keeps what it synced, as on a signal: how to go on is said;
            # one stopped by its input (unreadable mid-job) keeps it too, for that same input only
            if args.command in ("predict", "embed") and isinstance(e, WriteError):
                hint = _after_stop(args)
            elif getattr(e, "kept", False):  # the job's, as it stopped (not an earlier job's parts beside it)
                hint = ("; what the job had done is kept beside the output: --resume goes on from it once the same "
                        "input reads, and a run without --resume removes it")
            _rank_err(f"error: {said}{hint}")
        return _leave_group(2)
    except BrokenPipeError:
        return _stdout_gone()
    except Terminated as e:
        if not _launcher_says():
            _say("terminated" + _after_stop(args))
        return _leave_now(128 + e.signum, entry)
    except KeyboardInterrupt:
        _say("interrupted" + _after_stop(args))
        return _leave_now(130, entry)
    except Exception as e:
        if _peer_lost(e):  # its own error line, if it had one, came from the process that stopped
            if not _launcher_says():
                _say("error: another process of this training job stopped" + _after_stop(args))
            return _leave_group(1)
        line = write_error_line(e)
        if line is None:
            raise
        _rank_err(line)
        return 2


if __name__ == "__main__":
    sys.exit(main())
