"""The flags several commands share, defined once: the same name, meaning, choices and help
wherever they appear (tests/test_cli_help.py checks it)."""
from __future__ import annotations

import argparse
import os
import sys

from spanflow.data.io import FORMAT_HELP, NER_FORMATS, STRICT_HELP
from spanflow.data.schemes import SCHEMES
from spanflow.monitor.report import clock_time, rate_text
from spanflow.runtime.budget import DEFAULT_BUDGETS, describe_budget, infer_tokens
from spanflow.runtime.policy import INT8_MIN_COSINE, PRECISIONS
from spanflow.training.defaults import UPDATES_PER_EPOCH

class Parser(argparse.ArgumentParser):
    """argparse's parser without abbreviated flags (`train re --head crf` would otherwise be read as
    --head-lr). A command's parser reports a flag it does not know itself, with its own usage and
    the nearest flag it has, where argparse would leave it to the top-level parser's usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.elsewhere: dict[str, list[str]] = {}  # flags this command lacks -> the commands that take them

    def parse_known_args(self, args=None, namespace=None):
        leaf = self._subparsers is None and " " in self.prog  # a command's own parser
        if leaf:  # a mistyped flag is told before a required flag is missed (`--trian x` said
            # "required: --train", never naming --trian)
            given = sys.argv[1:] if args is None else list(args)
            if any(a.split("=", 1)[0] not in self._option_string_actions for a in _flags_before_end(given)):
                required = [a for a in self._actions if a.required]
                for a in required:  # parsed as if none were required, to find what follows each unknown flag
                    a.required = False
                try:
                    _, extras = super().parse_known_args(given, namespace)
                finally:
                    for a in required:
                        a.required = True
                if extras:  # else what looked like a flag was a value after all: the plain parse decides
                    self.error(unknown_flags(extras, list(self._option_string_actions), self.elsewhere))
        ns, extras = super().parse_known_args(args, namespace)
        if extras and leaf:
            self.error(unknown_flags(extras, list(self._option_string_actions), self.elsewhere))
        return ns, extras

    def error(self, message: str):
        """One usage line (the required flags) and the error, where argparse prints every flag of the
        command first (twelve lines of usage above `embed`'s one line that says what was wrong). A parser
        of commands keeps argparse's usage: the list of its commands."""
        if self._subparsers is not None:
            super().error(message)
        self.exit(2, f"{short_usage(self)}\n{self.prog}: error: {message}\n")


def short_usage(p: argparse.ArgumentParser) -> str:
    """`usage: PROG --model MODEL ... [options]`: the flags a run must give, then where the rest are."""
    required = [f"{a.option_strings[0]} {a.metavar or a.dest.upper()}" for a in p._actions
                if a.required and a.option_strings]
    positional = [f"[{a.metavar or a.dest}]" if a.nargs in ("?", "*") else a.metavar or a.dest for a in p._actions
                  if not a.option_strings and a.nargs != argparse.PARSER]
    more = any(not a.required and a.option_strings and a.help is not argparse.SUPPRESS for a in p._actions
               if not isinstance(a, argparse._HelpAction))
    rest = f" [options] (`{p.prog} --help` lists them)" if more else ""
    return "usage: " + " ".join([p.prog, *required, *positional]) + rest


def _flags_before_end(args: list[str]) -> list[str]:
    """The long flags among `args`, up to a `--` (after which everything is a value)."""
    out = []
    for a in args:
        if a == "--":
            break
        if a.startswith("--") and len(a) > 2 and " " not in a:  # argparse takes "--my notes.txt" for a value
            out.append(a)
    return out


# the flags of other tools (transformers' Trainer and scripts, sentence-transformers, spaCy) -> what
# stands for them here; a hint names the first one the command takes
BUDGET = ("--max-tokens", "a token budget: padded tokens per batch")
PEER_FLAGS = {
    "--batch-size": (BUDGET[0], f"{BUDGET[1]}, not a count of texts"),
    "--per-device-train-batch-size": BUDGET,
    "--per-device-eval-batch-size": BUDGET,
    "--train-batch-size": BUDGET,
    "--learning-rate": ("--lr", None),
    "--num-train-epochs": ("--epochs", None),
    "--num-epochs": ("--epochs", None),
    "--fp16": ("--precision", "--precision fp16"),
    "--bf16": ("--precision", "--precision bf16"),
    "--no-cuda": ("--device", "--device cpu"),
    "--use-cpu": ("--device", "--device cpu"),
    "--output-dir": ("--out", None),
    "--output-path": ("--output", None),
    "--model-name-or-path": ("--model", None),
    "--model-name": ("--model", None),
    "--train-file": ("--train", None),
    "--validation-file": ("--dev", None),
    "--eval-file": ("--dev", None),
    "--max-seq-length": ("--max-length", None),
    "--gradient-accumulation-steps": ("--grad-accum", None),
    "--eval-steps": ("--eval-every", None),
    "--save-steps": ("--save-every", None),
    "--logging-steps": ("--log-every", None),
    "--warmup-steps": ("--warmup-ratio", "a share of the steps"),
}


def _peer_hint(flag: str, known: list[str]) -> str | None:
    """What this command takes for another tool's `flag`, or None."""
    target = PEER_FLAGS.get(flag)
    if target is None:
        return None
    name, how = target
    if name not in known:
        name = {"--out": "--output", "--output": "--out"}.get(name)
        if name not in known:
            return None
        how = None
    return how if how and how.startswith("--") else f"{name} ({how})" if how else name


def unknown_flags(extras: list[str], known: list[str], elsewhere: dict[str, list[str]] | None = None) -> str:
    """The error for arguments a parser does not take: a flag another command takes is said to
    be that command's ("--head: only spanflow train ner takes it"), any other unknown flag gets the
    nearest known one ("--epoch: did you mean --epochs?")."""
    import difflib

    hints = []
    for arg in extras:
        name = arg.split("=", 1)[0]
        if name in (elsewhere or {}):
            hints.append(f"{name}: only {' and '.join(elsewhere[name])} take{'s' if len(elsewhere[name]) == 1 else ''} "
                         "it")
            continue
        flag = name.replace("_", "-").lower()
        peer = _peer_hint(flag, known) if name.startswith("--") else None
        if peer:
            hints.append(f"{name}: here {peer}")
            continue
        # a flag it begins (--budget: --budget-seconds) as well as the closest spelling (--budgets)
        near = list(dict.fromkeys([k for k in known if k.startswith(flag + "-")][:1]
                                  + difflib.get_close_matches(flag, known, n=1, cutoff=0.75))) \
            if name.startswith("--") else []
        if near:
            hints.append(f"{name}: did you mean {' or '.join(near)}?")
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")

_CPU = {job: b["cpu"] for job, b in DEFAULT_BUDGETS.items()}
# the default budget of each job, and why serve's differs from a job's on CPU
BUDGET_DEFAULTS = {
    "infer": f"{describe_budget('infer')}; serve takes {_CPU['serve']} on CPU",
    "serve": f"{describe_budget('serve')}: more than a job's {_CPU['infer']} on CPU because a server batch "
             "gathers the requests of many clients and is then cut into parts of similar length, where a job "
             "sorts its own input by length",
    "train": f"sized from the data: about {UPDATES_PER_EPOCH} updates per epoch, at most {describe_budget('train')}",
}
MAX_TOKENS_HELP = "padded tokens per batch (longest x count), or 'auto'"
AUTO_HELP = {  # serve has no data of its own to measure on
    "serve": "the profile an earlier run cached for this model and device, else the default",
    "infer": "measured once per model and device on a sample of the texts to run, then cached",
    "train": "measured once per model and device on the training data, then cached",
}
SCHEME_HELP = "tag scheme of CoNLL input, any case [detected from the tags]"


class Precisions(tuple):
    """--precision's choices, as listed in the help and in argparse's error. `int8` also gets past
    argparse, so that the runtime answers it with its own line, which names --quantize."""

    def __contains__(self, value) -> bool:
        return value == "int8" or tuple.__contains__(self, value)


def add_runtime_args(p: argparse.ArgumentParser, *, job: str = "infer", budget: str | None = None) -> None:
    """--max-tokens, --profile, --precision and --device; `job` ("infer", "serve", "train") names the
    default budget, which `budget` says instead where a task sizes it its own way."""
    add_budget_args(p, job=job, budget=budget)
    add_precision_arg(p)
    add_device_arg(p)


def add_budget_args(p: argparse.ArgumentParser, *, job: str, budget: str | None = None) -> None:
    """--max-tokens and --profile, with `job`'s default budget in the help (`budget`: said instead)."""
    p.add_argument("--max-tokens", default=None,
                   help=f"{MAX_TOKENS_HELP} ({AUTO_HELP[job]}) [{budget or BUDGET_DEFAULTS[job]}]")
    p.add_argument("--profile", default=None,
                   help="a profile.json from 'spanflow tune' (--mode train for training, infer otherwise): run "
                        "its best token budget, and for serve its backend [none; an explicit --max-tokens wins]")


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    """--precision, one of PRECISIONS; `--precision int8` is answered by the runtime with a line that names
    --quantize, not with argparse's list of choices."""
    p.add_argument("--precision", default="auto", choices=Precisions(PRECISIONS),
                   help="auto: a reduced precision where the hardware runs it (inference: and the model's results "
                        "agree with fp32; training: by the device alone, docs/precision.md), else fp32; int8 is a "
                        "quantization: --quantize of embed, serve and tune [%(default)s]")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps [%(default)s]")


def add_quantize_args(p: argparse.ArgumentParser, *, gate: str, forced: str = "an int8 quantization") -> None:
    """--quantize int8 and --force: CPU dynamic quantization of an embedding model, refused when
    its mean cosine to fp32 on `gate` is below its gate, unless --force (which runs `forced`)."""
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="int8: CPU dynamic quantization of an embedding model's Linear layers, checked against "
                        f"fp32 on {gate} and refused below a mean cosine of {INT8_MIN_COSINE} [none]")
    p.add_argument("--force", action="store_true", help=f"run {forced} that fails its cosine check against fp32")


def add_task_arg(p: argparse.ArgumentParser, names: list[str], shown: str | None = None, **kw) -> None:
    """--task, one of the registered tasks; `kw`: required or default; `shown`: the default as
    the help says it, where it is no value."""
    shown = f" [{shown}]" if shown else " [%(default)s]" if kw.get("default") else ""
    p.add_argument("--task", choices=names, help=f"the task of --model and --data{shown}", **kw)


def add_format_arg(p: argparse.ArgumentParser, flag: str = "--format", dest: str = "format") -> None:
    """The format of labelled NER data (`train ner` defines the same)."""
    p.add_argument(flag, dest=dest, choices=NER_FORMATS, default=None, help=FORMAT_HELP)


def add_scheme_arg(p: argparse.ArgumentParser, *, strict: bool = False) -> None:
    """--scheme (any case) and, with `strict`, --strict (`train ner` defines the same)."""
    p.add_argument("--scheme", type=str.lower, choices=SCHEMES, default=None, help=SCHEME_HELP)
    if strict:
        p.add_argument("--strict", action="store_true", help=STRICT_HELP)


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per input, special tokens included: NER reads longer texts in windows of it, "
                        "relations and embeddings cut there [NER and relations: the longest window the model "
                        "was trained on (NER: on long documents it loses far less F1 than the encoder's full "
                        "window); an encoder directory: its max_seq_length]")
    p.add_argument("--stride", type=int, default=None, help="NER: tokens shared by neighbouring windows [as trained]")


def check_window_args(model: str, max_length: int | None, stride: int | None) -> None:
    """--max-length and --stride checked before the model loads (a ConfigError), where its
    spanflow.json says its limit and the window it was trained on: a --stride past the window
    was refused only after the weights loaded and the precision was checked."""
    from spanflow.batching.align import check_window, check_window_floor
    from spanflow.models.directory import CONFIG, read_model_config
    from spanflow.tasks.registry import names, takes

    check_window_floor(max_length, stride)
    if stride is None and max_length is None or not os.path.isfile(os.path.join(model, CONFIG)):
        return
    cfg = read_model_config(model)
    length = max_length if max_length is not None else cfg.get("max_length")
    if not (cfg.get("task") in names() and takes(cfg["task"], "stride")):
        stride = None  # a model that reads no overlapping windows says it takes none, once loaded
    if isinstance(cfg.get("limit"), int) and isinstance(length, int):
        check_window(length, stride or 0, cfg["limit"])


class _Given(argparse.Action):
    """Store the value and note that it was given (`field_given`): a default cannot clash with
    another flag, a value the user typed can."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_text_args(p: argparse.ArgumentParser) -> None:
    """--field and --column: where the texts are in the input."""
    p.add_argument("--field", default="text", action=_Given,
                   help="JSONL field, or Parquet/Arrow column or CSV/TSV header name, with the text [%(default)s]")
    p.add_argument("--column", type=column_arg, default=None,
                   help="the column with the text: a name (a Parquet/Arrow column, a JSONL field, or a CSV/TSV "
                        "header name, which skips the header row) or a 0-based CSV/TSV index [CSV/TSV: 0; else "
                        "--field]")


def column_arg(value: str) -> int | str:
    """--column: digits are a 0-based CSV/TSV index (a table's column of that name: tables.py),
    anything else a column name; digits with a leading zero (01) are a name: no index is written so."""
    return int(value) if value.isdigit() and (value == "0" or not value.startswith("0")) else value


def names_arg(value: str) -> list[str]:
    """--keep-columns A,B: the names, in order."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected column names separated by commas, got {value!r}")
    twice = [n for k, n in enumerate(names) if n in names[:k]]
    if twice:
        raise argparse.ArgumentTypeError(f"{twice[0]!r} is named twice")
    return names


def add_input_args(p: argparse.ArgumentParser, *, kept_into: str) -> None:
    """--field, --column, --skip-header, --id-column and --keep-columns: where the texts, their
    ids and the columns carried along are in the input; `kept_into`: the outputs that hold kept columns."""
    add_text_args(p)
    p.add_argument("--skip-header", action="store_true", help="skip the first line/row")
    p.add_argument("--id-column", default=None,
                   help="the column (JSONL field) whose values are the output's ids [Parquet/Arrow: the row number "
                        "from 0; JSONL: its \"id\" field, else the line number; CSV/TSV: the line number]")
    p.add_argument("--keep-columns", type=names_arg, default=[], metavar="A,B",
                   help=f"input columns (JSONL fields, CSV/TSV header names, Parquet/Arrow columns) carried into the "
                        f"output ({kept_into}) [none]")


def rates_said(texts: int, seconds: float, real_tokens: int, efficiency: float) -> str:
    """How fast a bulk job's texts went, as predict and embed end: `in 0.84 s: 1201 texts/s, 23190
    real tokens/s, padding efficiency 0.913`."""
    secs = max(seconds, 1e-9)
    return (f"in {clock_time(seconds)}: {rate_text(texts / secs)} texts/s, {rate_text(real_tokens / secs)} real tokens/s, "
            f"padding efficiency {efficiency:.3f}")


def cut_line(model, count: int, read: str = "read") -> str:
    """What a model that reads no windows did with `count` texts longer than its max length:
    only their start was `read` (predict) or scored (evaluate)."""
    limit = getattr(model, "limit", None)  # what --max-length may raise it to, where the model says
    more = f" (--max-length raises it, up to {limit})" if limit and limit > model.max_length else ""
    return (f"{count} text(s) were longer than the {model.max_length} tokens the model reads: only their start was "
            f"{read}{more}")


def note_small_budget(model, asked, max_tokens: int | None) -> None:
    """A note where a --max-tokens given (`asked`, the flag's value) is below the tokens the model reads
    of a text: it sizes a whole batch, and a user who took it for a text's length (HF's max_length)
    gets batches of one text at a fraction of the speed. On stderr: stdout may be a result."""
    window = getattr(model, "max_length", None)
    if asked in (None, "auto") or not max_tokens or not window or max_tokens >= window:
        return
    print(f"note: --max-tokens {max_tokens} sizes a whole batch, in padded tokens, and is below the {window} tokens "
          f"the model reads of a text (--max-length): batches this small hold few texts each, which runs slowly; "
          f"leave it out for this device's default ({infer_tokens(model.policy.device)})", file=sys.stderr)


def resume_hint(a, journal_of, where: str) -> str | None:
    """The stop line's hint of a bulk job whose journal (`journal_of(output)`) is there: the same
    command with --resume goes on from `where`; None where there is none."""
    output = getattr(a, "output", None)
    if output and os.path.exists(journal_of(output)):
        return f"; the same command with --resume goes on from {where}"
    return None


def job_status(path: str, n_texts: int, errors: int = 0) -> int:
    """The job's exit status, with the stderr line of a job whose input held no texts (a warning:
    it ran, and wrote an empty output) or none that could be read: every record an error record,
    which a wrong --field or --column makes (status 1: a script must not take it for a result)."""
    if not n_texts:
        print(f"warning: {path} holds no texts (an empty file?)", file=sys.stderr)
    elif errors >= n_texts:
        print(f"error: every record of {path} is an error record ({errors}); is the text in another field or "
              "column (--field, --column), or the file in another encoding than UTF-8 (iconv -f ENCODING -t "
              "UTF-8)? The output says why for each", file=sys.stderr)
        return 1
    return 0


def check_input(a) -> None:
    """--input before any model loads: a local file that exists and holds texts (labelled data is
    named, not read line by line); a URI (s3://, gs://, ...) only with --ray, whose cluster reads it."""
    from spanflow.data.formats.common import STREAM, refuse_stream
    from spanflow.data.formats.sniff import refuse_labelled_input
    from spanflow.data.tables import is_table
    from spanflow.errors import ConfigError, DataError

    if "://" in a.input:
        if getattr(a, "ray", None) is None:
            raise ConfigError(f"--input {a.input}: a URI is read by a Ray cluster; add --ray, or copy the file here")
        return
    if a.input == "-":
        raise ConfigError(f"--input -: standard input is {STREAM}")
    if not os.path.exists(a.input):
        raise DataError("file not found", path=a.input)
    refuse_stream(a.input)
    output = getattr(a, "output", None)
    if output:
        from spanflow.inference.journal import refuse_onto_input

        refuse_onto_input(a.input, output, "--output")
    if getattr(a, "field_given", False) and getattr(a, "column", None) is not None:
        raise ConfigError(f"--field {a.field} and --column {a.column} both name the text's column; give one")
    if os.path.isdir(a.input):
        if getattr(a, "ray", None) is None:
            raise DataError("is a directory; a directory of Parquet files is read with --ray (docs/ray.md), a "
                            "single job reads one file", path=a.input)
        return
    if is_table(a.input):
        if getattr(a, "skip_header", False):
            raise ConfigError(f"--skip-header: {a.input} is Parquet/Arrow, whose rows hold no header line")
        return
    refuse_utf16(a.input)
    refuse_labelled_input(a.input)
    field_as_column(a, a.input)


def field_as_column(a, path: str) -> None:
    """A --field given for a CSV/TSV input names its header's column, even the default's name
    ("text") typed: it becomes that --column (a job begun with either is the same job), once the
    header is checked to have it."""
    from spanflow.data.formats.common import kind_of
    from spanflow.data.records import check_header_column

    # by its name: a JSON list (CasRel data to tune on) is not read as texts here, whose refusal would say so
    if getattr(a, "field_given", False) and kind_of(path) in ("csv", "tsv"):
        check_header_column(path, a.field, "--field")
        a.column, a.field = a.field, "text"


def refuse_utf16(path: str) -> None:
    """A DataError for a text input in UTF-16 or UTF-32 (told by its byte-order mark): read as
    UTF-8 its every other byte is a NUL, and each line would come out garbled, not as an error."""
    from spanflow.data.formats.common import MAGIC_BYTES, refuse_wide

    if not os.path.isfile(path):  # a pipe's first bytes, read here, would be gone for the job
        return
    with open(path, "rb") as f:
        refuse_wide(f.read(MAGIC_BYTES), path)
