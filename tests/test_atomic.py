"""Atomic writes where the file system is not plain: a save stopped between its two renames, a
directory or file that is a link, a copy left aside by a kill."""
import os

import pytest

import spanflow.atomic as atomic
from spanflow.atomic import aside_path, atomic_dir, atomic_open, found_dir


def filled(path, text):
    path.mkdir(parents=True, exist_ok=True)
    (path / "spanflow.json").write_text(text)
    return path


def test_a_save_stopped_between_its_renames_puts_the_old_copy_back(tmp_path, monkeypatch):
    final = filled(tmp_path / "model", "old")
    real = os.replace

    def interrupted(src, dst):  # a SIGTERM's exception as the new copy moves in
        if os.fspath(dst) == str(final) and ".model-" in os.fspath(src):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(str(final), "model") as tmp:
            (tmp_path / tmp / "spanflow.json").write_text("new")
    assert (final / "spanflow.json").read_text() == "old" and not os.path.lexists(aside_path(str(final)))
    assert [n for n in os.listdir(tmp_path) if n != "model"] == []  # the new copy removed too


def test_a_copy_a_kill_left_aside_is_taken_back_when_read(tmp_path):
    final = tmp_path / "model"
    filled(tmp_path / ".model.replaced", "old")  # kill -9 between the renames: nothing at the final path
    assert found_dir(str(final)) and (final / "spanflow.json").read_text() == "old"
    assert not found_dir(str(tmp_path / "never"))


def test_a_directory_that_is_a_link_is_written_through_every_time(tmp_path):
    target = filled(tmp_path / "big" / "model", "v0")
    link = tmp_path / "run" / "model"
    link.parent.mkdir()
    link.symlink_to(target)
    for version in ("v1", "v2"):  # the second save crashed on the link the first had moved aside
        with atomic_dir(str(link), "model") as tmp:
            (tmp_path / tmp / "spanflow.json").write_text(version)
        assert link.is_symlink() and (target / "spanflow.json").read_text() == version
    assert sorted(os.listdir(tmp_path / "run")) == ["model"]


def test_a_file_that_is_a_link_is_written_through(tmp_path):
    target = tmp_path / "store" / "p.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    (tmp_path / "p.jsonl").symlink_to(target)
    with atomic_open(str(tmp_path / "p.jsonl")) as f:
        f.write("new\n")
    assert (tmp_path / "p.jsonl").is_symlink() and target.read_text() == "new\n"


def test_a_report_line_the_disk_cut_short_is_taken_back(tmp_path, monkeypatch):
    import errno
    import json

    from spanflow.monitor import report

    path = tmp_path / "train_report.jsonl"
    report.append_jsonl(str(path), {"epoch": 1})
    real = os.write

    def full(fd, data):  # the disk fills halfway through the line
        real(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report.os, "write", full)
    with pytest.raises(OSError):
        report.append_jsonl(str(path), {"epoch": 2, "padded_tokens_per_s": 1.0})
    monkeypatch.undo()
    report.append_jsonl(str(path), {"epoch": 3})  # the resumed run's next line stands on its own
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"epoch": 1}, {"epoch": 3}]


def test_a_temporary_whose_writer_holds_it_is_kept_though_its_pid_is_not_seen(tmp_path):
    fcntl = pytest.importorskip("fcntl")  # (advisory locks: none on Windows)

    from spanflow.atomic import clean_stale

    unseen = tmp_path / ".predict-999999999-abc.jsonl"  # a pid no process here has: another container's writer
    unseen.write_text("half")
    fd = os.open(unseen, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as its writer holds it while it lives
    try:
        assert clean_stale(str(tmp_path), "predict") == [] and unseen.exists()
    finally:
        os.close(fd)
    assert clean_stale(str(tmp_path), "predict") == [str(unseen)]  # its writer gone: stale
    with atomic_open(str(tmp_path / "out.jsonl"), "predict") as f:  # this process's own are held so
        [tmp] = [n for n in os.listdir(tmp_path) if n.startswith(".predict-")]
        probe = os.open(tmp_path / tmp, os.O_RDONLY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        f.write("x")


def test_a_copy_left_aside_through_a_link_is_taken_back_and_a_users_backup_is_not(tmp_path):
    target = tmp_path / "big" / "model"
    link = tmp_path / "run" / "model"
    link.parent.mkdir()
    link.symlink_to(target)
    filled(tmp_path / "big" / ".model.replaced", "old")  # a kill between the renames of a save through the link
    assert found_dir(str(link)) and (target / "spanflow.json").read_text() == "old"
    backup = filled(tmp_path / "mine.old", "a user's backup")  # `mv mine mine.old`: not a reader's to move
    assert not found_dir(str(tmp_path / "mine")) and backup.exists()


def test_a_copy_aside_is_left_while_its_writer_is_between_the_renames(tmp_path):
    fcntl = pytest.importorskip("fcntl")  # (advisory locks: none on Windows)

    filled(tmp_path / ".model.replaced", "old")
    live = tmp_path / ".model-999999999-abc"  # the new copy, its writer alive (holding its lock)
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert not found_dir(str(tmp_path / "model"))  # its own to finish: taking the old back would fail it
    finally:
        os.close(fd)
    assert found_dir(str(tmp_path / "model"))
