"""GPU datasheet numbers for hardware what-ifs (`--gpu NAME`, or `--gpu-spec FILE` for a GPU
not in the list).

A trace set records the copy bandwidth and bf16 matmul rate *measured* on the GPU it ran on.
A what-if rescales the fitted latency model by the ratio of datasheet numbers (target GPU over
the measured GPU's datasheet entry), which keeps the efficiencies that were measured. Outputs
of a what-if always say that the target GPU was not measured.

A spec file (JSON or TOML) describes another GPU::

    {"name": "mi300x", "memory_gb": 192, "hbm_bandwidth_gbs": 5300, "bf16_tflops": 1307}

hbm_bandwidth_gbs and bf16_tflops are datasheet numbers (dense bf16), scaled by ratio as
above. copy_bandwidth_gbs instead of (or beside) hbm_bandwidth_gbs is a *measured*
device-to-device copy rate, as a trace set's meta.json records it: it is used as it is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vegas_sim.bounds import GPU_SPEC_RANGES
from vegas_sim.errors import UserInputError


_SPEC_EXAMPLE = ('write e.g. {"name": "mi300x", "memory_gb": 192, "hbm_bandwidth_gbs": 5300, '
                 '"bf16_tflops": 1307}')
DEFAULT_ALLREDUCE_LATENCY_US = 10.0  # assumed, not measured: see docs/DESIGN.md, Tensor parallelism


def _spec_number(raw: dict[str, Any], key: str, where: str) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise UserInputError(f"{key} must be a number > 0, got {value!r}", where=where,
                             fix=f"give {key} from the GPU's datasheet (units: {_unit(key)})")
    lo, hi = GPU_SPEC_RANGES[key]
    if not lo <= value <= hi:  # past any GPU built, a what-if's ratios overflow or vanish
        raise UserInputError(f"{key} {value:g} is outside the plausible range [{lo:g}, {hi:g}] "
                             "of any GPU", where=where,
                             fix=f"give {key} from the GPU's datasheet (units: {_unit(key)})")
    return float(value)


def _unit(key: str) -> str:
    return {"gb": "GB", "gbs": "GB/s", "tflops": "TFLOP/s", "us": "µs"}[key.rsplit("_", 1)[1]]


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float
    bandwidth_gbs: float  # HBM bandwidth, datasheet
    bf16_tflops: float  # dense bf16 tensor-core rate, datasheet
    # a measured copy bandwidth (spec files only): replaces the datasheet-ratio scaling
    copy_bandwidth_gbs: float | None = None
    source: str = "datasheet"  # "datasheet", or "spec file PATH"
    # GPU-to-GPU link for tensor parallelism: bandwidth per direction per GPU (datasheet NVLink
    # figure halved; 0 = unknown) and the fixed cost of one all-reduce call (an assumption:
    # NCCL / custom all-reduce launch + synchronisation across the node)
    link_gbs: float = 0.0
    allreduce_latency_us: float = DEFAULT_ALLREDUCE_LATENCY_US

    def __post_init__(self) -> None:
        """A GpuSpec built in Python (the API's gpu=) is held to the spec file's ranges."""
        for key, value in (("memory_gb", self.memory_gb), ("hbm_bandwidth_gbs", self.bandwidth_gbs),
                           ("bf16_tflops", self.bf16_tflops),
                           ("copy_bandwidth_gbs", self.copy_bandwidth_gbs),
                           ("link_bandwidth_gbs", self.link_gbs or None),  # 0: unknown
                           ("allreduce_latency_us", self.allreduce_latency_us)):
            if value is not None:
                _spec_number({key: value}, key, f"GpuSpec {self.name!r}")

    def label(self) -> str:
        """How a what-if to this GPU is described in outputs."""
        how = "by datasheet ratios" if self.source == "datasheet" else f"({self.source})"
        return f"GPU {self.name}: what-if {how} — NOT measured"


# link_gbs: NVLink per direction, half the vendor datasheet's total (H100 NVL: bridged pairs).
DATASHEETS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", 80.0, 2039.0, 312.0, link_gbs=300.0),  # A100 SXM 80GB
    "h100-sxm": GpuSpec("h100-sxm", 80.0, 3350.0, 989.0, link_gbs=450.0),
    "h100-nvl": GpuSpec("h100-nvl", 94.0, 3900.0, 835.0, link_gbs=300.0),
    "h200": GpuSpec("h200", 141.0, 4800.0, 989.0, link_gbs=450.0),
    "b200": GpuSpec("b200", 180.0, 8000.0, 2250.0, link_gbs=900.0),
}

# Names a measured trace set may carry (torch.cuda.get_device_name) → datasheet key.
_DEVICE_NAME_KEYS = (
    ("H200", "h200"),
    ("H100 NVL", "h100-nvl"),
    ("H100", "h100-sxm"),
    ("B200", "b200"),
    ("A100", "a100"),
)


def get_gpu(name: str) -> GpuSpec:
    """The datasheet entry of a GPU named as --gpu takes it."""
    try:
        return DATASHEETS[name.lower()]
    except KeyError:
        raise UserInputError(
            f"unknown GPU {name!r}", where="--gpu",
            fix=f"use one of: {', '.join(sorted(DATASHEETS))}; for another GPU, describe it "
                "in a JSON or TOML file and pass --gpu-spec FILE (name, memory_gb, "
                "hbm_bandwidth_gbs or copy_bandwidth_gbs, bf16_tflops)",
        ) from None


SPEC_NUMBERS = ("memory_gb", "hbm_bandwidth_gbs", "copy_bandwidth_gbs", "bf16_tflops",
                "link_bandwidth_gbs", "allreduce_latency_us")


def load_gpu_spec(path: Path) -> GpuSpec:
    """A GPU described by a JSON or TOML file (see the module's docstring), for --gpu-spec."""
    where = f"--gpu-spec {path}"
    try:
        text = Path(path).read_text()
        raw: Any = _toml(text) if Path(path).suffix.lower() == ".toml" else json.loads(text)
    except FileNotFoundError:
        raise UserInputError("no such file", where=where,
                             fix="give the path of a JSON or TOML GPU spec") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSON/TOML errors are ValueErrors
        raise UserInputError(f"not a readable JSON or TOML file: {e}", where=where,
                             fix=_SPEC_EXAMPLE) from None
    if not isinstance(raw, dict):
        raise UserInputError("the spec must be one object (table) of keys", where=where,
                             fix=_SPEC_EXAMPLE)
    unknown = sorted(set(raw) - {"name", *SPEC_NUMBERS})
    if unknown:
        raise UserInputError(f"unknown key(s) {', '.join(unknown)}", where=where,
                             fix=f"keys are name, {', '.join(SPEC_NUMBERS)}")
    numbers = {k: _spec_number(raw, k, where) for k in SPEC_NUMBERS if k in raw}
    missing = [k for k in ("memory_gb", "bf16_tflops") if k not in numbers]
    if "hbm_bandwidth_gbs" not in numbers and "copy_bandwidth_gbs" not in numbers:
        missing.append("hbm_bandwidth_gbs (or copy_bandwidth_gbs)")
    if not isinstance(raw.get("name"), str) or not raw["name"].strip():
        missing.insert(0, "name")
    if missing:
        raise UserInputError(f"missing {', '.join(missing)}", where=where,
                             fix="give name, memory_gb, hbm_bandwidth_gbs (datasheet) or "
                                 "copy_bandwidth_gbs (measured), bf16_tflops (dense, datasheet)")
    copy = numbers.get("copy_bandwidth_gbs")
    return GpuSpec(name=raw["name"].strip(), memory_gb=numbers["memory_gb"],
                   bandwidth_gbs=numbers.get("hbm_bandwidth_gbs", copy or 0.0),
                   bf16_tflops=numbers["bf16_tflops"], copy_bandwidth_gbs=copy,
                   source=f"spec file {path}", link_gbs=numbers.get("link_bandwidth_gbs", 0.0),
                   allreduce_latency_us=numbers.get("allreduce_latency_us",
                                                    DEFAULT_ALLREDUCE_LATENCY_US))


def _toml(text: str) -> Any:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        raise UserInputError("reading TOML needs Python 3.11 or later", where="--gpu-spec",
                             fix="write the spec as JSON") from None
    return tomllib.loads(text)


def resolve_gpu(name: str | None, spec_file: Path | None) -> GpuSpec | None:
    """The what-if target of --gpu NAME or --gpu-spec FILE (at most one), or None."""
    if name is not None and spec_file is not None:
        raise UserInputError("--gpu and --gpu-spec both name a target GPU", where="--gpu",
                             fix="give one of them")
    if spec_file is not None:
        return load_gpu_spec(spec_file)
    return None if name is None else get_gpu(name)


def datasheet_for_device(device_name: str) -> GpuSpec | None:
    """The datasheet entry for a measured device name such as 'NVIDIA H200', if known."""
    for needle, key in _DEVICE_NAME_KEYS:
        if needle.lower() in device_name.lower():
            return DATASHEETS[key]
    return None
