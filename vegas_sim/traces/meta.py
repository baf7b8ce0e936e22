"""meta.json read once into typed records (`TraceSetMeta`, `GridMeta`), with the defaults an
older set's missing keys take written here and nowhere else.

`validation.validate_meta` has already checked the kinds and bounds of these fields
(schema.MODEL_FIELDS / GRID_FIELDS) by the time a loaded set's meta reaches this module;
the records only name the fields and fill what a set may lack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vegas_sim.methods import MIN_TOKENS

# The calibration runtime's revision of a set that does not record one (schema.RUNTIME_REVISION).
UNRECORDED_RUNTIME = "1"


@dataclass(frozen=True)
class GridMeta:
    """meta.json 'grid': the calibration grid and how it was timed.

    A key an older set lacks takes the default here: `verify_after_draft` True (nothing known
    against it), `cuda_graphs` False (the floor may grow with the batch), `min_tokens` the
    budget floor of methods.MIN_TOKENS, greedy latency runs (`latency_temperature` 0) with
    top-p 1 and no top-k, and no YaRN extension.
    """

    batch: tuple[int, ...] = ()
    context: tuple[int, ...] = ()
    gamma: tuple[int, ...] = ()
    sparsity: tuple[float, ...] = ()
    methods: tuple[str, ...] = ()
    min_tokens: int = MIN_TOKENS
    verify_after_draft: bool = True
    cuda_graphs: bool = False
    latency_temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    rope_extension: float | None = None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> GridMeta:
        grid: Mapping[str, Any] = meta.get("grid") or {}
        d = cls()
        factor = grid.get("rope_extension")
        return cls(
            batch=tuple(int(b) for b in grid.get("batch", ())),
            context=tuple(int(c) for c in grid.get("context", ())),
            gamma=tuple(int(g) for g in grid.get("gamma", ())),
            sparsity=tuple(float(s) for s in grid.get("sparsity", ())),
            methods=tuple(str(m) for m in grid.get("methods", ())),
            min_tokens=int(grid.get("min_tokens", d.min_tokens)),
            verify_after_draft=bool(grid.get("verify_after_draft", d.verify_after_draft)),
            cuda_graphs=bool(grid.get("cuda_graphs", d.cuda_graphs)),
            latency_temperature=float(grid.get("latency_temperature", d.latency_temperature)),
            top_p=float(grid.get("top_p", d.top_p)),
            top_k=int(grid.get("top_k", d.top_k)),
            rope_extension=float(factor) if factor else None,
        )

    @property
    def sampling(self) -> tuple[float, int]:
        """(top-p, top-k) the latency runs sampled with."""
        return self.top_p, self.top_k


@dataclass(frozen=True)
class TraceSetMeta:
    """The fields of meta.json the loaders, predictions and reports ask for."""

    model_name: str
    weights_kind: str  # 'real' | 'random' (schema.WEIGHT_KINDS); '' when unrecorded
    gpu_name: str
    synthetic: bool
    runtime_revision: str
    grid: GridMeta
    content_hash: Mapping[str, str] = field(default_factory=dict)
    # the context trend's sd scale this set's own hold-out chose, and where from
    # ('acceptance_calibration'; None: the default scale, sim.context_trend.TREND_SD_SCALE)
    context_trend_sd_scale: float | None = None
    calibrated_by: str = ""

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> TraceSetMeta:
        model: Mapping[str, Any] = meta.get("model") or {}
        weights: Mapping[str, Any] = model.get("weights") or {}
        calibration: Mapping[str, Any] = meta.get("acceptance_calibration") or {}
        return cls(
            model_name=str(model.get("name", "?")),
            weights_kind=str(weights.get("kind", "")),
            gpu_name=str((meta.get("gpu") or {}).get("name", "?")),
            synthetic=bool(meta.get("synthetic", False)),
            runtime_revision=str((meta.get("software") or {}).get("runtime",
                                                                    UNRECORDED_RUNTIME)),
            grid=GridMeta.from_meta(meta),
            content_hash=dict(meta.get("content_hash") or {}),
            context_trend_sd_scale=_scale(calibration),
            calibrated_by=str(calibration.get("from", "")),
        )


def _scale(calibration: Mapping[str, Any]) -> float | None:
    scale = calibration.get("context_trend_sd_scale")
    return None if scale is None else float(scale)
