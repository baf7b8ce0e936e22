"""Files on disk, one way: atomic writes, content hashes, output-path checks and output locks.

Every file vegas-sim writes (trace-set parts and meta, result tables, reports, run logs, the
fit cache) goes through `atomic_write`: a temp file beside the target, then a rename, so a
reader never sees half a file and a failed write leaves the old one intact. An output of
several files (a report and its CSVs) goes through `write_together`: all staged, then all
renamed, so an interrupt or a full disk leaves the old output or the whole new one. Output
paths are checked before any work (`check_out`), so that a long run is not lost to a typo. An
output has one writer at a time (`output_lock`): a second command writing the same path is
refused and told which process holds it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vegas_sim.errors import UserInputError

Writer = Callable[[Path], object]


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- atomic writes
def _fsync_dir(path: Path) -> None:
    # Makes a rename durable; some filesystems refuse O_RDONLY on directories: best effort.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask. Linux shows it in /proc; elsewhere the only way to read it is to set
    it and put it back, which briefly leaves other threads' new files unmasked."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _umask_mode() -> int:
    """0o666 less the umask: the mode `open(path, "w")` would give a new file."""
    return 0o666 & ~_umask()


def atomic_write(path: Path, write: Writer, *, durable: bool = False,
                 mode: int | None = None) -> Path:
    """Write `path` through `write(tmp)` to a hidden temp file beside it, then rename it over.

    The rename alone makes the write all-or-nothing for a killed process; `durable` adds the
    fsyncs that make it survive a power loss too (trace sets; not throwaway outputs). The file
    gets `mode`, else the mode a plain `open` would (mkstemp makes it 0600). OSError
    propagates.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode() if mode is None else mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if durable:
        _fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs: one that arrives meanwhile is
    handled as it would have been (Ctrl-C's KeyboardInterrupt, say) when the block ends.
    Python runs signal handlers in the main thread only, so off it this holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda n, _: arrived.append(n))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for first in arrived[:1]:
        handler = previous[signal.Signals(first)]
        if callable(handler):
            handler(first, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), first)


def write_together(writes: list[tuple[Path, Writer]], option: str = "--out",
                   before_commit: Callable[[], object] | None = None) -> list[Path]:
    """Write several files as one output (a report and its CSVs): each `write(tmp)` stages a
    hidden temp file beside its path; only once every one is staged are they renamed into
    place, in the order given, with SIGINT and SIGTERM held back until the last rename (and
    `before_commit`, run just before the renames, e.g. to delete files the output no longer
    has). A failure or interrupt while staging (a full disk, Ctrl-C) removes what was staged
    and leaves every path as it was. An OSError is a UserInputError naming `option`."""
    staged: list[tuple[Path, Path]] = []  # (temp file, its path)
    current = writes[0][0] if writes else Path()
    try:
        for current, write in writes:
            fd, name = tempfile.mkstemp(dir=current.parent, prefix=f".{current.name}.tmp-",
                                        suffix=".tmp")
            os.close(fd)
            staged.append((Path(name), current))
            write(Path(name))
            os.chmod(name, _umask_mode())
        with _signals_held():
            if before_commit is not None:
                before_commit()
            while staged:
                tmp, current = staged[0]
                os.replace(tmp, current)
                staged.pop(0)
    except OSError as e:
        raise _cannot_write(current, e, option) from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return [path for path, _ in writes]


def write_json(path: Path, obj: Any, *, durable: bool = False) -> Path:
    """`obj` as indented JSON with sorted keys (values JSON lacks are written as strings)."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    return atomic_write(path, lambda tmp: tmp.write_text(text), durable=durable)


def write_atomic(path: str | Path, write: Writer, option: str = "--out") -> Path:
    """`atomic_write` for a path the user named with `option`: its directory is made, and
    a path that cannot be written is a UserInputError naming `option`."""
    path = Path(path)
    make_parent(path, option)
    try:
        return atomic_write(path, write)
    except OSError as e:
        raise _cannot_write(path, e, option) from None


# ------------------------------------------------------------------------- output-path checks
def _os_why(e: OSError) -> str:
    """A short reason for an OSError; a file where a directory should be reads clearer so."""
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        return "a part of the path is a file, not a directory"
    return e.strerror or str(e)


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, quota or file-size limit


def _cannot_write(path: Path, e: OSError, option: str) -> UserInputError:
    if e.errno in NO_ROOM:
        return UserInputError(f"cannot write {str(path)!r}: {_os_why(e)}", where=option,
                              fix="free space on that filesystem (or raise the file-size "
                                  "limit, ulimit -f), or choose a path on another one, and run "
                                  "the command again")
    return UserInputError(f"cannot write {str(path)!r}: {_os_why(e)}", where=option,
                          fix="choose a path in a writable directory (one that exists or "
                              "can be created)")


def nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its nearest ancestor that does: where making the
    directory `path` would start (a file there means it cannot be made)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def make_parent(path: Path, option: str = "--out") -> None:
    """Create `path`'s directory, or say why it cannot be (a file in the way, no permission)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(path, e, option) from None


def check_writable(path: Path, option: str = "--out") -> None:
    """Fail now, before any work or any other output, if `path` cannot be written: its
    directory cannot be made, or takes no new file (read-only, or a pseudo-filesystem such as
    /proc that passes permission checks but refuses files). A missing directory is refused,
    not made: a typo in it would otherwise put the output where nobody looks."""
    found = nearest_existing(path.parent)
    if not found.is_dir():
        raise UserInputError(f"{str(found)!r} is not a directory", where=option,
                             fix="name a file inside a directory")
    if not path.parent.is_dir():
        raise UserInputError(f"the directory {str(path.parent)!r} does not exist", where=option,
                             fix=f"create it first (mkdir -p {path.parent}), or name a file in "
                                 "an existing directory")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise _cannot_write(path, e, option) from None


def check_out(path: Path, suffixes: tuple[str, ...], option: str = "--out") -> Path:
    """Check an output path before any work is done, so that a long run is not lost to a typo:
    not a directory, a known suffix, and a directory that exists and takes a new file.
    Returns the path."""
    if path.is_dir():
        raise UserInputError(f"{str(path)!r} is a directory", where=option,
                             fix=f"name a file inside it, e.g. {path / ('result' + suffixes[0])}")
    if path.suffix.lower() not in suffixes:
        raise UserInputError(f"cannot tell what to write to {str(path)!r} from its suffix",
                             where=option, fix=f"name the file *{', *'.join(suffixes)}")
    check_writable(path, option)
    return path


# ------------------------------------------------------------------------------ output locks
LOCK_SUFFIX = ".lock"
_held = threading.local()  # the locks this thread holds: a nested lock of one path is free


def lock_path(path: Path) -> Path:
    """The lock file of output `path` (a file or a directory): `<path>.lock` beside it."""
    return path.with_name(path.name + LOCK_SUFFIX)


def _holder_text(fd: int) -> str:
    """Who holds a lock, from what its holder wrote into the lock file."""
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not said which yet)"
    return (f"process {info['pid']} ({info.get('command', '?')}, since "
            f"{info.get('started', '?')})")


def _open_locked(lock: Path, option: str, path: Path) -> int:
    """An fd of `lock`, flock'ed; the lock file a last holder unlinked between our open and
    our flock is opened again. A lock held by a live process is a UserInputError."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            raise _cannot_write(path, e, option) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd)
            os.close(fd)
            raise UserInputError(
                f"{str(path)!r} is being written by {holder}", where=option,
                fix=f"wait for it to finish, or choose another {option} (its lock is "
                    f"{lock}; a lock of a process that has died is taken over)") from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | Path, option: str = "--out", *, make: bool = True
                ) -> Iterator[Path]:
    """Hold `path`'s lock (`lock_path`) while the block writes `path` and its companions
    (a sweep's checkpoint, a report's CSVs). A second writer, in another process or thread,
    gets a UserInputError naming the first. The lock is the kernel's (flock): a process that
    dies releases it, so its leftover lock file is taken over, not obeyed. Nested locks of one
    path in one thread are free. `make`: create `path`'s directory for the lock (else a path
    whose directory is missing, which nothing can be written into, takes no lock)."""
    path = Path(path)
    key = str(path.resolve())
    held: set[str] = _held.__dict__.setdefault("paths", set())
    if key in held:
        yield lock_path(path)
        return
    lock = lock_path(path)
    if make:
        make_parent(lock, option)
    elif not lock.parent.is_dir():
        yield lock
        return
    fd = _open_locked(lock, option, path)
    info = {"pid": os.getpid(), "command": shlex.join(["vegas-sim", *sys.argv[1:]]),
            "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass  # the lock holds without the note of who holds it
    held.add(key)
    try:
        yield lock
    finally:
        held.discard(key)
        with contextlib.suppress(OSError):
            os.unlink(lock)  # still locked: no one else can have it
        os.close(fd)
