"""The package's dependency rules (docs/DESIGN.md, Layout): the two halves meet only at the trace
set. Every import counts, at module top or inside a function, TYPE_CHECKING blocks too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vegas_sim"

# What each part may import (besides itself). The base modules import only each other.
BASE = {"errors", "bounds", "methods", "models", "gpus", "grids", "files", "workload_info",
        "progress"}
ALLOWED = {
    **{b: BASE for b in BASE},
    "kernels": BASE,
    # fitcache (the signed on-disk cache; it imports only files) records checked trace tables
    # and cached quantiles as well as fits
    "traces": BASE | {"fitcache"},
    "sim": BASE | {"traces", "fitcache"},
    "fitcache": BASE,
    "api": BASE | {"sim", "traces", "fitcache"},
    "calibrate": BASE | {"kernels", "traces"},
    "reports": BASE | {"traces", "sim"},
    # runs: a sweep that writes as it goes (checkpoint, partial table, resume). The sim layer
    # yields finished chunks and writes nothing; this part owns their files on disk.
    "runs": BASE | {"sim", "reports"},
    "validate": BASE | {"api", "sim", "traces", "calibrate"},
    "cli": BASE | {"api", "sim", "traces", "calibrate", "validate", "reports", "runs"},
}


def _part(module: str) -> str | None:
    """'vegas_sim.sim.engine' → 'sim'; 'vegas_sim' itself → None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "vegas_sim" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "vegas_sim":  # from vegas_sim import api
                found |= {f"vegas_sim.{alias.name}" for alias in node.names}
    return found


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer part, imported part) → the files with such an import."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        here = _part(".".join(rel.parts))
        if here in (None, "__init__", "__main__"):
            continue
        for module in _imports(path):
            there = _part(module)
            if there is not None and there != here and there != "__init__":
                edges.setdefault((here, there), []).append(str(rel))
    return edges


def test_every_part_has_a_rule() -> None:
    parts = {_part("vegas_sim." + p.stem if p.is_file() else "vegas_sim." + p.name)
             for p in PACKAGE.iterdir() if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    parts -= {None, "__init__", "__main__"}
    assert parts <= set(ALLOWED), f"no dependency rule for {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("importer", sorted(ALLOWED))
def test_imports_follow_the_layers(importer: str) -> None:
    bad = {there: files for (here, there), files in _edges().items()
           if here == importer and there not in ALLOWED[importer]}
    assert not bad, f"{importer} may not import {sorted(bad)}: {bad}"


def test_no_cycle_between_parts() -> None:
    graph: dict[str, set[str]] = {}
    for here, there in _edges():
        graph.setdefault(here, set()).add(there)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(p for p in graph if reaches(p, p, {p}))
    assert not cycles, f"parts in an import cycle: {cycles}"


def test_the_rules_catch_an_upward_import(tmp_path: Path) -> None:
    """The parser sees imports inside functions and `from vegas_sim import x` forms."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from vegas_sim.calibrate import grid\n"
                 "from vegas_sim import validate\n")
    assert {_part(m) for m in _imports(f)} - {None} == {"calibrate", "validate"}
