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


def test_an_input_that_is_a_pipe_is_refused_before_it_is_read(tmp_path, capsys):
    """A pipe (`/dev/stdin` under `|`, `<(...)`) is used up by a job's first read (the check, or
    the count), and the job then read nothing and wrote an empty output with exit 0: refused,
    before it is opened (a named pipe with no writer would block the open)."""
    from spanflow.data.records import read_texts
    from spanflow.errors import DataError

    fifo = tmp_path / "texts"
    os.mkfifo(fifo)
    said = "is a pipe or device, not a file: its data can be read once"
    for argv in (["predict", "--model", str(tmp_path / "m"), "--input", str(fifo), "--output", str(tmp_path / "o.jsonl")],
                 ["train", "ner", "--train", str(fifo), "--model", "tiny", "--out", str(tmp_path / "run")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {fifo}: {said}, and an input is read more than once (checked, counted, then run); "
                       "write it to a file first"], err
    assert main(["predict", "--model", str(tmp_path / "m"), "--input", "-", "--output", str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --input -: standard input {said}")
    with pytest.raises(DataError, match=said):
        list(read_texts(str(fifo)))
    assert sorted(os.listdir(tmp_path)) == ["texts"]  # no output, no run folder


def test_an_output_through_a_link_that_leads_nowhere_is_named(tmp_path, capsys):
    """The output is written where its link leads: a link into a missing folder, or a folder that
    is a link to nothing, was a traceback from the lock file (or "a file stands where its
    directory should be")."""
    (tmp_path / "t.conll").write_text(CONLL)
    dangling = tmp_path / "out.jsonl"
    dangling.symlink_to(tmp_path / "gone" / "x.jsonl")
    (tmp_path / "dl").symlink_to(tmp_path / "gone2")
    for out, said in ((dangling, f"{dangling} is a link to {tmp_path / 'gone' / 'x.jsonl'}, whose folder "
                                 f"{tmp_path / 'gone'} does not exist"),
                      (tmp_path / "dl" / "x.jsonl", f"{tmp_path / 'dl' / 'x.jsonl'}: its folder {tmp_path / 'dl'} "
                                                   f"is a link to {tmp_path / 'gone2'}, which does not exist")):
        assert main(["convert", str(tmp_path / "t.conll"), str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {said}"), err
    with pytest.raises(ConfigError, match="whose folder .* does not exist"):
        with claim_output(str(dangling)):
            pass
    deeper = tmp_path / "dl" / "sub" / "x.jsonl"  # a folder below the link: the link is named too
    with pytest.raises(ConfigError, match=f"its folder {tmp_path / 'dl'} is a link to"):
        with claim_output(str(deeper)):
            pass
    assert not (tmp_path / "gone").exists() and not (tmp_path / "gone2").exists()
