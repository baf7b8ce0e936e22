"""The callbacks a long job reports through, one type per shape, shared by every layer."""

from __future__ import annotations

from collections.abc import Callable

# progress(done, total): sweep and predict
Progress = Callable[[int, int], None]
# progress(done, total, label): calibrate and validate, the label naming the point at work
LabelledProgress = Callable[[int, int, str], None]
# progress(step, done, total): tune and the CLI's bars, one bar a step
StepProgress = Callable[[str, int, int], None]
# say(text): one line for the user
Say = Callable[[str], None]
