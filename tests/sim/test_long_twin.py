"""A lookup of a short-prompt workload far past its traced prompts names the long twin of its
kind (code-long for HumanEval's code, chat-long for MT-Bench's chat) where that twin was traced
at the asked context; inside the traced prompts, or without a twin, nothing is added."""

from __future__ import annotations

from vegas_sim import api


def _notes(workload: str, context: int) -> str:
    real = api._fit_packaged("smollm2-135m-real")
    return " | ".join(real.lookup("magicdec-stream", 12, 0.05, context, workload, 0.6,
                                  output_len=128).extrapolated)


def test_far_past_its_prompts_a_workload_names_its_long_twin() -> None:
    for workload in ("code", "chat"):
        note = _notes(workload, 5600)
        assert "context trend" in note
        assert f"--workload {workload}-long predicts this context" in note, note


def test_no_twin_is_named_inside_the_prompts_below_the_twin_or_without_one() -> None:
    assert "-long" not in _notes("code", 200)  # inside code's traced prompts
    assert "--workload code-long" not in _notes("code", 700)  # below code-long's 1K
    assert "--workload" not in _notes("reasoning", 5600)  # reasoning has no long twin
