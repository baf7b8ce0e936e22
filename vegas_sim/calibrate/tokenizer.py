"""BPE tokenizers from GGUF metadata or a Hugging Face tokenizer.json.

GGUF stores the vocabulary (`tokenizer.ggml.tokens`), the merges, token types (3 = control,
4 = user-defined: matched whole, never split) and a pre-tokenizer name (`tokenizer.ggml.pre`).
We rebuild the same pipeline with the `tokenizers` package: the pre-tokenizer split, byte-level
mapping, BPE merges. Chat prompts use ChatML (<|im_start|>role\\n...<|im_end|>\\n), which is what
SmolLM2 and Qwen use; a vocabulary without ChatML's tokens (Gemma 3 base) gets plain text.

Gemma 3's GGUF holds a SentencePiece vocabulary (`tokenizer.ggml.model` "llama") with no merges.
It is rebuilt as transformers' GGUF converter rebuilds it (`gemma_tokenizer`): spaces written
as U+2581, BPE with byte fallback, tokens of only spaces respelled with U+2581, and merges
derived from the vocabulary, best first in the order the tokens appear in the file (Gemma's
scores do not follow its merge order).
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
_CONTROL, _USER_DEFINED = 3, 4
SPIECE_SPACE = "\u2581"  # SentencePiece's written space


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
        self.chatml = im_end is not None and tok.token_to_id("<|im_start|>") is not None
        # generation stops at end-of-turn as well as end-of-text
        ends = (eos_id, im_end, tok.token_to_id("<|endoftext|>"), tok.token_to_id("<end_of_turn>"))
        self.stop_ids: frozenset[int] = frozenset(i for i in ends if i is not None)

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
        arch = f["general.architecture"].contents() if "general.architecture" in f else "?"
        if model == "llama" and arch == "gemma3":
            return cls._from_gguf_gemma(f)
        if model != "gpt2":
            raise UserInputError(f"tokenizer model {model!r} is not byte-level BPE",
                                 where="GGUF tokenizer.ggml.model",
                                 fix="use a Llama-3 / Qwen / SmolLM (gpt2-style BPE) model, or "
                                     "Gemma 3")
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
    def _from_gguf_gemma(cls, f: Any) -> Tokenizer:
        """Gemma 3's SentencePiece vocabulary as BPE (see the module doc)."""
        from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        tokens = [SPIECE_SPACE * len(t) if t and not t.strip(" ") else t
                  for t in f["tokenizer.ggml.tokens"].contents()]
        types: list[int] = f["tokenizer.ggml.token_type"].contents()
        vocab = {t: i for i, t in enumerate(tokens)}
        unk = tokens[int(f["tokenizer.ggml.unknown_token_id"].contents())]
        bpe = models.BPE(vocab=vocab, merges=merges_from_vocab(tokens, vocab), fuse_unk=True,
                         unk_token=unk, byte_fallback=True)
        tok = HFTokenizer(bpe)
        tok.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace(SPIECE_SPACE, " "),
                                         decoders.ByteFallback(), decoders.Fuse()])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty == _CONTROL])
        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
        bos = int(f["tokenizer.ggml.bos_token_id"].contents())
        add_bos = bool(f["tokenizer.ggml.add_bos_token"].contents()) \
            if "tokenizer.ggml.add_bos_token" in f else True  # llama.cpp's default for SPM
        return cls(tok, bos if add_bos else None, int(f["tokenizer.ggml.eos_token_id"].contents()))

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
        The template's default system prompt is used when `system` is None (SmolLM2 has one).
        A vocabulary without ChatML (a base model: Gemma 3 270M) gets no template: the text
        as it is, after the system text and a blank line when one is given."""
        if not self.chatml:
            return f"{system}\n\n{user}" if system else user
        system = system if system is not None else self.default_system
        head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """Token ids of `chat_text` (with bos first when the model wants one)."""
        return self.encode(self.chat_text(user, system), add_bos=True)


def merges_from_vocab(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two
    tokens, ranked by the token's place in the file (earlier first), then the longer left
    piece first (transformers' generate_merges with scores -index)."""
    # A token's splits differ in their left length, so that order is total: no sort needed.
    merges: list[tuple[str, str]] = []
    for token in tokens:
        for k in range(len(token) - 1, 0, -1):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges


def _default_system(template: str) -> str | None:
    """The default system message a ChatML jinja template inserts, if any (SmolLM2's)."""
    m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, flags=re.DOTALL)
    if m is None or "{{" in m.group(1) or "message" in m.group(1):
        return None
    return m.group(1)
