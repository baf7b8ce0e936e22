"""Workloads: token-id prompts built on the CPU from the evaluation datasets, shipped per model.

    reasoning  AIME 2024 + AIME 2025 + GSM8K problems, "reason step by step" (short prompt,
               long output), chat-templated
    code       HumanEval function stubs to complete, chat-templated
    chat       MT-Bench first turns (all 8 categories), chat-templated
    longdoc    Project Gutenberg book text (body between the *** START/END OF markers) as raw
               continuation windows of 1K, 2K, 4K and 7K tokens, 32 of each (SmolLM2 holds
               8192 positions, so 7K leaves room for the output), then 32 of 3K
               (LONGDOC_ADDED_LENGTHS, drawn after the others from a stream of their own)
    recall     long-range recall: a book window, then an instruction to quote the passage
               that follows a cue copied from the window, then the cue; the answer lies at a
               recorded distance from the prompt's end (RECALL_DEPTHS of the window), so a
               draft that sees only recent tokens cannot find it. Prompts of exactly
               RECALL_LENGTHS tokens (1K-7K), 32 of each; `recall.answer_start` /
               `recall.distance` per prompt
    code-long  long source context: a window of a long Python standard-library module
               (CODE_LONG_FILES of CPython CODE_LONG_PYTHON, starting at a def/class line),
               then an instruction to continue the file; chat-templated, exactly
               ADDED_LENGTHS tokens (1K-7K), 8 of each, one of each length per round
    chat-long  long multi-turn chat: MT-Bench two-turn questions with their GPT-4 reference
               answers as earlier turns, chained in a seeded order, ending on an MT-Bench first
               turn to answer; ChatML, exactly ADDED_LENGTHS tokens (the earliest turn cut at
               its start, as a server truncating a long history would), 8 of each length
    competitive
               competitive programming (what CodeElo-style benchmarks run): a Codeforces 2024
               (DeepCoder) or CodeContests problem statement, asked for reasoning then a
               Python program; chat-templated, 150-1.5K-token prompts whose acceptance is
               traced along long generations (the per-iteration context is prompt + generated)

"chat-templated" is the model's ChatML turn (SmolLM2, Qwen); a base model without ChatML's
tokens (Gemma-3-270M) gets no template: the same text, plain (Tokenizer.chat_text). Every
prompt, book windows included, starts with the model's BOS where its tokenizer adds one
(Gemma; SmolLM2 adds none).

`build_workloads()` tokenizes the datasets with the model's own tokenizer and writes
`workloads/<model>.npz` (this is run once, here, and the file is shipped); `load_workload()`
reads it. Selection is deterministic (seeded numpy Generator).

Long windows (`build_long_workloads()`, `workloads/<model>.long.npz`, `long=True` when
loading): longdoc, recall, code-long and chat-long at LONG_LENGTHS (12K–32K tokens), past SmolLM2's trained 8K, for
acceptance traced with the RoPE extended by YaRN (`calibrate --rope-scaling yarn:4
--long-prompts`). A file of its own, so that the shipped prompts' order, which the request ids
of existing trace sets index, never changes. A change to a workload's shipped prompts goes with
its rows of every packaged set measured again (tests check request ids against prompt lengths).
The workloads after recall (ADDED_WORKLOADS) each draw from a seeded stream of their own, so
none of them moves another's prompts.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vegas_sim.calibrate.tokenizer import Tokenizer
from vegas_sim.errors import UserInputError

# Drawn in this order from one seeded stream (build_prompts); the shipped prompts' order
FIRST_WORKLOADS: tuple[str, ...] = ("reasoning", "code", "chat", "longdoc", "recall")
# Each from a stream of its own (ADDED_SEEDS), added after the first ones were traced
ADDED_WORKLOADS: tuple[str, ...] = ("code-long", "chat-long", "competitive")
WORKLOADS: tuple[str, ...] = FIRST_WORKLOADS + ADDED_WORKLOADS
# Windows of a book (the question, if any, at the end); every other workload's prompt ends on
# the request and the assistant's turn
BOOK_WINDOW_WORKLOADS: tuple[str, ...] = ("longdoc", "recall")
# Prompts that end on a question about the text before it, which any cut loses
WHOLE_PROMPT_WORKLOADS: tuple[str, ...] = ("recall",)
ADDED_SEEDS = {"code-long": 3, "chat-long": 4, "competitive": 5}
# code-long / chat-long prompt lengths (longdoc's and recall's buckets), tokens
ADDED_LENGTHS: tuple[int, ...] = (1024, 2048, 3072, 4096, 7168)
ADDED_PER_LENGTH = 8
# Long modules of the standard library installed here (20K-60K tokens each); the builder
# refuses another Python version, whose files differ
CODE_LONG_PYTHON = "3.11.7"
CODE_LONG_FILES: tuple[str, ...] = (
    "argparse.py", "ast.py", "datetime.py", "difflib.py", "doctest.py", "enum.py",
    "inspect.py", "ipaddress.py", "mailbox.py", "pdb.py", "pickle.py", "pydoc.py",
    "subprocess.py", "tarfile.py", "typing.py", "zipfile.py")
# chat-long's 12K-32K histories: GSM8K exchanges (about 200 tokens each) beside MT-Bench's,
# numbered past MT-Bench's question ids
TUTORING_EXCHANGES = 400
GSM8K_ID_BASE = 10_000
# Packages whose modules, read in a row, make the 12K-32K code windows (no one module is long
# enough)
CODE_LONG_PACKAGES: tuple[str, ...] = (
    "asyncio", "email", "multiprocessing", "tkinter", "importlib", "xml", "http", "lib2to3")
CODE_LONG_START = re.compile(r"^(?:class |def |    def |@)", flags=re.MULTILINE)
CODE_LONG_INSTRUCTION = (
    "\n```\n\nThe Python source above (Lib/{name} of CPython {version}) stops part-way. "
    "Continue it from exactly where it stops; reply with the code that follows in a "
    "```python block.")
COMPETITIVE_PER_SOURCE = 16  # Codeforces and CodeContests problems, interleaved
COMPETITIVE_MAX_TOKENS = 1536  # statements longer than this are skipped (room for the output)
COMPETITIVE_PROMPT = (
    "{problem}\n\nSolve this competitive programming problem. First reason step by step "
    "about an efficient approach, then write a complete Python 3 program that reads from "
    "standard input and writes to standard output, in a ```python block.")
CHATML_TURN = "<|im_start|>{role}\n{content}<|im_end|>\n"
PLAIN_TURN = "{Role}: {content}\n\n"  # a base model's history (no chat template)
LONGDOC_LENGTHS: tuple[int, ...] = (1024, 2048, 4096, 7168)
LONGDOC_PER_LENGTH = 32  # windows of each length (longdoc_prompts)
# Appended after the LONGDOC_LENGTHS windows, from their own seeded stream, so that the earlier
# windows (and every workload drawn after longdoc) keep their draws and request ids. 3K gives
# longdoc's context trend fitted on <= 3K a third bucket, as recall has
LONGDOC_ADDED_LENGTHS: tuple[int, ...] = (3072,)
LONGDOC_ADDED_SEED = 2
MAX_WINDOW_DRAWS = 100  # redraws of a window whose start another window of its length took
WORKLOAD_DIR = Path(__file__).resolve().parent / "workloads"
# Whole prompt, tokens. 3K gives a context trend fitted on <= 3K three buckets, not two
RECALL_LENGTHS: tuple[int, ...] = (1024, 2048, 3072, 4096, 7168)
# Where the cue starts, as a fraction of the book window: 0.1 is far back, 0.95 recent
RECALL_DEPTHS: tuple[float, ...] = (0.1, 0.4, 0.7, 0.95)
# Windows per (length, depth), one round of cells after another. A recall prompt's acceptance
# varies far more than a longdoc window's (the 135M model copies some passages, not others),
# so a length's mean acceptance length needs more of them than a longdoc length does
RECALL_PER_CELL = 8
LONG_LENGTHS: tuple[int, ...] = (12288, 16384, 24576, 31744)  # 31K: room for the output in 32K
LONG_LONGDOC_PER_LENGTH = 4
LONG_RECALL_PER_CELL = 1
LONG_SEED = 1  # its own stream: the long windows never move the shipped prompts' draws
LONG_ADDED_PER_LENGTH = 4  # code-long / chat-long windows of each LONG_LENGTHS length
RECALL_CUE = 24  # cue tokens, copied from the window
RECALL_ANSWER = 64  # tokens of the window after the cue: the passage to quote
RECALL_INSTRUCTION = ("\n\n---\nQuote, word for word, the passage of the text above that "
                      "begins with these words:\n\n")

REASONING_PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CODE_PROMPT = "Complete the following Python function. Reply with the full function in a ```python block.\n\n```python\n{prompt}```"
BOOKS = ("pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt", "pg1342_pride_and_prejudice.txt")
LONG_BOOKS = BOOKS[1:]  # Alice (~36K tokens) holds no distinct 32K windows


@dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids and where it came from (dataset:id, or book@char offset).
    Recall prompts also say where their answer starts (index into tokens)."""

    workload: str
    source: str
    tokens: list[int]
    answer_start: int | None = None

    @property
    def distance(self) -> int | None:
        """Tokens from the start of the answer passage to the end of the prompt."""
        return None if self.answer_start is None else len(self.tokens) - self.answer_start


def default_datasets_dir() -> Path:
    """$VEGAS_SIM_DATASETS, else ../shared/datasets next to the repository."""
    env = os.environ.get("VEGAS_SIM_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "datasets"


def check_workload(name: str) -> str:
    if name not in WORKLOADS:
        raise UserInputError(f"unknown workload {name!r}", where="--workload",
                             fix=f"use one of: {', '.join(WORKLOADS)}")
    return name


# ---- reading the datasets ----------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserInputError("dataset file missing", where=str(path),
                             fix="point VEGAS_SIM_DATASETS at the shared datasets directory")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _pick(items: list[Any], n: int, rng: np.random.Generator) -> list[Any]:
    """n items without replacement, in dataset order (stable source ids)."""
    idx = np.sort(rng.choice(len(items), size=min(n, len(items)), replace=False))
    return [items[i] for i in idx]


def reasoning_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator) -> list[Prompt]:
    """n/4 AIME 2024, n/4 AIME 2025, the rest GSM8K."""
    n_aime = n // 4
    out = []
    for fname, tag in (("aime24.jsonl", "aime24"), ("aime25.jsonl", "aime25")):
        for r in _pick(_jsonl(data / fname), n_aime, rng):
            out.append((f"{tag}:{r['id']}", str(r["problem"])))
    gsm = list(enumerate(_jsonl(data / "gsm8k_test.jsonl")))
    for i, r in _pick(gsm, n - 2 * n_aime, rng):
        out.append((f"gsm8k:{i}", str(r["question"])))
    return [Prompt("reasoning", s, tok.chat(REASONING_PROMPT.format(problem=p))) for s, p in out]


def code_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator) -> list[Prompt]:
    rows = _pick(_jsonl(data / "HumanEval.jsonl.gz"), n, rng)
    return [Prompt("code", f"humaneval:{r['task_id'].split('/')[-1]}",
                   tok.chat(CODE_PROMPT.format(prompt=r["prompt"]))) for r in rows]


def chat_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator) -> list[Prompt]:
    """n MT-Bench first turns, the same number from each category."""
    rows = _jsonl(data / "mt_bench_question.jsonl")
    cats = sorted({r["category"] for r in rows})
    picked = []
    for c in cats:
        picked += _pick([r for r in rows if r["category"] == c], max(1, n // len(cats)), rng)
    picked = sorted(picked, key=lambda r: r["question_id"])[:n]
    return [Prompt("chat", f"mtbench:{r['question_id']}", tok.chat(r["turns"][0])) for r in picked]


def book_body(path: Path) -> str:
    """The text between '*** START OF ...' and '*** END OF ...', LF line endings, no BOM."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start = re.search(r"^\*\*\* START OF .*\*\*\*$", text, flags=re.MULTILINE)
    end = re.search(r"^\*\*\* END OF .*\*\*\*$", text, flags=re.MULTILINE)
    if start is None or end is None:
        raise UserInputError("no *** START OF / *** END OF markers", where=str(path),
                             fix="use a Project Gutenberg text with its header and footer")
    return text[start.end():end.start()].strip()


def longdoc_prompts(
    tok: Tokenizer, data: Path, n: int, rng: np.random.Generator,
    lengths: tuple[int, ...] = LONGDOC_LENGTHS, per_length: int = LONGDOC_PER_LENGTH,
    books: tuple[str, ...] = BOOKS,
) -> list[Prompt]:
    """Raw-text windows starting at paragraph starts of the books in turn, `per_length` of
    each exact length (the length is part of the source id, book@char+tokens).

    Order: first n/len(lengths) of each length (the 32-window set of the first trace sets,
    whose request ids index it), then the rest of each length. Acceptance varies from window
    to window by more than it varies with context (SmolLM2, T 0.6), hence more windows than
    prompts of the other workloads."""
    bodies = {b: book_body(data / "gutenberg" / b) for b in books}
    first = max(1, n // len(lengths))
    out: list[Prompt] = []
    taken: set[str] = set()  # source ids so far
    k = 0
    for count in (first, max(0, per_length - first)):
        for length in lengths:
            for _ in range(count):
                name = books[k % len(books)]
                k += 1
                out.append(_distinct_window(tok, name, bodies[name], length, rng, taken))
                taken.add(out[-1].source)
    return out


def _distinct_window(tok: Tokenizer, name: str, body: str, length: int,
                     rng: np.random.Generator, taken: set[str]) -> Prompt:
    """A window whose source id is not in `taken` (redrawn on a clash)."""
    for _ in range(MAX_WINDOW_DRAWS):
        window = _book_window(tok, name, body, length, rng)
        if window.source not in taken:
            return window
    raise UserInputError(f"book {name} has too few paragraph starts for another distinct "
                         f"{length}-token window", where=name,
                         fix="lower LONGDOC_PER_LENGTH or add a book")


def _book_window(tok: Tokenizer, name: str, body: str, length: int, rng: np.random.Generator) -> Prompt:
    paragraphs = [0] + [m.end() for m in re.finditer(r"\n\n+", body)]
    # starts late enough in the book that `length` tokens still fit (~3.2 chars per token)
    limit = max(1, len(body) - int(length * 5))
    starts = [p for p in paragraphs if p < limit] or [0]
    start = int(starts[int(rng.integers(len(starts)))])
    ids = tok.encode(body[start:start + length * 8], add_bos=True)  # BOS if the model has one
    if len(ids) < length:
        raise UserInputError(f"book {name} too short for a {length}-token window", where=name,
                             fix="ask for a shorter window (--context)")
    return Prompt("longdoc", f"{name.split('_')[0]}@{start}+{length}", ids[:length])


def recall_prompts(
    tok: Tokenizer, data: Path, n: int, rng: np.random.Generator,
    lengths: tuple[int, ...] = RECALL_LENGTHS, depths: tuple[float, ...] = RECALL_DEPTHS,
    per_cell: int = RECALL_PER_CELL, books: tuple[str, ...] = BOOKS,
) -> list[Prompt]:
    """Book window + RECALL_INSTRUCTION + a RECALL_CUE-token cue copied from the window at
    each depth; the answer is the RECALL_ANSWER window tokens after the cue. Raw text (no chat
    template: the instruct model copies more faithfully without one, and the window is raw
    text as in longdoc). Order: one window per (length, depth) cell, then the next round.
    `n` is ignored: the set is lengths x depths x per_cell."""
    bodies = {b: book_body(data / "gutenberg" / b) for b in books}
    instruction = tok.encode(RECALL_INSTRUCTION)
    out: list[Prompt] = []
    taken: set[str] = set()
    k = 0
    for _ in range(per_cell):
        for length in lengths:
            for depth in depths:
                name = books[k % len(books)]
                k += 1
                doc_len = length - len(instruction) - RECALL_CUE
                window = _distinct_window(tok, name, bodies[name], doc_len, rng, taken)
                taken.add(window.source)
                out.append(_recall_prompt(tok, window, instruction, depth))
    return out


def _recall_prompt(tok: Tokenizer, window: Prompt, instruction: list[int], depth: float
                   ) -> Prompt:
    """The window, the instruction and the cue that starts at the first sentence start at or
    after `depth` of the window (leaving room for the answer inside it)."""
    doc = window.tokens
    last = len(doc) - RECALL_CUE - RECALL_ANSWER
    cue = min(_sentence_start(tok, doc, int(depth * len(doc))), last)
    tokens = doc + instruction + doc[cue:cue + RECALL_CUE]
    answer = cue + RECALL_CUE
    source = f"{window.source}:cue{cue}:d{len(tokens) - answer}"
    return Prompt("recall", source, tokens, answer_start=answer)


def _sentence_start(tok: Tokenizer, doc: list[int], at: int) -> int:
    """The first token index >= at that follows a token ending a sentence (else `at`)."""
    for i in range(max(at, 1), min(len(doc), at + 200)):
        if tok.decode([doc[i - 1]]).rstrip().endswith((".", "!", "?", '."', '!"', '?"')):
            return i
    return at


# ---- the added workloads: long code and chat contexts, competitive programming ----------


def code_long_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator,
                      lengths: tuple[int, ...] = ADDED_LENGTHS,
                      per_length: int = ADDED_PER_LENGTH,
                      packages: bool = False) -> list[Prompt]:
    """A window of a long standard-library module starting at a def/class line, then
    CODE_LONG_INSTRUCTION, chat-templated: exactly each of `lengths` tokens, `per_length` of
    each, one per length per round (the first k rounds cover every length). `packages`: the
    window runs over a whole package's modules in a row (CODE_LONG_PACKAGES), as a
    repository-wide context does, for lengths no single module holds. `data` and `n` are
    unused: the files are the installed Python's (CODE_LONG_PYTHON)."""
    if platform.python_version() != CODE_LONG_PYTHON:
        raise UserInputError(
            f"code-long is built from CPython {CODE_LONG_PYTHON}'s standard library; this is "
            f"{platform.python_version()}", where="code-long",
            fix=f"build the workloads with Python {CODE_LONG_PYTHON}")
    sources = _package_sources() if packages else _module_sources()
    names = list(sources)
    out: list[Prompt] = []
    taken: set[str] = set()
    k = 0
    for _ in range(per_length):
        for length in lengths:
            name = names[k % len(names)]
            k += 1
            for _draw in range(MAX_WINDOW_DRAWS):
                prompt = _code_window(tok, name, sources[name], length, rng)
                if prompt.source not in taken:
                    break
            taken.add(prompt.source)
            out.append(prompt)
    return out


def _module_sources() -> dict[str, str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return {f: (lib / f).read_text(encoding="utf-8") for f in CODE_LONG_FILES}


def _package_sources() -> dict[str, str]:
    """Each of CODE_LONG_PACKAGES as one text: its modules in path order, each under a
    `# Lib/<path>` line (tests and data files left out)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = {}
    for package in CODE_LONG_PACKAGES:
        files = [f for f in sorted((lib / package).rglob("*.py"))
                 if "test" not in f.relative_to(lib).as_posix()]
        out[f"{package}/"] = "".join(f"# Lib/{f.relative_to(lib).as_posix()}\n"
                                     f"{f.read_text(encoding='utf-8')}\n" for f in files)
    return out


def _code_window(tok: Tokenizer, name: str, text: str, length: int,
                 rng: np.random.Generator) -> Prompt:
    """`length` tokens: the chat head and a ```python fence, the module from a def/class
    line on, the instruction and the assistant header."""
    mark = "\x00"
    user = "```python\n" + mark + CODE_LONG_INSTRUCTION.format(name=name,
                                                              version=CODE_LONG_PYTHON)
    head_text, tail_text = tok.chat_text(user).split(mark)
    head = tok.encode(head_text, add_bos=True)
    tail = tok.encode(tail_text)
    room = length - len(head) - len(tail)
    limit = max(1, len(text) - room * 6)  # ~4.5 characters per token of Python
    starts = [m.start() for m in CODE_LONG_START.finditer(text) if m.start() < limit] or [0]
    start = int(starts[int(rng.integers(len(starts)))])
    body = tok.encode(text[start:start + room * 10])
    if len(body) < room:
        raise UserInputError(f"{name} too short for a {length}-token window", where=name,
                             fix="ask for a shorter window (--context)")
    return Prompt("code-long", f"py{CODE_LONG_PYTHON}/{name}@{start}+{length}",
                  head + body[:room] + tail)


def chat_long_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator,
                      lengths: tuple[int, ...] = ADDED_LENGTHS,
                      per_length: int = ADDED_PER_LENGTH,
                      tutoring: bool = False) -> list[Prompt]:
    """MT-Bench dialogs with reference answers (both turns, the reference's answers as the
    assistant's) chained in a seeded order as the history, then an MT-Bench first turn not
    among them: exactly each of `lengths` tokens, the history's earliest turn cut at its
    start. ChatML where the tokenizer has it (SmolLM2's template); a base model's plain
    'User: ... / Assistant: ...' turns otherwise. One per length per round; `n` is unused.
    `tutoring`: GSM8K questions with their worked answers join the dialogs, one exchange
    each, for histories longer than MT-Bench's reference dialogs hold (about 15K tokens)."""
    turn_format = CHATML_TURN if tok.chatml else PLAIN_TURN
    questions = {int(r["question_id"]): r for r in _jsonl(data / "mt_bench_question.jsonl")}
    exchanges: dict[int, list[tuple[str, str]]] = {}
    for r in _jsonl(data / "mt_bench_reference_answer_gpt-4.jsonl"):
        qid = int(r["question_id"])
        exchanges[qid] = list(zip(questions[qid]["turns"], r["choices"][0]["turns"]))
    if tutoring:
        for i, r in enumerate(_jsonl(data / "gsm8k_test.jsonl")[:TUTORING_EXCHANGES]):
            exchanges[GSM8K_ID_BASE + i] = [(str(r["question"]), str(r["answer"]))]
    dialogs = {k: [tok.encode(turn_format.format(role=ro, Role=ro.title(), content=c))
                   for q, a in pairs for ro, c in (("user", q), ("assistant", a))]
               for k, pairs in exchanges.items()}
    out: list[Prompt] = []
    for _ in range(per_length):
        for length in lengths:
            out.append(_chat_history(tok, questions, dialogs, length, rng))
    return out


def _chat_history(tok: Tokenizer, questions: dict[int, dict[str, Any]],
                  dialogs: dict[int, list[list[int]]], length: int,
                  rng: np.random.Generator) -> Prompt:
    qids = sorted(questions)
    last = qids[int(rng.integers(len(qids)))]
    question = str(questions[last]["turns"][0])
    if tok.chatml:
        head_text, final_text = tok.chat_text("\x00").split("\x00")
        head = tok.encode(head_text.removesuffix("<|im_start|>user\n"), add_bos=True)
        final = tok.encode("<|im_start|>user\n" + question + final_text)
    else:
        head = tok.encode("", add_bos=True)
        final = tok.encode(PLAIN_TURN.format(Role="User", content=question) + "Assistant:")
    order = [int(q) for q in rng.permutation(sorted(dialogs)) if int(q) != last]
    room = length - len(head) - len(final)
    kept: list[list[int]] = []  # whole turns from the end of the chained history
    used: list[int] = []
    for qid in reversed(order):
        used.append(qid)
        for turn in reversed(dialogs[qid]):
            take = room - sum(len(t) for t in kept)
            kept.insert(0, turn if len(turn) <= take else turn[len(turn) - take:])
            if len(turn) >= take:
                history = [t for turn_ids in kept for t in turn_ids]
                src = f"mtbench:{last}<{'.'.join(str(q) for q in reversed(used))}+{length}"
                return Prompt("chat-long", src, head + history + final)
    raise UserInputError(f"MT-Bench reference dialogs hold fewer than {room} tokens",
                         where="chat-long", fix="lower ADDED_LENGTHS")


def competitive_prompts(tok: Tokenizer, data: Path, n: int, rng: np.random.Generator,
                        per_source: int = COMPETITIVE_PER_SOURCE) -> list[Prompt]:
    """`per_source` Codeforces 2024 (DeepCoder's CodeElo-style set) and CodeContests test
    problems of at most COMPETITIVE_MAX_TOKENS prompt tokens, in dataset order, interleaved
    (Codeforces first); COMPETITIVE_PROMPT, chat-templated. `n` is unused."""
    cf_ids = json.loads((data / "codeforces_2024_408_problem_ids.json").read_text())
    sets = (("codeforces", list(zip(cf_ids, _json(data / "codeforces_2024_408.json")))),
            ("codecontests", list(enumerate(_json(data / "codecontests_test_165.json")))))
    picked: list[list[Prompt]] = []
    for tag, rows in sets:
        prompts = [Prompt("competitive", f"{tag}:{pid}",
                          tok.chat(COMPETITIVE_PROMPT.format(problem=str(r["problem"]).strip())))
                   for pid, r in rows]
        picked.append(_pick([p for p in prompts if len(p.tokens) <= COMPETITIVE_MAX_TOKENS],
                            per_source, rng))
    return [p for pair in zip(*picked) for p in pair]


def _json(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserInputError("dataset file missing", where=str(path),
                             fix="point VEGAS_SIM_DATASETS at the shared datasets directory")
    rows: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return rows


BUILDERS = {"reasoning": reasoning_prompts, "code": code_prompts, "chat": chat_prompts,
            "longdoc": longdoc_prompts, "recall": recall_prompts,
            "code-long": code_long_prompts, "chat-long": chat_long_prompts,
            "competitive": competitive_prompts}


def build_prompts(
    tok: Tokenizer, datasets: Path | None = None, n: int = 32, seed: int = 0,
) -> dict[str, list[Prompt]]:
    """Every workload's prompts, tokenized with `tok` (in memory)."""
    data = datasets or default_datasets_dir()
    rng = np.random.default_rng(seed)
    prompts = {w: BUILDERS[w](tok, data, n, rng) for w in FIRST_WORKLOADS}
    added = np.random.default_rng(LONGDOC_ADDED_SEED)
    n_added = LONGDOC_PER_LENGTH * len(LONGDOC_ADDED_LENGTHS)
    prompts["longdoc"] += longdoc_prompts(tok, data, n_added, added, LONGDOC_ADDED_LENGTHS)
    for w in ADDED_WORKLOADS:
        prompts[w] = BUILDERS[w](tok, data, n, np.random.default_rng(ADDED_SEEDS[w]))
    return prompts


# ---- the shipped files -------------------------------------------------------------------


def build_workloads(
    model: str = "smollm2-135m", tokenizer: Tokenizer | None = None, *,
    datasets: Path | None = None, out_dir: Path | None = None, n: int = 32, seed: int = 0,
) -> Path:
    """Build and write `<out_dir>/<model>.npz` (default: the package's workloads/ dir).

    The tokenizer defaults to SmolLM2's (from its GGUF) for model "smollm2-135m". Layout per
    workload w: `w.tokens` (concatenated ids; uint16 when the vocabulary fits), `w.offsets`
    [n+1] int64, `w.sources` [n] str.
    """
    tokenizer = tokenizer or _default_tokenizer(model)
    prompts = build_prompts(tokenizer, datasets, n, seed)
    return _write_prompts(prompts, tokenizer, (out_dir or WORKLOAD_DIR) / f"{model}.npz")


def _default_tokenizer(model: str) -> Tokenizer:
    from vegas_sim.calibrate.loading import gemma3_gguf_path, smollm2_gguf_path

    ggufs = {"smollm2-135m": smollm2_gguf_path, "gemma3-270m": gemma3_gguf_path}
    if model not in ggufs:
        raise UserInputError(f"no tokenizer given for {model!r}",
                             fix="pass the model's Tokenizer (load_model returns it)")
    return Tokenizer.from_gguf(ggufs[model]())


def _write_prompts(prompts: dict[str, list[Prompt]], tokenizer: Tokenizer, out: Path) -> Path:
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    arrays: dict[str, np.ndarray] = {}
    for w, ps in prompts.items():
        arrays[f"{w}.tokens"] = np.concatenate([np.asarray(p.tokens, dtype=dtype) for p in ps])
        arrays[f"{w}.offsets"] = np.concatenate([[0], np.cumsum([len(p.tokens) for p in ps])]).astype(np.int64)
        arrays[f"{w}.sources"] = np.asarray([p.source for p in ps])
        if all(p.answer_start is not None for p in ps):
            arrays[f"{w}.answer_start"] = np.asarray([p.answer_start for p in ps], dtype=np.int64)
            arrays[f"{w}.distance"] = np.asarray([p.distance for p in ps], dtype=np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(out)
    return out


def build_long_workloads(
    model: str = "smollm2-135m", tokenizer: Tokenizer | None = None, *,
    datasets: Path | None = None, out_dir: Path | None = None,
) -> Path:
    """Build and write `<out_dir>/<model>.long.npz`: longdoc (LONG_LONGDOC_PER_LENGTH windows)
    and recall (LONG_RECALL_PER_CELL per length x depth) at LONG_LENGTHS, seeded LONG_SEED;
    code-long and chat-long (LONG_ADDED_PER_LENGTH each) from streams of their own."""
    tokenizer = tokenizer or _default_tokenizer(model)
    data = datasets or default_datasets_dir()
    rng = np.random.default_rng(LONG_SEED)
    prompts = {
        "longdoc": longdoc_prompts(tokenizer, data, LONG_LONGDOC_PER_LENGTH * len(LONG_LENGTHS),
                                   rng, LONG_LENGTHS, LONG_LONGDOC_PER_LENGTH, LONG_BOOKS),
        "recall": recall_prompts(tokenizer, data, 0, rng, LONG_LENGTHS,
                                 per_cell=LONG_RECALL_PER_CELL, books=LONG_BOOKS),
    }
    # each from a stream of its own, after the first two
    prompts["code-long"] = code_long_prompts(
        tokenizer, data, 0, np.random.default_rng([LONG_SEED, ADDED_SEEDS["code-long"]]),
        LONG_LENGTHS, LONG_ADDED_PER_LENGTH, packages=True)
    prompts["chat-long"] = chat_long_prompts(
        tokenizer, data, 0, np.random.default_rng([LONG_SEED, ADDED_SEEDS["chat-long"]]),
        LONG_LENGTHS, LONG_ADDED_PER_LENGTH, tutoring=True)
    return _write_prompts(prompts, tokenizer, (out_dir or WORKLOAD_DIR) / f"{model}.long.npz")


def _workload_file(model: str, directory: Path | None, long: bool) -> Path:
    return (directory or WORKLOAD_DIR) / f"{model}{'.long' if long else ''}.npz"


def workload_prompts(name: str, model: str = "smollm2-135m", directory: Path | None = None,
                     long: bool = False) -> list[Prompt]:
    """The shipped prompts of workload `name` for `model`, with their source ids (`long`: the
    long windows of `build_long_workloads`)."""
    check_workload(name)
    path = _workload_file(model, directory, long)
    if not path.is_file():
        raise UserInputError(f"no workloads built for model {model!r}", where=str(path),
                             fix="run vegas_sim.calibrate.workloads.build_workloads(model, tokenizer)"
                                 " or use synthetic prompts for random-weight models")
    with np.load(path, allow_pickle=False) as z:
        if f"{name}.tokens" not in z.files:
            raise UserInputError(f"workload {name!r} is not in {path.name}", where=str(path),
                                 fix="rebuild it with vegas_sim.calibrate.workloads.build_workloads")
        tokens, offsets, sources = z[f"{name}.tokens"], z[f"{name}.offsets"], z[f"{name}.sources"]
        starts = z[f"{name}.answer_start"] if f"{name}.answer_start" in z.files else None
    return [Prompt(name, str(sources[i]), tokens[offsets[i]:offsets[i + 1]].astype(np.int64).tolist(),
                   None if starts is None else int(starts[i]))
            for i in range(len(sources))]


def load_workload(name: str, model: str = "smollm2-135m", max_len: int | None = None,
                  long: bool = False) -> list[list[int]]:
    """Token ids of each prompt of workload `name` (one of WORKLOADS);
    `max_len` drops longer prompts (e.g. to leave room for the output); `long`: the long
    windows."""
    prompts = [p.tokens for p in workload_prompts(name, model, long=long)]
    return [p for p in prompts if max_len is None or len(p) <= max_len]


def synthetic_prompts(n: int, length: int, vocab: int, rng: np.random.Generator) -> list[list[int]]:
    """n prompts of `length` uniform random ids in [0, vocab): for random-weight models,
    whose acceptance comes from replay and whose latency does not depend on token values."""
    if n < 1 or length < 1:
        raise UserInputError(f"need n >= 1 and length >= 1, got n={n}, length={length}",
                             fix="ask for at least one prompt of at least one token")
    return [row.tolist() for row in rng.integers(0, vocab, size=(n, length), dtype=np.int64)]
