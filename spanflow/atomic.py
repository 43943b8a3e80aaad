"""Temporary files and directories for atomic writes (write aside, then rename into place).

Their names carry the writer's pid (`.KIND-PID-XXXX`), and the writer holds a lock on each
while it lives, so a later run can remove what a killed run left behind without touching the
temporaries of a run still going, even one whose pid it cannot see (another container). They get
the modes a plain open()/mkdir would (the user's umask), not tempfile's private 0600/0700.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from spanflow.errors import ConfigError, WriteError


log = logging.getLogger("spanflow")
LOCKS = importlib.util.find_spec("fcntl") is not None  # advisory locks (none on Windows)
_TEMPORARY = re.compile(r"^\.[a-z]+-\d+-")  # temp_dir's and temp_file's names


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_dirs(path: str) -> None:
    """os.makedirs(path, exist_ok=True), where a file stands in the way (or the path is one no
    directory can be made at) as a ConfigError naming it, not a traceback."""
    from spanflow.errors import ConfigError

    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{path}: a file stands where a directory should be") from None
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no directory can be made there ({e.strerror})") from None


@contextmanager
def kept_only_if_filled(path: str | None) -> Iterator[None]:
    """A block that may make the directory `path`: where it was not there before and the block
    fails, an empty one is removed (a refused run leaves no empty folder behind)."""
    new = bool(path) and not os.path.lexists(path)
    try:
        yield
    except BaseException:
        if new and os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)  # only an empty one: anything written stays
        raise


def temp_dir(parent: str, kind: str) -> str:
    """A new directory `.KIND-PID-XXXX` in `parent`, mode 0777 less the umask."""
    make_dirs(parent)
    try:
        path = tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=parent)
    except FileNotFoundError as e:
        raise no_new_files(e, parent) from None
    os.chmod(path, 0o777 & ~_umask())
    return path


def temp_file(parent: str, kind: str, suffix: str = "") -> tuple[int, str]:
    """(fd, path) of a new file `.KIND-PID-XXXX<suffix>` in `parent`, mode 0666 less the umask."""
    try:
        fd, path = tempfile.mkstemp(prefix=f".{kind}-{os.getpid()}-", suffix=suffix, dir=parent)
    except FileNotFoundError as e:
        raise no_new_files(e, parent) from None
    os.chmod(path, 0o666 & ~_umask())
    return fd, path


def no_new_files(e: OSError, parent: str) -> OSError:
    """`e` (ENOENT on creating a file) as the refusal it is where `parent` exists (/proc, a
    file system of fixed entries): an EACCES naming the directory, which the write-error paths
    report in one line; else `e` itself."""
    if not os.path.isdir(parent or "."):
        return e
    return PermissionError(errno.EACCES, f"no file can be created in {parent or '.'}", e.filename)


_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
            (stat.S_ISSOCK, "a socket"))


def check_output_path(path: str) -> None:
    """A ConfigError for an output path no finished file or directory can be renamed onto: an empty
    one (it would name the current directory), or a device, pipe or socket (`/dev/null`, a shell's
    `/dev/stdout`): the rename would put a file in place of the device, or block on the pipe."""
    if not str(path).strip():
        raise ConfigError("the output path is empty; give the name of a file or directory to write", field="output")
    _check_links(path)
    try:
        mode = os.stat(path).st_mode  # through links: what the write would replace
    except OSError:
        return
    kind = next((name for test, name in _SPECIAL if test(mode)), None)
    if kind:
        raise ConfigError(f"{path} is {kind}: spanflow writes an output whole, then renames it into place; "
                          "give the path of a file or directory", field="output")


def _check_links(path: str) -> None:
    """A ConfigError where the output, or its folder, is a link that leads nowhere a file can be
    made: the write goes through the link (replace the target, keep the link), so the target's
    folder must be there; else the lock beside it failed with a traceback."""
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.exists(folder):  # the folders to be made, up to the first one there
        if os.path.islink(folder):
            raise ConfigError(f"{path}: its folder {folder} is a link to {os.readlink(folder)}, which does not exist; "
                              "make it, or give another path", field="output")
        parent = os.path.dirname(folder)
        folder = "" if parent == folder else parent
    if os.path.islink(path) and not os.path.exists(path):
        target = os.path.realpath(path)
        if not os.path.isdir(os.path.dirname(target)):
            raise ConfigError(f"{path} is a link to {os.readlink(path)}, whose folder {os.path.dirname(target)} does "
                              "not exist (the output is written where the link leads); make it, or give another path",
                              field="output")


def make_output_folder(path: str, what: str) -> None:
    """The folder the output `path` goes in, made where missing, after check_output_path; a file
    in its way is a ConfigError, a full or read-only disk a WriteError naming `what`."""
    check_output_path(path)
    with writing(what, path):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"--output {path}: a file stands where its directory should be", field="output") from None


def aside_path(final: str) -> str:
    """Where replace_dir keeps the old copy of `final` while the new one moves in: a hidden name
    of spanflow's own (`.NAME.replaced`), so that no directory of the user's (`NAME.old`) is taken."""
    parent, base = os.path.split(final.rstrip("/"))
    return os.path.join(parent, f".{base}.replaced")


def _remove(path: str) -> None:
    """Remove a directory, file or link at `path`, whatever is there (nothing: nothing to do)."""
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(OSError):  # (one that stays is found by what comes next)
            os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def replace_dir(tmp: str, final: str) -> None:
    """Move a finished directory into place, replacing any older one atomically enough:
    the old copy is renamed aside first and removed only once the new one is in place; a
    failure or a signal between the two renames puts the old copy back (a kill -9 there leaves
    it aside, where recover_dir finds it)."""
    old = None
    try:
        if os.path.exists(final):
            old = aside_path(final)
            _remove(old)
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        if old and os.path.lexists(old) and not os.path.lexists(final):
            os.replace(old, final)
        raise
    if old:
        _remove(old)


def recover_dir(final: str, *, legacy: bool = True) -> bool:
    """Finish a replace_dir that was killed between its two renames (through a link: its target's);
    whether a copy was taken back. With `legacy`, an older spanflow's copy at NAME.old too: taken
    back only where it is a checkpoint or a model, never deleted (training's own paths only: a
    user's backup of that name is not a reader's to move)."""
    final = os.path.realpath(final)
    old = aside_path(final)
    if not os.path.exists(final) and os.path.exists(old):
        os.replace(old, final)
        return True
    older = final.rstrip("/") + ".old"
    if legacy and not os.path.exists(final) and any(os.path.exists(os.path.join(older, f))
                                                    for f in ("state.json", "spanflow.json", "modules.json")):
        os.replace(older, final)
        return True
    return False


def found_dir(path: str) -> bool:
    """Whether `path` is a directory, once the copy a save killed between its two renames left
    aside is taken back (a model or export read before the next save would be missing); not while
    a live writer's temporary is beside it (a save between its renames: its own to finish)."""
    real = os.path.realpath(path)
    if not os.path.isdir(path) and os.path.lexists(aside_path(real)) and not _writing_beside(real):
        with contextlib.suppress(OSError):  # a read-only file system: it stays aside, and is not found
            if recover_dir(path, legacy=False):
                log.warning("%s: took back the copy an interrupted save had left aside", path)
    return os.path.isdir(path)


def _writing_beside(path: str) -> bool:
    """Whether a live writer holds a temporary (`.KIND-PID-...`) in the directory of `path`."""
    parent = os.path.dirname(path)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return False
    return any(_TEMPORARY.match(n) and _in_use(os.path.join(parent, n)) for n in names)


@contextmanager
def atomic_dir(path: str, kind: str) -> Iterator[str]:
    """A temporary directory beside `path` to fill; put in place of `path` (replace_dir) when the
    block ends without error, removed otherwise. Stale ones of killed runs are removed first."""
    check_output_path(path)
    path = os.path.realpath(path)  # a link is written through: its target replaced, the link kept
    parent = os.path.dirname(path)
    clean_stale(parent, kind)
    tmp = temp_dir(parent, kind)
    held = _hold(tmp)
    try:
        yield tmp
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _release(held)


@contextmanager
def atomic_path(path: str, kind: str = "write", suffix: str = "") -> Iterator[str]:
    """A temporary path beside `path` to write to; renamed onto `path` when the block ends
    without error, removed otherwise. Stale ones of killed runs are removed first."""
    check_output_path(path)
    path = os.path.realpath(path)  # a link is written through: its target replaced, the link kept
    parent = os.path.dirname(path)
    make_dirs(parent)
    clean_stale(parent, kind)
    fd, tmp = temp_file(parent, kind, suffix)
    held = fd if LOCKS and try_lock(fd) else None  # open, and locked, until it is in place (where a
    if held is None:                                # file held open cannot be renamed: closed now)
        os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        try:
            if os.path.exists(tmp):
                os.unlink(tmp)
        finally:
            _release(held)


def _hold(path: str) -> int | None:
    """An fd locking `path` (a file or a directory) for as long as this writer has it open: a
    process that cannot see this one's pid (another PID namespace or container on this machine)
    still sees the temporary is in use. None where nothing is held."""
    fd = _open_for_lock(path) if LOCKS else None
    if fd is not None and not try_lock(fd):
        os.close(fd)
        return None
    return fd


def _open_for_lock(path: str) -> int | None:
    try:  # never through a link, never waiting on a pipe
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # the lock goes with it


def _in_use(path: str) -> bool:
    """Whether another process holds the lock of a temporary (see _hold)."""
    fd = _open_for_lock(path) if LOCKS else None
    if fd is None:
        return False
    try:
        return not try_lock(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str, kind: str = "write", suffix: str = "", *, sync: bool = False) -> Iterator[IO[str]]:
    """A UTF-8 text file that appears at `path` whole or not at all (see atomic_path)."""
    with atomic_path(path, kind, suffix) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def clean_stale(parent: str, kind: str) -> list[str]:
    """Remove the `.KIND-PID-*` temporaries in `parent` whose process is gone; the removed paths."""
    pattern = re.compile(rf"^\.{re.escape(kind)}-(\d+)-")  # (a kind of _TEMPORARY's)
    removed = []
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(parent, name)
        if _in_use(path):  # a live writer whose pid this process cannot see
            continue
        _remove(path)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def try_lock(fd: int) -> bool:
    """An exclusive advisory lock on `fd` without waiting; True where the platform has none."""
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform: run unguarded
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        # held by another: EWOULDBLOCK (EAGAIN), EACCES on some systems; anything else (ENOLCK on
        # NFS without a lock daemon, ENOSYS on Lustre without flock) means no locks here: unguarded
        return e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    return True


class OutputBusy(ConfigError):
    """Another live job holds the output (`pid` names it)."""

    def __init__(self, path: str, pid: str):
        who = "another job of this process (another thread)" if str(pid) == str(os.getpid()) else \
            f"another job (pid {pid})"
        super().__init__(f"{path} is being written by {who}; wait for it, or choose another output", field="output")
        self.path, self.pid = path, pid


@contextmanager
def claim_output(path: str) -> Iterator[None]:
    """Hold the output `path` for this job: a second job on the same path stops at once with
    OutputBusy naming the first one's pid. The lock is a hidden file next to the output
    (`.NAME.lock`, removed at the end); the lock itself is the kernel's, so a killed job
    never leaves its output held. Nested claims of one path in one process are one claim (the
    CLI claims before loading a model, the job again when it starts)."""
    check_output_path(path)  # before a lock file is made beside a device
    parent, name = os.path.split(os.path.realpath(path))  # a link and its target: one output, one lock
    lock = os.path.join(parent, f".{name}.lock")
    key = (threading.get_ident(), lock)  # nested in one thread; another thread is another job
    if key in _HELD:
        yield
        return
    try:
        fd = _locked(lock, path)
    except FileNotFoundError as e:  # other write faults are named by the job's own writing() context
        raise WriteError("the output", path, no_new_files(e, parent)) from None
    _HELD.add(key)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            if os.path.exists(lock):  # a user may have removed it by hand; the lock is the fd's
                os.unlink(lock)
    finally:
        _HELD.discard(key)
        os.close(fd)


_HELD: set[tuple[int, str]] = set()  # (thread, lock file) of the claims this process holds


def _locked(lock: str, path: str) -> int:
    """An fd holding the lock on the file now at `lock`. A job that ends removes its lock file, so
    a lock taken on a file that was removed meanwhile holds nothing: try again on the new one."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        if not try_lock(fd):
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputBusy(path, pid)
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


@contextmanager
def writing(what: str, path: str) -> Iterator[None]:
    """Turn the OSErrors of a write that the user must fix (a full disk, a read-only file system,
    no permission) into a WriteError naming `what` was being written to `path`; also a Rust
    library's error for one (as_os_error)."""
    try:
        yield
    except WriteError as e:  # a save that names its own output (models.directory.write_aside) is part of this one
        raise WriteError(what, path, e.err) from None
    except Exception as e:
        err = as_os_error(e)
        if err is not None and err.errno in WRITE_ERRNOS:
            named = getattr(err, "filename", None)
            # a temporary of an atomic write is no name the user gave: the output it stands for is
            temp = isinstance(named, str) and _TEMP.match(os.path.basename(named))
            raise WriteError(what, path if temp or not named else named, err) from None
        raise


_TEMP = re.compile(r"^\.[\w-]+?-\d+-")  # temp_file's names, .KIND-PID-XXXX


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error shows an errno


def as_os_error(e: BaseException, path: str | None = None) -> OSError | None:
    """`e` as the OSError it stands for: itself, or the error of a library written in Rust whose
    message ends in Rust's "(os error N)" (safetensors raises SafetensorError, tokenizers a plain
    Exception, even for a full disk), as OSError(N) naming `path`; None for any other error."""
    if isinstance(e, OSError):
        return e
    m = _RUST_OS_ERROR.search(str(e))
    if m is None:
        return None
    n = int(m.group(1))
    return OSError(n, os.strerror(n), path)


def hold_output(held, path: str, what: str) -> None:
    """claim_output(path) until the ExitStack `held` closes; a lock file the file system refuses
    (read-only, full) is a WriteError naming the output and `what` it is, not the hidden lock file."""
    try:
        held.enter_context(claim_output(path))
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise WriteError(what, path, e) from None
