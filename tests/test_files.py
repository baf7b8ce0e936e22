"""files.write_together: several files written as one output (a report and its CSVs)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.files import write_together


def _writer(text: str):  # type: ignore[no-untyped-def]
    return lambda tmp: tmp.write_text(text)


def test_ctrl_c_while_the_files_are_renamed_waits_for_the_last(tmp_path: Path) -> None:
    """SIGINT arrives as the renames start: every file is in place before the interrupt."""
    paths = [tmp_path / f"f{i}.txt" for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        write_together([(p, _writer(p.name)) for p in paths],
                       before_commit=lambda: os.kill(os.getpid(), signal.SIGINT))
    assert [p.read_text() for p in paths] == ["f0.txt", "f1.txt", "f2.txt"]
    assert sorted(q.name for q in tmp_path.iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_failure_while_staging_leaves_every_path_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old a")

    def full(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(UserInputError, match="No space left") as e:
        write_together([(tmp_path / "a.txt", _writer("new a")), (tmp_path / "b.txt", full)])
    assert e.value.where == "--out" and "free space" in (e.value.fix or "")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "old a"
