"""spanflow.ray: the bulk jobs on Ray Data give the single-process jobs' rows, bit for bit and
in order, whatever the input's row groups, files or format; survive workers killed mid-job;
and report a worker's error as the error it is. One local Ray (4 logical CPUs) serves the module."""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
from helpers import tiny_bert

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.ray import source as S
from spanflow.ray.job import DEFAULT_BATCH_ROWS, RayJob, _actor_asked, run_job
from spanflow.ray.output import FORMAT, MANIFEST, _host, check_target, clean_stale, staged
from spanflow.ray.resources import plan_actors
from spanflow.ray.source import ROW, Source
from spanflow.ray.stages import ModelStage
from spanflow.runtime.resolve import Asked

TEXTS = [e.text for e in synthetic_ner(60, seed=4, max_clauses=3)]
NULL_ROW = 7  # the input row whose text is null
GROUP = 7  # rows per Parquet row group: they do not line up with the chunks
CHUNK = 20  # rows per chunk of the single-process job, and per model call of the Ray job
ASKED = Asked(device="cpu", precision="fp32", max_tokens="256")
QUIET = {"log": lambda line: None}
WAIT = 120  # seconds a test helper waits for an event before failing the test

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)  # logical CPUs: room for held tasks
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Ray's log records stay out of pytest's capture: a record of a failed job's error holds the
    # error's frames, so the job's pipeline and its actors (their CPUs) past the test
    ray_log = logging.getLogger("ray")
    was, ray_log.propagate = ray_log.propagate, False
    yield
    ray_log.propagate = was
    ray.shutdown()


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("enc")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=0)
    enc.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    from spanflow.tasks.ner import NerModel

    path = tmp_path_factory.mktemp("ner")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=1)
    NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=64).save(str(path))
    return str(path)


def _texts():
    return [None if k == NULL_ROW else t for k, t in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """TEXTS as Parquet in row groups of GROUP, the text of NULL_ROW null, and a kept column."""
    path = tmp_path_factory.mktemp("in") / "texts.parquet"
    pq.write_table(pa.table({"text": _texts(), "n": list(range(len(TEXTS)))}), path, row_group_size=GROUP)
    return str(path)


def embed_single(enc_dir, src: str, out: str, **kw):
    """The single-process `spanflow embed --output x.parquet` file of `src`, in chunks of CHUNK."""
    from spanflow.tasks.embed import Embedder
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    emb = Embedder.load(enc_dir, precision="fp32", device="cpu")
    embed_file(emb, EmbedSpec(input=src, output=out, chunk_size=CHUNK, **kw), max_tokens=256, calibrate=False,
               progress=False)
    return pq.read_table(out)


@pytest.fixture(scope="module")
def reference(enc_dir, table, tmp_path_factory):
    return embed_single(enc_dir, table, str(tmp_path_factory.mktemp("ref") / "v.parquet"), column="text", keep=["n"])


def embed_job(enc_dir, src, out, *, source=None, **kw) -> RayJob:
    return RayJob(model=enc_dir, source=source or Source(path=str(src), column="text", keep=("n",)),
                  output=str(out), asked=kw.pop("asked", ASKED), batch_rows=CHUNK, **kw)


@ray.remote(num_cpus=0)
class Gate:
    """Opened by the model stage after its first chunk; the read tasks after the first wait for it."""

    def __init__(self):
        self.opened = asyncio.Event()

    async def open(self) -> None:
        self.opened.set()

    async def wait(self) -> None:
        await asyncio.wait_for(self.opened.wait(), WAIT)


def _read_after_the_first_chunk(read=S.read_task):
    def gated(batch, **kw):
        if batch["task"][0].as_py() != 0:
            ray.get(ray.get_actor("spanflow-test-gate").wait.remote())
        yield from read(batch, **kw)

    return gated


class OpensTheGate(ModelStage):
    def __call__(self, batch):
        out = super().__call__(batch)
        ray.get(ray.get_actor("spanflow-test-gate").open.remote())
        return out


def test_rows_equal_the_single_process_files_bit_for_bit_across_row_groups(enc_dir, table, reference, tmp_path,
                                                                           monkeypatch):
    # the input streams in: the model sees the first read task's rows (21, three row groups)
    # before any other, and they must still make a chunk of 20 and the start of the next
    monkeypatch.setattr(S, "read_task", _read_after_the_first_chunk())
    gate = Gate.options(name="spanflow-test-gate").remote()
    try:
        # tokenized in CPU tasks of their own, as for GPU actors (CPU actors tokenize themselves: the
        # other tests here); the values must not depend on where
        said = []
        s = run_job(embed_job(enc_dir, table, tmp_path / "out", actors=1, cpus_per_actor=0.5, tokenize_apart=True),
                    stage=OpensTheGate, log=said.append)
        assert any("tokenizing in CPU tasks" in line for line in said), said
    finally:
        ray.kill(gate)
    got = pq.read_table(tmp_path / "out")
    assert got.schema == reference.schema  # id int64, n, embedding fixed_size_list<float>[32], error
    assert got.equals(reference)  # every value, the error row's message and input order included
    assert (s["rows"], s["errors"]) == (len(TEXTS), 1) and len(s["files"]) == -(-len(TEXTS) // CHUNK)
    assert [f.startswith("part-") for f in s["files"]] == [True] * 3 and s["files"] == sorted(s["files"])
    assert s["real_tokens"] > 0 and 0 < s["padding_efficiency"] <= 1 and s["truncated"] == 0
    err = got.column("error").to_pylist()[NULL_ROW]
    assert got.column("embedding")[NULL_ROW].as_py() is None and f"row {NULL_ROW}" in err and "null" in err
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["format"] == FORMAT and manifest["rows"] == len(TEXTS) and manifest["files"] == s["files"]
    assert manifest["real_tokens"] == s["real_tokens"] and os.listdir(tmp_path) == ["out"]
    # the budget the actors ran (a number, where the asked "256" was written as given) and where things are
    assert manifest["max_tokens"] == s["max_tokens"] == 256
    assert (manifest["model"], manifest["input"]) == (os.path.abspath(enc_dir), os.path.abspath(table))


class OneThread(ModelStage):
    """ModelStage that fails a chunk run on another thread than the one its model loaded on."""

    def _load(self, spec):
        self.loaded_on = threading.get_ident()
        super()._load(spec)

    def _chunk(self, batch):
        if threading.get_ident() != self.loaded_on:
            raise ConfigError("a chunk ran on another thread than its model's")
        if os.nice(0) != 0:  # Ray's workers run at nice 15; the model's are raised to Ray's own
            raise ConfigError(f"the model actor runs at nice {os.nice(0)}")
        return super()._chunk(batch)


def test_each_actor_loads_and_runs_its_model_on_one_thread(enc_dir, table, reference, tmp_path):
    # Ray Data calls an actor from a thread pool of its own; a second thread running torch ops
    # would be a second OpenMP team, and the model slower (spanflow.runtime.threads)
    said = []
    run_job(embed_job(enc_dir, table, tmp_path / "out", actors=1), stage=OneThread, log=said.append)
    assert pq.read_table(tmp_path / "out").equals(reference)
    assert any("tokenizing in the model actors" in line for line in said), said  # CPU actors tokenize themselves


class StrictGate(ModelStage):
    """ModelStage in whose process no bf16 embedding passes the gate (a mean cosine of 1.01)."""

    def _load(self, spec):
        from spanflow.tasks.embed import model

        model.MIN_MEAN_COSINE["bf16"] = 1.01
        super()._load(spec)


def test_a_reduced_precision_asked_by_name_is_held_to_its_gate(enc_dir, table, tmp_path):
    # as the single-process job holds it: checked on the input's sample, refused unless --force
    asked = dataclasses.replace(ASKED, precision="bf16")
    with pytest.raises(ConfigError, match=r"bf16 embeddings reach a mean cosine of .* below 1.01.*--force"):
        run_job(embed_job(enc_dir, table, tmp_path / "out", asked=asked), stage=StrictGate, **QUIET)
    assert not (tmp_path / "out").exists()
    run_job(embed_job(enc_dir, table, tmp_path / "forced", asked=dataclasses.replace(asked, force=True)),
            stage=StrictGate, **QUIET)
    assert pq.read_table(tmp_path / "forced").num_rows == len(TEXTS)


def test_a_directory_of_files_is_one_input_numbered_across_them(enc_dir, reference, tmp_path):
    texts, cuts = _texts(), [0, 5, 30, len(TEXTS)]  # NULL_ROW is row 2 of the second file
    (tmp_path / "in").mkdir()
    for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
        part = pa.table({"text": texts[a:b], "n": list(range(a, b))})
        pq.write_table(part, tmp_path / "in" / f"{'abc'[k]}.parquet", row_group_size=GROUP)
    (tmp_path / "in" / "_notes.parquet").write_bytes(b"skipped: its name starts with _")
    run_job(embed_job(enc_dir, tmp_path / "in", tmp_path / "out"), **QUIET)
    got = pq.read_table(tmp_path / "out")
    assert got.drop_columns(["error"]).equals(reference.drop_columns(["error"]))  # ids 0..59 over the files
    errors = got.column("error").to_pylist()
    assert errors[NULL_ROW].startswith(f"{tmp_path / 'in' / 'b.parquet'}: row 2: ")
    assert [k for k, e in enumerate(errors) if e] == [NULL_ROW]


def _jsonl(path):
    with open(path, "w", encoding="utf-8") as f:
        for k, t in enumerate(TEXTS):
            f.write("{not json\n" if k == 3 else json.dumps({"doc": f"d{k}", "text": t if k != NULL_ROW else None,
                                                               "n": k}) + "\n")
    return str(path)


def test_jsonl_read_on_the_drivers_node_into_a_uri(enc_dir, tmp_path):
    src = _jsonl(tmp_path / "in.jsonl")
    want = embed_single(enc_dir, src, str(tmp_path / "v.parquet"), id_column="doc", keep=["n"])
    source = Source(path=src, id_column="doc", keep=("n",))
    s = run_job(embed_job(enc_dir, src, f"file://{tmp_path / 'out'}", source=source), **QUIET)
    got = pq.read_table(tmp_path / "out")
    assert got.equals(want) and s["errors"] == 2  # ids "d0".., the bad line and the null text as error rows
    assert (tmp_path / "out" / MANIFEST).exists()


def test_predict_csv_under_ray_is_the_single_process_file(ner_dir, tmp_path, capsys):
    from spanflow.cli.main import main
    from spanflow.inference.predict_job import predict_file
    from spanflow.tasks.ner import NerModel

    src = tmp_path / "in.csv"
    pa.csv.write_csv(pa.table({"text": TEXTS, "n": list(range(len(TEXTS)))}), src)
    model = NerModel.load(ner_dir, device="cpu", precision="fp32")
    predict_file(model, str(src), str(tmp_path / "p.parquet"), column="text", keep=["n"], max_tokens=256,
                 progress=False)
    out = tmp_path / "out"
    assert main(["predict", "--model", ner_dir, "--input", str(src), "--column", "text", "--keep-columns", "n",
                 "--output", str(out), "--ray", "--device", "cpu", "--precision", "fp32", "--max-tokens", "256"]) == 0
    out_text, err = capsys.readouterr()
    line = out_text.splitlines()[-1]
    assert line.startswith(f"wrote {len(TEXTS)} rows (0 error rows) to {out} in ") and "real tokens/s" in line
    assert "warning" not in err
    got = pq.read_table(out)
    assert got.equals(pq.read_table(tmp_path / "p.parquet"))
    assert sum(len(e or []) for e in got.column("entities").to_pylist()) > 0  # spans to compare
    (tmp_path / "empty.txt").write_text("")
    assert main(["predict", "--model", ner_dir, "--input", str(tmp_path / "empty.txt"), "--output",
                 str(tmp_path / "e"), "--ray", "--device", "cpu", "--precision", "fp32", "--max-tokens", "256"]) == 0
    assert f"warning: {tmp_path / 'empty.txt'} holds no texts" in capsys.readouterr().err  # as without --ray


def test_an_empty_input_gives_one_empty_file_with_the_schema(enc_dir, tmp_path):
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "n": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    (tmp_path / "e.jsonl").write_text("")
    for name, keep in (("e.parquet", ("n",)), ("e.jsonl", ())):
        src = str(tmp_path / name)
        want = embed_single(enc_dir, src, str(tmp_path / f"{name}.single.parquet"), column="text" if keep else None,
                            keep=list(keep))
        s = run_job(embed_job(enc_dir, src, tmp_path / f"{name}.out",
                              source=Source(path=src, column="text" if keep else None, keep=keep)), **QUIET)
        got = pq.read_table(tmp_path / f"{name}.out")
        assert got.num_rows == 0 and got.schema == want.schema and s["rows"] == 0 and len(s["files"]) == 1


class FailsInItsChunk(ModelStage):
    def __call__(self, batch):
        raise ConfigError("this chunk cannot be run")


class FailsToLoad(ModelStage):
    def _load(self, spec):
        raise ConfigError("this chunk cannot be run")  # as a precision the actor's device lacks would


@ray.remote(num_cpus=4)
def _every_cpu() -> bool:
    return True


@pytest.mark.parametrize("stage", [FailsInItsChunk, FailsToLoad])
def test_a_workers_error_reaches_the_caller_as_itself(enc_dir, table, tmp_path, stage):
    worker = rf"MapWorker\(MapBatches\({stage.__name__}\)\)\S*, pid \d+ on \S+"
    with pytest.raises(ConfigError, match=rf"^this chunk cannot be run \(in the Ray worker {worker}\)$") as failed:
        run_job(embed_job(enc_dir, table, tmp_path / "out"), stage=stage, **QUIET)
    assert os.listdir(tmp_path) == []  # nothing at the output, no staging left
    # the failed job's actors gave their CPUs back, though its error (held here) held its pipeline
    assert failed.value and ray.get(_every_cpu.remote(), timeout=WAIT)


def test_a_damaged_page_is_one_data_error_naming_the_file_and_its_rows(enc_dir, table, tmp_path):
    from spanflow.errors import DataError

    data = bytearray(open(table, "rb").read())
    data[40:400] = b"\xab" * 360  # the first pages; the footer, read on the driver, is whole
    (tmp_path / "bad.parquet").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"bad.parquet: rows 0-6 \(row group 0\) cannot be read: [^\n]*$"):
        run_job(embed_job(enc_dir, tmp_path / "bad.parquet", tmp_path / "out"), **QUIET)
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_parquet_is_one_data_error_naming_it(enc_dir, table, tmp_path):
    from spanflow.errors import DataError

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(open(table, "rb").read())
    for name, data in (("b.parquet", b""), ("b.parquet", open(table, "rb").read()[:-20]), ("b.parquet", b"a,b\n")):
        (tmp_path / "in" / name).write_bytes(data)
        with pytest.raises(DataError, match=r"^" + str(tmp_path / "in" / "b.parquet") + r": not a Parquet file \("):
            run_job(embed_job(enc_dir, tmp_path / "in", tmp_path / "out"), **QUIET)
    assert not (tmp_path / "out").exists()


def test_a_string_that_is_not_utf8_is_an_error_row_as_in_one_process(enc_dir, tmp_path):
    import numpy as np

    raw = [t.encode() for t in TEXTS]
    raw[25] = b"caf\xff au lait"  # in the second chunk: read by a worker, not in the driver's sample
    offsets = np.cumsum([0] + [len(v) for v in raw]).astype(np.int32)
    texts = pa.Array.from_buffers(pa.string(), len(raw), [None, pa.py_buffer(offsets.tobytes()),
                                                           pa.py_buffer(b"".join(raw))])
    src = tmp_path / "in.parquet"
    notes = [b"n%d" % k for k in range(len(TEXTS))]
    notes[3] = b"bad \xff bytes"  # a kept column's: carried backslash-escaped, as in one process
    note = pa.Array.from_buffers(pa.string(), len(notes), [None, pa.py_buffer(np.cumsum(
        [0] + [len(v) for v in notes]).astype(np.int32).tobytes()), pa.py_buffer(b"".join(notes))])
    pq.write_table(pa.table({"text": texts, "n": list(range(len(TEXTS))), "note": note}), src, row_group_size=GROUP)
    want = embed_single(enc_dir, str(src), str(tmp_path / "v.parquet"), column="text", keep=["n", "note"])
    job = embed_job(enc_dir, src, tmp_path / "out", source=Source(path=str(src), column="text", keep=("n", "note")))
    s = run_job(job, **QUIET)
    got = pq.read_table(tmp_path / "out")
    assert got.equals(want) and s["errors"] == 1
    assert got.column("error")[25].as_py() == f"{src}: row 25: column 'text' holds invalid UTF-8 at byte 3"
    assert got.column("note")[3].as_py() == "bad \\xff bytes"


def test_output_names_and_error_rows_are_as_the_command_gave_them(tmp_path, monkeypatch):
    from spanflow.ray.cli import check_ray_output

    for name in ("v.npy", "out.jsonl", "out/x.txt"):
        with pytest.raises(ConfigError, match="under --ray the output is a directory of Parquet files"):
            check_ray_output(name)
    for name in ("out", "out/", "vectors.parquet", "s3://bucket/entities/"):
        check_ray_output(name)
    (tmp_path / "pq").mkdir()
    with pytest.raises(ConfigError, match="is inside the input directory .*: the next run would read this output"):
        check_ray_output(str(tmp_path / "pq" / "result"), str(tmp_path / "pq"))  # its files are all read
    check_ray_output(str(tmp_path / "pq-out"), str(tmp_path / "pq"))  # beside it: fine
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "in.jsonl")
    src = Source(path="in.jsonl").for_workers()  # the path made absolute, the name kept
    errors = [str(r.text) for r in S.records(src) if not isinstance(r.text, str)]
    assert errors[0].startswith("in.jsonl:4: ") and len(errors) == 2  # as the single-process job says it


def _budget_measured(calls):
    def measure(**kw):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}:{len(kw['texts'])}\n")  # measured on the driver's sample of the input
        return {"best": {"max_tokens": 256}}

    return measure


def test_max_tokens_auto_is_measured_once_for_every_actor(enc_dir, table, reference, tmp_path):
    calls = tmp_path / "calls"
    asked = Asked(device="cpu", precision="fp32", max_tokens="auto")
    s = run_job(embed_job(enc_dir, table, tmp_path / "out", asked=asked, actors=2, cpus_per_actor=0.5),
                measure=_budget_measured(str(calls)), **QUIET)
    (call,) = calls.read_text().split()
    assert int(call.split(":")[1]) > 0 and s["max_tokens"] == 256 and s["actors"].startswith("2 actors")
    assert pq.read_table(tmp_path / "out").equals(reference)


def test_an_explicit_max_tokens_wins_over_a_profile(tmp_path):
    from spanflow.tasks.registry import get

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"task": "embed", "mode": "infer", "best": {"max_tokens": 999}}))
    asked = _actor_asked(Asked(device="cuda:1", max_tokens="300", profile=str(prof)), get("embed"))
    assert (asked.max_tokens, asked.profile, asked.device) == ("300", None, "cuda")
    assert _actor_asked(Asked(profile=str(prof)), get("embed")).max_tokens == 999
    assert _actor_asked(Asked(max_tokens="auto", profile=str(prof)), get("embed")).max_tokens == 999


@ray.remote(num_cpus=0)
class Signal:
    """What the killing test's stage reports: the actors built, who ran which chunk, and the
    pid of the actor holding its second chunk until the test kills it."""

    def __init__(self):
        self.held, self.gone = asyncio.Event(), asyncio.Event()
        self.pid, self.killed, self.built, self.ran = None, False, [], {}

    async def built_in(self, pid: int) -> None:
        self.built.append(pid)

    async def holding(self, pid: int, row: int) -> None:
        self.pid, self.row = pid, row
        self.held.set()
        await asyncio.wait_for(self.gone.wait(), WAIT)  # a chunk held for ever fails the test instead

    async def wait_held(self) -> int:
        await asyncio.wait_for(self.held.wait(), WAIT)
        self.killed = True  # before the kill: the restarted actor must not hold again
        return self.pid

    async def dead(self) -> None:
        self.gone.set()

    async def was_killed(self) -> bool:
        return self.killed

    async def ran_chunk(self, row: int, pid: int) -> None:
        self.ran[row] = pid

    async def report(self) -> tuple:
        return self.built, self.ran, self.row


class KilledInSecondChunk:
    """ModelStage, whose first actor is killed (SIGKILL, by the test) in its second chunk."""

    def __init__(self, spec):
        self.inner, self.calls = ModelStage(spec), 0
        self.signal = ray.get_actor("spanflow-test-signal")
        ray.get(self.signal.built_in.remote(os.getpid()))

    def __call__(self, batch):
        self.calls += 1
        row = batch[ROW][0].as_py()
        if self.calls == 2 and not ray.get(self.signal.was_killed.remote()):
            ray.get(self.signal.holding.remote(os.getpid(), row))
        out = self.inner(batch)
        ray.get(self.signal.ran_chunk.remote(row, os.getpid()))
        return out


def _read_killed_after_its_first_block(marker: str):
    """S.read_task, whose first task kills its own process after yielding its first block."""
    read = S.read_task

    def killing(batch, **kw):
        for k, b in enumerate(read(batch, **kw)):
            yield b
            if k == 0 and _first(marker):
                os.kill(os.getpid(), signal.SIGKILL)

    return killing


def _first(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _earlier_output(out):
    out.mkdir()
    (out / "part-old.parquet").write_bytes(b"")
    (out / MANIFEST).write_text(json.dumps({"format": FORMAT, "rows": 1, "errors": 0, "files": ["part-old.parquet"],
                                            "task": "embed", "model": "m", "input": "i"}))


def test_killed_workers_lose_and_repeat_no_row(enc_dir, table, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _earlier_output(out)  # replaced whole
    (tmp_path / "out.old").mkdir()  # someone's: left alone
    monkeypatch.setattr(S, "read_task", _read_killed_after_its_first_block(str(tmp_path / "read-killed")))
    sig = Signal.options(name="spanflow-test-signal").remote()
    killed = []

    def kill():
        pid = ray.get(sig.wait_held.remote(), timeout=WAIT)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        ray.get(sig.dead.remote())

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    try:
        s = run_job(embed_job(enc_dir, table, out), stage=KilledInSecondChunk, **QUIET)
        t.join(timeout=WAIT)
        built, ran, row = ray.get(sig.report.remote())
    finally:
        ray.kill(sig)
    assert killed and (tmp_path / "read-killed").exists(), "no actor, or no read task, was killed"
    assert len(built) >= 2 and ran[row] != killed[0] and ran[row] in built[1:]  # a restarted actor ran it
    ids = pq.read_table(out).column("id").to_pylist()
    assert s["rows"] == len(TEXTS) and ids == list(range(len(TEXTS)))
    assert pq.read_table(out).equals(reference)
    assert not (out / "part-old.parquet").exists() and (tmp_path / "out.old").is_dir()


def test_the_output_and_the_columns_are_checked_before_any_work(enc_dir, table, tmp_path):
    job = RayJob(model=enc_dir, source=Source(path=table, column="body"), output=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="--column body: .* has no such column; it has text, n"):
        run_job(job, **QUIET)
    job = RayJob(model=enc_dir, source=Source(path=table, column="n"), output=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="--column n: the column 'n' of .* holds int64, not strings"):
        run_job(job, **QUIET)
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == []
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="no spanflow Ray job wrote"):
        check_target(str(tmp_path / "theirs"))
    (tmp_path / "theirs" / MANIFEST).write_text("{}")  # a manifest of no format of ours
    with pytest.raises(ConfigError, match="no spanflow Ray job wrote"):
        check_target(str(tmp_path / "theirs"))
    _earlier_output(tmp_path / "ours")
    assert check_target(str(tmp_path / "ours")).local
    (tmp_path / "ours" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"and other files too \(notes.txt\)"):
        check_target(str(tmp_path / "ours"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_target(str(tmp_path / "f"))
    assert check_target(str(tmp_path / "new")).local


def test_files_put_at_the_output_during_a_job_keep_the_jobs_output_beside_it(tmp_path):
    """A file dropped into --output while the job ran was refused at the end, and the job's own
    output, in its staging directory, was removed with it: all the work lost."""
    out = tmp_path / "out"
    target = check_target(str(out))
    with pytest.raises(ConfigError, match=r"no spanflow Ray job wrote, put there while the job ran: .* kept at "
                                          rf"{re.escape(str(out))}\.new-{os.getpid()} "):
        with staged(target) as where:
            (Path(where) / "part-0.parquet").write_text("the job's rows")
            out.mkdir(exist_ok=True)
            (out / "mine.txt").write_text("a user's file")  # during the job
    assert (out / "mine.txt").read_text() == "a user's file"
    assert (tmp_path / f"out.new-{os.getpid()}" / "part-0.parquet").read_text() == "the job's rows"
    clean_stale(str(out))  # a later job's clean-up leaves it
    assert (tmp_path / f"out.new-{os.getpid()}").is_dir()
    # a plain file put there: it was moved aside under a staging name, hidden, and the output put in its place
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match=r"other is a file, put there while the job ran: .* kept at "):
        with staged(check_target(str(other))) as where:
            (Path(where) / "part-0.parquet").write_text("the job's rows")
            other.write_text("a user's file")
    assert other.read_text() == "a user's file" and sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["out", f"out.new-{os.getpid()}", "other", f"other.new-{os.getpid()}"])


def test_only_this_outputs_leftovers_of_dead_jobs_here_are_cleaned(tmp_path):
    p = subprocess.Popen(["true"])
    p.wait()
    dead, host = p.pid, _host()
    for name in (f".out.ray-{host}-{dead}-abc", f".out.ray-{host}-{os.getppid()}-abc",  # dead; alive
                 f".out.ray-otherhost-{dead}-abc", f".other.ray-{host}-{dead}-abc"):  # elsewhere; another output
        (tmp_path / name).mkdir()
    (tmp_path / f".out.ray-{host}-{dead}-old").mkdir()  # an earlier output moved aside, never replaced
    (tmp_path / f".out.ray-{host}-{dead}-old" / "x").write_text("kept")
    clean_stale(str(tmp_path / "out"))
    kept = [f".out.ray-{host}-{os.getppid()}-abc", f".out.ray-otherhost-{dead}-abc", f".other.ray-{host}-{dead}-abc"]
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["out"])
    assert (tmp_path / "out" / "x").read_text() == "kept"
    with pytest.raises(RuntimeError), staged(check_target(str(tmp_path / "new"))) as where:
        assert os.path.basename(where).startswith(f".new.ray-{host}-{os.getpid()}-")
        raise RuntimeError("a job that fails leaves nothing")
    assert not (tmp_path / "new").exists() and not os.path.exists(where)


def test_actors_follow_the_cluster():
    gpu_nodes = [{"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 4}]
    a = plan_actors(gpu_nodes)
    assert (a.count, a.cpus, a.gpus) == (8, 1.0, 1.0)
    assert plan_actors(gpu_nodes, gpus=0.5).count == 16
    assert plan_actors(gpu_nodes, device="cpu").gpus == 0
    assert plan_actors(gpu_nodes, device="cuda:1").gpus == 1.0
    a = plan_actors([{"CPU": 4, "GPU": 4}])  # CPUs == GPUs: one CPU left for the tasks
    assert (a.count, a.cpus) == (4, 0.75)
    a = plan_actors([{"CPU": 1, "GPU": 1}])
    assert (a.count, a.cpus, a.gpus) == (1, 0.0, 1.0)
    a = plan_actors([{"CPU": 2}])
    assert (a.count, a.cpus, a.gpus) == (1, 1.0, 0.0)  # one CPU left for reading and tokenizing
    assert a.threads == 2  # ... which the actor's threads share: the single-process job's cores
    with pytest.raises(ConfigError, match="more than 1 CPU.*--num-cpus 2"):
        plan_actors([{"CPU": 1}])  # a 1-CPU node: the actor would take the only CPU and the job wait for ever
    a = plan_actors([{"CPU": 16}, {"CPU": 16}])
    assert (a.count, a.cpus, a.threads) == (6, 4.0, 5)  # 3 actors share 16 CPUs
    a = plan_actors([{"CPU": 2}, {"CPU": 16}])  # a small head node: actors sized from the workers
    assert (a.count, a.cpus, a.initial) == (3, 4.0, 3)
    a = plan_actors([{"CPU": 16}], count=8, cpus=2)
    assert (a.count, a.initial, a.threads) == (8, 7, 2)  # starts with what fits, may grow to 8; threads as asked
    with pytest.raises(ConfigError, match="no node of the Ray cluster has that many CPUs"):
        plan_actors([{"CPU": 4}], cpus=4)
    with pytest.raises(ConfigError, match="no GPUs"):
        plan_actors([{"CPU": 4}], device="cuda")
    assert plan_actors([{"CPU": 4}], gpus=1, count=2).initial == 1  # waits for an autoscaler's GPU nodes


def test_chunks_are_the_single_process_jobs_chunks():
    from spanflow.tasks.embed.journal import EmbedSpec
    from spanflow.tasks.ner.tagging import tag_texts
    from spanflow.tasks.re.model import ReModel

    ner = inspect.signature(tag_texts).parameters["chunk_size"].default
    rel = inspect.signature(ReModel.predict_stream).parameters["chunk_size"].default
    assert DEFAULT_BATCH_ROWS % ner == 0 and DEFAULT_BATCH_ROWS % rel == 0 and DEFAULT_BATCH_ROWS <= max(ner, rel)
    assert EmbedSpec.model_fields["chunk_size"].default == DEFAULT_BATCH_ROWS  # embed's --chunk-size passes through


def test_an_address_where_nothing_answers_is_refused_at_once():
    import socket

    from spanflow.ray.job import answering

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match=f"--ray {address}: nothing answers at 127.0.0.1:{port}"):
            answering(address)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        answering(f"127.0.0.1:{s.getsockname()[1]}")  # something answers: left to ray.init
    answering("local")
    answering("auto")
    answering("::1")  # a bare IPv6 address: its port is not told apart, so it is left to ray.init
    with pytest.raises(ConfigError, match=rf"nothing answers at \[::1\]:{port} "):
        answering(f"[::1]:{port}")


def test_ray_datas_error_records_are_held_and_dropped_when_the_error_is_raised_as_itself():
    import io

    from spanflow.ray.job import HELD_MAX, _held_errors

    out = io.StringIO()
    terminal = logging.StreamHandler(out)
    ray_data, inner = logging.getLogger("ray.data"), logging.getLogger("ray.data._internal.somewhere")
    ray_data.addHandler(terminal)
    try:
        with _held_errors() as held:
            inner.info("plan")  # the plan and progress (30 lines a job of seconds): the log file's only
            inner.warning("progress")
            inner.warning("Warning: The Ray cluster currently does not have any available CPUs. The Dataset job "
                          "will hang unless more CPUs are freed up.")  # a moment's state the job's plan outlives
            inner.error("Exception occurred in Ray Data or Ray Core internal code")
            assert out.getvalue() == "progress\n"  # warnings shown as they come, errors held
            held.clear()  # the job raises its own error
        assert out.getvalue() == "progress\n"
        with _held_errors(quiet_cpus=False):  # a cluster joined by address: others' work may hold its CPUs
            inner.warning("The Ray cluster currently does not have any available CPUs.")
        assert out.getvalue() == "progress\nThe Ray cluster currently does not have any available CPUs.\n"
        out.seek(0), out.truncate()
        out.write("progress\n")
        with _held_errors():
            inner.error("a failure spanflow does not explain")
        assert out.getvalue() == "progress\na failure spanflow does not explain\n"  # shown at the end
        inner.error("after the job")
        assert out.getvalue().endswith("after the job\n")  # the handler is as it was
        out.seek(0), out.truncate()
        with _held_errors():  # a job retrying for hours: the first records kept, the rest counted
            for k in range(HELD_MAX + 7):
                inner.error("retry %d", k)
        lines = out.getvalue().splitlines()
        assert lines[:HELD_MAX] == [f"retry {k}" for k in range(HELD_MAX)]
        assert lines[HELD_MAX:] == ["... and 7 more error records (Ray Data's log file has them)"]
    finally:
        ray_data.removeHandler(terminal)


def test_files_whose_kept_columns_differ_in_encoding_read_as_one_type(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    body = ["Ann ran", "Bob sat"]
    # as writers differ: one file dictionary-encodes a column or holds it all null, another not
    pq.write_table(pa.table({"body": body, "cat": pa.array(["x", "y"]).dictionary_encode(), "url": pa.nulls(2),
                             "k": pa.array([1, 2], pa.int32())}), d / "a.parquet")
    pq.write_table(pa.table({"body": body, "cat": ["z", "x"], "url": ["u1", None], "k": pa.array([3, 4], pa.int64())}),
                   d / "b.parquet")
    src = Source(path=str(d), column="body", id_column="k", keep=("cat", "url")).for_workers()
    pieces, types, total = S.plan_parquet(src)
    assert (str(types.field("id").type), str(types.field("cat").type), str(types.field("url").type)) == \
        ("int64", "string", "string") and total == 4
    blocks = list(S.read_task({"task": pa.array([0])}, tasks=[pieces], src=src, types=types))
    joined = pa.concat_tables(blocks)  # one schema over the files: Ray's blocks concatenate
    assert joined.column(S.ID).to_pylist() == [1, 2, 3, 4]
    assert joined.column(S.KEEP + "cat").to_pylist() == ["x", "y", "z", "x"]
    assert joined.column(S.KEEP + "url").to_pylist() == [None, None, "u1", None]
    pq.write_table(pa.table({"body": body, "cat": [1, 2], "url": ["u", "v"], "k": [5, 6]}), d / "c.parquet")
    with pytest.raises(ConfigError, match=r"^--keep-columns cat: the column holds string in .*a\.parquet and int64 "
                                          r"in .*c\.parquet; an output column takes one type"):
        S.plan_parquet(src)  # before any work, as a column a file lacks is
    pq.write_table(pa.table({"body": body, "cat": ["a", "b"], "url": ["u", "v"], "k": [5.0, 6.5]}), d / "c.parquet")
    with pytest.raises(ConfigError, match=r"^--id-column k: the column holds int64 in .*b\.parquet and double in "):
        S.plan_parquet(src)  # a float column would turn large ids inexact: named, the file that set int64 first


def test_an_object_store_that_cannot_be_reached_is_one_error_naming_the_uri(monkeypatch):
    from spanflow.errors import DataError

    def unreachable(uri):  # what pyarrow raises with no network, no such bucket or no credentials
        raise OSError("When resolving region for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket")

    monkeypatch.setattr(S, "store", unreachable)
    with pytest.raises(DataError, match=r"^s3://b/in/: cannot reach it \(When resolving region .*NETWORK_CONNECTION"):
        S.is_parquet_input("s3://b/in/")
    with pytest.raises(DataError, match=r"^s3://b/out/: cannot reach it"):
        check_target("s3://b/out/")


def test_joining_ray_keeps_the_commands_sigterm_handler(monkeypatch):
    import spanflow.ray.job as J

    class JoinedRay:  # ray.init installs its own SIGTERM handler in the driver, as Ray does
        def is_initialized(self):
            return False

        def init(self, **kw):
            signal.signal(signal.SIGTERM, lambda *a: None)

        def shutdown(self):
            pass

    def ours(signum, frame):
        raise SystemExit(143)

    was = signal.signal(signal.SIGTERM, ours)
    try:
        monkeypatch.setattr(J, "ray_module", JoinedRay)
        with J.connected("local"):
            assert signal.getsignal(signal.SIGTERM) is ours  # ended as Ctrl-C: exit 143, staging removed
    finally:
        signal.signal(signal.SIGTERM, was)


def test_normalized_rows_equal_the_single_process_jobs(enc_dir, table, tmp_path):
    """`embed --normalize --ray`: the actors' vectors are made unit-length as they are written, the
    rows the single-process job writes with --normalize."""
    import numpy as np

    want = embed_single(enc_dir, table, str(tmp_path / "one.parquet"), column="text", keep=["n"], normalize=True)
    run_job(embed_job(enc_dir, table, tmp_path / "out", actors=1, opts={"normalize": True}))
    got = pq.read_table(tmp_path / "out")
    rows = [r for r in got.column("embedding").to_pylist() if r is not None]
    np.testing.assert_allclose(np.linalg.norm(np.array(rows), axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.array(rows), np.array([r for r in want.column("embedding").to_pylist()
                                                         if r is not None]), atol=1e-7)


@ray.remote(num_cpus=0)
class Unanswering:
    """A tally whose members() never returns: as one whose cluster a SIGTERM to the process group ended."""

    def __init__(self):
        self.never = asyncio.Event()

    async def members(self) -> list:
        await self.never.wait()


def test_a_stopped_job_does_not_wait_on_a_tally_that_never_answers(monkeypatch):
    """A job ended by SIGTERM to its process group (timeout, a scheduler's kill) lost its local Ray's
    own processes too: asking them for the model actors waited out Ray's minute for its GCS,
    and Ray then aborted the process (exit 1, the output's lock left)."""
    import spanflow.ray.job as J

    monkeypatch.setattr(J, "MEMBERS_WAIT", 0.5)
    tally = Unanswering.remote()
    try:
        assert J._members(ray, tally) == []
    finally:
        ray.kill(tally)


def test_a_chunks_rows_leave_the_model_stage_as_one_record_batch(enc_dir, table):
    """The stage's table is one record batch, whatever blocks its chunk came in: Ray's Parquet
    write task gives a table's batches to pyarrow's write_dataset on threads, which may write
    them in any order (rows of a file out of input order, now and then, before)."""
    from spanflow.ray.stages import StageSpec

    src = Source(path=table, column="text", keep=("n",))
    pieces, types, _ = S.plan_parquet(src)
    blocks = list(S.read_task(pa.table({"task": [0]}), tasks=[pieces], src=src, types=types))
    batch = pa.concat_tables(blocks)
    assert batch.column("__row").num_chunks > 1  # in pieces, as the job's blocks come
    import torch

    from spanflow.runtime.threads import on_model_thread

    # the stage sets its actor's threads on the thread that runs its model: here, this process's
    threads = on_model_thread(torch.get_num_threads)
    try:
        out = ModelStage(StageSpec(task="embed", model=enc_dir, asked=ASKED, types=types))(batch)
    finally:
        on_model_thread(torch.set_num_threads, threads)
    assert [len(b) for b in out.to_batches()] == [len(TEXTS)]
    assert out.column("n").to_pylist() == list(range(len(TEXTS)))


def test_a_chunk_whose_output_ray_would_cut_is_said_or_refused(enc_dir, table, tmp_path, monkeypatch):
    """Ray Data cuts a task's output at 1.5 times its target block size, and its Parquet writer may
    write the pieces out of order: where vectors alone make a chunk that large, the job is refused
    before any work (naming the chunk size that fits); where other columns do (predict keeping
    long texts), each actor says so once, and the job goes on (every row keeps its id)."""
    from spanflow.ray.stages import cut_warning

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 1000)
    assert cut_warning(1499, 20) is None
    assert "a chunk of 20 rows gives 0 MiB of output, over the 0 MiB Ray Data keeps in one block" in cut_warning(1500, 20)
    # a row: 32 float32 dimensions, an int64 id and the kept int64 "n": 144 bytes; 20 rows of them pass 1500
    with pytest.raises(ConfigError, match=r"--chunk-size 20: a chunk's output would be 0 MiB of vectors, over the 0 "
                                          r"MiB Ray Data keeps in one block .*: give --chunk-size 10 or less"):
        run_job(embed_job(enc_dir, table, tmp_path / "out"), **QUIET)
    assert not (tmp_path / "out").exists()


def test_a_chunk_size_past_what_rays_writer_keeps_in_order_is_refused(enc_dir, table, tmp_path):
    from spanflow.ray.job import MAX_BATCH_ROWS

    for rows in (0, MAX_BATCH_ROWS + 1):
        job = RayJob(model=enc_dir, source=Source(path=table, column="text"), output=str(tmp_path / "out"),
                     batch_rows=rows)
        with pytest.raises(ConfigError, match=f"--chunk-size under --ray is a whole number from 1 to "
                                              f"{MAX_BATCH_ROWS}, got {rows}"):
            run_job(job, **QUIET)
    assert not (tmp_path / "out").exists()


def test_the_predictor_stage_in_a_pipeline_of_ones_own_gives_the_models_rows(ner_dir, table):
    """Predictor in Dataset.map_batches: each row keeps its columns and gets the entities the model
    gives its text (one batch of the whole input: the model's own batches), a null text an error.
    Last in this file: Ray Data lets the stage's actor go after the dataset ends, and one still
    holding a CPU would give the jobs of a test after it actors of fewer threads (other bits)."""
    from spanflow.ray import Predictor
    from spanflow.tasks.ner import NerModel

    ds = ray.data.read_parquet(table).map_batches(
        Predictor, fn_constructor_kwargs={"model": ner_dir, "device": "cpu", "precision": "fp32", "max_tokens": 256},
        batch_format="pyarrow", batch_size=len(TEXTS), compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
    rows = sorted(ds.take_all(), key=lambda r: r["n"])
    want = NerModel.load(ner_dir, device="cpu", precision="fp32").predict([t or "" for t in _texts()],
                                                                          max_tokens=256)
    assert [r["n"] for r in rows] == list(range(len(TEXTS)))
    assert [r["error"] is not None for r in rows] == [k == NULL_ROW for k in range(len(TEXTS))]
    got = [None if r["entities"] is None else [(e["start"], e["end"], e["label"]) for e in r["entities"]]
           for r in rows]
    assert got == [None if k == NULL_ROW else [tuple(s) for s in spans] for k, spans in enumerate(want)]
    assert any(got[k] for k in range(len(TEXTS)) if k != NULL_ROW)  # spans to compare


def test_the_summary_line_gives_a_slow_jobs_rates_unrounded():
    """3 rows in 10.6 s said `0 rows/s, 2 real tokens/s`; a slow job's rates keep two digits."""
    from spanflow.ray.cli import summary_line

    line = summary_line({"rows": 3, "errors": 0, "output": "out", "seconds": 10.6, "startup_seconds": 9.0,
                         "rows_per_s": 3 / 10.6, "real_tokens_per_s": 24 / 10.6, "padding_efficiency": 0.9,
                         "truncated": 0, "files": ["a"], "actors": "1 actor"})
    assert "0.28 rows/s, 2.3 real tokens/s, padding efficiency 0.900" in line, line
