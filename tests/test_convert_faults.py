"""`spanflow convert` and write_ner on input a user gets wrong: the output named as the input,
texts CoNLL cannot hold, a token column left empty, a file system that refuses the write."""
import errno
import os

import pytest

from spanflow.cli.main import main
from spanflow.data.examples import NerExample
from spanflow.data.io import read_ner, write_ner
from spanflow.errors import ConfigError, DataError, WriteError

CONLL = "Ada\tB-PER\nLovelace\tI-PER\nwrote\tO\n\n"


def test_converting_a_file_onto_itself_is_refused_and_leaves_it_whole(tmp_path, capsys):
    src = tmp_path / "data.txt"
    src.write_text("-DOCSTART- -X- -X- O\n\nAda NNP B-NP B-PER\nwrote VBD B-VP O\n\n")
    before = src.read_text()
    assert main(["convert", str(src), str(src)]) == 2
    assert "is the input: convert would write over what it reads" in capsys.readouterr().err
    assert src.read_text() == before


def test_texts_conll_has_no_line_for_are_named_and_not_counted_as_written(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    write_ner([NerExample("Ada Lovelace wrote", [(0, 12, "PER")]), NerExample(""), NerExample("   "),
               NerExample("Bob ran")], str(src))
    out = tmp_path / "out.conll"
    assert main(["convert", str(src), str(out)]) == 0
    printed = capsys.readouterr()
    assert f"note: 2 text(s) are empty or only whitespace (lines 2, 3 of {src})" in printed.err  # the input's lines
    assert "wrote 2 texts, 1 entity" in printed.out  # was "1 entities"
    assert [e.text for e in read_ner(str(out))] == ["Ada Lovelace wrote", "Bob ran"]


def test_a_conll_line_with_a_tag_and_no_token_names_its_line(tmp_path):
    src = tmp_path / "in.conll"
    src.write_text("The\tO\n\tO\nGrace\tB-PER\n\n")
    with pytest.raises(DataError, match=r"in\.conll:2: no token before the tag"):
        read_ner(str(src))


def test_a_refused_write_names_the_output_not_its_temporary(tmp_path, monkeypatch):
    import spanflow.atomic as atomic

    def read_only(prefix="", suffix="", dir=None):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, f"{prefix}x1y2{suffix}"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    out = tmp_path / "out.jsonl"
    with pytest.raises(WriteError) as e:
        write_ner([NerExample("Ada wrote", [(0, 3, "PER")])], str(out))
    assert str(e.value) == f"cannot write the data to {out}: Read-only file system"
    assert not out.exists()


def test_write_ner_says_which_texts_conll_cannot_hold(tmp_path, caplog):
    out = tmp_path / "out.conll"
    with caplog.at_level("WARNING", logger="spanflow"):
        write_ner([NerExample("Ada wrote", [(0, 3, "PER")]), NerExample("  ")], str(out))
    assert f"{out}: 1 empty or whitespace-only text(s) have no line in CoNLL: left out" in caplog.text
    assert [e.text for e in read_ner(str(out))] == ["Ada wrote"]


def test_texts_that_are_all_empty_make_no_empty_conll_file(tmp_path, capsys):
    out = tmp_path / "out.conll"
    with pytest.raises(DataError, match="none of the 2 texts has a token: CoNLL has no line"):
        write_ner([NerExample(""), NerExample("  ")], str(out))
    src = tmp_path / "in.jsonl"
    write_ner([NerExample(""), NerExample("  ")], str(src))  # JSONL holds them
    assert main(["convert", str(src), str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith(f"error: {src}: none of its 2 texts has a token")
    assert not out.exists()


def test_another_tasks_data_is_named_as_what_convert_does_not_read(tmp_path, capsys):
    src = tmp_path / "rel.json"
    src.write_text('[{"text": "Ann lives in Oslo", "triple_list": [["Ann", "lives_in", "Oslo"]]}]\n')
    assert main(["convert", str(src), str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "CasRel JSON" in err and "convert reads NER data only" in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("example, said", [
    (NerExample("John lives", [(0, 4, "P\tER")]), "its label 'P\\tER' holds a tab or line break"),
    (NerExample("John lives", [(0, 4, "P\nER")]), "its label 'P\\nER' holds a tab or line break"),
    (NerExample("a\tb c", [], words=[(0, 3), (4, 5)]), "its token 'a\\tb' holds a tab or line break"),
    (NerExample("-DOCSTART- John lives", [(11, 15, "PER")]), "its token -DOCSTART- would read back"),
    (NerExample("John lives", [(0, 4, "PER ")]), "its label 'PER ' begins or ends with white space"),
])
def test_texts_conll_would_read_back_otherwise_are_refused_naming_the_text(tmp_path, example, said):
    out = tmp_path / "out.conll"
    with pytest.raises(DataError, match=r"text 2 \(counted from 1\) cannot be written as CoNLL: "
                                        + __import__("re").escape(said)):
        write_ner([NerExample("Ada wrote", [(0, 3, "PER")]), example], str(out))
    assert not out.exists()
    write_ner([example], str(tmp_path / "out.jsonl"))  # JSONL keeps it
    assert read_ner(str(tmp_path / "out.jsonl"))[0].spans == example.spans


def test_convert_numbers_a_text_it_cannot_write_as_the_input_does(tmp_path, capsys):
    """An empty text left out before the check made the third text "text 2", told of the output;
    a JSONL input's text is told by its line (blank lines are no records: "text 3" was line 5)."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok", "entities": []}\n\n{"text": "  ", "entities": []}\n\n'
                   '{"text": "fine -DOCSTART- x", "entities": []}\n')
    assert main(["convert", str(src), str(tmp_path / "o.conll")]) == 2
    assert f"error: {src}:5: the text cannot be written as CoNLL: its token -DOCSTART-" in capsys.readouterr().err
    assert not (tmp_path / "o.conll").exists()


@pytest.mark.parametrize("name", ["x.parquet", "x.csv", "x.npy", "x.arrow", "x.jsonl.gz", "x.xlsx", "-"])
def test_convert_refuses_an_output_named_as_another_kind_of_file(tmp_path, capsys, monkeypatch, name):
    """It wrote tab-separated CoNLL into x.parquet (and a file named -), exit 0."""
    monkeypatch.chdir(tmp_path)
    write_ner([NerExample("Ada wrote", [(0, 3, "PER")])], "in.jsonl")
    assert main(["convert", "in.jsonl", name]) == 2
    said = "name an output file" if name == "-" else "NER data is written as CoNLL (.conll), JSONL (.jsonl) or a spaCy"
    err = capsys.readouterr().err
    assert said in err
    assert name != "x.arrow" or "x.arrow names an Arrow file" in err  # was "a Arrow"
    assert name != "x.jsonl.gz" or "x.jsonl.gz names a gzip-compressed file" in err  # was written as plain CoNLL
    assert not os.path.exists(name)
    assert main(["convert", "in.jsonl", name, "--to", "jsonl"]) == (2 if name == "-" else 0)  # a format given
    with pytest.raises(ConfigError, match="give the format"):
        write_ner([NerExample("Ada wrote", [(0, 3, "PER")])], "y.parquet")


def test_tag_flags_on_input_without_tags_are_refused_and_unlabelled_texts_are_noted(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    write_ner([NerExample("Ada wrote", [(0, 3, "PER")])], str(src))
    for flag in (["--scheme", "bmes"], ["--strict"]):  # they were ignored
        assert main(["convert", *flag, str(src), str(tmp_path / "o.conll")]) == 2
        assert f"{flag[0]} reads CoNLL tags; {src} is jsonl (spans, no tags): leave it out" in capsys.readouterr().err
    assert not (tmp_path / "o.conll").exists()
    assert main(["convert", "--strict", str(tmp_path / "none.jsonl"), str(tmp_path / "o.conll")]) == 2
    assert "none.jsonl: file not found" in capsys.readouterr().err  # what is wrong first
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "Ada wrote"}\n{"text": "Bob ran"}\n')
    assert main(["convert", str(texts), str(tmp_path / "t.conll")]) == 0
    said = capsys.readouterr()
    assert f"note: no text of {texts} has an entity: every tag written is O" in said.err
    assert "wrote 2 texts, 0 entities" in said.out


def test_train_and_evaluate_refuse_tag_flags_where_no_file_has_tags(tmp_path, capsys):
    """--scheme/--strict did nothing on JSONL data in train and evaluate; a CoNLL file beside
    the JSONL one still takes them."""
    spans, tags = tmp_path / "d.jsonl", tmp_path / "d.conll"
    write_ner([NerExample("Ada wrote", [(0, 3, "PER")]), NerExample("Bo ran", [(0, 2, "PER")])], str(spans))
    write_ner(read_ner(str(spans)), str(tags))
    run = ["train", "ner", "--model", "tiny", "--epochs", "1", "--out"]
    for flag in (["--scheme", "bio"], ["--strict"]):
        assert main([*run, str(tmp_path / "r"), "--train", str(spans), *flag]) == 2
        assert f"{flag[0]} reads CoNLL tags; {spans} is jsonl (spans, no tags): leave it out" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert main([*run, str(tmp_path / "r"), "--train", str(tags), "--dev", str(spans), "--scheme", "bio"]) == 0
    capsys.readouterr()
    model = str(tmp_path / "r" / "model")
    assert main(["evaluate", "--model", model, "--data", str(spans), "--scheme", "bio"]) == 2
    assert f"--scheme reads CoNLL tags; {spans} is jsonl" in capsys.readouterr().err
    assert main(["evaluate", "--model", model, "--data", str(tags), "--scheme", "bio"]) == 0


def test_an_entity_of_white_space_alone_is_refused_at_its_line(tmp_path, capsys):
    """A CoNLL token of spaces tagged as an entity: JSONL's reader refuses such an entity, and
    training would train it as none; the CoNLL reader refuses it at its line (convert named a
    text number, train took it)."""
    src = tmp_path / "ws.conll"
    src.write_text("Ann\tB-PER\nran\tO\n\nAnn\tB-PER\n \tB-LOC\nran\tO\n\n", encoding="utf-8")
    assert main(["convert", str(src), str(tmp_path / "o.jsonl")]) == 2
    assert f"error: {src}:5: entity 'LOC' is a token of white space alone (' '): tag it O" \
        in capsys.readouterr().err
    assert main(["train", "ner", "--train", str(src), "--out", str(tmp_path / "run")]) == 2
    assert f"error: {src}:5: entity 'LOC'" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
