"""A full disk, a read-only one and two jobs on one output, through the real CLI, for the bulk
writers (`spanflow embed` to .npy and JSONL, `spanflow predict`): one `error:` line naming the
output and exit 2, never a traceback or a signal, nothing at the final path; `--resume` once
space is freed gives the vectors of a fresh run."""
import errno
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
from helpers import tiny_bert

from spanflow.cli.main import main
from spanflow.data.synthetic import synthetic_ner

TEXTS = [e.text for e in synthetic_ner(40, seed=8, max_clauses=2)]
N = 1000  # 1000 x 16 float32 = 64 KB of .npy, about 200 KB of JSONL: more than the small disk
RUN = ["--chunk-size", "50", "--precision", "fp32", "--max-tokens", "2048", "--device", "cpu"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    enc, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "in.txt"
    path.write_text("".join(f"{i} {TEXTS[i % len(TEXTS)]}\n" for i in range(N)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def fresh(model, src, tmp_path_factory):
    """The vectors of a fresh, undisturbed run."""
    out = str(tmp_path_factory.mktemp("fresh") / "out.npy")
    assert main(["embed", "--model", model, "--input", src, "--output", out, *RUN]) == 0
    return np.load(out)


def embed(model, src, out, *extra):
    return main(["embed", "--model", model, "--input", src, "--output", str(out), *RUN, *extra])


def predict(model, src, out, *extra):
    return main(["predict", "--model", model, "--input", src, "--output", str(out), "--max-tokens", "2048",
                 "--precision", "fp32", "--device", "cpu", *extra])


def one_error(rc, capsys, *expect):
    """The job failed with exit 2 and one `error:` line holding every one of `expect`."""
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    for e in expect:
        assert e in lines[0], err
    return lines[0]


def jsonl_vectors(path):
    return np.array([json.loads(x)["embedding"] for x in open(path, encoding="utf-8")])


class Disk:
    """A small tmpfs at `path`, for the length of a test (skipped where mounting is not allowed)."""

    def __init__(self, path, size):
        self.path = path
        path.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          check=False, capture_output=True).returncode != 0:
            pytest.skip("mounting a tmpfs is not allowed here")

    def remount(self, opts):
        subprocess.run(["mount", "-o", f"remount,{opts}", str(self.path)], check=True, capture_output=True)

    def umount(self):
        subprocess.run(["umount", str(self.path)], check=True, capture_output=True)


@contextmanager
def small_disk(path, size="128k"):
    disk = Disk(path, size)
    try:
        yield disk
    finally:
        disk.umount()


def test_a_full_disk_under_npy_is_one_line_and_resume_completes(model, src, fresh, tmp_path, capsys):
    with small_disk(tmp_path / "disk") as disk:
        filler = disk.path / "filler"
        filler.write_bytes(b"x" * 96 * 1024)  # 32 KB left: not room for the 64 KB .npy
        out = disk.path / "out.npy"
        one_error(embed(model, src, out), capsys, f"cannot write the embeddings to {out}", "No space left on device")
        assert not out.exists() and not (disk.path / "out.npy.partial").exists()  # the space is given back
        filler.unlink()
        assert embed(model, src, out, "--resume") == 0
        np.testing.assert_allclose(np.load(out), fresh, atol=1e-6)
        assert (disk.path / "out.ids.txt").read_text().split("\n")[:-1] == [str(i) for i in range(1, N + 1)]


def test_a_disk_filling_up_under_jsonl_resumes_at_the_first_unfinished_chunk(model, src, fresh, tmp_path, capsys):
    with small_disk(tmp_path / "disk") as disk:
        out = disk.path / "out.jsonl"
        one_error(embed(model, src, out), capsys, str(out), "No space left on device")
        assert not out.exists()
        disk.remount("size=4m")
        assert embed(model, src, out, "--resume") == 0
        assert "resuming: " in capsys.readouterr().out  # the chunks finished before the disk filled are kept
        np.testing.assert_allclose(jsonl_vectors(out), fresh, atol=1e-6)
        assert sorted(os.listdir(disk.path)) == ["out.jsonl"]


def test_a_full_disk_under_predict_leaves_nothing_at_the_output_and_resumes(model, src, fresh, tmp_path, capsys):
    with small_disk(tmp_path / "disk") as disk:
        out = disk.path / "p.jsonl"
        one_error(predict(model, src, out), capsys, f"cannot write the predictions to {out}",
                  "No space left on device")
        # no final file, no temporary, no lock: the job's journal and what it synced, to go on from
        assert sorted(os.listdir(disk.path)) == ["p.jsonl.partial", "p.jsonl.predict.json"]
        disk.remount("size=4m")
        assert predict(model, src, out, "--resume") == 0
        np.testing.assert_allclose(jsonl_vectors(out), fresh, atol=1e-5)
        assert sorted(os.listdir(disk.path)) == ["p.jsonl"]


def test_a_read_only_output_directory_is_one_line(model, src, tmp_path, capsys):
    with small_disk(tmp_path / "ro") as disk:
        disk.remount("ro")
        for ext in ("npy", "jsonl"):
            out = disk.path / f"out.{ext}"
            one_error(embed(model, src, out), capsys, f"cannot write the embeddings to {out}", "Read-only file system")
        out = disk.path / "p.jsonl"
        one_error(predict(model, src, out), capsys, f"cannot write the predictions to {out}", "Read-only file system")


def no_space(*a, **kw):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fails_on_call(real, n):
    """`real`, but its n-th call raises ENOSPC."""
    calls = [0]

    def wrapped(*a, **kw):
        calls[0] += 1
        if calls[0] == n:
            no_space()
        return real(*a, **kw)
    return wrapped


def test_no_room_to_reserve_the_npy_is_one_line(model, src, fresh, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.npy"
    with monkeypatch.context() as m:
        m.setattr(os, "posix_fallocate", no_space, raising=False)
        one_error(embed(model, src, out), capsys, f"cannot write the embeddings to {out}", "No space left on device")
    assert sorted(os.listdir(tmp_path)) == []
    assert embed(model, src, out, "--resume") == 0
    np.testing.assert_allclose(np.load(out), fresh, atol=1e-6)


@pytest.mark.parametrize("ext,where", [("npy", "rows"), ("jsonl", "rows"), ("npy", "journal")])
def test_a_write_failing_mid_job_keeps_the_journal_consistent(model, src, fresh, tmp_path, capsys, monkeypatch, ext,
                                                              where):
    from spanflow.inference import journal
    from spanflow.tasks.embed import job

    out = tmp_path / f"out.{ext}"
    with monkeypatch.context() as m:
        if where == "journal":  # the third chunk's journal entry
            m.setattr(journal, "write_synced", fails_on_call(journal.write_synced, 4))
            expect = f"cannot write the resume journal to {out}.progress.chunks.json"
        elif ext == "npy":
            m.setattr(job._ChunkWriter, "_pwrite_rows", fails_on_call(job._ChunkWriter._pwrite_rows, 3))
            expect = f"cannot write the embeddings to {out}"
        else:  # _append writes a chunk's rows, then its error records
            m.setattr(job, "_append", fails_on_call(job._append, 5))
            expect = f"cannot write the embeddings to {out}"
        one_error(embed(model, src, out), capsys, expect, "No space left on device")
    assert not out.exists()
    assert embed(model, src, out, "--resume") == 0
    said = capsys.readouterr().out
    assert "resuming: 2 chunks already done" in said
    # the summary's figures are the job's: it says how many texts were done before (it read as this run's)
    assert f"embedded {N} texts (100 of them before --resume; rates over the job's runs) in " in said
    got = np.load(out) if ext == "npy" else jsonl_vectors(out)
    np.testing.assert_allclose(got, fresh, atol=1e-6)


def test_predict_full_mid_file_leaves_nothing(model, src, tmp_path, capsys, monkeypatch):
    from spanflow.inference import predict_job

    real = predict_job._open_partial

    @contextmanager
    def fills_up(path):
        with real(path) as f:
            f.write = fails_on_call(f.write, 100)
            yield f

    monkeypatch.setattr(predict_job, "_open_partial", fills_up)
    out = tmp_path / "p.jsonl"
    one_error(predict(model, src, out), capsys, f"cannot write the predictions to {out}", "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["p.jsonl.partial", "p.jsonl.predict.json"]  # nothing at the output


def test_injected_read_only_directory_is_one_line(model, src, tmp_path, capsys, monkeypatch):
    real = os.open
    ro = str(tmp_path / "ro")
    os.mkdir(ro)

    def refuses(path, flags, *a, **kw):
        if str(path).startswith(ro) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", refuses)
    out = os.path.join(ro, "out.npy")
    one_error(embed(model, src, out), capsys, f"cannot write the embeddings to {out}", "Read-only file system")
    out = os.path.join(ro, "p.jsonl")
    one_error(predict(model, src, out), capsys, f"cannot write the predictions to {out}", "Read-only file system")
    assert os.listdir(ro) == []


@contextmanager
def held_elsewhere(out):
    """`out` claimed by a real other process (a claim is per process: nested claims in one
    process are one), until the block ends; yields that process's pid."""
    code = ("import os, sys; from spanflow.atomic import claim_output\n"
            f"with claim_output({str(out)!r}):\n    print(os.getpid(), flush=True); sys.stdin.readline()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = holder.stdout.readline().strip()
        assert pid == str(holder.pid)
        yield pid
    finally:
        holder.communicate("\n", timeout=30)


def test_a_second_embed_on_the_same_output_stops_at_once(model, src, tmp_path, capsys, monkeypatch):
    from spanflow.tasks.embed import Embedder

    out = tmp_path / "out.npy"
    from spanflow.runtime.loads import Loads

    monkeypatch.setattr(Embedder, "encode_stream", lambda *a, **kw: pytest.fail("the second job embedded"))
    monkeypatch.setattr(Loads, "take", lambda *a, **kw: pytest.fail("the second job loaded its model"))
    with held_elsewhere(out) as pid:
        one_error(embed(model, src, out), capsys, str(out), f"pid {pid}")
        assert os.listdir(tmp_path) == [".out.npy.lock"]  # the first job's lock, and nothing of the second


def test_a_second_predict_on_the_same_output_stops_at_once(model, src, tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    with held_elsewhere(out) as pid:
        one_error(predict(model, src, out), capsys, str(out), f"pid {pid}")
        assert not out.exists()


def test_an_output_that_is_a_directory_is_one_line_before_any_work(model, src, tmp_path, capsys, monkeypatch):
    from spanflow.tasks.embed import Embedder

    monkeypatch.setattr(Embedder, "encode_stream", lambda *a, **kw: pytest.fail("the job ran before the check"))
    (tmp_path / "d.npy").mkdir()
    one_error(embed(model, src, tmp_path / "d.npy"), capsys, f"--output {tmp_path / 'd.npy'} is a directory")
    one_error(predict(model, src, tmp_path), capsys, f"--output {tmp_path} is a directory")


@pytest.mark.parametrize("err,busy", [(errno.EWOULDBLOCK, True), (errno.EACCES, True), (errno.ENOLCK, False),
                                      (errno.ENOSYS, False)])
def test_a_file_system_without_locks_runs_unguarded_rather_than_busy(monkeypatch, err, busy):
    import fcntl

    from spanflow.atomic import try_lock

    def refuse(fd, op):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(fcntl, "flock", refuse)
    assert try_lock(0) is (not busy)


def test_another_thread_on_the_same_output_is_another_job(tmp_path):
    import threading

    from spanflow.atomic import OutputBusy, claim_output

    out, seen = str(tmp_path / "o.npy"), []

    def second():
        try:
            with claim_output(out):
                seen.append("claimed")
        except OutputBusy as e:
            seen.append(e.pid)

    with claim_output(out), claim_output(out):  # nested in one thread: one claim
        t = threading.Thread(target=second)
        t.start()
        t.join()
    assert seen == [str(os.getpid())]


# a kill while a finished job moves its files into place


@pytest.fixture(scope="module")
def emb(model):
    from spanflow.tasks.embed import Embedder

    return Embedder.load(model, precision="fp32", device="cpu")


def small_input(tmp_path):
    """Eight texts and one unreadable line (an error record), for chunks of 3."""
    src = tmp_path / "in.txt"
    src.write_bytes("\n".join(TEXTS[:5]).encode() + b"\n\xff bad\n" + "\n".join(TEXTS[5:8]).encode() + b"\n")
    return str(src)


def finished_files(out):
    """What a job leaves for `out` (the output, its ids and errors files), by name, with their bytes;
    a Parquet file as its rows."""
    import pyarrow.parquet as pq

    stem = os.path.splitext(out)[0]
    got = {}
    for path in (out, stem + ".ids.txt", stem + ".errors.jsonl"):
        if os.path.exists(path):
            got[os.path.basename(path)] = (pq.read_table(path).to_pylist() if path.endswith(".parquet")
                                           else open(path, "rb").read())
    return got


@contextmanager
def killed_at_step(k):
    """The k-th rename, removal or copy from the start of the job's _finish raises KeyboardInterrupt
    before it happens, as a kill there would stop it; yields the count of steps seen."""
    from spanflow.tasks.embed import job

    seen, armed = [0], [False]

    def step(real):
        def run(*a, **kw):
            if armed[0]:
                seen[0] += 1
                if seen[0] == k:
                    seen.append(k)  # the step the kill came at (clean-up steps after it count on)
                    raise KeyboardInterrupt
            return real(*a, **kw)
        return run

    def finish(*a, **kw):
        armed[0] = True
        try:
            return real_finish(*a, **kw)
        finally:
            armed[0] = False

    real_finish = job._finish
    with pytest.MonkeyPatch.context() as m:
        m.setattr(job, "_finish", finish)
        for mod, name in ((os, "replace"), (os, "remove"), (shutil, "copyfile")):
            m.setattr(mod, name, step(getattr(mod, name)))
        yield seen


@pytest.mark.parametrize("ext", ["jsonl", "npy", "parquet"])
def test_a_kill_at_any_step_of_the_final_moves_then_resume_gives_the_fresh_files(emb, tmp_path, ext):
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    src, quiet = small_input(tmp_path), dict(calibrate=False, progress=False, log=lambda m: None)
    spec = EmbedSpec(input=src, output=str(tmp_path / "fresh" / f"out.{ext}"), chunk_size=3)
    os.mkdir(tmp_path / "fresh")
    embed_file(emb, spec, **quiet)
    want = finished_files(spec.output)
    assert len(want) == 2 + (ext == "npy")  # the output, its errors (and its ids)
    for k in range(1, 50):
        d = tmp_path / f"k{k}"
        os.mkdir(d)
        run = spec.model_copy(update={"output": str(d / f"out.{ext}")})
        with killed_at_step(k) as seen:
            try:
                embed_file(emb, run, **quiet)
                killed = False
            except KeyboardInterrupt:
                killed = True
        if not killed:
            break  # the k-th step is past the last one: every step has been killed at
        assert seen[1:] == [k]  # killed at that step (a journal's temporary is removed after it, counted on)
        from spanflow.tasks.embed.journal import job_paths

        P = job_paths(run.output)  # the journal still there, and the moves begun
        moving = os.path.exists(P.journal) and json.loads(open(P.progress).read()).get("placing")
        said = []
        with pytest.MonkeyPatch.context() as m:
            if os.path.exists(P.journal) and (moving or os.path.exists(run.output)):
                # every chunk was done: a resume only moves the files (an .npy's was all embedded again)
                m.setattr(type(emb), "_embed_ids", lambda *a, **kw: pytest.fail("embedded again"))
            embed_file(emb, run, resume=True, **{**quiet, "log": said.append})
        assert ("resuming: all 3 chunks were done; putting the output in place" in said) == bool(moving), said
        assert finished_files(run.output) == want, f"killed at step {k}"
        assert sorted(os.listdir(d)) == sorted(want), f"killed at step {k}"
    assert k > 5  # the steps: the journal saying the moves begin, the output's and the errors' moves, the
    # journal's removal, the parts
    # the moves rename: a JSONL output was copied, and needed the disk twice over at the end


QUIET = dict(calibrate=False, progress=False, log=lambda m: None)


@contextmanager
def dying_after(batches: int):
    """Embedder._embed_ids raising KeyboardInterrupt after `batches` batches, as a kill would
    stop a job there; yields the count of batches asked for."""
    from spanflow.tasks.embed import Embedder

    calls, real = [0], Embedder._embed_ids

    def dies(self, ids, *a, **kw):
        calls[0] += 1
        if calls[0] > batches:
            raise KeyboardInterrupt
        return real(self, ids, *a, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Embedder, "_embed_ids", dies)
        yield calls


def interrupted(emb, spec) -> None:
    """A job of `spec` stopped after its first two batches: chunks done, and a journal."""
    from spanflow.tasks.embed.job import embed_file

    with dying_after(2), pytest.raises(KeyboardInterrupt):
        embed_file(emb, spec, **QUIET)


def test_resume_refuses_a_part_shorter_than_its_journal_says(emb, tmp_path):
    from spanflow.errors import ConfigError
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    spec = EmbedSpec(input=small_input(tmp_path), output=str(tmp_path / "out.jsonl"), chunk_size=3)
    interrupted(emb, spec)
    part = tmp_path / "out.jsonl.part"
    size = part.stat().st_size
    part.write_bytes(part.read_bytes()[:10])
    with pytest.raises(ConfigError) as e:
        embed_file(emb, spec, resume=True, **QUIET)
    assert str(e.value) == (f"{part} holds 10 bytes, fewer than the {size} that {spec.output}.progress.chunks.json "
                            "records as finished: it was cut or removed; drop --resume to start over")
    assert part.stat().st_size == 10 and not os.path.exists(spec.output)


@pytest.mark.parametrize("ext, harm, said", [
    ("npy", lambda out: os.truncate(out + ".partial", 128), "bytes, fewer than the"),
    ("npy", lambda out: os.remove(out + ".ids.partial"), "the ids the job wrote when it began, is gone"),
    ("parquet", lambda out: os.remove(out + ".chunk0.parquet"), ".chunk0.parquet, a part"),
    ("parquet", lambda out: os.truncate(out + ".chunk1.parquet", 100), ".chunk1.parquet, a part"),
])
def test_resume_refuses_finished_rows_that_are_cut_or_gone_before_embedding_more(emb, tmp_path, ext, harm, said):
    """A finished chunk's rows lost from the .npy (they would read as zeros), its ids, or a Parquet
    part: one error before any text is embedded, not zeros or a traceback after the rest."""
    from spanflow.errors import ConfigError
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    spec = EmbedSpec(input=small_input(tmp_path), output=str(tmp_path / f"out.{ext}"), chunk_size=3)
    interrupted(emb, spec)
    harm(spec.output)
    with dying_after(2) as calls, pytest.raises(ConfigError, match="drop --resume to start over") as e:
        embed_file(emb, spec, resume=True, **QUIET)
    assert said in str(e.value) and calls[0] == 0 and not os.path.exists(spec.output)


def test_an_npy_job_whose_ids_an_earlier_version_named_resumes(emb, tmp_path):
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    spec = EmbedSpec(input=small_input(tmp_path), output=str(tmp_path / "out.npy"), chunk_size=3)
    interrupted(emb, spec)
    os.replace(tmp_path / "out.npy.ids.partial", tmp_path / "out.ids.txt.partial")  # the name it had then
    embed_file(emb, spec, resume=True, **QUIET)
    fresh = EmbedSpec(input=spec.input, output=str(tmp_path / "fresh" / "out.npy"), chunk_size=3)
    os.mkdir(tmp_path / "fresh")
    embed_file(emb, fresh, **QUIET)
    assert finished_files(spec.output) == finished_files(fresh.output)


def test_a_fresh_run_removes_what_killed_runs_left(emb, tmp_path):
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    out = str(tmp_path / "out.jsonl")
    left = [".partial", ".errors.partial", ".errors.part", ".errors.part1", ".part", ".part0", ".progress.rank0.json",
            ".progress.chunks.json", ".progress.json.partial", ".chunk3.parquet", ".chunk3.parquet.partial"]
    for name in left:
        with open(out + name, "w") as f:
            f.write("left")
    embed_file(emb, EmbedSpec(input=small_input(tmp_path), output=out, chunk_size=3), calibrate=False,
               progress=False, log=lambda m: None)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.errors.jsonl", "out.jsonl"]


def test_a_jsonl_job_ends_by_renaming_its_part_not_copying_it(emb, tmp_path, monkeypatch):
    """Its end copied the part onto the output: the disk had to hold the output twice over, and a
    disk full there named the part it read as the file it could not write."""
    from spanflow.tasks.embed.job import EmbedSpec, embed_file

    spec = EmbedSpec(input=small_input(tmp_path), output=str(tmp_path / "out.jsonl"), chunk_size=3)
    monkeypatch.setattr(shutil, "copyfile", lambda *a, **k: pytest.fail("copied"))
    part_inode = []
    real = os.replace

    def replace(src, dst, *a, **k):
        if str(dst) == spec.output:
            part_inode.append(os.stat(src).st_ino)
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    embed_file(emb, spec, **QUIET)
    assert part_inode == [os.stat(spec.output).st_ino] and len(open(spec.output).readlines()) == 9
