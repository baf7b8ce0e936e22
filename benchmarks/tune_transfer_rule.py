"""What tune would choose were the anchors' shape-transfer term in its selection rule.

Tune compares `pi_low_shape` (the prediction interval's low end without an anchored
acceptance's shape-transfer term) with vanilla (`sim.tune_rules.lower_score`); the printed
interval keeps the term. This runs the same tune twice on the CPU, as shipped and with the rule
given the full `pi_low` (each row's `pi_low_shape` set to its `pi_low`), and prints each cell's
line both ways.

    PYTHONPATH=. python benchmarks/tune_transfer_rule.py [--batch 1,4,16] [--context 32K,120K]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Callable, Iterator
from typing import Any

import vegas_sim.sim.predict as predict_module
from vegas_sim.cli import main as cli_main


@contextlib.contextmanager
def full_pi_low() -> Iterator[None]:
    """Every predicted row's `pi_low_shape` is its `pi_low` while inside."""
    orig: Callable[..., dict[str, Any]] = predict_module.interval_columns

    def with_full(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = orig(*args, **kwargs)
        out["pi_low_shape"] = out["pi_low"]
        return out

    predict_module.interval_columns = with_full  # type: ignore[assignment]
    try:
        yield
    finally:
        predict_module.interval_columns = orig  # type: ignore[assignment]


def cells(batch: str, context: str, out: str) -> list[str]:
    """The 'B=...' lines of one in-process `vegas-sim tune` (one worker: the patch holds)."""
    sys.argv = ["vegas-sim", "tune", "--batch", batch, "--context", context, "--workers", "1",
                "--out", out]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            cli_main()
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    return [line for line in buf.getvalue().splitlines() if line.startswith("B=")]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--context", default="32K,120K")
    args = ap.parse_args()
    shipped = cells(args.batch, args.context, "/tmp/tune_transfer_rule_shipped.json")
    with full_pi_low():
        full = cells(args.batch, args.context, "/tmp/tune_transfer_rule_full.json")
    print("as shipped (the rule without the shape-transfer term):")
    print("\n".join("  " + line for line in shipped))
    print("with the full pi_low in the rule:")
    print("\n".join("  " + line for line in full))


if __name__ == "__main__":
    main()
