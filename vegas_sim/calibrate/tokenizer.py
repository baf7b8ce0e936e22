"""Byte-level BPE tokenizers from GGUF metadata or a Hugging Face tokenizer.json.

GGUF stores the vocabulary (`tokenizer.ggml.tokens`), the merges, token types (3 = control,
4 = user-defined: matched whole, never split) and a pre-tokenizer name (`tokenizer.ggml.pre`).
We rebuild the same pipeline with the `tokenizers` package: the pre-tokenizer split, byte-level
mapping, BPE merges. Chat prompts use ChatML (<|im_start|>role\\n...<|im_end|>\\n), which is what
SmolLM2 and Qwen use.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vegas_sim.errors import UserInputError

# Pre-tokenizer regexes, as llama.cpp (llama-vocab.cpp) and the HF tokenizer.json files use them.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPECIAL_TYPES = (3, 4)  # llama.cpp token types CONTROL and USER_DEFINED


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm", "starcoder", "refact"):  # GPT-2 split after splitting every digit
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"), byte_level])
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"), byte_level])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # "gpt2", default


class Tokenizer:
    """encode / decode / chat for one model. Wraps a `tokenizers.Tokenizer`."""

    def __init__(self, tok: Any, bos_id: int | None, eos_id: int, default_system: str | None = None):
        self.tok = tok
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.default_system = default_system
        im_end = tok.token_to_id("<|im_end|>")
        # generation stops at end-of-turn as well as end-of-text
        self.stop_ids: frozenset[int] = frozenset(
            i for i in (eos_id, im_end, tok.token_to_id("<|endoftext|>")) if i is not None)

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size(with_added_tokens=True))

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """From an open gguf.GGUFReader (or a path to a .gguf file)."""
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as HFTokenizer

        if isinstance(reader, (str, Path)):
            from gguf import GGUFReader

            reader = GGUFReader(str(reader))
        f = reader.fields
        model = f["tokenizer.ggml.model"].contents() if "tokenizer.ggml.model" in f else "?"
        if model != "gpt2":
            raise UserInputError(f"tokenizer model {model!r} is not byte-level BPE",
                                 where="GGUF tokenizer.ggml.model",
                                 fix="use a Llama-3 / Qwen / SmolLM (gpt2-style BPE) model")
        tokens: list[str] = f["tokenizer.ggml.tokens"].contents()
        merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
        types: list[int] = f["tokenizer.ggml.token_type"].contents() if "tokenizer.ggml.token_type" in f else []
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
        tok = HFTokenizer(bpe)
        pre = f["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in f else "gpt2"
        tok.pre_tokenizer = _pre_tokenizer(str(pre))
        tok.decoder = decoders.ByteLevel()
        specials = [tokens[i] for i, ty in enumerate(types) if ty in _SPECIAL_TYPES]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        bos = int(f["tokenizer.ggml.bos_token_id"].contents()) if "tokenizer.ggml.bos_token_id" in f else None
        add_bos = bool(f["tokenizer.ggml.add_bos_token"].contents()) if "tokenizer.ggml.add_bos_token" in f else False
        eos = int(f["tokenizer.ggml.eos_token_id"].contents())
        template = str(f["tokenizer.chat_template"].contents()) if "tokenizer.chat_template" in f else ""
        return cls(tok, bos if add_bos else None, eos, _default_system(template))

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """From tokenizer.json (+ tokenizer_config.json for eos/bos and the chat template)."""
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            cfg = json.loads((path / "tokenizer_config.json").read_text())

        def token_id(key: str) -> int | None:
            t = cfg.get(key)
            t = t.get("content") if isinstance(t, dict) else t
            return tok.token_to_id(t) if isinstance(t, str) else None

        eos = token_id("eos_token")
        eos = eos if eos is not None else tok.token_to_id("<|endoftext|>")
        if eos is None:
            raise UserInputError("no eos token", where=str(path / "tokenizer_config.json"),
                                 fix="add eos_token to tokenizer_config.json")
        bos = token_id("bos_token") if cfg.get("add_bos_token") else None
        return cls(tok, bos, eos, _default_system(str(cfg.get("chat_template") or "")))

    # ---- use -----------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text are matched whole."""
        ids: list[int] = self.tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id] + ids if add_bos and self.bos_id is not None else ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special))

    def chat_text(self, user: str, system: str | None = None) -> str:
        """One user turn in ChatML, ending with the assistant header (generation prompt).
        The template's default system prompt is used when `system` is None (SmolLM2 has one)."""
        system = system if system is not None else self.default_system
        head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """Token ids of `chat_text` (with bos first when the model wants one)."""
        return self.encode(self.chat_text(user, system), add_bos=True)


def _default_system(template: str) -> str | None:
    """The default system message a ChatML jinja template inserts, if any (SmolLM2's)."""
    m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, flags=re.DOTALL)
    if m is None or "{{" in m.group(1) or "message" in m.group(1):
        return None
    return m.group(1)
