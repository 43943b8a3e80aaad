"""Unreadable records in bulk input are records: each yields one error record in its place and
the job goes on. Labelled data (train, evaluate) stays strict: one `error:` line and exit 2."""
import json

import numpy as np
import pytest
from helpers import tiny_bert

from spanflow.cli.main import main
from spanflow.data.formats.common import read_lines
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.io import read_ner, read_re
from spanflow.data.records import read_records, read_texts, sample_texts
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import DataError

GOOD = [e.text for e in synthetic_ner(6, seed=11, max_clauses=1)]
BAD_LINE = b"caf\xc3 au lait \xff"  # a lead byte with no continuation, then a stray byte


def write(tmp_path, name, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def shape(path, **kw):
    """(id, text) per record, an error as ("ERR", its line, its message)."""
    return [(rid, t) if isinstance(t, str) else (rid, ("ERR", t.line, str(t)))
            for rid, t in read_records(path, **kw)]


def err(path, line, message):
    return ("ERR", line, f"{path}:{line}: {message}")


@pytest.mark.parametrize("data,want", [
    # invalid UTF-8 in the middle of a line
    (b"one\ntw\xc3o\nthree\n", [("1", "one"), ("2", (2, "invalid UTF-8 at byte 2 of the line")), ("3", "three")]),
    # a multi-byte character cut off at the end of the file, no newline after it
    (b"one\ntwo \xe2\x82", [("1", "one"), ("2", (2, "invalid UTF-8 at byte 4 of the line"))]),
    # a lone continuation byte as the first line
    (b"\x80\nok\n", [("1", (1, "invalid UTF-8 at byte 0 of the line")), ("2", "ok")]),
    # CRLF line ends: good lines lose their \r, line numbers hold
    (b"one\r\ntw\xffo\r\n\r\nthree\r\n",
     [("1", "one"), ("2", (2, "invalid UTF-8 at byte 2 of the line")), ("3", ""), ("4", "three")]),
])
def test_text_lines_with_invalid_utf8(tmp_path, data, want):
    p = write(tmp_path, "in.txt", data)
    assert shape(p) == [(rid, w if isinstance(w, str) else err(p, *w)) for rid, w in want]


def test_jsonl_bad_records_in_order(tmp_path):
    lines = [b'{"text": "first"}', b"[1, 2]", b'{"txt": "x"}', b'{"text": 5}', b'{"text": "a", ',
             b'{"text": "caf\xc3"}', b'{"text": "a\\ud800b"}', b"", b'{"id": "k9", "text": "last"}']
    p = write(tmp_path, "in.jsonl", b"\n".join(lines) + b"\n")
    field = 'expected an object with a string "text" field'
    got = shape(p)
    other = field + '; it has "txt" (--field names the one to read)'  # a record with another key: named
    held = field + "; it holds a number, 5"  # the field is there, of another type: said so
    assert got[:4] == [("1", "first"), ("2", err(p, 2, field)), ("3", err(p, 3, other)), ("4", err(p, 4, held))]
    assert got[4][0] == "5" and got[4][1][:2] == ("ERR", 5) and "invalid JSON" in got[4][1][2]
    assert got[5:] == [("6", err(p, 6, "invalid UTF-8 at byte 13 of the line")),
                       ("7", err(p, 7, "\"text\" holds a lone surrogate '\\ud800' at character 1, not a character")),
                       ("8", ""), ("k9", "last")]
    # the API default still raises the first bad record; errors="record" yields it in place
    with pytest.raises(DataError, match=r"in\.jsonl:2: expected an object"):
        list(read_texts(p))
    items = list(read_texts(p, errors="record"))
    assert len(items) == 9 and [i for i, t in enumerate(items) if isinstance(t, DataError)] == [1, 2, 3, 4, 5, 6]


def test_csv_bad_rows_in_order(tmp_path):
    data = (b'id,text\n1,alpha\n2\n3,b\xe9ta\n4,"two\nlines"\n5,ok\xff\n6,omega\n')
    p = write(tmp_path, "in.csv", data)
    assert shape(p, column=1, skip_header=True) == [
        ("2", "alpha"),
        ("3", err(p, 3, "record has 1 column, --column 1 asked")),
        ("4", err(p, 4, "invalid UTF-8 at byte 1 of column 1")),
        ("6", "two\nlines"),  # a quoted newline: one record, numbered by its last line
        ("7", err(p, 7, "invalid UTF-8 at byte 2 of column 1")),
        ("8", "omega"),
    ]
    t = write(tmp_path, "in.tsv", b"a\tb\nc\xff\td\ne\tf\n")
    assert shape(t, column=1) == [("1", "b"), ("2", err(t, 2, "invalid UTF-8 at byte 1 of column 0")), ("3", "f")]


def test_a_quote_never_closed_is_one_error_and_every_row_after_it_is_read(tmp_path):
    """The reader would take every line after an unclosed quote into one field: to the file's end
    (no error at all), or past the field limit (one error for thousands of rows)."""
    import csv

    unclosed = "unreadable CSV record: a quoted field opened on this line is never closed"
    short = write(tmp_path, "short.csv", b'text,id\nAda wrote,1\n"Unclosed quote,2\nAlan flew,3\nBea ran,4\n')
    got = shape(short, skip_header=True)
    assert [g for g in got if isinstance(g[1], str)] == [("2", "Ada wrote"), ("4", "Alan flew"), ("5", "Bea ran")]
    rid, (_, line, message) = got[1]
    assert (rid, line) == ("3", 3) and message.startswith(f"{short}:3: {unclosed} (unexpected end of data)")
    last = write(tmp_path, "last.csv", b'Ada wrote,1\n"Bea ran,2\n')  # on the last line: no line after it
    assert shape(last)[1][1][2].startswith(f"{last}:2: {unclosed} (unexpected end of data)")
    rows = ["text,id"] + [f"row {i} {'x' * 40},{i}" for i in range(1, 6001)]
    rows[4] = '"Unclosed quote,4'
    long = write(tmp_path, "long.csv", ("\n".join(rows) + "\n").encode())
    limit = csv.field_size_limit()
    try:
        csv.field_size_limit(100_000)  # the field outgrows it long before the file ends
        got = shape(long, skip_header=True)
    finally:
        csv.field_size_limit(limit)
    assert len(got) == 6000 and got[5] == ("7", f"row 6 {'x' * 40}")
    assert [g[0] for g in got if not isinstance(g[1], str)] == ["5"]
    assert got[3][1][1] == 5 and got[3][1][2].startswith(f"{long}:5: {unclosed} (field larger than field limit")


def test_a_quote_that_opens_mid_cell_and_never_closes_costs_one_record(tmp_path):
    """A strict reader fails on such a row for another reason first: only the lenient reader's own
    signal (it asked past the last line) tells an open quote."""
    p = write(tmp_path, "mid.csv", b'text,id\n"Nice" phone,"great\nAlan flew,3\nBea ran,4\n')
    got = shape(p, column="text")
    assert [g for g in got if isinstance(g[1], str)] == [("3", "Alan flew"), ("4", "Bea ran")]
    assert got[0][0] == "2" and "a quoted field opened on this line is never closed" in got[0][1][2]


def test_a_csv_header_after_a_byte_order_mark_names_its_column(tmp_path):
    p = write(tmp_path, "bom.csv", "\ufefftext,id\nAda wrote,1\n".encode())
    assert shape(p, column="text") == [("2", "Ada wrote")]
    wide = write(tmp_path, "wide.csv", "text,id\nAda wrote,1\n".encode("utf-16"))
    with pytest.raises(DataError, match="is UTF-16 text"):
        shape(wide)


def test_a_long_document_in_one_quoted_field_is_one_record(tmp_path):
    doc = "\n".join(f"Paragraph {i}, with a comma, and some words after it." for i in range(4000))  # ~220 KB
    p = write(tmp_path, "docs.csv", f'"{doc}",1\nshort one,2\n'.encode())
    assert shape(p) == [("4000", doc), ("4001", "short one")]


def test_labelled_data_stays_strict(tmp_path):
    """Training and evaluation read through read_lines, which still refuses the whole file."""
    bad_jsonl = b'{"text": "Ann", "entities": []}\n{"text": "caf\xc3", "entities": []}\n'
    for name, data, reader in [("n.jsonl", bad_jsonl, read_ner), ("n.conll", b"a O\nb\xff O\n", read_ner),
                               ("r.jsonl", b'{"text": "x", "relations": []}\n{"text": "\xff"}\n', read_re)]:
        p = write(tmp_path, name, data)
        with pytest.raises(DataError, match="invalid UTF-8 at byte") as e:
            reader(p)
        assert e.value.line == 2 and str(e.value).startswith(f"{p}:2: ")
    with pytest.raises(DataError, match=r"n\.conll:2: invalid UTF-8 at byte 1 of the line"):
        list(read_lines(tmp_path / "n.conll"))


@pytest.fixture(scope="module")
def ner_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_records")
    train = d / "train.jsonl"
    with open(train, "w", encoding="utf-8") as f:
        for e in synthetic_ner(30, seed=5, max_clauses=1):
            write_jsonl_record(f, e.text, e.spans)
    assert main(["train", "ner", "--train", str(train), "--out", str(d / "run"), "--epochs", "1",
                 "--max-tokens", "512", "--log-every", "0"]) == 0
    return str(d / "run" / "model")


def mixed_and_clean(tmp_path, bad_at: int = 2):
    good = [t.encode("utf-8") for t in GOOD]
    mixed = write(tmp_path, "mixed.txt", b"\n".join(good[:bad_at] + [BAD_LINE] + good[bad_at:]) + b"\n")
    clean = write(tmp_path, "clean.txt", b"\n".join(good) + b"\n")
    return mixed, clean, bad_at + 1  # the bad record's line number


def jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def test_predict_writes_one_error_record_and_goes_on(ner_model, tmp_path, capsys):
    mixed, clean, line = mixed_and_clean(tmp_path)
    for src in (mixed, clean):
        assert main(["predict", "--model", ner_model, "--input", src, "--output", src + ".out.jsonl",
                     "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {len(GOOD) + 1} records to {mixed}.out.jsonl (1 error record)" in out
    got, want = jsonl(mixed + ".out.jsonl"), jsonl(clean + ".out.jsonl")
    assert got[line - 1] == {"line": line, "error": "invalid UTF-8 at byte 3 of the line"}
    assert got[:line - 1] + got[line:] == want and len(want) == len(GOOD)


def test_train_and_evaluate_refuse_invalid_utf8(ner_model, tmp_path, capsys):
    bad = write(tmp_path, "bad.jsonl", b'{"text": "Ann", "entities": []}\n{"text": "caf\xc3", "entities": []}\n')
    for argv in (["train", "ner", "--train", bad, "--out", str(tmp_path / "o"), "--epochs", "1"],
                 ["evaluate", "--model", ner_model, "--data", bad]):
        assert main(argv) == 2
        assert f"error: {bad}:2: invalid UTF-8 at byte 13 of the line" in capsys.readouterr().err


@pytest.fixture(scope="module")
def embed_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_records_embed")
    enc, tok = tiny_bert(GOOD, hidden=32, layers=2, heads=2, seed=0)
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_embed_writes_one_error_record_and_goes_on(embed_model, tmp_path, capsys):
    mixed, clean, line = mixed_and_clean(tmp_path, bad_at=4)
    for src in (mixed, clean):
        assert main(["embed", "--model", embed_model, "--input", src, "--output", src + ".out.jsonl",
                     "--precision", "fp32"]) == 0
    assert "1 errors" in capsys.readouterr().out
    got, want = jsonl(mixed + ".out.jsonl"), jsonl(clean + ".out.jsonl")
    error = {"id": str(line), "line": line, "error": "invalid UTF-8 at byte 3 of the line"}
    assert got[line - 1] == error and jsonl(mixed + ".out.errors.jsonl") == [error]
    rest = got[:line - 1] + got[line:]
    assert len(rest) == len(want) == len(GOOD)
    np.testing.assert_allclose([r["embedding"] for r in rest], [r["embedding"] for r in want], atol=1e-5)
    # .npy: the bad record is a NaN row in its place, every other row as without it
    assert main(["embed", "--model", embed_model, "--input", mixed, "--output", str(tmp_path / "m.npy"),
                 "--precision", "fp32"]) == 0
    m = np.load(tmp_path / "m.npy")
    assert np.isnan(m[line - 1]).all() and not np.isnan(np.delete(m, line - 1, axis=0)).any()
    np.testing.assert_allclose(np.delete(m, line - 1, axis=0), [r["embedding"] for r in want], atol=1e-5)
    assert jsonl(tmp_path / "m.errors.jsonl") == [error]


def test_embed_on_an_empty_input_says_so(embed_model, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert main(["embed", "--model", embed_model, "--input", str(empty), "--output", str(tmp_path / "e.npy"),
                 "--precision", "fp32"]) == 0
    out, err = capsys.readouterr()
    assert "embedded 0 texts" in out and f"warning: {empty} holds no texts (an empty file?)" in err


def test_inputs_a_job_would_misread_are_refused_before_any_work(ner_model, embed_model, tmp_path, capsys):
    src = write(tmp_path, "in.jsonl", b'{"text": "Ann lives in Rome ."}\n')
    before = open(src, "rb").read()
    cases = [
        (["--input", src, "--output", src], "--output " + src + " is the input: the job would write over what it reads"),
        (["--input", src, "--field", "text", "--column", "body", "--output", str(tmp_path / "o.jsonl")],
         "--field text and --column body both name the text's column; give one"),
        # with --column a directory was told it was plain text with no columns
        (["--input", str(tmp_path), "--column", "body", "--output", str(tmp_path / "o.jsonl")],
         f"{tmp_path}: is a directory; a directory of Parquet files is read with --ray"),
        (["--input", write(tmp_path, "wide.txt", "Ann lives in Rome .\n".encode("utf-16")),
          "--output", str(tmp_path / "o.jsonl")], "is UTF-16 text (it starts with a UTF-16 byte-order mark)"),
    ]
    for args, said in cases:
        for command in (["predict", "--model", ner_model], ["embed", "--model", embed_model]):
            assert main(command + args) == 2, args
            err = capsys.readouterr().err
            assert said in err and err.count("\n") == 1, err
    assert open(src, "rb").read() == before and not (tmp_path / "o.jsonl").exists()
    assert main(["predict", "--model", ner_model, "--input", src, "--field", "text",
                 "--output", str(tmp_path / "o.jsonl"), "--precision", "fp32"]) == 0  # --field alone is fine


def test_a_job_whose_every_record_failed_says_so(ner_model, tmp_path, capsys):
    src = write(tmp_path, "in.jsonl", b'{"body": "Ann lives in Rome ."}\n{"body": "Bob ."}\n')
    assert main(["predict", "--model", ner_model, "--input", src, "--output", str(tmp_path / "o.jsonl"),
                 "--precision", "fp32"]) == 1  # the default --field text: no record has it; no result, status 1
    err = capsys.readouterr().err
    assert f"error: every record of {src} is an error record (2); is the text in another field or column" in err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2  # each error record says why
    assert main(["predict", "--model", ner_model, "--input", src, "--field", "body",
                 "--output", str(tmp_path / "p.jsonl"), "--precision", "fp32"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_jsonl_ids_mixed_with_line_numbers_are_said_once(tmp_path, caplog):
    """Without --id-column a JSONL record's id is its "id", else its line number: a file with both
    gave ids that could collide (7 and line 7) without a word."""
    p = write(tmp_path, "ids.jsonl", b'{"id": 7, "text": "a"}\n{"text": "b"}\n{"id": null, "text": "c"}\n'
                                     b'{"id": 4, "text": "d"}\n')
    with caplog.at_level("WARNING", logger="spanflow"):
        assert [rid for rid, _ in read_records(p)] == ["7", "2", "3", "4"]  # 4: an id, and a line number too
        list(read_records(p))  # a job that reads its input twice says it once
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{p}: 2 records have an \"id\" and 2 have none, whose id is their line number: an id of one may "
                    "equal a line number of another; name the id field with --id-column (a record without it is "
                    "then an error record)"]
    caplog.clear()
    q = write(tmp_path, "own.jsonl", b'{"id": "x", "text": "a"}\n{"id": "y", "text": "b"}\n')
    with caplog.at_level("WARNING", logger="spanflow"):
        list(read_records(q))
        named = write(tmp_path, "named.jsonl", open(p, "rb").read())
        list(read_records(named, id_column="id"))  # named: a record without it is an error record, nothing to say
        # a command's sample of its input (read before the job, without --id-column) says nothing either:
        # predict --id-column id told the user to give --id-column
        sample = write(tmp_path, "sampled.jsonl", open(p, "rb").read())
        assert sample_texts(sample, 10) == ["a", "b", "c", "d"]
        # nor a read whose ids go nowhere: read_texts, predict to JSONL without --id-column
        texts = write(tmp_path, "texts.jsonl", open(p, "rb").read())
        assert list(read_texts(texts)) == ["a", "b", "c", "d"]
    assert caplog.records == []
    one = write(tmp_path, "one.jsonl", b'{"id": 7, "text": "a"}\n{"text": "b"}\n')
    with caplog.at_level("WARNING", logger="spanflow"):
        list(read_records(one))
    assert caplog.records[0].getMessage().startswith(f"{one}: 1 record has an \"id\" and 1 has none")


def test_predict_to_jsonl_without_id_column_says_nothing_of_ids(ner_model, tmp_path, caplog):
    """Its records hold no id: the mix of ids and line numbers is nothing to it (a Parquet output's
    id column holds them: said there)."""
    src = write(tmp_path, "ids.jsonl", b'{"id": 7, "text": "a"}\n{"text": "b"}\n')
    with caplog.at_level("WARNING", logger="spanflow"):
        assert main(["predict", "--model", ner_model, "--input", src, "--output", str(tmp_path / "o.jsonl")]) == 0
        assert "have none" not in caplog.text
        pytest.importorskip("pyarrow")
        assert main(["predict", "--model", ner_model, "--input", src, "--output", str(tmp_path / "o.parquet")]) == 0
    assert "1 record has an \"id\" and 1 has none" in caplog.text


def test_an_error_record_read_back_is_said_as_one(ner_model, tmp_path, capsys):
    """predict's output fed to convert, or to predict again: its error records are named as such,
    with the jq command that leaves them out (before: "a string text field", or that it has an
    "error" field --field could name)."""
    src = write(tmp_path, "in.jsonl", b'{"text": "Paris is nice"}\n{"text": 5}\n')
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", ner_model, "--input", src, "--output", str(out)]) == 0
    capsys.readouterr()
    hint = ("it is an error record, which predict and embed write for an input they could not read: leave those "
            f"lines out (jq -c '. | select(.error == null)' {out} > {tmp_path / 'p.ok.jsonl'})")
    assert main(["convert", str(out), str(tmp_path / "x.conll")]) == 2
    assert hint in capsys.readouterr().err
    texts = [t for _, t in read_records(str(out))]
    assert texts[0] == "Paris is nice" and isinstance(texts[1], DataError) and hint in str(texts[1])


def test_predict_keeps_jsonl_values_as_json_in_jsonl_and_as_their_json_text_in_parquet(ner_model, tmp_path):
    """predict's writers, as embed's: a kept number or object was written to JSONL as a string of its JSON."""
    pq = pytest.importorskip("pyarrow.parquet")
    src = write(tmp_path, "in.jsonl", b'{"text": "Ann went home", "n": 100, "meta": {"src": "web"}}\n'
                                      b'{"text": "Bo ran", "n": NaN}\n')
    assert main(["predict", "--model", ner_model, "--input", src, "--keep-columns", "n,meta",
                 "--output", str(tmp_path / "o.jsonl")]) == 0
    recs = [json.loads(x) for x in open(tmp_path / "o.jsonl")]
    assert [(r["n"], r["meta"]) for r in recs] == [(100, {"src": "web"}), (None, None)]  # NaN: JSON's null
    assert main(["predict", "--model", ner_model, "--input", src, "--keep-columns", "n,meta",
                 "--output", str(tmp_path / "o.parquet")]) == 0
    assert pq.read_table(tmp_path / "o.parquet").select(["n", "meta"]).to_pylist() == [
        {"n": "100", "meta": '{"src": "web"}'}, {"n": None, "meta": None}]


def test_a_max_tokens_below_the_models_window_is_told_as_a_batch_size(ner_model, embed_model, tmp_path, capsys):
    """`--max-tokens 64`, taken for a text's length (HF's max_length), ran batches of a few texts at a
    fraction of the default's speed, without a word."""
    src = write(tmp_path, "in.txt", b"Paris is nice\nAda met Bob\n")
    said = "sizes a whole batch, in padded tokens, and is below the"
    for cmd, model, out in (("predict", ner_model, "o.jsonl"), ("embed", embed_model, "e.npy")):
        assert main([cmd, "--model", model, "--input", src, "--output", str(tmp_path / out), "--max-tokens", "8"]) == 0
        err = capsys.readouterr().err
        assert f"note: --max-tokens 8 {said}" in err and "leave it out for this device's default (2048)" in err, cmd
        assert main([cmd, "--model", model, "--input", src, "--output", str(tmp_path / ("d" + out))]) == 0
        assert said not in capsys.readouterr().err, cmd  # the default: nothing to say
