"""Outputs that are no file or directory: a device (`/dev/null`), a named pipe (a shell's
`/dev/stdout`), an empty path. The writes rename a finished file into place, which would put a
file where the device was (run as root, `/dev/null` itself) or block on the pipe: refused."""
import os
import stat

import pytest

from spanflow.atomic import atomic_dir, atomic_path, claim_output
from spanflow.cli.main import main
from spanflow.errors import ConfigError

CONLL = "Ada\tB-PER\nLovelace\tI-PER\nwrote\tO\n\n"


def specials(tmp_path):
    """A named pipe, and where this process may make one (root), a null device of its own."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    made = [(fifo, "a named pipe")]
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made.append((tmp_path / "null", "a character device"))
    except PermissionError:
        pass
    return made


def still(path, kind):
    mode = os.lstat(path).st_mode
    return stat.S_ISFIFO(mode) if kind == "a named pipe" else stat.S_ISCHR(mode)


def test_convert_refuses_a_device_or_pipe_and_leaves_it_as_it_was(tmp_path, capsys):
    src = tmp_path / "in.conll"
    src.write_text(CONLL)
    for path, kind in specials(tmp_path):
        assert main(["convert", str(src), str(path), "--to", "jsonl"]) == 2
        err = capsys.readouterr().err
        assert f"{path} is {kind}: spanflow writes an output whole" in err and "Traceback" not in err
        assert still(path, kind) and not (tmp_path / f".{path.name}.replaced").exists()
    link = tmp_path / "out.jsonl"  # through a link, as a shell's /dev/stdout is one
    link.symlink_to(tmp_path / "pipe")
    assert main(["convert", str(src), str(link)]) == 2
    assert "is a named pipe" in capsys.readouterr().err and still(tmp_path / "pipe", "a named pipe")


def test_an_empty_output_path_is_refused_not_the_current_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.conll").write_text(CONLL)
    assert main(["convert", "in.conll", ""]) == 2
    err = capsys.readouterr().err
    assert "the output path is empty" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.conll"]


@pytest.mark.parametrize("writer", [atomic_path, lambda p: atomic_dir(p, "model"), claim_output])
def test_every_atomic_writer_refuses_a_device_or_pipe(tmp_path, writer):
    for path, kind in specials(tmp_path):
        with pytest.raises(ConfigError, match=f"is {kind}"):
            with writer(str(path)):
                pass
        assert still(path, kind)
        assert set(os.listdir(tmp_path)) <= {"pipe", "null"}  # no temporary, lock or copy aside left
