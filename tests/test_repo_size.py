"""The tracked tree stays small: a device call carries it next to half of the SmolLM2 GGUF
(49 MB: `split -n 2` of the 98 MB file) under a 64 MiB limit (benchmarks/gpu/h200_session.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20
GGUF_HALF = 49_181_216  # .model/smollm2.gguf.part.aa and .ab (equal halves)


def test_tracked_tree_leaves_room_for_half_the_gguf() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    size = sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())
    assert size + GGUF_HALF < LIMIT - 2 * 2**20, f"tracked files take {size / 1e6:.1f} MB"
