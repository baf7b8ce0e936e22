"""GPU datasheet numbers for hardware what-ifs (`predict --gpu NAME`).

A trace set records the copy bandwidth and bf16 matmul rate *measured* on the GPU it ran on.
A what-if rescales the fitted latency model by the ratio of datasheet numbers (target GPU over
the measured GPU's datasheet entry), which keeps the efficiencies that were measured. Outputs
of a what-if always say that the target GPU was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from vegas_sim.errors import UserInputError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float
    bandwidth_gbs: float  # HBM bandwidth, datasheet
    bf16_tflops: float  # dense bf16 tensor-core rate, datasheet


DATASHEETS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", 80.0, 2039.0, 312.0),  # A100 SXM 80GB
    "h100-sxm": GpuSpec("h100-sxm", 80.0, 3350.0, 989.0),
    "h100-nvl": GpuSpec("h100-nvl", 94.0, 3900.0, 835.0),
    "h200": GpuSpec("h200", 141.0, 4800.0, 989.0),
    "b200": GpuSpec("b200", 180.0, 8000.0, 2250.0),
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
    try:
        return DATASHEETS[name.lower()]
    except KeyError:
        raise UserInputError(
            f"unknown GPU {name!r}", fix=f"use one of: {', '.join(sorted(DATASHEETS))}"
        ) from None


def datasheet_for_device(device_name: str) -> GpuSpec | None:
    """The datasheet entry for a measured device name such as 'NVIDIA H200', if known."""
    for needle, key in _DEVICE_NAME_KEYS:
        if needle.lower() in device_name.lower():
            return DATASHEETS[key]
    return None
