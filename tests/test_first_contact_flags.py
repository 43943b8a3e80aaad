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


@pytest.mark.parametrize("flags, says", [
    (["--device", "gpu"], "--device gpu: not a device name; use auto, cpu, cuda, cuda:N or mps"),
    (["--devices", "0"], "--devices must be >= 1 (processes on this node), got 0"),
])
def test_the_cli_answers_a_wrong_device_in_one_line(tmp_path, capsys, flags, says):
    train = tmp_path / "t.conll"
    train.write_text("Ada B-PER\nlives O\n", encoding="utf-8")
    lines = error_lines(["train", "ner", "--train", str(train), "--out", str(tmp_path / "o"), *flags], capsys)
    assert lines == [f"error: {says}"]


def test_a_cuda_device_the_machine_lacks_is_named(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^--device cuda:0 asked, but no CUDA device is available \(torch sees "
                                              r"none; --device auto"):
            pick_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"^--device cuda:3: this machine has 1 CUDA device\(s\), cuda:0 to cuda:0$"):
        pick_device("cuda:3")


@pytest.mark.parametrize("field, value, says", [
    ("weight_decay", -1.0, "--weight-decay must be >= 0, got -1.0"),
    ("max_grad_norm", -1.0, "--max-grad-norm must be >= 0, got -1.0"),
    ("log_every", -1, "--log-every must be >= 0, got -1"),
    ("patience", -1, "--patience must be >= 0, got -1"),
    ("max_length", 4, "--max-length must be >= 8 (two special tokens and the text's), got 4"),
])
def test_training_values_out_of_range_are_refused(field, value, says):
    with pytest.raises(ConfigError) as e:
        TrainOptions(**{field: value})
    flag = "--" + field.replace("_", "-")  # the command line's words; the Python API's name the field
    assert e.value.cli == says and str(e.value) == f"TrainOptions.{field}{says[len(flag):]}" and e.value.field == field
    TrainOptions(**{field: 0 if field != "max_length" else 8})  # the bound itself is taken


@pytest.mark.parametrize("argv, says", [
    (["train", "ner", "--train", "t.conll", "--out", "o", "--epoch", "1"],
     "spanflow train ner: error: unrecognized arguments: --epoch 1 (--epoch: did you mean --epochs?)"),
    (["train", "re", "--train", "t.json", "--out", "o", "--max_steps=2"],
     "spanflow train re: error: unrecognized arguments: --max_steps=2 (--max_steps: did you mean --max-steps?)"),
    (["tune", "--task", "ner", "--model", "m", "--data", "d", "--budget", "30"],  # seconds, or token budgets
     "spanflow tune: error: unrecognized arguments: --budget 30 (--budget: did you mean --budget-seconds or "
     "--budgets?)"),
    (["tune", "--task", "ner", "--model", "m", "--data", "d", "--budgets", "1.5"],
     "spanflow tune: error: argument --budgets: expected whole numbers separated by commas, got '1.5'"),
    (["predict", "--model", "m", "--input", "i", "--output", "o", "--zzz"],
     "spanflow predict: error: unrecognized arguments: --zzz"),
    # a misspelled required flag is named, not reported as missing ("required: --train")
    (["train", "ner", "--trian", "t.conll", "--out", "o"],
     "spanflow train ner: error: unrecognized arguments: --trian t.conll (--trian: did you mean --train?)"),
    # another tool's flag: what stands for it here
    (["train", "ner", "--train", "t.conll", "--output-dir", "o"],
     "spanflow train ner: error: unrecognized arguments: --output-dir o (--output-dir: here --out)"),
    (["predict", "--model", "m", "--input", "i", "--output", "o", "--batch_size", "8"],
     "spanflow predict: error: unrecognized arguments: --batch_size 8 (--batch_size: here --max-tokens (a token "
     "budget: padded tokens per batch, not a count of texts))"),
    (["train", "ner", "--train", "t.conll", "--out", "o", "--fp16"],
     "spanflow train ner: error: unrecognized arguments: --fp16 (--fp16: here --precision fp16)"),
    # a flag another task takes is that task's, not a misspelling of --head-lr
    (["train", "re", "--train", "t.json", "--out", "o", "--head", "crf"],
     "spanflow train re: error: unrecognized arguments: --head crf (--head: only spanflow train ner takes it)"),
])
def test_a_flag_is_told_by_its_command_with_the_nearest_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == says and err[0].startswith("usage: " + says.split(":")[0])  # the command's own usage
    assert len(err) == 2 and err[0].endswith("--help` lists them)")  # one usage line, not every flag


def test_values_that_look_like_flags_are_still_values():
    """The check for mistyped flags runs before the parse: a value argparse takes as one (a
    field named "--my field", anything after `--`) must not be refused by it."""
    from spanflow.cli.main import build_parser

    a = build_parser().parse_args(["predict", "--model", "m", "--input", "i", "--output", "o", "--field", "--my field"])
    assert a.field == "--my field"
    a = build_parser().parse_args(["predict", "--model", "m", "--input", "i", "--output", "o", "--field=--x"])
    assert a.field == "--x"


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


def test_training_values_are_checked_before_a_budget_is_measured(tmp_path, capsys, monkeypatch):
    from spanflow.tuning import auto

    monkeypatch.setattr(auto, "quick_profile", lambda **kw: pytest.fail("measured before the options were checked"))
    train = tmp_path / "t.conll"
    train.write_text("Ada B-PER\nlives O\n", encoding="utf-8")
    lines = error_lines(["train", "ner", "--train", str(train), "--out", str(tmp_path / "o"), "--max-tokens", "auto",
                         "--weight-decay", "-1"], capsys)
    assert lines == ["error: --weight-decay must be >= 0, got -1.0"]


@pytest.mark.parametrize("flag", [["--devices", "2"], ["--devices=2"]])
def test_devices_relaunches_without_its_own_flag(tmp_path, monkeypatch, flag):
    from spanflow.training import distributed

    launched = []
    monkeypatch.setattr(distributed, "relaunch", lambda argv, n, after=None: launched.append((argv, n)) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["train", "ner", "--train", "t.conll", *flag, "--out", "o"]
    assert main(argv) == 0
    assert launched == [(["train", "ner", "--train", "t.conll", "--out", "o"], 2)]


def test_data_errors_number_casrel_records_from_one(tmp_path):
    from spanflow.errors import DataError

    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"text": "Ann lives in Rome .", "triple_list": []}, {"triple_list": []}]),
                    encoding="utf-8")
    with pytest.raises(DataError, match=r'record 2 \(of the list, from 1\) has no string "text"'):
        read_re(path)


def test_unknown_names_say_which_and_what_they_may_mean():
    from spanflow.tasks.metrics import unknown_names

    assert unknown_names(["LOC", "PER"], {"LOC", "PER"}, "labels") == []
    assert unknown_names(["LOC", "PER"], {"LOC", "person", "ZZZ"}, "labels") == [
        "2 of the data's labels are not the model's and count as misses: ZZZ, person (the model's PER?)"]
    none = unknown_names(["birthPlace"], {"locatedIn"}, "relations")
    assert none == ["none of the data's relations is one the model was trained on (birthPlace): every one counts "
                    "as a miss and F1 is 0; check that model and data match: locatedIn"]


def test_an_inference_policy_says_nothing_of_training():
    import dataclasses

    import torch

    from spanflow.runtime.policy import Policy

    fp16 = Policy(device=torch.device("cpu"), amp_dtype=torch.float16, use_scaler=True)
    assert fp16.describe() == "device cpu, precision fp16 autocast, fp32 master weights, GradScaler"
    assert fp16.describe(training=False) == "device cpu, precision fp16 autocast"
    assert dataclasses.replace(fp16, why="x").describe(training=False).endswith(" (x)")


def test_doctor_needs_a_step_to_probe():
    from spanflow.tuning.doctor import doctor

    with pytest.raises(ConfigError, match="--steps must be >= 1, got 0"):
        doctor(model="tiny", data="x", steps=0, log_fn=lambda s: None)


def test_doctor_refuses_a_path_it_cannot_probe_before_its_machine_report(tmp_path, capsys):
    (tmp_path / "d.conll").write_text("Ann\tB-PER\n\n")
    assert error_lines(["doctor", "--model", str(tmp_path / "nope"), "--data", str(tmp_path / "d.conll")], capsys) == [
        f"error: model directory not found: {tmp_path / 'nope'}"]  # error_lines: nothing on stdout, the report neither
    assert error_lines(["doctor", "--model", "tiny", "--data", str(tmp_path / "gone.conll")], capsys) == [
        f"error: {tmp_path / 'gone.conll'}: file not found"]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_window_under_the_floor_is_refused_before_the_model_is_looked_at(tmp_path, capsys, command):
    texts, data = tmp_path / "t.txt", tmp_path / "d.conll"
    texts.write_text("Ada lives in Paris .\n", encoding="utf-8")
    data.write_text("Ada B-PER\nlives O\n", encoding="utf-8")
    io = ["--input", str(texts), "--output", str(tmp_path / "p.jsonl")] if command == "predict" else ["--data", str(data)]
    # the model directory does not exist: the window is told first, as it needs no model
    lines = error_lines([command, "--model", str(tmp_path / "none"), *io, "--max-length", "4"], capsys)
    assert lines == ["error: --max-length must be at least 8 (and at most the model's limit), got 4"]
    lines = error_lines([command, "--model", str(tmp_path / "none"), *io, "--stride", "-1"], capsys)
    assert lines == ["error: --stride must be >= 0 (NER's windows; other tasks take none), got -1"]


def test_a_training_run_ends_with_the_command_to_run_its_model(tmp_path, capsys):
    from spanflow.data.formats.jsonl import write_jsonl_record
    from spanflow.data.synthetic import synthetic_ner

    data = tmp_path / "train.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for e in synthetic_ner(40, seed=3, max_clauses=1):
            write_jsonl_record(f, e.text, e.spans)
    out = tmp_path / "run"
    assert main(["train", "ner", "--train", str(data), "--dev", str(data), "--out", str(out), "--epochs", "1",
                 "--max-length", "32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(x.endswith("; words: tokenizer (plain text is cut into words by the tokenizer, which splits "
                          "punctuation off)") for x in lines), lines  # JSONL spans: the tokenizer's words
    assert lines[-2].startswith("the model tags ") and " labels: " in lines[-2]
    assert lines[-1] == f"next: spanflow predict --model {out / 'model'} --input texts.txt --output spans.jsonl"
    # stopped before any model was kept: no command to run one
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / "stopped"), "--max-steps", "1"]) == 0
    assert not any(x.startswith("next:") for x in capsys.readouterr().out.splitlines())


def test_tune_refuses_a_max_length_under_the_floor_before_a_model_loads(tmp_path):
    from spanflow.tuning.tune import tune

    with pytest.raises(ConfigError, match=r"^--max-lengths must each be >= 8, got 4$"):
        tune(task="ner", model=str(tmp_path / "none"), data="x", mode="infer", max_lengths=[4, 64],
             log_fn=lambda s: None)


def test_the_training_line_says_what_whitespace_words_mean(tmp_path, capsys):
    conll = tmp_path / "t.conll"
    conll.write_text("Ada B-PER\nlives O\nin O\nParis B-LOC\n, O\n\nBob B-PER\nsmiled O\n.\tO\n", encoding="utf-8")
    assert main(["train", "ner", "--train", str(conll), "--out", str(tmp_path / "o"), "--max-steps", "1"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if "; words: " in x]
    assert line.endswith("; words: whitespace (plain text is cut into words at its spaces, as these tokens were, and "
                         "an entity starts and ends only at a word's ends; punctuation cut off a word's start: , .; off its end: , .)")


def test_invisible_marks_are_shown_by_their_code_points():
    from spanflow.tasks.ner.words import shown_marks

    assert shown_marks(",\u200b)") == ", U+200B )" and shown_marks("") == "none"


def test_next_is_said_only_for_a_model_this_run_finished(tmp_path):
    from spanflow.training.outcome import next_command

    out = tmp_path / "my runs"  # a space: the command is quoted to be copied as it is
    (out / "model").mkdir(parents=True)
    report = out / "train_report.jsonl"
    assert next_command(str(out), "run {model}") == ""  # no report: not this run's model
    report.write_text(json.dumps({"epoch": 1}) + "\n" + json.dumps({"epoch": 2}) + "\n", encoding="utf-8")
    assert next_command(str(out), "run {model}") == f"\nnext: run '{out}/model'"
    with open(report, "a", encoding="utf-8") as f:  # stopped by --max-steps: the model there is an earlier run's
        f.write(json.dumps({"epoch": 3, "partial": True}) + "\n")
    assert next_command(str(out), "run {model}") == ""
    # a model that scored 0 on dev at every evaluation learned nothing: running it is no next step
    report.write_text("".join(json.dumps({"epoch": k, "dev_f1": 0.0}) + "\n" for k in (1, 2)), encoding="utf-8")
    assert next_command(str(out), "run {model}") == ""
    report.write_text("".join(json.dumps({"epoch": k, "dev_f1": f}) + "\n" for k, f in ((1, float("nan")), (2, 0.4))),
                      encoding="utf-8")  # an undefined first score (a Spearman of constant cosines) hides no later one
    assert next_command(str(out), "run {model}") == f"\nnext: run '{out}/model'"


def test_a_flag_of_two_other_tasks_names_both(capsys):
    with pytest.raises(SystemExit):
        main(["train", "embed", "--train", "p.csv", "--out", "o", "--oversample", "1"])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "(--oversample: only spanflow train ner and spanflow train re take it)")


def test_a_slip_for_tiny_is_named_and_tiny_where_no_training_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative name, as typed
    (tmp_path / "d.conll").write_text("Ann B-PER\n\n")
    for slip in ("tin", "Tiny", "tinny"):
        assert error_lines(["train", "ner", "--train", "d.conll", "--model", slip, "--out", "o"], capsys) == [
            f"error: model directory not found: {slip}; did you mean 'tiny' (an encoder built from scratch, for "
            "training)?"]
    assert error_lines(["train", "ner", "--train", "d.conll", "--model", "tinybert", "--out", "o"], capsys) == [
        "error: model directory not found: tinybert"]  # another name: no guess
    (tmp_path / "t.txt").write_text("Ann\n")
    assert error_lines(["predict", "--model", "tiny", "--input", "t.txt", "--output", "p.jsonl"], capsys) == [
        "error: model directory not found: tiny; 'tiny' names an encoder built from scratch when training starts: "
        "this needs a trained model directory"]
    assert not (tmp_path / "o").exists() and not (tmp_path / "p.jsonl").exists()


def test_a_token_budget_is_held_to_the_datas_longest_window_not_the_encoders_limit(tmp_path, capsys):
    """--max-tokens 64 on short sentences was refused as 'below the max length 512' (the tiny
    encoder's limit), though every window of the data fits it many times."""
    from spanflow.data.formats.jsonl import write_jsonl_record
    from spanflow.data.synthetic import synthetic_ner

    data = tmp_path / "train.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for e in synthetic_ner(20, seed=3, max_clauses=1):
            write_jsonl_record(f, e.text, e.spans)
    run = ["train", "ner", "--train", str(data), "--epochs", "1", "--model", "tiny", "--pack", "0"]
    assert main([*run, "--out", str(tmp_path / "ok"), "--max-tokens", "64"]) == 0
    capsys.readouterr()
    assert main([*run, "--out", str(tmp_path / "small"), "--max-tokens", "8"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    longest = int(line.split("longest training window, ")[1].split()[0])
    assert 8 < longest <= 64 and line == (f"error: --max-tokens 8 is below the longest training window, {longest} "
                                          f"tokens: one window must fit in a batch (give --max-tokens {longest} or more)")


def test_an_out_that_cannot_be_a_directory_is_named_for_what_it_is(tmp_path, capsys):
    data = tmp_path / "t.conll"
    data.write_text("Ann B-PER\nran O\n\n")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere" / "x")
    run = ["train", "ner", "--train", str(data), "--model", "tiny", "--epochs", "1", "--out"]
    for out, said in (("", "--out is '' (an empty path); give a directory"),
                      ("/dev/null", "--out /dev/null is no directory; give a directory"),
                      (str(tmp_path / "gone"), f"--out {tmp_path / 'gone'} is a link to {tmp_path / 'nowhere' / 'x'}, "
                                               "which does not exist; create it, or give another --out")):
        assert main([*run, out]) == 2
        assert capsys.readouterr().err.strip() == f"error: {said}"  # was "cannot write to --out ...: File exists"


@pytest.mark.parametrize("command", ["predict", "embed"])
def test_ray_flags_need_ray_and_a_range_before_ray_starts(tmp_path, capsys, monkeypatch, command):
    """Without --ray the --ray-* flags did nothing (this process ran the job); with it, a count of
    0 was refused only once Ray had started and the model loaded."""
    import spanflow.ray.job as job

    monkeypatch.setattr(job, "run_job", lambda *a, **k: pytest.fail("Ray started"))
    texts = tmp_path / "t.txt"
    texts.write_text("Ada lives in Paris .\n", encoding="utf-8")
    io = ["--model", str(tmp_path / "none"), "--input", str(texts), "--output", str(tmp_path / "out")]
    lines = error_lines([command, *io, "--ray-gpus-per-actor", "0.5"], capsys)
    assert lines == ["error: --ray-gpus-per-actor applies to a job on Ray Data: add --ray (or drop "
                     "--ray-gpus-per-actor; without --ray this process runs the job)"]
    assert error_lines([command, *io, "--ray", "--ray-actors", "0"], capsys) == [
        "error: --ray-actors must be a positive number, got 0"]
    assert error_lines([command, *io, "--ray", "--ray-cpus-per-actor", "-1"], capsys) == [
        "error: --ray-cpus-per-actor must be a positive number, got -1.0"]
    assert error_lines([command, *io, "--ray", "--ray-gpus-per-actor", "inf"], capsys) == [
        "error: --ray-gpus-per-actor must be a number, 0 or more, got inf"]


def test_a_model_path_with_an_unexpanded_tilde_names_the_path_it_stands_for(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # --model=~/m: the shell expands no ~ after "="
    (tmp_path / "m").mkdir()
    (tmp_path / "t.txt").write_text("Ann\n")
    monkeypatch.chdir(tmp_path)
    assert error_lines(["predict", "--model=~/m", "--input", "t.txt", "--output", "p.jsonl"], capsys) == [
        f"error: model directory not found: ~/m (a ~ is not expanded here: give {tmp_path / 'm'})"]


@pytest.mark.parametrize("argv, said", [
    (["--train-size", "-5"], "error: --train-size must be >= 1, got -5"),
    (["--epochs", "0"], "error: --epochs must be >= 1, got 0"),
])
def test_demo_refuses_a_size_or_epochs_below_one_before_making_data(tmp_path, capsys, argv, said):
    """`demo --train-size -5` made '0 train' texts and failed on 'no entities'; --epochs 0 after the data."""
    assert main(["demo", "--out", str(tmp_path / "d"), *argv]) == 2
    out = capsys.readouterr()
    assert said in out.err and "synthetic data" not in out.out and not (tmp_path / "d").exists()
