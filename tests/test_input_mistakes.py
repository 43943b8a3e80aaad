"""Input a user gets slightly wrong, named as what it is: a .json file of records, one JSON list,
wide text, a weight that would turn the loss away, JSON cut off inside a string."""
import os

import pytest

from spanflow.data.io import read_ner
from spanflow.data.records import read_records, read_rows
from spanflow.errors import ConfigError, DataError
from spanflow.tasks.ner.features import class_weight_tensor


def test_a_json_file_of_one_record_a_line_is_read_as_jsonl(tmp_path):
    p = tmp_path / "records.json"
    p.write_text('{"id": "a1", "body": "Ada wrote"}\n{"id": "a2", "body": "Bob ran"}\n')
    assert list(read_records(str(p), field="body")) == [("a1", "Ada wrote"), ("a2", "Bob ran")]


def test_a_json_list_is_refused_with_how_to_make_jsonl(tmp_path):
    p = tmp_path / "array.json"
    p.write_text('[{"id": "a1", "text": "Ada wrote"}]\n')
    with pytest.raises(DataError, match=r"array\.json: is one JSON list; predict and embed read JSONL.*jq -c"):
        list(read_records(str(p)))


@pytest.mark.parametrize("encoding, said", [("utf-16", "is UTF-16 text (it starts with a UTF-16 byte-order mark)"),
                                            ("utf-16-le", "holds NUL bytes between its characters")])
def test_labelled_data_in_utf16_is_named_as_such(tmp_path, encoding, said):
    p = tmp_path / "train.conll"
    p.write_bytes("Ada\tB-PER\nLovelace\tI-PER\nwrote\tO\n\n".encode(encoding))
    with pytest.raises(DataError) as e:
        read_ner(str(p))
    assert said in str(e.value) and "iconv" in str(e.value)


@pytest.mark.parametrize("pack, name, tool", [("gzip", "gzip", "gunzip"), ("bz2", "bzip2", "bunzip2"),
                                              ("lzma", "xz", "unxz")])
def test_a_compressed_input_is_named_as_such(tmp_path, pack, name, tool, capsys):
    import importlib

    from spanflow.cli.main import main

    texts = tmp_path / "texts.jsonl.z"
    texts.write_bytes(importlib.import_module(pack).compress(b'{"text": "Ada wrote"}\n' * 50))
    assert main(["predict", "--model", "m", "--input", str(texts), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {texts}: is {name}-compressed; spanflow reads uncompressed "
                                               f"text: decompress it first, e.g. {tool} -k {texts}")
    train = tmp_path / "train.conll"  # training data too: not one error per line
    train.write_bytes(importlib.import_module(pack).compress(b"Ada\tB-PER\n\n" * 50))
    with pytest.raises(DataError, match=f"is {name}-compressed"):
        read_ner(str(train))
    plain = tmp_path / "plain.txt"  # a text that begins as bzip2's magic does is text
    plain.write_text("BZh is how the line begins\n")
    assert [t for _, t in read_records(str(plain))] == ["BZh is how the line begins"]


def test_json_cut_off_inside_a_string_reads_as_one_sentence(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "Ada wrote", "entities": [[0, 3, "PER"]]}\n{"text": "Bob ran\n')
    with pytest.raises(DataError) as e:
        read_ner(str(p))
    assert "Unterminated string starting at column 10" in str(e.value) and " at at " not in str(e.value)


@pytest.mark.parametrize("weights", ["PER=-1", "PER=0", {"PER": float("inf")}, {"PER": "2"}, {"PER": True},
                                     {"PER": 10**400}])
def test_a_class_weight_that_is_not_a_finite_number_above_zero_is_refused_with_the_options(weights):
    from spanflow.training.options import TrainOptions

    with pytest.raises(ConfigError, match="^TrainOptions.class_weights: the weight of 'PER' must be a finite number above 0"):
        TrainOptions(class_weights=weights)  # before any model loads
    assert class_weight_tensor("PER=2", [], ["O", "B-PER", "I-PER"]).tolist() == [1.0, 2.0, 2.0]
    with pytest.raises(ConfigError, match=r"unknown label 'per'; entity labels: PER \(or a BIO tag"):
        class_weight_tensor("per=2", [], ["O", "B-PER", "I-PER"])


@pytest.mark.parametrize("argv, left, said", [
    (["embed", "--model", "m", "--input", "in.txt", "--output", "{d}/v.npy"], "v.npy.progress.json",
     "terminated; the same command with --resume goes on from the last chunk written"),
    (["train", "ner", "--train", "t.conll", "--out", "{d}/run"], "run/checkpoint/state.json",
     "terminated; the same command with --resume goes on from {d}/run/checkpoint (step 56, in epoch 3): the steps "
     "after it are trained again"),
    (["embed", "--model", "m", "--input", "in.txt", "--output", "{d}/w.npy"], None, "terminated"),
])
def test_a_stopped_job_says_how_it_goes_on_where_it_left_something(tmp_path, monkeypatch, capsys, argv, left, said):
    from spanflow.cli import main as cli

    if left:
        (tmp_path / left).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / left).write_text('{"global_step": 56, "epoch": 2, "step_in_epoch": 6}')
    module = cli.COMMANDS[argv[0]]

    def stopped(a):
        raise cli.Terminated()

    monkeypatch.setattr(module, "run", stopped)
    assert cli.main([x.format(d=tmp_path) for x in argv]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == said.format(d=tmp_path)

    def interrupted(a):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)  # Ctrl-C: the same line, its own word
    assert cli.main([x.format(d=tmp_path) for x in argv]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == said.format(d=tmp_path).replace("terminated",
                                                                                                 "interrupted")


def test_an_earlier_runs_checkpoint_is_not_offered_to_go_on_from(tmp_path, monkeypatch, capsys):
    import os

    from spanflow.cli import main as cli

    state = tmp_path / "run" / "checkpoint" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    os.utime(state, (1_000_000_000, 1_000_000_000))  # written long before this process started

    def stopped(a):
        raise cli.Terminated()

    monkeypatch.setattr(cli.COMMANDS["train"], "run", stopped)
    assert cli.main(["train", "ner", "--train", "t.conll", "--out", str(tmp_path / "run")]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "terminated"
    # the checkpoint a --resume run started from is its own to go on from
    assert cli.main(["train", "ner", "--train", "t.conll", "--out", str(tmp_path / "run"), "--resume"]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"terminated; the same command with --resume goes on from {tmp_path / 'run' / 'checkpoint'}")


def test_a_short_row_names_the_text_column_as_it_was_asked(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text("doc,body\na1,Ada wrote\na2\n")
    _, error = list(read_records(str(p), column="body", id_column="doc"))[1]
    assert str(error).endswith("in.csv:3: record has 1 column, --column body (column 1) asked"), str(error)


def test_a_pairs_file_with_one_short_row_names_that_row(tmp_path):
    from spanflow.tasks.embed.pairs import read_pairs

    rows = ["sentence1,sentence2,score"] + [f"A man plays guitar {i},Someone plays music {i},{i % 5}.0" for i in range(30)]
    rows[21] = "only one column"
    p = tmp_path / "pairs.csv"
    p.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"pairs\.csv:22: record has 1 column, the file's first has 3"):
        read_pairs(str(p))
    prose = tmp_path / "prose.csv"  # sentences, some with a comma: still text lines, not a table
    prose.write_text("".join(f"The {i}th day was long, and the night was short and cold.\n" if i % 3 else
                             f"Nothing happened on day {i} at all.\n" for i in range(30)))
    with pytest.raises(DataError, match="this is plain text lines"):
        read_pairs(str(prose))


def test_ner_jsonl_whose_spans_sit_under_another_key_names_that_key(tmp_path):
    p = tmp_path / "doccano.jsonl"
    p.write_text('{"id": 1, "text": "Ada wrote", "label": [[0, 3, "PER"]]}\n{"id": 2, "text": "Bob ran", "label": []}\n')
    with pytest.raises(DataError, match=r"doccano\.jsonl:1: no record has \"entities\" \(or \"spans\"\), but 'label' "
                                        "holds spans"):
        read_ner(str(p))
    texts = tmp_path / "texts.jsonl"  # texts with no labels at all are still read, each without entities
    texts.write_text('{"id": 1, "text": "Ada wrote", "label": "news"}\n')
    assert [(e.text, e.spans) for e in read_ner(str(texts))] == [("Ada wrote", [])]


def test_a_column_number_past_the_first_rows_width_is_one_error_before_any_record(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text("Ada wrote,1\nBob ran,2\n")
    with pytest.raises(ConfigError, match=r"^--column 5: the first row of .*in\.csv has 2 columns, numbered from 0$"):
        read_rows(str(p), column=5)  # as a job checks its input before loading its model
    assert list(read_records(str(p), column=1)) == [("1", "1"), ("2", "2")]


def test_the_line_readers_refuse_wide_text_themselves(tmp_path):
    from spanflow.data.formats.common import read_lines

    p = tmp_path / "texts.txt"
    p.write_bytes("Ada wrote\nBob ran\n".encode("utf-16"))
    with pytest.raises(DataError, match="is UTF-16 text"):
        list(read_lines(str(p)))
    with pytest.raises(DataError, match="is UTF-16 text"):
        list(read_records(str(p)))  # a bulk job's reader: one error for the file, not one per garbled line


def test_class_weights_changed_after_the_options_were_made_are_checked_again():
    from spanflow.training.options import TrainOptions

    given = {"PER": 2}
    opts = TrainOptions(class_weights=given)
    given["PER"] = -1  # the options hold their own copy
    assert class_weight_tensor(opts.class_weights, [], ["O", "B-PER", "I-PER"]).tolist() == [1.0, 2.0, 2.0]
    opts.class_weights = {"PER": -1}
    with pytest.raises(ConfigError, match="the weight of 'PER' must be a finite number above 0"):
        class_weight_tensor(opts.class_weights, [], ["O", "B-PER", "I-PER"])


def test_ner_jsonl_labelled_with_tags_is_refused_at_the_line_that_shows_it(tmp_path):
    p = tmp_path / "tags.jsonl"
    p.write_text('{"text": "Ann met Bob Smith", "entities": [[0, 3, "B-PER"]]}\n{"text": "x", "entities": []}\n'
                 '{"text": "Bob Smith", "entities": [[0, 3, "B-PER"], [4, 9, "I-PER"]]}\n')
    with pytest.raises(DataError, match=r"tags\.jsonl:3: labels 'B-PER' and 'I-PER' are tags, not entity types.*"
                                        r"\('PER'\)"):
        read_ner(str(p))
    p.write_text('{"text": "Ann met Bob", "entities": [[0, 3, "PER"], [4, 7, "O"]]}\n')
    with pytest.raises(DataError, match=r"tags\.jsonl:1: a span labelled \"O\" marks no entity"):
        read_ner(str(p))
    p.write_text('{"text": "I-95 and B-52", "entities": [[0, 4, "I-95"], [9, 13, "B-52"]]}\n')
    assert [lab for *_, lab in read_ner(str(p))[0].spans] == ["I-95", "B-52"]  # a prefix alone is a type's name


def test_examples_labelled_with_tags_are_refused_by_the_python_api(tmp_path):
    from spanflow.data.examples import NerExample
    from spanflow.tasks.ner import train_ner

    data = [NerExample("Bob Smith", [(0, 3, "B-PER"), (4, 9, "I-PER")])]
    with pytest.raises(ConfigError, match="^train\\[0\\]: labels 'B-PER' and 'I-PER' are tags"):
        train_ner(data, None, out_dir=str(tmp_path))
    good = [NerExample("Ann met Bob", [(0, 3, "PER")])] * 2
    with pytest.raises(ConfigError, match='^train\\[2\\]: a span labelled "O" marks no entity'):  # the item named
        train_ner(good + [NerExample("abc", [(0, 3, "O")])], None, out_dir=str(tmp_path))


@pytest.mark.parametrize("signal_, rc, said", [("KeyboardInterrupt", 130, "interrupted"), ("Terminated", 143,
                                                                                           "terminated")])
def test_a_stop_while_the_commands_load_is_one_line_not_a_traceback(monkeypatch, capsys, signal_, rc, said):
    from spanflow.cli import main as cli

    def loading():  # Ctrl-C or SIGTERM in the second the command modules (torch) are imported
        raise KeyboardInterrupt if signal_ == "KeyboardInterrupt" else cli.Terminated()

    monkeypatch.setattr(cli, "build_parser", loading)
    assert cli.main(["predict", "--help"]) == rc
    assert capsys.readouterr().err == said + "\n"


def test_a_link_that_leads_nowhere_is_named_as_one(tmp_path):
    (tmp_path / "a.conll").symlink_to(tmp_path / "b.conll")
    (tmp_path / "b.conll").symlink_to(tmp_path / "a.conll")  # a loop: "file not found" sent the user looking
    with pytest.raises(DataError, match=r"a\.conll: is a link that leads to no file"):
        read_ner(str(tmp_path / "a.conll"))


def test_a_csv_header_read_as_a_record_is_warned_about_once(tmp_path, caplog):
    table = tmp_path / "t.csv"
    table.write_text("Text,id\nAnn met Bob,1\nBob ran,2\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        assert [t for _, t in read_records(str(table))] == ["Text", "Ann met Bob", "Bob ran"]  # as documented
        list(read_records(str(table)))  # a job reads its input more than once: one warning
        assert [t for _, t in read_records(str(table), skip_header=True)] == ["Ann met Bob", "Bob ran"]
        assert [t for _, t in read_records(str(table), column="Text")] == ["Ann met Bob", "Bob ran"]
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{table}: its first row reads 'Text' in column 0, which looks like a header; it is read as a "
                    "record (--skip-header skips it, --column Text reads the column by that name)"]
    plain = tmp_path / "p.csv"
    plain.write_text("Ann met Bob,1\ntext,2\n")  # a text that is the word, later on: no header
    caplog.clear()
    with caplog.at_level("WARNING", logger="spanflow"):
        list(read_records(str(plain)))
    assert not caplog.records


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a directory that takes no new files: Linux's /proc")
def test_an_output_in_a_directory_that_takes_no_new_files_is_one_line(tmp_path, capsys):
    """/proc exists, but no file can be made in it: the temporary file's (or the lock's) ENOENT was a
    traceback naming a hidden file the user never gave."""
    from spanflow.atomic import claim_output
    from spanflow.cli.main import main
    from spanflow.errors import WriteError

    data = tmp_path / "d.conll"
    data.write_text("Ada\tB-PER\nwrote\tO\n\n")
    assert main(["convert", str(data), "/proc/x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "to /proc/x.jsonl: no file can be created in /proc" in err and "Traceback" not in err
    with pytest.raises(WriteError, match=r"^cannot write the output to /proc/x\.jsonl: no file can be created in /proc$"):
        with claim_output("/proc/x.jsonl"):  # predict's and embed's lock beside their output
            pass


def test_labelled_data_in_windows_1252_is_told_how_to_convert(tmp_path):
    p = tmp_path / "lat.conll"
    p.write_bytes("Par\u00eds\tB-LOC\n\n".encode("cp1252"))
    with pytest.raises(DataError, match=r"lat\.conll:1: invalid UTF-8 at byte 3 .*iconv -f WINDOWS-1252 -t UTF-8"):
        read_ner(p)


def test_a_byte_order_mark_inside_joined_files_is_dropped_and_said(tmp_path, caplog):
    # `cat a.conll b.conll`: b's byte-order mark begins a later line, and its -DOCSTART- mark
    p = tmp_path / "joined.conll"
    p.write_bytes(b"Paris\tB-LOC\n\n\xef\xbb\xbf-DOCSTART-\tO\n\n\xef\xbb\xbfRome\tB-LOC\n\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        got = read_ner(p)
    assert [(e.text, e.spans) for e in got] == [("Paris", [(0, 5, "LOC")]), ("Rome", [(0, 4, "LOC")])]
    assert "2 byte-order marks inside the file dropped" in caplog.text and "line 3, 5" in caplog.text


@pytest.mark.parametrize("body, line, other", [
    ("# sent_id = 1\nParis\tB-LOC\n\n", 1, 2),
    ("Paris\tB-LOC\n# text = Rome\nRome\tB-LOC\n\n", 2, 1),
])
def test_a_comment_line_in_conll_is_named_as_one(tmp_path, body, line, other):
    p = tmp_path / "c.conll"
    p.write_text(body)
    with pytest.raises(DataError, match=rf"c\.conll:{line}: a line that starts with '#' and has other columns than "
                                        rf"line {other}: a comment\?"):
        read_ner(p)


def test_a_stopped_run_says_where_its_checkpoint_is_in_the_run(tmp_path):
    """'interrupted; ... goes on from OUT/checkpoint' left unsaid how much a resume trains again."""
    from spanflow.cli.train import _at

    state = tmp_path / "checkpoint" / "state.json"
    state.parent.mkdir()
    state.write_text('{"global_step": 40, "epoch": 2, "step_in_epoch": 0}')
    assert _at(str(tmp_path)) == " (step 40, the end of epoch 2): the steps after it are trained again"
    state.write_text("not json")
    assert _at(str(tmp_path)) == ""
