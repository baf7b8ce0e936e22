"""Every refusal the package raises says what to do: each `UserInputError(...)` call in
vegas_sim passes `fix=` (errors.py: which input, why, what to do)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vegas_sim"


def refusals_without_a_fix() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "UserInputError"
                    and not any(k.arg in ("fix", None) for k in node.keywords)):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_every_user_input_error_says_what_to_do() -> None:
    assert refusals_without_a_fix() == []
