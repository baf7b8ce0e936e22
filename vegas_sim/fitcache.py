"""An on-disk cache of fitted models, so that `predict` does not refit a trace set it has seen.

Fitting a measured set's latency and acceptance models takes seconds, against a fraction of
that for the simulation itself. The fit is a pure function of the trace set's data file (its
sha256 in meta.json 'content_hash'), of the rest of its meta.json, and of the code that fits,
so the key hashes all three: the whole meta (content_hash narrowed to the fit's own file) and
the source of every vegas_sim module the fitting modules import, directly or not (`fit_modules`).
Any edit of the set or of that code misses the cache.

Safe by construction, though entries are pickles: an entry is read only from a private folder
(owned by the user, mode 0700: made so when the user owns it, refused when another user does)
and only when its HMAC-SHA256, keyed by a per-user secret kept outside the cache (0600, in
$VEGAS_SIM_CACHE_KEY, else $XDG_CONFIG_HOME/vegas-sim/cache.key, else
~/.config/vegas-sim/cache.key), matches its bytes and its key. A planted or tampered file is
never unpickled: it is a miss, fitted again and overwritten. Writes are atomic
(`files.atomic_write`); the folder is bounded ($VEGAS_SIM_CACHE_MAX_MB, default
DEFAULT_MAX_MB) and evicts the least recently used entries first. A cache that cannot be read
or written is skipped (it is only a speed-up); a refused folder or key says so once on stderr.

Where: $VEGAS_SIM_CACHE_DIR, else $XDG_CACHE_HOME/vegas-sim, else ~/.cache/vegas-sim.
VEGAS_SIM_CACHE=0 turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import mmap
import os
import pickle
import re
import secrets
import stat
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from vegas_sim.files import atomic_write

T = TypeVar("T")

# An entry: MAGIC, 32-byte HMAC, then the signed body: the count of out-of-band buffers, the
# lengths of the pickle and of each buffer (8 bytes each, little-endian), the pickle, the
# buffers. Arrays travel out of band, so that reading an entry does not copy them again.
MAGIC = b"vegas-sim fit cache 3\n"
SUFFIX = ".fit"
DEFAULT_MAX_MB = 2048.0  # a few trace sets' fits across a few code versions
_MAC_BYTES = 32
_PACKAGE = "vegas_sim"
_warned: set[str] = set()
_ROOT = Path(__file__).resolve().parent  # the package's source folder


# ------------------------------------------------------------------------------------ where
def cache_dir() -> Path | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get("VEGAS_SIM_CACHE", "1") == "0":
        return None
    if os.environ.get("VEGAS_SIM_CACHE_DIR"):
        return Path(os.environ["VEGAS_SIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vegas-sim"


def key_file() -> Path:
    """The per-user secret that signs entries, outside the cache folder."""
    if os.environ.get("VEGAS_SIM_CACHE_KEY"):
        return Path(os.environ["VEGAS_SIM_CACHE_KEY"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "vegas-sim" / "cache.key"


def max_bytes() -> int:
    """The folder's size bound ($VEGAS_SIM_CACHE_MAX_MB; a bad value keeps the default)."""
    try:
        mb = float(os.environ.get("VEGAS_SIM_CACHE_MAX_MB", DEFAULT_MAX_MB))
    except ValueError:
        mb = DEFAULT_MAX_MB
    if not 0 <= mb < float("inf"):  # NaN, negative or infinite
        mb = DEFAULT_MAX_MB
    return int(mb * 1e6)


def _warn_once(what: Path, why: str, fix: str) -> None:
    if str(what) not in _warned:
        _warned.add(str(what))
        print(f"vegas-sim: fit cache off: {what} {why}; {fix}", file=sys.stderr)


# ------------------------------------------------------------------------------------- key
def _module_file(name: str) -> Path | None:
    """The source file of vegas_sim module `name` (a package's __init__), without importing."""
    parts = name.split(".")
    if parts[0] != _PACKAGE:
        return None
    root = _ROOT.joinpath(*parts[1:])
    for candidate in (root.with_suffix(".py"), root / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


_FROM_IMPORT = re.compile(  # from vegas_sim.x import a, b  |  from vegas_sim.x import (a,\n b)
    rf"^[ \t]*from[ \t]+({_PACKAGE}(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|(?:[^\n\\]|\\\n)*)",
    re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+((?:[^\n\\]|\\\n)*)", re.MULTILINE)


def _imported_names(source: str) -> set[str]:
    """Every vegas_sim module a source file imports, at module level or inside a function
    (`from vegas_sim.sim import latency` names both the package and the module).

    A line scan, not `ast.parse` (parsing every module the fit reads slowed each command):
    an import-looking line inside a string adds a name, which only widens the key (a miss,
    never a stale hit); tests/test_fitcache.py checks it finds what the AST finds."""
    names: set[str] = set()
    for m in _FROM_IMPORT.finditer(source):
        module = m.group(1)
        names.add(module)
        names.update(f"{module}.{alias}" for alias in _aliases(m.group(2).strip("()")))
    for m in _IMPORT.finditer(source):
        names.update(_aliases(m.group(1)))
    return {n for n in names if n.split(".")[0] == _PACKAGE}


def _aliases(names: str) -> list[str]:
    """'a as b, c  # note' (continuation lines and comments allowed) -> ['a', 'c']."""
    plain = re.sub(r"#[^\n]*", "", names).replace("\\", " ")
    return [part.split()[0] for part in plain.split(",") if part.strip()]


@functools.lru_cache(maxsize=None)
def _imports_of(path: Path) -> frozenset[str]:
    """The vegas_sim modules one source file imports (read once per process)."""
    return frozenset(_imported_names(path.read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=32)
def _closure(roots: tuple[str, ...]) -> tuple[tuple[Path, ...], str]:
    """(the source files of `roots` and of every vegas_sim module they import, transitively;
    the sha256 of their paths and bytes), once per process: the package's files do not change
    under a running command."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        todo.extend(_imports_of(path))
    paths = tuple(sorted(set(seen.values())))
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(_ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
    return paths, h.hexdigest()


def fit_modules(code: tuple[ModuleType, ...]) -> tuple[Path, ...]:
    """The source files a fit by `code`'s modules reads: those modules and every vegas_sim
    module they import, transitively (models.py, methods.py, gpus.py, errors.py, ...)."""
    return _closure(tuple(sorted(m.__name__ for m in code)))[0]


def _code_hash(code: tuple[ModuleType, ...]) -> str:
    return _closure(tuple(sorted(m.__name__ for m in code)))[1]


def cache_key(kind: str, meta: dict[str, Any], data_file: str,
              code: tuple[ModuleType, ...]) -> str | None:
    """Key of a model fitted by `code` from `data_file` of a trace set with `meta`: the whole
    meta (its content_hash narrowed to `data_file`, so that a fit does not miss when only
    another table changed), the data's hash and the fitting code. None when the set has no
    content hash (an in-memory set): such fits are not cached."""
    content = (meta.get("content_hash") or {}).get(data_file)
    if not content:
        return None
    ident = {"kind": kind, "meta": {**meta, "content_hash": {data_file: content}},
             "code": _code_hash(code)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=repr).encode()).hexdigest()


def key(kind: str, ident: dict[str, Any], code: tuple[ModuleType, ...]) -> str:
    """Key of a value computed by `code` from what `ident` (JSON-able) names, e.g. a file's
    sha256: an edit of that code, or another `ident`, misses."""
    whole = {"kind": kind, "ident": ident, "code": _code_hash(code)}
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=repr).encode()).hexdigest()


# ---------------------------------------------------------------------------- private places
def _private_dir(folder: Path) -> bool:
    """Make `folder` (0700) or check that it is a folder of the user's own, tightened to 0700;
    False (said once on stderr): another user's folder, not a folder, or not writable."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            _warn_once(folder, "is not a folder owned by you",
                       "set VEGAS_SIM_CACHE_DIR to a folder of your own (or VEGAS_SIM_CACHE=0)")
            return False
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700)  # the user's own: entries are checked by their HMAC anyway
        return True
    except OSError:
        return False


def _read_private(path: Path) -> mmap.mmap | bytes | None:
    """The bytes of `path` if it is a regular file the user owns that no one else may read or
    write (no symlink followed); None otherwise. OSError (e.g. missing) propagates. Mapped
    copy-on-write: arrays unpickled out of band from it are writable, as unpickled arrays are,
    and no page is copied until written (entries are replaced by rename, never rewritten)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        if st.st_size == 0:
            return b""
        return mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def _secret() -> bytes | None:
    """The per-user signing key, made on first use (32 random bytes, 0600, linked into place
    so that two first runs agree on one); None when it cannot be made or is not private."""
    path = key_file()
    if not _private_dir(path.parent):
        return None
    try:
        if not os.path.lexists(path):
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache.key.")
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        secret = _read_private(path)
    except OSError:
        return None
    if not secret:
        _warn_once(path, "is not a file of yours that only you can read",
                   "delete it (a new key is made; cached fits are then fitted again)")
    return bytes(secret) if secret else None


def _mac(secret: bytes, key: str, payload: bytes | memoryview) -> bytes:
    mac = hmac.new(secret, key.encode() + b"\0", hashlib.sha256)
    mac.update(payload)
    return mac.digest()


# ------------------------------------------------------------------------------ read / write
def _load(path: Path, key: str, secret: bytes) -> tuple[bool, Any]:
    """(True, value) for an entry the user wrote under `key`; (False, None) otherwise: missing,
    not the user's, another format, or bytes the HMAC does not sign. Nothing unverified is
    unpickled."""
    try:
        blob = _read_private(path)
    except OSError:
        return False, None
    head = len(MAGIC) + _MAC_BYTES
    if blob is None or len(blob) < head or blob[:len(MAGIC)] != MAGIC:
        return False, None
    body = memoryview(blob)[head:]
    if not hmac.compare_digest(bytes(blob[len(MAGIC):head]), _mac(secret, key, body)):
        return False, None
    try:
        value = _unpack(body)
    except Exception:  # noqa: BLE001 - signed but unreadable (another Python): fit again
        return False, None
    try:
        os.utime(path)  # a hit is recent use: evicted last
    except OSError:
        pass
    return True, value


def _pack(value: object) -> bytes:
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [len(payload), *(r.nbytes for r in raws)]
    header = struct.pack(f"<{len(sizes) + 1}Q", len(raws), *sizes)
    return b"".join([header, payload, *raws])


def _unpack(body: memoryview) -> Any:
    """The value `_pack` wrote; its arrays share `body`'s (writable) memory, not copies."""
    (count,) = struct.unpack_from("<Q", body)
    sizes = struct.unpack_from(f"<{count + 1}Q", body, 8)
    start = 8 * (count + 2)
    parts = []
    for size in sizes:
        parts.append(body[start:start + size])
        start += size
    return pickle.loads(parts[0], buffers=parts[1:])  # noqa: S301 - signed by the user's key


def _store(folder: Path, path: Path, key: str, secret: bytes, value: object) -> None:
    body = _pack(value)
    blob = MAGIC + _mac(secret, key, body) + body
    atomic_write(path, lambda tmp: tmp.write_bytes(blob), mode=0o600)
    evict(folder, max_bytes(), keep=path)


def evict(folder: Path, limit: int, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used entries of `folder` until they total at most `limit`
    bytes (`keep`, the entry just written, goes last). Returns what was deleted."""
    entries = []
    for p in folder.glob(f"*{SUFFIX}"):
        try:
            st = p.lstat()
        except OSError:
            continue
        entries.append((p == keep, st.st_mtime_ns, st.st_size, p))
    entries.sort()
    total = sum(e[2] for e in entries)
    gone: list[Path] = []
    for _, _, size, p in entries:
        if total <= limit:
            break
        try:
            p.unlink()
        except OSError:
            continue
        total -= size
        gone.append(p)
    return gone


def cached(key: str | None, build: Callable[[], T]) -> T:
    """build(), or its result stored under `key` by an earlier call of this user."""
    folder = cache_dir()
    if key is None or folder is None or not _private_dir(folder):
        return build()
    secret = _secret()
    if secret is None:
        return build()
    path = folder / f"{key[:32]}{SUFFIX}"
    hit, value = _load(path, key, secret)
    if hit:
        return value  # type: ignore[no-any-return]
    value = build()
    try:
        _store(folder, path, key, secret, value)
    except Exception:  # noqa: BLE001, S110 - a full disk or unpicklable value loses the speed-up
        pass
    return value
