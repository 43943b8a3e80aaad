"""Parquet and Arrow in the bulk jobs: tables as input (a named column, ids, kept columns, bad
rows as error rows, streamed), Parquet as the output of predict and embed (the same rows as
JSONL, the same vectors as .npy, resumable, atomic, one writer, a full disk as one line)."""
import datetime
import errno
import itertools
import json
import os
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from helpers import tiny_bert

from spanflow.atomic import OutputBusy, claim_output
from spanflow.cli.common import column_arg
from spanflow.cli.main import main
from spanflow.data import tables
from spanflow.data.records import read_records, read_rows, sample_texts
from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError, DataError, WriteError
from spanflow.inference.predict_job import predict_file
from spanflow.runtime.policy import resolve_policy
from spanflow.tasks.embed import Embedder, job
from spanflow.tasks.embed.job import EmbedSpec, check_resumable, embed_file

TEXTS = [e.text for e in synthetic_ner(14, seed=3, max_clauses=2)]
QUIET = dict(progress=False, log=lambda m: None)


def write_table(path, table, **kw):
    """`table` at `path` as its extension says: Parquet, an Arrow IPC file, or an IPC stream (.ipc)."""
    path = str(path)
    if path.endswith(".parquet"):
        pq.write_table(table, path, **kw)
    elif path.endswith(".ipc"):
        with pa.ipc.new_stream(path, table.schema) as w:
            w.write_table(table, max_chunksize=3)
    else:
        feather.write_feather(table, path, chunksize=3)
    return path


def docs_table(n=11, null_at=3):
    texts = [TEXTS[i % len(TEXTS)] for i in range(n)]
    texts[null_at] = None
    return pa.table({"uid": [f"u{i}" for i in range(n)], "body": texts, "score": [i / 4 for i in range(n)]})


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    enc, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def embedder(enc_dir):
    return Embedder.load(enc_dir, precision="fp32", device="cpu")


@pytest.fixture(scope="module")
def tiny_encoder():
    from spanflow.models.encoder import build_tiny

    return build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101, max_length=128)


@pytest.fixture(scope="module")
def ner_model(tiny_encoder):
    from spanflow.tasks.ner import NerModel

    enc, tok = tiny_encoder
    return NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=64, policy=resolve_policy("fp32", "cpu"))


@pytest.fixture(scope="module")
def re_model(tiny_encoder):
    from spanflow.tasks.re import ReModel

    enc, tok = tiny_encoder
    # a low threshold: an untrained head then finds relations, and the comparison has some to compare
    return ReModel(encoder=enc, tokenizer=tok, relations=["born_in", "works_for"], limit=64, threshold=0.3,
                   policy=resolve_policy("fp32", "cpu"))


# reading tables


@pytest.mark.parametrize("name", ["in.parquet", "in.arrow", "in.ipc"])
def test_a_table_gives_its_rows_ids_and_kept_columns_with_a_null_as_an_error(tmp_path, name):
    src = write_table(tmp_path / name, docs_table(7, null_at=2), row_group_size=3)
    recs = list(read_rows(src, column="body", id_column="uid", keep=["score"]))
    assert [r.id for r in recs] == [f"u{i}" for i in range(7)]
    assert [r.kept for r in recs] == [(i / 4,) for i in range(7)]
    assert [r.text for r in recs if isinstance(r.text, str)] == [TEXTS[i] for i in (0, 1, 3, 4, 5, 6)]
    err = recs[2].text
    assert isinstance(err, DataError) and str(err) == f"{src}: row 2: column 'body' holds null, expected a string"
    # without an id column the ids are the row numbers, from 0; --field names the column too
    assert [rid for rid, _ in read_records(src, field="body")] == [str(i) for i in range(7)]
    assert sample_texts(src, 3, column="body") == TEXTS[:2] + [TEXTS[3]]


@pytest.mark.parametrize("name", ["in.parquet", "in.arrow", "in.ipc"])
def test_a_table_saved_without_its_extension_is_read_as_the_table_it_is(tmp_path, name):
    src = write_table(tmp_path / name, docs_table(5))
    named = [(rid, str(t)) for rid, t in read_records(src, field="body", id_column="uid")]
    bare = str(tmp_path / "export.data")  # read as text lines before: binary rows of garbage, exit 0
    os.rename(src, bare)
    assert tables.is_table(bare) and not tables.is_table(str(tmp_path / "absent.data"))
    assert [(rid, str(t).replace(bare, src)) for rid, t in read_records(bare, field="body", id_column="uid")] == named
    assert named[0] == ("u0", TEXTS[0])
    text = tmp_path / "codes.txt"  # a text that only starts like a table stays text
    text.write_text("PAR1 results are in\nARROW1 is next\n")
    assert not tables.is_table(str(text)) and [t for _, t in read_records(str(text))][0] == "PAR1 results are in"


def test_a_text_column_that_is_not_strings_is_one_error_before_any_row_is_read(tmp_path, monkeypatch):
    t = pa.table({"n": [5, None], "b": pa.array([b"\x00", None]), "d": pa.array(["x", None]).dictionary_encode(),
                  "l": pa.array(["y", None], pa.large_string())})
    src = write_table(tmp_path / "n.parquet", t)
    for column, typ in (("n", "int64"), ("b", "binary")):
        with monkeypatch.context() as m:
            m.setattr(tables, "_batches", lambda *a: pytest.fail("rows were read"))
            with pytest.raises(ConfigError) as e:
                read_rows(src, column=column)
        assert str(e.value) == f"--column {column}: the column {column!r} of {src} holds {typ}, not strings"
    for column, text in (("d", "x"), ("l", "y")):  # dictionary-encoded and large strings are strings
        got = list(read_rows(src, column=column))
        assert got[0].text == text
        assert str(got[1].text) == f"{src}: row 1: column {column!r} holds null, expected a string"


def test_a_table_column_is_named_even_by_digits_and_never_numbered(tmp_path):
    src = write_table(tmp_path / "in.parquet", pa.table({"a": ["no"], "2021": ["yes"], "01": ["zero one"]}))
    assert [r.text for r in read_rows(src, column=column_arg("2021"))] == ["yes"]  # `--column 2021`
    assert [r.text for r in read_rows(src, column=column_arg("01"))] == ["zero one"]  # not column 1's name "1"
    with pytest.raises(ConfigError, match=r"^--column 0: .*in\.parquet has no such column; it has a, 2021, 01$"):
        read_rows(src, column=column_arg("0"))


def damaged(path, group):
    """A Parquet file of 40 texts in row groups of 10, the page header of row group `group` overwritten."""
    pq.write_table(pa.table({"text": [f"text number {i}" for i in range(40)]}), path, row_group_size=10,
                   compression="none")
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    data = bytearray(path.read_bytes())
    at = col.dictionary_page_offset or col.data_page_offset
    data[at:at + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    return str(path)


def test_a_damaged_page_is_one_error_naming_the_file_and_the_rows(enc_dir, tmp_path, capsys):
    src = damaged(tmp_path / "in.parquet", group=2)
    recs = read_rows(src)
    assert [r.text for r in itertools.islice(recs, 20)] == [f"text number {i}" for i in range(20)]
    with pytest.raises(DataError) as e:
        next(recs)
    line = str(e.value)
    assert line.startswith(f"{src}: rows 20-29 (row group 2) cannot be read: Couldn't deserialize thrift")
    assert "\n" not in line
    out = tmp_path / "p.parquet"
    for cmd in ("predict", "embed"):
        assert main([cmd, "--model", enc_dir, "--input", src, "--output", str(out), "--precision", "fp32",
                     "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert [x for x in err.splitlines() if x.startswith("error")] == [f"error: {line}"] and "Traceback" not in err
        assert not out.exists()
        # nothing was done: no part is left for a resume that has nothing to go on from (an .npy's whole
        # reserved file was)
        assert sorted(os.listdir(tmp_path)) == ["in.parquet"], os.listdir(tmp_path)
    # chunks done before the damaged rows are kept, and said, for a resume on that same input
    import spanflow.tasks.embed.job as job

    real = job._run_chunks

    def one_then_damaged(embedder, spec, job_, prog, out, *a):  # the first chunk done, then the damage
        real(embedder, spec, job_.model_copy(update={"chunks": 1}), prog, out, *a)
        raise DataError("line 11: cannot be read", path=spec.input)

    texts = tmp_path / "t.txt"
    texts.write_text("".join(f"text number {i}\n" for i in range(20)))
    with pytest.MonkeyPatch.context() as m:  # damaged before any chunk was done: nothing kept (the .npy's
        m.setattr(job, "_run_chunks", lambda *a: (_ for _ in ()).throw(DataError("line 1: bad", path=str(texts))))
        for cmd, out_name in (("embed", "v.npy"), ("predict", "p.jsonl")):  # whole reserved file was)
            m.setattr("spanflow.inference.predict_job._write_jsonl",
                      lambda *a, **k: (_ for _ in ()).throw(DataError("line 1: bad", path=str(texts))))
            assert main([cmd, "--model", enc_dir, "--input", str(texts), "--output", str(tmp_path / out_name),
                         "--precision", "fp32", "--device", "cpu"]) == 2
            assert capsys.readouterr().err.splitlines()[-1] == f"error: {texts}: line 1: bad"
            assert sorted(os.listdir(tmp_path)) == sorted(["in.parquet", "t.txt"]), os.listdir(tmp_path)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(job, "_run_chunks", one_then_damaged)
        assert main(["embed", "--model", enc_dir, "--input", str(texts), "--output", str(tmp_path / "v.npy"),
                     "--precision", "fp32", "--device", "cpu", "--chunk-size", "10"]) == 2
    err = capsys.readouterr().err
    assert f"error: {texts}: line 11: cannot be read; what the job had done is kept beside the output: --resume " \
           "goes on from it once the same input reads, and a run without --resume removes it" in err.splitlines(), err
    assert os.path.exists(tmp_path / "v.npy.progress.json") and not os.path.exists(tmp_path / "v.npy")
    bad = tmp_path / "footer.parquet"  # a footer that cannot be decoded: a traceback before
    whole = open(src, "rb").read()
    size = int.from_bytes(whole[-8:-4], "little")  # the footer overwritten, its length and magic kept
    bad.write_bytes(whole[:-8 - size] + b"\xff" * size + whole[-8:])
    assert main(["predict", "--model", enc_dir, "--input", str(bad), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: its footer (the schema and row groups) cannot be read: " in err and "Traceback" not in err


def test_a_missing_column_is_one_error_before_any_row_is_read(tmp_path, monkeypatch):
    src = write_table(tmp_path / "in.parquet", docs_table())
    monkeypatch.setattr(tables, "_batches", lambda *a: pytest.fail("rows were read"))
    for kw, flag in (({"column": "text"}, "--column text"), ({"column": "body", "id_column": "id"}, "--id-column id"),
                     ({"column": "body", "keep": ["body", "x"]}, "--keep-columns x")):
        with pytest.raises(ConfigError) as e:
            read_rows(src, **kw)  # raised by the call, not by the first next()
        assert str(e.value) == f"{flag}: {src} has no such column; it has uid, body, score"


def test_table_files_are_closed_once_read(tmp_path, monkeypatch):
    opened, real_init, real_map = [], pq.ParquetFile.__init__, pa.memory_map

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        opened.append(self)

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    monkeypatch.setattr(pa, "memory_map", lambda *a, **kw: opened.append(real_map(*a, **kw)) or opened[-1])
    for name in ("in.parquet", "in.arrow", "in.ipc"):
        src = write_table(tmp_path / name, docs_table())
        assert len(list(read_rows(src, column="body"))) == tables.table_rows(src) == 11
        assert list(tables.table_ids(src, "uid")) == [f"u{i}" for i in range(11)]
    assert len(opened) >= 12 and [f for f in opened if not f.closed] == []


def test_the_cli_names_the_missing_column_before_loading_a_model(enc_dir, tmp_path, capsys, monkeypatch):
    from spanflow.runtime.loads import Loads

    src = write_table(tmp_path / "in.parquet", docs_table())
    monkeypatch.setattr(Loads, "__init__", lambda *a, **kw: pytest.fail("a model was loaded"))
    for cmd in ("predict", "embed"):
        out = tmp_path / f"{cmd}.parquet"
        assert main([cmd, "--model", enc_dir, "--input", src, "--column", "text", "--output", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [f"error: --column text: {src} has no such column; it has uid, body, score"]
        assert not out.exists()
        # named by --field (or its default): said by that flag (it said --column, never given)
        assert main([cmd, "--model", enc_dir, "--input", src, "--field", "foo", "--output", str(out)]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: --field foo: {src} has no such column; it has uid, "
                                                        "body, score"]


def test_a_column_the_file_holds_twice_is_one_error_naming_it(enc_dir, tmp_path, capsys):
    """Two columns of one name: a KeyError traceback from Arrow (rc 1)."""
    src = write_table(tmp_path / "dup.parquet", pa.Table.from_arrays([pa.array(["a b"]), pa.array(["c"]),
                                                                      pa.array([1])], names=["text", "text", "m"]))
    with pytest.raises(DataError, match=r"dup\.parquet: --column text: the file has 2 columns named 'text'"):
        read_rows(src, column="text")
    for cmd in ("predict", "embed"):
        assert main([cmd, "--model", enc_dir, "--input", src, "--output", str(tmp_path / f"{cmd}.jsonl")]) == 2
        assert "the file has 2 columns named 'text', and a column is read by its name" in capsys.readouterr().err
        assert not (tmp_path / f"{cmd}.jsonl").exists()


def test_a_parquet_file_of_many_row_groups_streams(tmp_path, monkeypatch):
    src = write_table(tmp_path / "in.parquet", pa.table({"text": [f"t{i}" for i in range(10)]}), row_group_size=2)
    assert pq.ParquetFile(src).metadata.num_row_groups == 5
    monkeypatch.setattr(tables, "BATCH_ROWS", 2)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **kw: pytest.fail("the whole table was read"))
    pulled, real = [], pq.ParquetFile.iter_batches

    def counted(self, *a, **kw):
        for b in real(self, *a, **kw):
            pulled.append(b.num_rows)
            yield b

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    recs = read_rows(src)
    assert next(recs).text == "t0" and pulled == [2]  # one batch decoded for the first row
    assert [r.text for r in recs] == [f"t{i}" for i in range(1, 10)] and pulled == [2] * 5


def test_without_pyarrow_a_table_is_one_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails, as where it is not installed
    for call in (lambda: read_rows(str(tmp_path / "x.parquet")),
                 lambda: embed_file(None, EmbedSpec(input=__file__, output=str(tmp_path / "o.parquet")))):
        with pytest.raises(ConfigError, match=r"need pyarrow: pip install 'spanflow\[parquet\]'"):
            call()
    assert os.listdir(tmp_path) == []


def test_without_pyarrow_npy_and_jsonl_embeddings_are_written(enc_dir, tmp_path, monkeypatch):
    """The end of an .npy or JSONL job made a Parquet schema it did not use: without pyarrow, every
    text was embedded and the job then stopped short of its output."""
    from spanflow.tasks.embed import Embedder

    emb = Embedder.load(enc_dir, precision="fp32", device="cpu")
    src = tmp_path / "in.txt"
    src.write_text("a b\nc d\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    for ext in ("npy", "jsonl"):
        out = str(tmp_path / f"o.{ext}")
        s = embed_file(emb, EmbedSpec(input=str(src), output=out), calibrate=False, progress=False,
                       log=lambda m: None)
        assert s["texts"] == 2 and os.path.exists(out)


def test_csv_columns_by_header_name_skip_the_header(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("key,sentence,score\nk1,hello there,0.5\nk2,second one,1\n", encoding="utf-8")
    got = list(read_rows(str(src), column="sentence", id_column="key", keep=["score"]))
    assert [tuple(r) for r in got] == [("k1", "hello there", ("0.5",)), ("k2", "second one", ("1",))]
    assert list(read_records(str(src), column=1, skip_header=True)) == [("2", "hello there"), ("3", "second one")]
    with pytest.raises(ConfigError, match=r"--column text: .*in.csv has no such column in its header; it has key, "
                                          r"sentence, score"):
        read_rows(str(src), column="text")
    with pytest.raises(ConfigError, match="plain text lines, with no columns"):
        read_rows(str(tmp_path / "x.txt"), keep=["a"])
    with pytest.raises(ConfigError, match="^--column: .*x.txt is plain text lines, with no columns"):
        read_rows(str(tmp_path / "x.txt"), column="body")
    with pytest.raises(ConfigError, match="^--field body: .*x.txt is plain text lines, with no columns"):
        read_rows(str(tmp_path / "x.txt"), field="body")  # taken and ignored before


def test_a_csv_takes_a_field_name_as_its_header_column(tmp_path):
    """--field names a JSONL field and a table's column: on a CSV/TSV it is the header's column
    (it was ignored: column 0 was read, and the header row as a record)."""
    src = tmp_path / "in.csv"
    src.write_text("key,body\nk1,hello there\nk2,second one\n", encoding="utf-8")
    assert [(i, t) for i, t, _ in read_rows(str(src), field="body")] == [("2", "hello there"), ("3", "second one")]
    with pytest.raises(ConfigError, match=r"^--field text2: .*in.csv has no such column in its header"):
        read_rows(str(src), field="text2")
    assert [t for _, t, _ in read_rows(str(src))] == ["key", "k1", "k2"]  # the default: column 0, no header


def test_a_field_given_for_a_csv_is_its_header_column_and_the_same_job_as_column(tmp_path):
    """The commands' --field on a CSV/TSV (predict, embed, tune): the header's column, the default's
    name typed included, checked against the header in --field's words, and then the job --column
    NAME makes (a resume of one with the other is the same job)."""
    from argparse import Namespace

    from spanflow.cli.common import field_as_column

    src = tmp_path / "in.csv"
    src.write_text("id,text\n1,hello\n", encoding="utf-8")
    a = Namespace(field="text", field_given=True, column=None)
    field_as_column(a, str(src))
    assert (a.column, a.field) == ("text", "text")
    with pytest.raises(ConfigError, match=r"^--field body: .*in.csv has no such column in its header; it has id, text"):
        field_as_column(Namespace(field="body", field_given=True, column=None), str(src))
    untouched = Namespace(field="text", column=None)  # the default, not typed: column 0 as before
    field_as_column(untouched, str(src))
    assert untouched.column is None
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"body": "x"}\n', encoding="utf-8")
    b = Namespace(field="body", field_given=True, column=None)
    field_as_column(b, str(jsonl))
    assert (b.column, b.field) == (None, "body")


def test_jsonl_takes_a_column_name_as_its_field_and_needs_the_id_it_was_told_of(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "one", "uid": "a", "n": 1}\n{"body": "two", "n": [2]}\n{"body": "three", "uid": 7}\n')
    got = list(read_rows(str(src), column="body", id_column="uid", keep=["n"]))
    assert [(r.id, r.text, r.kept) for r in got if isinstance(r.text, str)] == [("a", "one", (1,)),
                                                                                 ("7", "three", (None,))]
    assert str(got[1].text) == f'{src}:2: its id field "uid" (--id-column) is missing' and got[1].kept == ([2],)
    assert got[1].id is None  # unknown, not a line number that could pass for an id
    assert [r.id for r in read_rows(str(src), field="body")] == ["1", "2", "3"]  # no --id-column: line numbers
    with pytest.raises(ConfigError, match=r"^--column 1: .*in\.jsonl is JSONL, whose records have fields, not "
                                          r"numbered columns; name the text's field \(--field NAME\)$"):
        read_rows(str(src), column=1)
    csv = tmp_path / "in.csv"
    csv.write_text("text,key\nhello,k1\nshort\n")
    got = list(read_rows(str(csv), id_column="key"))
    assert tuple(got[0]) == ("k1", "hello", ())
    assert str(got[1].text) == f"{csv}:3: record has 1 column, its id (--id-column key) is column 1"
    assert got[1].id is None


def test_a_kept_column_named_twice_is_one_error(enc_dir, tmp_path, capsys):
    src = write_table(tmp_path / "in.parquet", docs_table())
    for call in (lambda: read_rows(src, column="body", keep=["score", "uid", "score"]),
                 lambda: tables.carried_schema(src, keep=["score", "score"]),
                 lambda: read_rows(str(tmp_path / "x.jsonl"), keep=["a", "a"])):
        with pytest.raises(ConfigError, match="^--keep-columns score: named twice$|^--keep-columns a: named twice$"):
            call()
    for cmd in ("predict", "embed"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--model", enc_dir, "--input", src, "--column", "body", "--keep-columns", "score,score",
                  "--output", str(tmp_path / "o.parquet")])
        assert e.value.code == 2
        assert "argument --keep-columns: 'score' is named twice" in capsys.readouterr().err


# predict to Parquet


def flat_relations(rec):
    return [{"head_start": r["head"][0], "head_end": r["head"][1], "type": r["type"], "tail_start": r["tail"][0],
             "tail_end": r["tail"][1], "head_text": r["head_text"], "tail_text": r["tail_text"]}
            for r in rec["relations"]]


@pytest.mark.parametrize("task", ["ner", "re"])
def test_predict_to_parquet_holds_the_jsonl_records(ner_model, re_model, tmp_path, task):
    model, column = (ner_model, "entities") if task == "ner" else (re_model, "relations")
    src = write_table(tmp_path / "in.parquet", docs_table(), row_group_size=5)
    kw = dict(column="body", id_column="uid", keep=["score"], progress=False)
    s = predict_file(model, src, str(tmp_path / "p.parquet"), rows_per_group=4, **kw)
    predict_file(model, src, str(tmp_path / "p.jsonl"), **kw)
    # a relation model reads no windows: it also counts the texts it cut (none of these)
    assert {k: v for k, v in s.items() if k in ("records", "errors", "truncated")} == {
        "records": 11, "errors": 1, **({"truncated": 0} if task == "re" else {})}
    assert s["texts"] == 11 and 0 < s["real_tokens"] <= s["padded_tokens"]
    f = pq.ParquetFile(tmp_path / "p.parquet")
    assert f.metadata.num_row_groups == 3  # 4 + 4 + 3 rows, written as they came
    assert f.schema_arrow.names == ["id", "score", column, "error"]
    assert f.schema_arrow.field("score").type == pa.float64()  # the kept column's own type
    rows = f.read().to_pylist()
    recs = [json.loads(x) for x in open(tmp_path / "p.jsonl", encoding="utf-8")]
    assert [r["id"] for r in rows] == [r["id"] for r in recs] == [f"u{i}" for i in range(11)]
    assert [r["score"] for r in rows] == [r["score"] for r in recs]
    for row, rec in zip(rows, recs):
        if "error" in rec:
            assert row[column] is None and row["error"] == f"{src}: {rec['error']}"
            assert rec["error"] == "row 3: column 'body' holds null, expected a string"
        else:
            assert row["error"] is None
            assert row[column] == (rec["entities"] if task == "ner" else flat_relations(rec))
    assert sum(len(r[column] or []) for r in rows) > 0  # the comparison is not of empty lists


@pytest.mark.parametrize("cmd,out,kept,own", [("predict", "p.parquet", "error", "a column"),
                                              ("predict", "p.jsonl", "row", "a key"),
                                              ("embed", "e.parquet", "error", "a column"),
                                              ("embed", "e.parquet", "embedding", "a column"),
                                              ("embed", "e.jsonl", "line", "a key")])
def test_a_kept_column_named_like_one_of_the_outputs_is_refused_before_a_model_loads(enc_dir, tmp_path, capsys,
                                                                                     monkeypatch, cmd, out, kept, own):
    from spanflow.runtime.loads import Loads

    src = write_table(tmp_path / "in.parquet", pa.table({"text": ["a b"], kept: ["x"]}))
    monkeypatch.setattr(Loads, "__init__", lambda *a, **kw: pytest.fail("a model was loaded"))
    assert main([cmd, "--model", enc_dir, "--input", src, "--keep-columns", kept, "--output", str(tmp_path / out)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: --keep-columns {kept}: the output has {own} of its own "
                                                    f"named {kept!r}"]
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_predict_refuses_before_any_work_what_its_model_decides(ner_model, tmp_path, monkeypatch):
    src = write_table(tmp_path / "in.parquet", pa.table({"text": ["a b"], "entities": ["x"]}))
    monkeypatch.setattr(type(ner_model), "predict_stream", lambda *a, **kw: pytest.fail("the model ran"))
    for out, own in (("p.parquet", "a column"), ("p.jsonl", "a key")):
        with pytest.raises(ConfigError, match=f"^--keep-columns entities: the output has {own} of its own named "):
            predict_file(ner_model, src, str(tmp_path / out), keep=["entities"], progress=False)

    class NoTable:  # a task model without arrow_results writes JSONL only
        task = "plain"
        predict_stream = ner_model.predict_stream
        output_record = staticmethod(ner_model.output_record)

    with pytest.raises(ConfigError, match=r"p\.parquet: plain models have no Parquet form of their results"):
        predict_file(NoTable(), src, str(tmp_path / "p.parquet"), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


@pytest.mark.parametrize("name", ["p.npy", "p.csv", "p.arrow", "p"])
def test_predict_refuses_an_output_it_cannot_write(enc_dir, tmp_path, capsys, name):
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    out = tmp_path / name
    assert main(["predict", "--model", enc_dir, "--input", str(src), "--output", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --output {out}: predict writes JSONL (.jsonl, .ndjson, "
                                               ".json) or Parquet (.parquet, .pq)")
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_jsonl_outputs_hold_valid_json_and_the_ids_parquet_holds(ner_model, embedder, tmp_path):
    t = pa.table({"body": [TEXTS[0], None, TEXTS[1]], "uid": [10, 11, 12], "blob": pa.array([b"\x00\xff", None, b""]),
                  "x": [float("nan"), 1.5, float("inf")], "day": [datetime.date(2024, 1, 2)] * 3})
    src = write_table(tmp_path / "in.parquet", t)
    kw = dict(column="body", id_column="uid", keep=["blob", "x", "day"])
    predict_file(ner_model, src, str(tmp_path / "p.jsonl"), progress=False, **kw)
    embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "e.jsonl"), **kw), calibrate=False, **QUIET)
    predict_file(ner_model, src, str(tmp_path / "p.parquet"), progress=False, **kw)
    assert pq.read_table(tmp_path / "p.parquet").column("id").to_pylist() == [10, 11, 12]
    null = "row 1: column 'body' holds null, expected a string"
    for name in ("p.jsonl", "e.jsonl"):
        recs = [json.loads(x, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
                for x in (tmp_path / name).read_text(encoding="utf-8").splitlines()]
        assert [r["id"] for r in recs] == [10, 11, 12]  # the id column's own values, as in the Parquet output
        assert [(r["blob"], r["x"], r["day"]) for r in recs] == [("AP8=", None, "2024-01-02"), (None, 1.5, "2024-01-02"),
                                                                 ("", None, "2024-01-02")]
        assert {k: recs[1][k] for k in ("row", "error")} == {"row": 1, "error": null} and "line" not in recs[1]
    errors = [json.loads(x) for x in open(tmp_path / "e.errors.jsonl", encoding="utf-8")]
    assert errors == [{"id": 11, "row": 1, "error": null}]


def test_a_lone_surrogate_in_a_jsonl_id_or_kept_field_is_written_to_parquet_as_its_escape(ner_model, embedder,
                                                                                          tmp_path):
    src = tmp_path / "in.jsonl"  # JSON's "\ud800" escape: a str Python holds and UTF-8 cannot
    src.write_text('{"id": "a\\ud800", "text": "Grace works", "tag": "t\\udc80"}\n'
                   '{"id": "b", "text": "Ada", "tag": "x"}\n', encoding="utf-8")
    predict_file(ner_model, str(src), str(tmp_path / "p.parquet"), progress=False, id_column="id", keep=["tag"])
    embed_file(embedder, EmbedSpec(input=str(src), output=str(tmp_path / "e.parquet"), id_column="id", keep=["tag"]),
               calibrate=False, **QUIET)
    for name in ("p.parquet", "e.parquet"):
        t = pq.read_table(tmp_path / name)
        assert t.column("id").to_pylist() == ["a\\ud800", "b"]  # the escape's characters, as JSONL output shows it
        assert t.column("tag").to_pylist() == ["t\\udc80", "x"]


def test_predict_text_lines_to_parquet_and_an_empty_input(ner_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    predict_file(ner_model, str(src), str(tmp_path / "p.parquet"), progress=False)
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.column("id").to_pylist() == ["1", "2", "3"] and t.column("error").null_count == 3
    (tmp_path / "empty.txt").write_text("")
    predict_file(ner_model, str(tmp_path / "empty.txt"), str(tmp_path / "e.parquet"), progress=False)
    e = pq.read_table(tmp_path / "e.parquet")
    assert e.num_rows == 0 and e.schema == t.schema


@pytest.mark.parametrize("task", ["ner", "re"])
def test_max_tokens_auto_measures_a_table_on_a_sample_of_its_texts(ner_model, re_model, tmp_path, monkeypatch, task):
    from spanflow.data import io
    from spanflow.tasks.registry import get

    (ner_model if task == "ner" else re_model).save(str(tmp_path / "m"))
    src = write_table(tmp_path / "in.parquet", docs_table(40, null_at=1))
    for reader in ("read_ner", "read_re"):  # labelled data: a table holds none
        monkeypatch.setattr(io, reader, lambda *a, **kw: pytest.fail("the table was read as labelled data"))
    w = get(task).workload(str(tmp_path / "m"), src, mode="infer", policy=resolve_policy("fp32", "cpu"),
                           precision="fp32", sample=5, field="text", column="body")
    assert len(w.items_at(64)) == 5 and w.quality is None  # five texts, no labels to score


# embed to Parquet


def vectors(path):
    t = pq.read_table(path)
    col = t.column("embedding").combine_chunks()
    return col, t


def test_embed_to_parquet_has_the_npy_vectors_bit_for_bit(embedder, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes("\n".join(TEXTS[:9]).encode() + b"\n\xff bad\n" + TEXTS[9].encode() + b"\n")
    for dtype, arrow_type in (("float32", pa.float32()), ("float16", pa.float16())):
        spec = EmbedSpec(input=str(src), output=str(tmp_path / f"{dtype}.npy"), chunk_size=4, dtype=dtype)
        embed_file(embedder, spec, calibrate=False, **QUIET)
        s = embed_file(embedder, spec.model_copy(update={"output": str(tmp_path / f"{dtype}.parquet")}),
                       calibrate=False, **QUIET)
        assert s["errors"] == 1
        arr = np.load(tmp_path / f"{dtype}.npy")
        col, t = vectors(tmp_path / f"{dtype}.parquet")
        assert t.schema.field("embedding").type == pa.list_(arrow_type, embedder.dim)
        assert pq.ParquetFile(tmp_path / f"{dtype}.parquet").metadata.num_row_groups == 3  # one per chunk
        assert t.column("id").to_pylist() == [str(i) for i in range(1, 12)]
        assert col.is_null().to_pylist() == [i == 9 for i in range(11)] and np.isnan(arr[9]).all()
        assert "invalid UTF-8" in t.column("error")[9].as_py()
        got = col.flatten().to_numpy().reshape(-1, embedder.dim)  # the 10 vectors: the null row has none
        assert got.dtype == arr.dtype and got.tobytes() == np.delete(arr, 9, axis=0).tobytes()


def test_a_table_embeds_to_npy_and_jsonl_as_text_lines_do(embedder, tmp_path):
    lines = tmp_path / "in.txt"
    lines.write_text("\n".join(TEXTS[:6]) + "\n", encoding="utf-8")
    src = write_table(tmp_path / "in.parquet", pa.table({"sentence": TEXTS[:6], "n": list(range(6))}),
                      row_group_size=4)
    embed_file(embedder, EmbedSpec(input=str(lines), output=str(tmp_path / "a.npy"), chunk_size=4),
               calibrate=False, **QUIET)
    embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "b.npy"), column="sentence", chunk_size=4),
               calibrate=False, **QUIET)
    assert np.load(tmp_path / "a.npy").tobytes() == np.load(tmp_path / "b.npy").tobytes()
    assert (tmp_path / "b.ids.txt").read_text().split() == [str(i) for i in range(6)]
    embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "c.jsonl"), column="sentence", keep=["n"],
                                   chunk_size=4), calibrate=False, **QUIET)
    recs = [json.loads(x) for x in open(tmp_path / "c.jsonl")]
    assert [(r["id"], r["n"]) for r in recs] == [(i, i) for i in range(6)]  # a table's ids: its row numbers
    np.testing.assert_allclose([r["embedding"] for r in recs], np.load(tmp_path / "a.npy"), atol=1e-6)


def test_kept_jsonl_values_stay_json_in_jsonl_and_are_their_json_text_in_parquet(embedder, tmp_path):
    """A JSONL output kept a number, object or list of a JSONL input as a string of its JSON
    ("100", "{\\"src\\": ...}"), while the same kept from a table stayed itself."""
    src = tmp_path / "in.jsonl"
    vals = [{"n": 100, "meta": {"src": "web"}, "ok": True, "tags": ["a"]}, {"n": "x", "meta": None}]
    src.write_text("".join(json.dumps({"text": TEXTS[i], **v}) + "\n" for i, v in enumerate(vals)))
    keep = ["n", "meta", "ok", "tags"]
    spec = dict(input=str(src), keep=keep)
    embed_file(embedder, EmbedSpec(output=str(tmp_path / "o.jsonl"), **spec), calibrate=False, **QUIET)
    recs = [json.loads(x) for x in open(tmp_path / "o.jsonl")]
    assert [{k: r[k] for k in keep} for r in recs] == [{"n": 100, "meta": {"src": "web"}, "ok": True, "tags": ["a"]},
                                                       {"n": "x", "meta": None, "ok": None, "tags": None}]
    embed_file(embedder, EmbedSpec(output=str(tmp_path / "o.parquet"), **spec), calibrate=False, **QUIET)
    t = pq.read_table(tmp_path / "o.parquet")
    assert t.select(keep).to_pylist() == [{"n": "100", "meta": '{"src": "web"}', "ok": "true", "tags": '["a"]'},
                                          {"n": "x", "meta": None, "ok": None, "tags": None}]


def test_kept_columns_need_an_output_that_holds_them(embedder, tmp_path):
    src = write_table(tmp_path / "in.parquet", pa.table({"id": ["a"], "body": ["x"], "embedding": [1]}))
    with pytest.raises(ConfigError, match=r"a \.npy holds only the vectors; use --output NAME\.parquet"):
        embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "o.npy"), column="body", keep=["body"]),
                   calibrate=False, **QUIET)
    with pytest.raises(ConfigError, match=r"--keep-columns id: 'id' is the output's id column \(use --id-column id\)"):
        embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "o.parquet"), column="body", keep=["id"]),
                   calibrate=False, **QUIET)
    with pytest.raises(ConfigError, match="^--keep-columns embedding: the output has a column of its own named "):
        embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "o.parquet"), column="body",
                                       keep=["embedding"]), calibrate=False, **QUIET)
    with pytest.raises(ConfigError, match=r"^--dtype float16 sets the vectors of an \.npy or \.parquet output; JSONL "):
        embed_file(embedder, EmbedSpec(input=src, output=str(tmp_path / "o.jsonl"), column="body", dtype="float16"),
                   calibrate=False, **QUIET)
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_embed_counts_a_table_by_its_metadata_and_reads_only_its_ids(tmp_path, monkeypatch):
    src = write_table(tmp_path / "in.parquet", docs_table(9), row_group_size=4)
    read, real = [], tables._batches
    monkeypatch.setattr(tables, "_batches", lambda path, cols: read.append(cols) or real(path, cols))
    spec, ids = EmbedSpec(input=src, output=str(tmp_path / "o.npy"), column="body"), tmp_path / "ids"
    assert job._count_and_ids(spec, None) == 9 and job._count_and_ids(spec, str(ids)) == 9 and read == []
    assert ids.read_text().split() == [str(i) for i in range(9)]
    assert job._count_and_ids(spec.model_copy(update={"id_column": "uid"}), str(ids)) == 9 and read == [["uid"]]
    assert ids.read_text().split() == [f"u{i}" for i in range(9)]


def test_an_embed_scans_for_stale_temporaries_once_not_per_chunk(embedder, tmp_path, monkeypatch):
    import spanflow.atomic as atomic

    scans, real = [], atomic.clean_stale
    monkeypatch.setattr(atomic, "clean_stale", lambda parent, kind: scans.append(kind) or real(parent, kind))
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:10]) + "\n", encoding="utf-8")
    embed_file(embedder, EmbedSpec(input=str(src), output=str(tmp_path / "o.parquet"), chunk_size=2), calibrate=False,
               **QUIET)
    assert scans == ["embed"]  # five chunks: the output's one scan


def interrupted(embedder, spec, after_chunks):
    """Run `spec` until a kill after `after_chunks` finished chunks."""
    calls, real = [0], embedder._embed_ids

    def dies(ids, *a, **kw):
        calls[0] += 1
        if calls[0] > after_chunks:
            raise KeyboardInterrupt
        return real(ids, *a, **kw)

    embedder._embed_ids = dies
    try:
        with pytest.raises(KeyboardInterrupt):
            embed_file(embedder, spec, calibrate=False, **QUIET)
    finally:
        del embedder._embed_ids


def test_a_killed_embed_to_parquet_resumes_to_the_fresh_file(embedder, tmp_path):
    src = write_table(tmp_path / "in.parquet", docs_table(13, null_at=5), row_group_size=4)
    spec = EmbedSpec(input=src, output=str(tmp_path / "out.parquet"), column="body", id_column="uid",
                     keep=["score"], chunk_size=3, dtype="float16")
    embed_file(embedder, spec.model_copy(update={"output": str(tmp_path / "fresh.parquet")}), calibrate=False, **QUIET)
    interrupted(embedder, spec, after_chunks=2)
    assert not (tmp_path / "out.parquet").exists()
    assert sorted(p.name for p in tmp_path.glob("out.parquet.chunk*")) == ["out.parquet.chunk0.parquet",
                                                                          "out.parquet.chunk1.parquet"]
    seen, real = [], embedder._embed_ids
    embedder._embed_ids = lambda ids, *a, **kw: seen.append(len(ids)) or real(ids, *a, **kw)
    try:
        embed_file(embedder, spec, resume=True, calibrate=False, **QUIET)
    finally:
        del embedder._embed_ids
    assert seen == [3, 3, 1]  # chunks 2, 3 and 4 only
    assert pq.read_table(tmp_path / "out.parquet").equals(pq.read_table(tmp_path / "fresh.parquet"))
    assert pq.read_table(tmp_path / "out.parquet").column("error").null_count == 12
    assert sorted(os.listdir(tmp_path)) == ["fresh.errors.jsonl", "fresh.parquet", "in.parquet", "out.errors.jsonl",
                                            "out.parquet"]


def test_an_embed_resume_refuses_a_model_saved_over_and_takes_a_path_spelled_otherwise(embedder, enc_dir, tmp_path,
                                                                                      monkeypatch):
    """The model's directory saved over since the job began: its vectors would join the first
    model's, row by row, in one output (as predict, the job keeps a digest of the model's files).
    ./in.txt and in.txt are one file."""
    import shutil

    from spanflow.errors import ConfigError

    model = tmp_path / "m"
    shutil.copytree(enc_dir, model)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS[:10]) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    spec = EmbedSpec(input="./in.txt", output="out.jsonl", chunk_size=3, model="m")
    interrupted(embedder, spec, after_chunks=2)
    config = model / "config.json"
    config.write_text(config.read_text() + "\n")  # saved over in place
    with pytest.raises(ConfigError, match=r"^the model .*/m changed since the interrupted job began \(saved over\)"):
        embed_file(embedder, spec, resume=True, calibrate=False, **QUIET)
    with pytest.raises(ConfigError, match="changed since the interrupted job began"):
        check_resumable(spec)  # the command line's check, before the model loads
    shutil.rmtree(model)
    shutil.copytree(enc_dir, model)  # the same files, sizes and times (copy2) again
    again = spec.model_copy(update={"input": str(tmp_path / "in.txt"), "output": str(tmp_path / "out.jsonl")})
    embed_file(embedder, again, resume=True, calibrate=False, **QUIET)
    embed_file(embedder, again.model_copy(update={"output": "fresh.jsonl"}), calibrate=False, **QUIET)
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "fresh.jsonl").read_bytes()


def test_a_job_journaled_by_the_earlier_single_process_layout_resumes(embedder, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:10]) + "\n", encoding="utf-8")
    spec = EmbedSpec(input=str(src), output=str(tmp_path / "out.jsonl"), chunk_size=3)
    embed_file(embedder, spec.model_copy(update={"output": str(tmp_path / "fresh.jsonl")}), calibrate=False, **QUIET)
    interrupted(embedder, spec, after_chunks=2)
    out = str(tmp_path / "out.jsonl")
    # the names and the spec an earlier version wrote: per-rank files of rank 0, no id_column or keep
    os.replace(out + ".progress.chunks.json", out + ".progress.rank0.json")
    os.replace(out + ".part", out + ".part0")
    os.replace(out + ".errors.part", out + ".errors.part0")
    job = json.loads(open(out + ".progress.json").read())
    assert job["spec"]["world"] == 1
    for k in ("id_column", "keep"):
        del job["spec"][k]
    open(out + ".progress.json", "w").write(json.dumps(job))
    embed_file(embedder, spec, resume=True, calibrate=False, **QUIET)
    assert open(out).read() == open(tmp_path / "fresh.jsonl").read()


@pytest.fixture
def held(tmp_path):
    """Claim an output from another thread (another job) until the test ends."""
    ready, done, box = threading.Event(), threading.Event(), {}

    def hold(path):
        with claim_output(path):
            ready.set()
            done.wait()

    def claim(path):
        box["t"] = threading.Thread(target=hold, args=(path,))
        box["t"].start()
        ready.wait()

    yield claim
    done.set()
    if "t" in box:
        box["t"].join()


def test_a_second_writer_on_the_same_parquet_stops_at_once(embedder, ner_model, tmp_path, held, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:4]) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    held(str(out))
    monkeypatch.setattr(Embedder, "encode_stream", lambda *a, **kw: pytest.fail("the second job embedded"))
    with pytest.raises(OutputBusy, match=r"is being written by another job of this process \(another thread\)"):
        embed_file(embedder, EmbedSpec(input=str(src), output=str(out)), calibrate=False, **QUIET)
    with pytest.raises(OutputBusy):
        predict_file(ner_model, str(src), str(out), progress=False)
    assert sorted(os.listdir(tmp_path)) == [".out.parquet.lock", "in.txt"]


def full_after(monkeypatch, n_bytes):
    """Files that tables.py opens take `n_bytes` and then fail with ENOSPC, as a full disk does."""
    real = open

    class Full:
        def __init__(self, f):
            self.f, self.room = f, n_bytes

        def write(self, data):
            if len(data) > self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.room -= len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(tables, "open", lambda *a, **kw: Full(real(*a, **kw)), raising=False)


def test_a_full_disk_under_parquet_is_one_write_error_and_nothing_at_the_output(ner_model, embedder, enc_dir,
                                                                              tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    out = tmp_path / "p.parquet"
    with monkeypatch.context() as m:
        full_after(m, 2000)
        assert main(["predict", "--model", enc_dir, "--input", str(src), "--output", str(out), "--precision", "fp32",
                     "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert [x for x in err.splitlines() if x.startswith("error")] == [
            f"error: cannot write the predictions to {out}: No space left on device; the same command with --resume "
            "goes on from the last records written"] and "Traceback" not in err
        left = sorted(os.listdir(tmp_path))  # nothing at the output; the journal (and parts done) to resume from
        assert "p.parquet" not in left and "p.parquet.predict.json" in left, left
        spec = EmbedSpec(input=str(src), output=str(tmp_path / "e.parquet"), chunk_size=8)
        with pytest.raises(WriteError, match=f"cannot write the embeddings to {spec.output}: No space left"):
            embed_file(embedder, spec, calibrate=False, **QUIET)
        assert not (tmp_path / "e.parquet").exists()
    embed_file(embedder, spec, resume=True, calibrate=False, **QUIET)  # space again: the job goes on
    args = ["predict", "--model", enc_dir, "--input", str(src), "--precision", "fp32", "--device", "cpu"]
    assert main([*args, "--output", str(out), "--resume"]) == 0
    assert main([*args, "--output", str(tmp_path / "q.parquet")]) == 0
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "q.parquet"))
    assert not (tmp_path / "p.parquet.predict.json").exists()
    embed_file(embedder, spec.model_copy(update={"output": str(tmp_path / "f.parquet")}), calibrate=False, **QUIET)
    assert pq.read_table(tmp_path / "e.parquet").equals(pq.read_table(tmp_path / "f.parquet"))


def test_embed_under_torchrun_points_to_ray(enc_dir, tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    monkeypatch.setenv("WORLD_SIZE", "2")  # rank 0 of a torchrun job of two
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert main(["embed", "--model", enc_dir, "--input", str(src), "--output", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--ray" in err[0] and "docs/ray.md" in err[0]
    assert os.listdir(tmp_path) == ["in.txt"]


def strings_with_bytes(values: list[bytes]) -> pa.Array:
    """A string column holding exactly these bytes (a writer that did not check its UTF-8 makes
    such files; pyarrow builds the array from its buffers without checking either)."""
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()),
                                                             pa.py_buffer(b"".join(values))])


def test_a_string_that_is_not_utf8_is_an_error_row_and_the_job_goes_on(ner_model, tmp_path, capsys):
    raw = [t.encode() for t in TEXTS[:6]]
    raw[2] = b"caf\xff au lait"
    tags = [b"t%d" % k for k in range(6)]
    tags[4] = b"t\xfe"
    src = write_table(tmp_path / "in.parquet", pa.table({"body": strings_with_bytes(raw),
                                                         "tag": strings_with_bytes(tags)}), row_group_size=4)
    recs = list(read_rows(src, column="body", keep=["tag"]))
    assert str(recs[2].text) == f"{src}: row 2: column 'body' holds invalid UTF-8 at byte 3"
    assert [r.text for k, r in enumerate(recs) if k != 2] == [t for k, t in enumerate(TEXTS[:6]) if k != 2]
    assert recs[4].kept == ("t\\xfe",)  # a kept value comes backslash-escaped, its row still runs
    s = predict_file(ner_model, src, str(tmp_path / "p.jsonl"), column="body", progress=False)
    assert (s["records"], s["errors"]) == (6, 1)
    lines = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [k for k, x in enumerate(lines) if "error" in x] == [2]
    nested = pa.table({"body": TEXTS[:2], "meta": pa.StructArray.from_arrays(
        [strings_with_bytes([b"ok", b"t\xfe"]), pa.array([1, 2])], names=["name", "n"]),
        "tags": pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), strings_with_bytes([b"ok", b"t\xfe"]))})
    recs = list(read_rows(write_table(tmp_path / "nested.parquet", nested), column="body", keep=["meta", "tags"]))
    assert recs[1].kept == ({"name": "t\\xfe", "n": 2}, ["t\\xfe"])  # nested strings escaped too (it crashed)
    fixed = pa.FixedSizeListArray.from_arrays(strings_with_bytes([b"a", b"b", b"ok", b"t\xfe"]), 2,
                                              mask=pa.array([True, False]))  # a null row keeps its slots
    recs = list(read_rows(write_table(tmp_path / "fixed.parquet", pa.table({"body": TEXTS[:2], "pair": fixed})),
                          column="body", keep=["pair"]))
    assert [r.kept for r in recs] == [(None,), (["ok", "t\\xfe"],)]
    empty = write_table(tmp_path / "nulls.parquet", pa.table({"body": pa.nulls(2), "n": [1, 2]}))  # typed null
    assert [str(r.text) for r in read_rows(empty, column="body")] == [
        f"{empty}: row {k}: column 'body' holds null, expected a string" for k in (0, 1)]  # error rows, not a refusal
    assert main(["predict", "--model", "x", "--input", src, "--column", "body", "--skip-header",
                 "--output", str(tmp_path / "q.jsonl")]) == 2  # no header line in a table
    assert "--skip-header: " in capsys.readouterr().err


def test_an_errors_file_kept_for_another_output_is_said(enc_dir, tmp_path, capsys):
    """v.npy's run without errors beside v.parquet's with them: v.errors.jsonl (the stem's) stayed,
    listing errors of another input, unsaid; and a run of error records only said texts/s."""
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.txt"
    bad.write_text('{"text": 5}\n{"text": "a b"}\n', encoding="utf-8")
    good.write_text("a b\nc d\n", encoding="utf-8")
    run = lambda src, out: main(["embed", "--model", enc_dir, "--input", str(src), "--output",  # noqa: E731
                                 str(tmp_path / out), "--precision", "fp32", "--device", "cpu"])
    assert run(bad, "v.parquet") == 0 and (tmp_path / "v.errors.jsonl").exists()
    capsys.readouterr()
    assert run(good, "v.npy") == 0
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'v.errors.jsonl'} is not this output's (it had no errors): it lists the errors of " \
           f"another output of its name, {tmp_path / 'v.parquet'}" in err
    bad.write_text('{"text": 5}\n', encoding="utf-8")
    assert run(bad, "w.npy") == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("embedded 1 texts"))
    assert ": 0 texts/s, " in line, line  # no text embedded (it was "1 texts/s")
