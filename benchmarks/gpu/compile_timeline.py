"""Which Triton kernels a run compiled, and when: one line per entry of a Triton cache
directory (the kernel's name, the entry's time), oldest first, beside a trace
set's progress.jsonl (points and their end times). Used to find recompiles in a calibration
(H200 runs 35-36).

    python benchmarks/gpu/compile_timeline.py CACHE_DIR [TRACE_SET_DIR]
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path


def compiled(cache: Path) -> list[tuple[float, str]]:
    """(mtime, kernel name) of every compiled kernel's metadata file in the cache."""
    out = []
    for meta in cache.glob("*/*.json"):
        if meta.name.startswith("__grp__"):
            continue
        try:
            name = json.loads(meta.read_text()).get("name")
        except (OSError, ValueError):
            continue
        if name:
            out.append((meta.stat().st_mtime, str(name)))
    return sorted(out)


def points(trace_set: Path) -> list[tuple[float, str]]:
    rows = [json.loads(line) for line in (trace_set / "progress.jsonl").read_text().splitlines()]
    return [(datetime.fromisoformat(r["time"]).timestamp(), f"POINT {r['key']} {r['status']}")
            for r in rows]


def main(argv: list[str]) -> int:
    events = compiled(Path(argv[0])) + (points(Path(argv[1])) if len(argv) > 1 else [])
    events.sort()
    t0 = events[0][0] if events else 0.0
    for t, what in events:
        stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")
        print(f"{t - t0:8.1f} s  {stamp}  {what}")
    names = [w.split()[0] for _, w in events if not w.startswith("POINT")]
    print(f"{len(names)} compiled kernels:",
          ", ".join(f"{n} x{names.count(n)}" for n in sorted(set(names))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
