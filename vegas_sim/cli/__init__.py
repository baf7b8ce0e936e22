"""The `vegas-sim` command line. Commands only parse, check and call the library.

The commands live in `vegas_sim.cli.group` (`cli`, the click group). This module stays light:
the console script's `main` imports them inside its Ctrl-C handling, so an interrupt while
numpy, pandas and scipy load (the first seconds of every command) ends as cleanly as one
while the command runs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from typing import Any

# What an interrupted command leaves, as `main` says it (keyed by the command's words).
INTERRUPTED = {
    "predict": "predict writes its output only when it finishes: nothing was written",
    "tune": "tune writes --out only when it finishes: nothing was written",
    "report": "report writes its page and its CSVs together, once all are made: nothing was "
              "written (a previous report there is as it was)",
    "sweep": "sweep keeps every configuration it finished (OUT.partial/, and a partial --out "
             "once a chunk is done); the same command resumes",
    "calibrate": "calibrate keeps the points it finished in --out; the same command resumes",
    "validate": "validate keeps what it measured in --out; the same command with --resume "
                "continues it",
    "traces merge": "every command refuses the half-written OUT: delete it and merge again",
    "traces subset": "every command refuses the half-written --out: delete it and run the "
                     "subset again",
    "traces finalize": "run it again: finalize rebuilds the same files from the parts",
    "traces import-vllm": "the anchors file is written only when the import finishes; a "
                          "half-written --trace-set directory is refused: delete it and import "
                          "again",
}
NOTHING_WRITTEN = "nothing was written"


def __getattr__(name: str) -> Any:
    """`vegas_sim.cli.cli`, the click group, imported on first use."""
    if name == "cli":
        from vegas_sim.cli.group import cli

        return cli
    raise AttributeError(f"module 'vegas_sim.cli' has no attribute {name!r}")


def command_words(argv: list[str]) -> str:
    """The command an argument list runs: 'predict', 'traces merge' ('' for none)."""
    words = [a for a in argv if not a.startswith("-")][:2]
    if words[:1] == ["traces"]:
        return " ".join(words)
    return words[0] if words else ""


def interrupted_note(argv: list[str]) -> str:
    """What an interrupt of the command `argv` runs has left on disk."""
    return INTERRUPTED.get(command_words(argv), NOTHING_WRITTEN)


def _exit_now(signum: int, frame: object) -> None:
    os._exit(130)


def main() -> None:
    """The console script: click's own handling, except that Ctrl-C exits 130 (the shell's
    code for SIGINT) with one line saying what was kept, never a traceback: while the
    commands are imported, while one runs, or while the process exits."""
    argv = sys.argv[1:]
    # What the command imports (numpy, pandas, the library) lives until the process ends:
    # imported without the cyclic collector's passes, which would walk it again and again
    # and find nothing, then frozen out of them (docs/RESULTS.md, Simulator).
    gc.disable()
    try:
        import click

        from vegas_sim.cli.group import cli, import_command

        with contextlib.suppress(Exception):  # a failing import fails again, as usual, below
            import_command(command_words(argv).split(" ")[0])
        gc.freeze()
        gc.enable()
        try:
            code = cli.main(args=argv, prog_name="vegas-sim", standalone_mode=False)
        except click.ClickException as e:
            e.show()
            code = e.exit_code
        except click.Abort:  # click's name for a KeyboardInterrupt in a command
            raise KeyboardInterrupt from None
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, _exit_now)  # a second Ctrl-C: no traceback either
        sys.stderr.write(f"\ninterrupted: {interrupted_note(argv)}\n")
        code = 130
    signal.signal(signal.SIGINT, _exit_now)  # the command is done: an interrupt now just exits
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
