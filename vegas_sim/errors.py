"""Errors a user can fix. The CLI turns them into `click.ClickException` (exit 1)."""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input: says what was wrong, where (file, column, option) and how to fix it."""

    def __init__(self, problem: str, *, where: str | None = None, fix: str | None = None):
        self.problem = problem
        self.where = where
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        text = f"{self.where}: {self.problem}" if self.where else self.problem
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class TraceSetError(UserInputError):
    """A trace set is missing, malformed, corrupt or used for what it cannot answer."""


class DoesNotFitError(UserInputError):
    """A configuration the model or the GPU cannot hold: a prompt plus output longer than the
    model's positions, or a batch whose KV cache does not fit next to the weights. One
    configuration fails with it; a grid (sweep, tune) skips such points and says which."""
