"""What each acceptance workload is, in one line, and the prompt lengths it ships: for the
`--workload` help texts, `vegas-sim traces show` and the prediction notes (neither sim/ nor
calibrate/, so both may read it). The prompts themselves are built in
calibrate/workloads.py; a trace set says which of them it traced and over which contexts."""

from __future__ import annotations

# name -> what it is and where its text comes from
WORKLOAD_INFO: dict[str, str] = {
    "reasoning": "math problems to reason through step by step (AIME 2024/2025, GSM8K), "
                 "chat-templated, long outputs",
    "code": "HumanEval function stubs to complete (completion, not reasoning about code), "
            "chat-templated",
    "chat": "MT-Bench first turns (8 categories), chat-templated",
    "longdoc": "Project Gutenberg book windows to continue (raw text)",
    "recall": "a book window, then an instruction to quote a passage cued from far back",
    "code-long": "a long Python standard-library module window to continue (past 8K: a "
                 "package's modules in a row), chat-templated",
    "chat-long": "a long multi-turn history (MT-Bench questions with reference answers; past "
                 "8K also GSM8K exchanges) ending on a new MT-Bench question, ChatML",
    "competitive": "competitive programming (Codeforces 2024 / CodeContests statements, "
                   "reason then write a program, as CodeElo-style benchmarks run), acceptance "
                   "traced along long generations",
}
# name -> the prompt lengths shipped for SmolLM2 (workloads/smollm2-135m*.npz), tokens
SHIPPED_PROMPTS: dict[str, str] = {
    "reasoning": "76-683", "code": "100-372", "chat": "42-380",
    "longdoc": "1K-7K (12K-31K with --long-prompts)",
    "recall": "1K-7K (12K-31K with --long-prompts)",
    "code-long": "1K-7K (12K-31K with --long-prompts)",
    "chat-long": "1K-7K (12K-31K with --long-prompts)", "competitive": "382-1074",
}


def describe(workload: str | None) -> str:
    """One line: what the workload is ('all traced workloads, pooled' for None)."""
    if workload is None:
        return "all traced workloads, pooled"
    return WORKLOAD_INFO.get(workload, "a workload of the trace set (not a shipped one)")


def workload_help() -> str:
    """The names, what each is and its shipped prompt lengths, for a --workload help."""
    return "; ".join(f"{name}: {what} ({SHIPPED_PROMPTS[name]}-token prompts)"
                     for name, what in WORKLOAD_INFO.items())
