"""Every command and `train TASK` subcommand: a description, help on every flag, its default shown,
choices for fixed sets, one reading of a flag shared by several commands; `--help` and `--version`."""
from __future__ import annotations

import argparse
import os
import re
import tomllib

import pytest

import spanflow
from spanflow.cli.common import MAX_TOKENS_HELP
from spanflow.cli.main import build_parser, main
from spanflow.data.io import NER_FORMATS
from spanflow.data.schemes import SCHEMES
from spanflow.runtime.backend import BACKENDS
from spanflow.runtime.budget import DEFAULT_BUDGETS
from spanflow.runtime.policy import PRECISIONS
from spanflow.tasks.ner.heads import HEAD_TYPES
from spanflow.tasks.registry import names

# flags whose values are a fixed set: their choices everywhere (None: choices of the command's own)
FIXED = {"--precision": PRECISIONS, "--format": NER_FORMATS, "--from": NER_FORMATS, "--scheme": SCHEMES,
         "--task": None, "--mode": ("train", "infer"), "--dtype": ("float32", "float16"), "--quantize": ("int8",),
         "--backend": BACKENDS, "--head": HEAD_TYPES, "--subjects": ("all", "sample"),
         "--loss": ("auto", "cosent", "angle", "ranking"), "--lr-scaling": ("none", "sqrt", "linear"),
         "--grad-compression": ("none", "fp16"), "--to": None}
# flags that mean the same on every command that has them: the same help, but for the default shown
SHARED = ("--device", "--precision", "--profile", "--field", "--column", "--skip-header", "--id-column",
          "--format", "--scheme", "--strict", "--task", "--epochs")
SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def _commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _commands(sub, (*path, name))


@pytest.fixture(scope="module")
def commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return list(_commands(build_parser()))


def _options(commands):
    """(command, flag or dest, action, help as printed) of every argument of every command."""
    for path, p in commands:
        for a in p._actions:
            if not isinstance(a, SKIP):
                shown = p._get_formatter()._expand_help(a) if a.help else ""
                yield " ".join(("spanflow", *path)), (a.option_strings or [a.dest])[-1], a, shown


def _stem(help_text: str) -> str:
    """The help without its trailing [default]."""
    return re.sub(r"\s*\[[^\]]*\]$", "", help_text)


def test_every_command_has_a_description(commands):
    assert len(commands) >= 14  # the top, train and its tasks, and every other command
    missing = [" ".join(("spanflow", *path)) for path, p in commands if not (p.description or "").strip()]
    assert not missing


def test_every_option_has_help(commands):
    missing = [f"{cmd} {flag}" for cmd, flag, a, shown in _options(commands)
               if not shown.strip() or a.help == argparse.SUPPRESS]
    assert not missing


def test_every_default_is_shown(commands):
    hidden = []
    for cmd, flag, a, shown in _options(commands):
        if a.nargs == 0 or a.required or not a.option_strings:
            continue  # a switch, a required flag or a positional: no default to show
        if a.default not in (None, []):
            ok = str(a.default) in shown
        else:  # nothing set: the help says what happens then
            ok = re.search(r"\[[^\]]+\]|\(default: ", shown) is not None
        if not ok:
            hidden.append(f"{cmd} {flag}")
    assert not hidden


def test_fixed_sets_are_choices(commands):
    wrong = []
    for cmd, flag, a, _ in _options(commands):
        if flag not in FIXED:
            continue
        want = FIXED[flag] if FIXED[flag] is not None else a.choices
        if not a.choices or list(a.choices) != list(want):
            wrong.append(f"{cmd} {flag}: {a.choices}")
    assert not wrong
    tasks = [a.choices for cmd, flag, a, _ in _options(commands) if flag == "--task"]
    assert len(tasks) == 2 and all(list(c) == names() for c in tasks)  # tune and doctor


def test_a_shared_flag_reads_the_same_on_every_command(commands):
    seen: dict[str, set] = {}
    for cmd, flag, a, shown in _options(commands):
        if flag in SHARED:
            seen.setdefault(flag, set()).add((_stem(shown), tuple(a.choices or ())))
    assert set(seen) == set(SHARED)
    assert {flag: s for flag, s in seen.items() if len(s) > 1} == {}
    budgets = {cmd: shown for cmd, flag, a, shown in _options(commands) if flag == "--max-tokens"}
    assert {"spanflow predict", "spanflow serve", "spanflow train ner", "spanflow doctor"} <= set(budgets)
    doctor = budgets.pop("spanflow doctor")  # a number only: no auto
    assert "auto" not in doctor and all(s.startswith(MAX_TOKENS_HELP) for s in budgets.values())


def test_a_default_that_differs_between_commands_says_why(commands):
    helps = {(cmd, flag): shown for cmd, flag, a, shown in _options(commands)}
    serve, predict = helps[("spanflow serve", "--max-tokens")], helps[("spanflow predict", "--max-tokens")]
    cpu = {job: str(b["cpu"]) for job, b in DEFAULT_BUDGETS.items()}
    assert cpu["serve"] != cpu["infer"]
    assert f"{cpu['serve']} on CPU" in serve and f"{cpu['infer']} on CPU because" in serve
    assert f"{cpu['infer']} on CPU" in predict and f"serve takes {cpu['serve']}" in predict


def test_train_lists_each_task_only_its_own_flags(commands):
    flags = {path: {f for a in p._actions for f in a.option_strings} for path, p in commands}
    ner_only = {"--stride", "--class-weights", "--pack", "--pack-span", "--head", "--scheme"}
    assert ner_only <= flags[("train", "ner")]
    assert not ner_only & flags[("train", "re")]
    assert not (ner_only | {"--oversample", "--label-smoothing"}) & flags[("train", "embed")]
    model = {path: a.help for path, p in commands for a in p._actions if "--model" in a.option_strings}
    assert "spanflow re model" in model[("train", "re")] and "NER" not in model[("train", "re")]


def test_choices_keep_every_value_that_worked(commands):
    p = build_parser()
    base = ["evaluate", "--model", "m", "--data", "d"]
    assert p.parse_args([*base, "--scheme", "BIOES"]).scheme == "bioes"  # any case, as the reader takes it
    # int8 gets past argparse: the runtime answers it with the line that names --quantize
    assert p.parse_args([*base, "--precision", "int8"]).precision == "int8"
    with pytest.raises(SystemExit) as e:
        p.parse_args([*base, "--precision", "fp8"])
    assert e.value.code == 2


def test_help_of_every_command_runs(commands, capsys):
    for path, _ in commands:
        with pytest.raises(SystemExit) as e:
            main([*path, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and out.startswith("usage: spanflow"), path


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"spanflow {spanflow.__version__}\n"
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["version"] == spanflow.__version__


def test_train_help_says_what_an_unset_epochs_lr_and_patience_get(commands):
    """`[per task, docs/defaults.md]` told a user nothing they could use; the values are each
    task's own table."""
    from spanflow.tasks.ner.train import DEFAULTS

    helps = {(cmd, flag): shown for cmd, flag, _, shown in _options(commands)}
    enc, tiny = DEFAULTS["pretrained"], DEFAULTS["tiny"]
    assert f"[an encoder {enc.epochs:g}, tiny {tiny.epochs:g}; docs/defaults.md]" in helps[("spanflow train ner",
                                                                                         "--epochs")]
    assert f"[an encoder {enc.lr:g}, tiny {tiny.lr:g}; scaled to the update size]" in helps[("spanflow train ner",
                                                                                          "--lr")]
    # the embedding tables go by the loss (--loss ranking on scored pairs takes the ranking table);
    # a value the same under both is said once
    from spanflow.tasks.embed.train import DEFAULTS as SCORED, RANKING_DEFAULTS as RANKING

    assert (f"CoSENT or AnglE (scored pairs): an encoder {SCORED['pretrained'].lr:g}" in
            helps[("spanflow train embed", "--lr")]
            and f"ranking (pairs or triplets): an encoder {RANKING['pretrained'].lr:g}" in
            helps[("spanflow train embed", "--lr")])
    assert SCORED["pretrained"].epochs == RANKING["pretrained"].epochs
    assert (f"[an encoder {SCORED['pretrained'].epochs:g}, tiny {SCORED['tiny'].epochs:g}; docs/defaults.md]" in
            helps[("spanflow train embed", "--epochs")])
    assert "tiny never" in helps[("spanflow train re", "--patience")]


def test_train_embed_max_tokens_help_says_the_ranking_loss_sets_micro_batches(commands):
    helps = {(cmd, flag): shown for cmd, flag, _, shown in _options(commands)}
    said = helps[("spanflow train embed", "--max-tokens")]
    assert "[the ranking loss: its --pairs-per-step update's micro-batches" in said and "CoSENT and AnglE: sized" in said
    assert "the ranking loss" not in helps[("spanflow train ner", "--max-tokens")]


def test_each_train_command_names_its_own_dev_score_in_patience(commands):
    helps = {(cmd, flag): shown for cmd, flag, _, shown in _options(commands)}
    assert "(entity F1)" in helps[("spanflow train ner", "--patience")]
    assert "(triple F1)" in helps[("spanflow train re", "--patience")]
    assert "(Spearman on scored pairs, MRR@10 on pairs or triplets)" in helps[("spanflow train embed", "--patience")]
