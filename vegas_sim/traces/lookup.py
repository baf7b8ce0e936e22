"""Where trace sets are: the packaged ones (`vegas_sim/traces/default/<name>/`), and the
directory a path or a packaged set's bare name stands for."""

from __future__ import annotations

from pathlib import Path

from vegas_sim.traces.schema import (
    META_FILE,
)

# Packaged sets (made by `vegas-sim calibrate`); each may be named by its directory's name.
PACKAGED_DIR = Path(__file__).parent / "default"


# ============================================================================ locating
def packaged_sets(packaged_dir: Path | None = None) -> list[Path]:
    """Directories of the packaged trace sets (those holding a meta.json), sorted by name."""
    root = PACKAGED_DIR if packaged_dir is None else packaged_dir
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / META_FILE).is_file())


def is_bare_name(path: Path) -> bool:
    """'qwen3-8b-h200', not 'traces/x', '/x', '.' or '..' ('./x' is 'x' to pathlib and click,
    but a path that exists is never looked up)."""
    return len(path.parts) == 1 and path.name not in ("", ".", "..") and not path.is_absolute()


def trace_set_dir(path: str | Path, packaged_dir: Path | None = None) -> Path:
    """The directory `path` names: itself when it exists (paths always win), else, for a bare
    name, the packaged set of that name if there is one, else `path` unchanged (the loader
    then says what is wrong). `packaged_dir`: where packaged sets live (tests move it)."""
    given = Path(path)
    if given.exists() or given.is_symlink() or not is_bare_name(given):
        return given
    packaged = {p.name: p for p in packaged_sets(packaged_dir)}
    return packaged.get(given.name, given)
