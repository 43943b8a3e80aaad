"""Flags a new user gets wrong: a device name torch does not know, values out of range, a
misspelt flag, export's output given as the other commands take it; and relation data whose
triples cannot be placed, told by cause."""
import json
import logging

import pytest

from spanflow.cli.main import main
from spanflow.data.io import read_re
from spanflow.errors import ConfigError
from spanflow.runtime.policy import pick_device
from spanflow.training.options import TrainOptions


def error_lines(argv, capsys) -> list[str]:
    """The stderr lines of a command that stopped with exit status 2, nothing on stdout."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    return err.strip().splitlines()


@pytest.mark.parametrize("name, says", [
    ("gpu", "--device gpu: not a device name; use auto, cpu, cuda, cuda:N or mps"),
    ("cuda:x", "--device cuda:x: not a device name"),
    ("meta", "--device meta: spanflow runs on auto, cpu, cuda, cuda:N or mps"),
])
def test_a_device_torch_does_not_know_is_one_config_error(name, says):
    with pytest.raises(ConfigError) as e:
        pick_device(name)
    assert str(e.value).startswith(says)


def test_the_cli_answers_a_wrong_device_in_one_line(tmp_path, capsys):
    train = tmp_path / "t.conll"
    train.write_text("Ada B-PER\nlives O\n", encoding="utf-8")
    lines = error_lines(["train", "ner", "--train", str(train), "--out", str(tmp_path / "o"), "--device", "gpu"],
                        capsys)
    assert lines == ["error: --device gpu: not a device name; use auto, cpu, cuda, cuda:N or mps"]


@pytest.mark.parametrize("field, value, says", [
    ("weight_decay", -1.0, "--weight-decay must be >= 0, got -1.0"),
    ("max_grad_norm", -1.0, "--max-grad-norm must be >= 0, got -1.0"),
    ("log_every", -1, "--log-every must be >= 0, got -1"),
    ("patience", -1, "--patience must be >= 0, got -1"),
    ("max_length", 4, "--max-length must be >= 8 (two special tokens and the text's), got 4"),
])
def test_training_values_out_of_range_are_refused(field, value, says):
    with pytest.raises(ConfigError, match="^" + says.replace("(", r"\(").replace(")", r"\)") + "$"):
        TrainOptions(**{field: value})
    TrainOptions(**{field: 0 if field != "max_length" else 8})  # the bound itself is taken


def test_devices_below_one_is_refused(tmp_path, capsys):
    train = tmp_path / "t.conll"
    train.write_text("Ada B-PER\nlives O\n", encoding="utf-8")
    lines = error_lines(["train", "ner", "--train", str(train), "--out", str(tmp_path / "o"), "--devices", "0"],
                        capsys)
    assert lines == ["error: --devices must be >= 1 (processes on this node), got 0"]


@pytest.mark.parametrize("argv, says", [
    (["train", "ner", "--train", "t.conll", "--out", "o", "--epoch", "1"],
     "spanflow train ner: error: unrecognized arguments: --epoch 1 (--epoch: did you mean --epochs?)"),
    (["train", "re", "--train", "t.json", "--out", "o", "--max_steps=2"],
     "spanflow train re: error: unrecognized arguments: --max_steps=2 (--max_steps: did you mean --max-steps?)"),
    (["predict", "--model", "m", "--input", "i", "--output", "o", "--zzz"],
     "spanflow predict: error: unrecognized arguments: --zzz"),
])
def test_a_misspelt_flag_is_told_by_its_command_with_the_nearest_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == says and err[0].startswith("usage: " + says.split(":")[0])  # the command's own usage


def test_export_takes_out_as_a_flag_and_its_only_format_by_default(tmp_path, capsys):
    missing = str(tmp_path / "no_model")
    for argv in (["export", "--model", missing, "--out", str(tmp_path / "hf")],
                 ["export", "--model", missing, str(tmp_path / "hf")]):
        lines = error_lines(argv, capsys)  # parsed (no --to needed); stops at the model, not at the flags
        assert len(lines) == 1 and "model directory not found" in lines[0], lines
    assert error_lines(["export", "--model", missing], capsys) == [
        "error: no output directory: give it as --out OUT (or as the last argument)"]
    lines = error_lines(["export", "--model", missing, "--out", str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert lines[0].startswith("error: two output directories given")


def test_triples_that_cannot_be_placed_are_counted_by_cause(tmp_path, caplog):
    path = tmp_path / "r.json"
    path.write_text(json.dumps([
        {"text": "Bacon is eaten .", "triple_list": [["Bacon", "ingredient", "Bacon"]]},
        {"text": "Ann lives in Rome .", "triple_list": [["Ann", "livesIn", "Rome"], ["Bob", "livesIn", "Oslo"]]},
    ]), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        examples = read_re(path)
    assert [len(e.triples) for e in examples] == [0, 1] and [len(e.unlocated) for e in examples] == [1, 1]
    msg = caplog.records[-1].getMessage()
    assert "2 of 3 triples cannot be placed in their text" in msg
    assert "1 name a subject or object not found in the text (e.g. record 2: ['Bob', 'livesIn', 'Oslo'])" in msg
    assert ("1 have a subject and object that are the same span of the text (e.g. record 1: "
            "['Bacon', 'ingredient', 'Bacon'])") in msg
