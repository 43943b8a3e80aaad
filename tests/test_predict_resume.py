"""`spanflow predict --resume`: a killed job leaves its journal and the records it synced, never a
file at the output; the same job resumed skips them and ends with the output an uninterrupted run
writes. Another job's journal, a changed input or a cut partial file is refused, not mixed in."""
import json
import os

import pytest

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.inference.predict_job import predict_file
from spanflow.runtime.policy import resolve_policy

pq = pytest.importorskip("pyarrow.parquet")

TEXTS = [e.text for e in synthetic_ner(22, seed=5)]
QUIET = dict(progress=False, log=lambda s: None)


@pytest.fixture(scope="module")
def model():
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner import NerModel

    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101, max_length=128)
    return NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=64, policy=resolve_policy("fp32", "cpu"))


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": t}) for t in TEXTS]
    lines[5] = '{"text": 5}'  # an error record among them, counted across the resume
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def killed_after(model, results: int, *args, **kw) -> None:
    """predict_file stopped (as Ctrl-C or a kill stops it) after `results` predictions."""
    real = model.predict_stream

    def dies(texts, **k):
        for n, r in enumerate(real(texts, **k)):
            if n == results:
                raise KeyboardInterrupt
            yield r

    model.predict_stream = dies
    try:
        with pytest.raises(KeyboardInterrupt):
            predict_file(model, *args, **kw)
    finally:
        del model.predict_stream



def counts(stats: dict) -> dict:
    """The job's counts of a predict_file summary (its rates aside)."""
    return {k: stats[k] for k in ("records", "errors")}

@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_a_killed_job_resumes_to_the_uninterrupted_output(model, src, tmp_path, ext):
    out, ref = str(tmp_path / f"out.{ext}"), str(tmp_path / f"ref.{ext}")
    want = predict_file(model, src, ref, rows_per_group=4, **QUIET)
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)  # two groups of 4 synced, 2 more not
    journal = json.loads((tmp_path / f"out.{ext}.predict.json").read_text())
    assert journal["records"] == 8 and journal["errors"] == 1 and not os.path.exists(out)
    if ext == "jsonl":
        with open(out + ".partial", "ab") as f:  # a record half-written when the kill came
            f.write(b'{"entities": [')
    got = predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    assert counts(got) == counts(want) == {"records": 22, "errors": 1}
    assert want["texts"] == 22 and got["texts"] == 22 - 8  # what this run ran: the records after the resume
    if ext == "jsonl":
        assert open(out, "rb").read() == open(ref, "rb").read()
    else:
        assert pq.read_table(out).equals(pq.read_table(ref)) and pq.ParquetFile(out).metadata.num_row_groups == 6
    assert sorted(os.listdir(tmp_path)) == sorted(["in.jsonl", f"out.{ext}", f"ref.{ext}"])  # nothing left beside


def test_a_parquet_job_killed_while_its_parts_are_assembled_resumes(model, src, tmp_path, monkeypatch):
    """Killed after the input's short last part (22 = 5 x 4 + 2) was journaled, while the parts were
    joined: the resume took that part for another job's (it holds 2 rows, not 4) and refused."""
    import spanflow.inference.predict_job as job

    out, ref = str(tmp_path / "out.parquet"), str(tmp_path / "ref.parquet")
    predict_file(model, src, ref, rows_per_group=4, **QUIET)

    def killed(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(job, "assemble", killed)
        with pytest.raises(KeyboardInterrupt):
            predict_file(model, src, out, rows_per_group=4, **QUIET)
    assert json.loads((tmp_path / "out.parquet.predict.json").read_text())["records"] == 22
    assert counts(predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)) == {"records": 22, "errors": 1}
    assert pq.read_table(out).equals(pq.read_table(ref))


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_a_job_killed_as_it_removes_its_journal_resumes_to_its_end(model, src, tmp_path, monkeypatch, ext):
    """Killed after its output was in place, as it removed its parts and journal: the resume said the
    partial file was cut or a part gone, and to start over on a complete output."""
    from spanflow.inference.predict_journal import PredictPaths

    out, ref = str(tmp_path / f"out.{ext}"), str(tmp_path / f"ref.{ext}")
    predict_file(model, src, ref, rows_per_group=4, **QUIET)
    real, calls = PredictPaths.remove_leftovers, []

    def killed(self):  # the second call is the job's last step: one file removed, then the kill
        calls.append(1)
        if len(calls) < 2:
            return real(self)
        left = self.leftovers()
        if ext == "parquet":
            os.remove(left[0])
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(PredictPaths, "remove_leftovers", killed)
        with pytest.raises(KeyboardInterrupt):
            predict_file(model, src, out, rows_per_group=4, **QUIET)
    assert os.path.exists(out) and os.path.exists(out + ".predict.json")
    said = []
    got = predict_file(model, src, out, rows_per_group=4, resume=True, progress=False, log=said.append)
    assert counts(got) == {"records": 22, "errors": 1} and got["texts"] == 0  # nothing predicted again
    assert said == [f"--resume: the job had ended: {os.path.realpath(out)} holds all 22 records; its journal is removed"]
    if ext == "jsonl":
        assert open(out, "rb").read() == open(ref, "rb").read()
    else:
        assert pq.read_table(out).equals(pq.read_table(ref))
    assert sorted(os.listdir(tmp_path)) == sorted(["in.jsonl", f"out.{ext}", f"ref.{ext}"])


def test_a_resume_with_every_record_done_says_so(model, src, tmp_path, monkeypatch):
    """Killed with every record journaled, before its output was in place: 'predicting from record 23'
    of a 22-record input."""
    import spanflow.inference.predict_job as job

    out = str(tmp_path / "out.parquet")
    with monkeypatch.context() as m:
        m.setattr(job, "assemble", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            predict_file(model, src, out, rows_per_group=4, **QUIET)
    said = []
    predict_file(model, src, out, rows_per_group=4, resume=True, progress=False, log=said.append)
    assert said == [f"--resume: 22 records of {os.path.realpath(out)} were done; that is all of them: putting the "
                    "output in place"]


def test_a_run_without_resume_starts_over_and_removes_what_the_killed_one_left(model, src, tmp_path):
    out = str(tmp_path / "out.parquet")
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    assert os.path.exists(out + ".chunk1.parquet")
    said = []
    assert counts(predict_file(model, src, out, rows_per_group=4, progress=False, log=said.append)) == {
        "records": 22, "errors": 1}
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.parquet"]
    assert said[0] == (f"note: {out} has an interrupted job's parts; this run starts over and replaces them "
                       "(--resume goes on with them)")  # was silent
    said = []
    predict_file(model, src, out, rows_per_group=4, resume=True, progress=False, log=said.append)
    assert said == [f"--resume: no interrupted job of {out} to go on with; predicting the whole input"]


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_a_resume_naming_the_same_column_another_way_goes_on(model, src, tmp_path, ext):
    """`--column text` of a JSONL input is its default `--field text`: the same job, not another's."""
    from spanflow.data.tables import pyarrow

    if ext == "parquet":  # a table input: its text column named by --column
        pa = pyarrow()
        rows = [json.loads(x) for x in open(src, encoding="utf-8")]
        pa.parquet.write_table(pa.table({"text": [str(r["text"]) for r in rows]}), str(tmp_path / "in.parquet"))
        src = str(tmp_path / "in.parquet")
    out, ref = str(tmp_path / "out.jsonl"), str(tmp_path / "ref.jsonl")
    predict_file(model, src, ref, rows_per_group=4, **QUIET)
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    predict_file(model, src, out, rows_per_group=4, column="text", resume=True, **QUIET)  # was refused
    assert open(out, encoding="utf-8").read() == open(ref, encoding="utf-8").read()


def test_a_resume_reading_another_column_is_refused(model, src, tmp_path):
    """Another column however it is named: digits name a table's column ("2021" and "2022" both
    read as no --column), a field names a CSV header's."""
    from spanflow.data.tables import pyarrow

    pa = pyarrow()
    texts = [str(json.loads(x)["text"]) for x in open(src, encoding="utf-8")]
    table = str(tmp_path / "in.parquet")
    pa.parquet.write_table(pa.table({"2021": texts, "2022": texts[::-1]}), table)
    csv = tmp_path / "in.csv"
    csv.write_text("a,b\n" + "".join(f"{t.replace(',', ' ')},x\n" for t in texts), encoding="utf-8")
    for path, was, now in ((table, {"column": 2021}, {"column": 2022}), (str(csv), {"field": "a"}, {"field": "b"})):
        out = str(tmp_path / f"out{len(was)}{os.path.basename(path)}.jsonl")
        killed_after(model, 10, path, out, rows_per_group=4, **was, **QUIET)
        with pytest.raises(ConfigError, match="belongs to a job with other settings"):
            predict_file(model, path, out, rows_per_group=4, resume=True, **now, **QUIET)
        predict_file(model, path, out, rows_per_group=4, resume=True, **was, **QUIET)  # the same: goes on


def test_python_jobs_check_what_the_command_line_checks(model, src, tmp_path):
    """From Python: an output that is the input was written over it; a resume with another model
    loaded (no model_dir) mixed two models' results; a bad max_tokens or rows_per_group was met
    after the job's files were laid out (or never); log=None raised on the first line."""
    import copy

    import torch

    from spanflow.errors import DataError

    with pytest.raises(DataError, match="nope.txt: file not found"):  # was FileNotFoundError
        predict_file(model, str(tmp_path / "nope.txt"), str(tmp_path / "o.jsonl"), **QUIET)
    with pytest.raises(ConfigError, match=r"model takes a loaded model .*, got str"):  # was AttributeError
        predict_file("runs/ner/model", src, str(tmp_path / "o.jsonl"), **QUIET)
    with pytest.raises(ConfigError, match="dst takes a path, got NoneType"):  # was TypeError
        predict_file(model, src, None, **QUIET)
    with pytest.raises(ConfigError, match="log takes a function of one line"):
        predict_file(model, src, str(tmp_path / "o.jsonl"), progress=False, log="log.txt")
    before = open(src, encoding="utf-8").read()
    with pytest.raises(ConfigError, match=r"is the input: the job would write over what it reads"):
        predict_file(model, src, src, **QUIET)
    assert open(src, encoding="utf-8").read() == before
    out = str(tmp_path / "out.jsonl")
    for bad in ({"max_tokens": 0}, {"rows_per_group": 0}, {"rows_per_group": "8"}):
        with pytest.raises(ConfigError, match="max_tokens|rows_per_group"):
            predict_file(model, src, out, **bad, **QUIET)
        assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # nothing laid out
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    other = copy.deepcopy(model)
    with torch.no_grad():
        next(other.module.parameters()).add_(1.0)
    with pytest.raises(ConfigError, match=r"the model \(in memory\) changed .* \(its weights differ\)"):
        predict_file(other, src, out, rows_per_group=4, resume=True, **QUIET)
    predict_file(model, src, out, rows_per_group=4, resume=True, progress=False, log=None)  # the same model: on


def test_a_resume_of_another_job_or_input_is_refused(model, src, tmp_path):
    out = str(tmp_path / "out.jsonl")
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    with pytest.raises(ConfigError, match=r"belongs to a job with other settings \(rows_per_group 4 then, 8 now\)"):
        predict_file(model, src, out, rows_per_group=8, resume=True, **QUIET)
    with pytest.raises(ConfigError, match=r"belongs to a job with other settings \(field 'text' then, 'body' now\); "
                                          r"give --field text to go on with it, or drop --resume to start over$"):
        predict_file(model, src, out, rows_per_group=4, field="body", resume=True, **QUIET)  # the flag named
    with pytest.raises(ConfigError, match=r"\(keep \[\] then, \['n'\] now\); leave out --keep-columns to go on"):
        predict_file(model, src, out, rows_per_group=4, keep=["n"], resume=True, **QUIET)
    with open(out + ".partial", "r+b") as f:  # cut by hand: the records the journal says are done are not all there
        f.truncate(10)
    with pytest.raises(ConfigError, match=r"holds 10 bytes, fewer than the \d+ that .* records as done"):
        predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    text = open(src, encoding="utf-8").read()
    with open(src, "w", encoding="utf-8") as f:  # the same size, another text
        f.write(text.replace("a", "b", 1) if "a" in text else text.replace("e", "f", 1))
    with pytest.raises(ConfigError, match=r"changed since the interrupted job began \(same size, other content\)"):
        predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    assert not os.path.exists(out)


def test_a_stopped_predict_says_how_to_go_on(model, src, tmp_path):
    import argparse

    from spanflow.cli import predict

    out = str(tmp_path / "out.jsonl")
    assert predict.after_stop(argparse.Namespace(output=out)) is None
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    assert predict.after_stop(argparse.Namespace(output=out)) == (
        "; the same command with --resume goes on from the last records written")


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_an_output_that_is_a_link_is_written_through(model, src, tmp_path, ext):
    target = tmp_path / "store" / f"p.{ext}"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / f"p.{ext}"
    link.symlink_to(target)
    assert predict_file(model, src, str(link), rows_per_group=4, **QUIET)["records"] == 22
    assert link.is_symlink() and target.read_bytes() != b"old\n"
    assert sorted(os.listdir(target.parent)) == [f"p.{ext}"]  # the job's own files gone from beside the target


def test_what_a_resume_cannot_go_on_from_is_refused_before_any_work(model, src, tmp_path):
    out = str(tmp_path / "out.parquet")
    killed_after(model, 10, src, out, rows_per_group=4, **QUIET)
    part = tmp_path / "out.parquet.chunk0.parquet"
    data = part.read_bytes()
    part.write_bytes(data[:len(data) // 2])  # cut: no footer, found at the end after all the work
    with pytest.raises(ConfigError, match=r"out\.parquet\.chunk0\.parquet, a part the journal records as done, is "
                                          r"damaged or of another job"):
        predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    part.write_bytes(data)
    journal = tmp_path / "out.parquet.predict.json"
    job = json.loads(journal.read_text())
    journal.write_text(json.dumps({**job, "records": 999}))  # edited by hand: more than the input holds
    with pytest.raises(ConfigError, match=r"records 999 records as done, but .*in\.jsonl holds 22"):
        predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    journal.write_bytes(b"\xff\xfe")  # not text at all
    with pytest.raises(ConfigError, match=r"is damaged or was not written by spanflow predict \(not UTF-8 text\)"):
        predict_file(model, src, out, rows_per_group=4, resume=True, **QUIET)
    journal.unlink()
    journal.mkdir()  # in the way of the job's own file: named, not a traceback
    with pytest.raises(ConfigError, match=r"out\.parquet\.predict\.json is a directory where the job keeps a file"):
        predict_file(model, src, out, rows_per_group=4, **QUIET)


def test_files_the_job_did_not_make_are_kept(model, src, tmp_path):
    """Without a journal there is nothing of a job's: a file named like its parts was removed."""
    out = str(tmp_path / "out.jsonl")
    (tmp_path / "out.jsonl.chunk1.notes").write_text("keep me")
    (tmp_path / "out.jsonl.chunk0.parquet").write_text("mine too")
    assert predict_file(model, src, out, rows_per_group=4, **QUIET)["records"] == 22
    assert (tmp_path / "out.jsonl.chunk1.notes").read_text() == "keep me"
    assert (tmp_path / "out.jsonl.chunk0.parquet").read_text() == "mine too"


def test_the_progress_total_counts_a_csvs_records_not_its_lines(model, tmp_path, monkeypatch):
    """A CSV with a header row and a cell of two lines ended its bar at 3/5 records."""
    from spanflow.inference import predict_job

    src = tmp_path / "in.csv"
    src.write_text('id,text,lang\n1,"Ada went\nhome",en\n2,Bob came,en\n3,Eve left,en\n', encoding="utf-8")
    totals = []
    real = predict_job.tqdm
    monkeypatch.setattr(predict_job, "tqdm", lambda *a, **k: totals.append(k["total"]) or real(*a, **k))
    predict_file(model, str(src), str(tmp_path / "out.jsonl"), column="text", id_column="id", **QUIET)
    assert totals == [3] and len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
    totals.clear()  # the columns kept name the header too, in the count as in the read
    predict_file(model, str(src), str(tmp_path / "kept.jsonl"), keep=["lang"], column=1, **QUIET)
    assert totals == [len((tmp_path / "kept.jsonl").read_text().splitlines())] == [3]


def test_an_input_that_stops_reading_keeps_only_work_done(model, src, tmp_path, monkeypatch):
    """A DataError from the input (an Arrow batch counted as it is decoded) right after the journal was
    written left a journal of nothing done, and the command line said work was kept."""
    import spanflow.inference.predict_job as job
    from spanflow.errors import DataError

    out = str(tmp_path / "out.jsonl")
    with monkeypatch.context() as m:
        m.setattr(job, "_records", lambda *a, **k: (_ for _ in ()).throw(DataError("batch 2 is damaged", path=src)))
        with pytest.raises(DataError) as e:
            predict_file(model, src, out, rows_per_group=4, **QUIET)
    assert not e.value.kept and sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    real = job.read_rows

    def damaged_after(*a, **k):  # the 11th record cannot be read
        for n, r in enumerate(real(*a, **k)):
            if n == 10:
                raise DataError("line 11: damaged", path=src)
            yield r

    with monkeypatch.context() as m:
        m.setattr(job, "read_rows", damaged_after)
        with pytest.raises(DataError) as e:
            predict_file(model, src, out, rows_per_group=4, **QUIET)
    assert e.value.kept and json.loads(open(out + ".predict.json").read())["records"] == 8
