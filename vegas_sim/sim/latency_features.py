"""The latency model's roofline features (DESIGN.md, Simulator): which features each phase has,
the roofline priors and bounds of their coefficients, the measured GPU they are expressed on,
and `Physics`, the feature values of a batch of calls. Shared by the fit (`latency_fit`) and
the predictions (`latency`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vegas_sim.errors import TraceSetError
from vegas_sim.models import ModelSpec

LATENCY_WHERE = "latency.parquet"


FEATURES: tuple[str, ...] = ("const", "gemm", "logits", "kv", "attn", "collect", "rank",
                             "tokens", "batched", "rows", "tile32", "tile64", "per_request")


FEATURE_INDEX = {name: i for i, name in enumerate(FEATURES)}


PHASE_FEATURES: dict[str, tuple[str, ...]] = {
    "decode": ("const", "gemm", "kv", "tokens", "batched"),
    "draft_step": ("const", "gemm", "kv", "tokens", "batched"),
    "verify": ("const", "gemm", "kv", "attn", "collect", "tokens", "batched", "rows", "tile32", "tile64"),
    "prefill": ("const", "gemm", "kv", "attn"),
    "collect": ("const", "collect"),
    "select": ("const", "collect", "rank"),
    "quest_meta": ("const", "kv", "per_request"),
    "sample": ("const", "logits"),
    "other": ("const", "gemm", "kv", "tokens", "batched"),
}


# Kernel-level GPU features (sum form only, no roofline prior): fitted when a group is GPU-bound.
#   tokens   B·n_query · gemm_flops(1) / F: GEMM FLOP time that does not hide under the weight
#            stream (small-M GEMMs run far from peak), so a step grows with batch even while the
#            roofline GEMM term is still weight-bound
#   batched  weight_bytes / BW when B·n_query > 1, else 0: the tensor-core GEMM path costs more
#            than the GEMV kernels a single-row step runs (decode B=2 is measurably slower
#            than B=1 on the graphed H200 set)
#   rows     collect_rows, per call: a fixed cost per collected score row (the verify kernel's
#            extra score stores per row, per layer)
#   tile32   the kv feature of a verify call whose attention runs on the M 32 tile
#            (`verify_m_tile`), else 0: that tile shape (mma.sync, 128-key tiles) is at the
#            register limit and spills once scores are stored, so its cost per KV byte is
#            not the M 16 / M 64 tiles' (Qwen3-8B set, collecting all rows: without it
#            n_query 8 sits above the fit at long contexts, n_query 16 below). The tile
#            follows n_query·G in powers of two, so γ 4-7 (n_query 5-8, G 4) share n_query
#            8's tile, not a line between n_query 4 and 16.
#   tile64   the same for the M 64 tile (wgmma, 64-key tiles; and the launch of long calls,
#            kernels.verify_launch.wide_config): n_query·G > 32, or Collect-2-Query past 16
#   per_request  the kv feature over the batch (Σ_b kv_read_b / B: one request's read): work
#            done per request in series, which more requests run beside, not after. Quest's
#            page scoring ends in a top-k over each request's pages (torch.topk, one row per
#            request), whose time grows with the pages of a row at any batch: on the Qwen3-8B
#            set a page costs more at B 1 than at B 2 (quest_meta), so one cost per Σ pages
#            under-predicted B 1 at long contexts
KERNEL_FEATURES = ("tokens", "batched", "rows", "tile32", "tile64", "per_request")


# The tile features and the M tile each marks (the M 16 tile is the kv feature's own cost).
TILE_FEATURES = {"tile32": 32, "tile64": 64}


# A sum-form fixed cost s up to this many weight streams (weight_bytes / BW) is folded into the
# `batched` weight-read term when every point takes the batched path (see latency_fit.sum_group).
FOLD_WEIGHT_STREAMS = 4.0


# Upper bounds of the kernel features' coefficients (1 / efficiency): a per-token GEMM cost runs
# at ≥ 5 % of the measured bf16 rate, the batched path's extra cost (or a fixed cost folded
# into it) is at most FOLD_WEIGHT_STREAMS weight streams. They keep the sum form from passing a
# host floor that grows with batch (an eager or launch-bound small model: 135M parameters) off
# as GPU work; the max form's batch-dependent floor explains such data instead.
KERNEL_MAX = {"tokens": 20.0, "batched": FOLD_WEIGHT_STREAMS}


# The verify attention kernel's smallest M tile, and its tile for Collect-2-Query (first and last
# rows collected, 0 < collect_rows < n_query) past 16 packed rows (kernels.verify_launch:
# MIN_M_COLLECT, default_min_m, launch_config; mirrored here: sim does not import kernels).
VERIFY_MIN_M = 16
VERIFY_MIN_M_COLLECT = 64


def verify_m_tile(n_query: int, group: int, rows: int) -> int:
    """The M tile (packed query rows) of one verify attention call: max(16, next_pow2(n_query
    · G)), at least 64 for Collect-2-Query with n_query·G > 16 (kernels.verify_launch)."""
    packed = max(1, int(n_query) * max(1, int(group)))
    m = max(VERIFY_MIN_M, 1 << (packed - 1).bit_length())
    if 0 < rows < n_query and packed > 16:
        m = max(m, VERIFY_MIN_M_COLLECT)
    return m


# Phases whose pass runs the sliding-window layers (their KV read: methods.window_kv_read).
WINDOW_PHASES = ("decode", "draft_step", "verify", "prefill")


# Phases a CUDA-graphed set replays from one graph per call (calibrate's GraphedForward; the
# draft step adds its token's sampling, a fixed handful of eager kernels): the host issues the
# same launches whatever the batch, so their max form's floor is one constant, h0 (a floor that
# grew with B·n_query would be GPU work, which the sum form's kernel features count as such).
GRAPHED_PHASES = ("decode", "draft_step", "verify")


# Phases whose kernel does not depend on the method: may borrow a fit pooled over methods.
METHOD_INDEPENDENT_PHASES = ("sample", "prefill")


# Phases of methods.iteration_plan a trace set may lack: 'other' (once-per-iteration draft
# work); a set without it has that work spread over draft_step and quest_meta.
OPTIONAL_PHASES = ("other",)


ANY_METHOD = "any"


POOLED = "*"


# Roofline priors (not fits): the efficiency a phase reaches on its GPU work when the trace set
# cannot tell (no GPU-bound point). Bandwidth-bound streams (KV, scores, logits, ranking) reach
# ~0.9 of the measured copy bandwidth; GEMMs ~0.7 of the measured bf16 rate (or of the copy
# bandwidth while weight-bound).
PRIOR_ETA_KV = 0.9


PRIOR_ETA_GEMM = 0.7


# The max form's prior penalty on each log-coefficient, in points: a coefficient moves away from
# its prior only when more than this many (share-weighted) GPU-bound points ask for it.
PRIOR_WEIGHT = 2.0


# Robust loss scale of the max form (|log error| above it counts linearly, like a median).
MAX_FIT_F_SCALE = 0.05


# The max form's GPU log-coefficients stay within ± this of their prior (keeps exp() finite).
MAX_FIT_LOG_RANGE = 30.0


# The sum form is kept when its median |log error| ≤ this × the max form's.
SUM_MODE_MARGIN = 0.9


# The sum form's GPU coefficients are bounded below by 1 / ROOFLINE_SLACK: no kernel beats the
# measured copy bandwidth / bf16 rate by more than this factor. Without it, on host-bound data the
# const would absorb the GPU work and leave sub-roofline (or zero, i.e. flat) slopes.
ROOFLINE_SLACK = 1.25


# Starting points of the max fit: every coefficient at prior × each scale (the max has zero
# gradient where all points are host-bound, so one start would stay where it began).
MAX_FIT_STARTS = (1.0 / 64, 1.0 / 8, 1.0, 8.0, 64.0, 512.0)


SOURCES = ("FITTED", "PRIOR", "CAPPED", "BOUND")


def prior_coef(phase: str) -> np.ndarray:
    """[n_features] the roofline prior coefficient (1 / efficiency) of each feature of `phase`.

    const has no prior (0: a host or serial cost is always fitted). attn's prior is 0 except
    for prefill: with ≤ ~40 query rows attention is bandwidth-bound on any current GPU
    (Hq/Hkv FLOPs per KV byte per row, far below the FLOP/byte ridge), so its FLOPs overlap the
    KV read counted by `kv`.
    """
    c = np.zeros(len(FEATURES))
    c[FEATURE_INDEX["gemm"]] = 1.0 / PRIOR_ETA_GEMM
    for name in ("logits", "kv", "collect", "rank"):
        c[FEATURE_INDEX[name]] = 1.0 / PRIOR_ETA_KV
    if phase == "prefill":
        c[FEATURE_INDEX["attn"]] = 1.0 / PRIOR_ETA_GEMM
    return c * feature_mask(phase)


REQUIRED_COLUMNS = ("phase", "method", "batch", "context", "n_query", "kv_read",
                     "collect_rows", "ms_median")


@dataclass(frozen=True)
class MeasuredGpu:
    """What the trace set measured (meta.json 'gpu')."""

    name: str
    copy_bandwidth_gbs: float
    bf16_tflops: float
    memory_gb: float

    @classmethod
    def from_meta(cls, gpu: dict[str, Any]) -> MeasuredGpu:
        """Build from meta.json's 'gpu' object; TraceSetError names the missing key."""
        try:
            out = cls(
                name=str(gpu["name"]),
                copy_bandwidth_gbs=float(gpu["copy_bandwidth_gbs"]),
                bf16_tflops=float(gpu["bf16_tflops"]),
                memory_gb=float(gpu.get("memory_gb", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceSetError(
                f"gpu entry is incomplete or malformed ({exc!r})",
                where="meta.json, key gpu",
                fix="record name, copy_bandwidth_gbs and bf16_tflops measured in the run",
            ) from None
        if out.copy_bandwidth_gbs <= 0 or out.bf16_tflops <= 0:
            raise TraceSetError(
                "measured copy_bandwidth_gbs and bf16_tflops must be positive",
                where="meta.json, key gpu", fix="re-run the hardware measurement of calibrate",
            )
        return out


@dataclass(frozen=True)
class Physics:
    """Roofline constants of one (model, GPU): ms per byte / per FLOP and per-entry sizes.

    Mixture of experts: the weight stream of a step over B·n_query rows is the shared weights
    plus the experts those rows touch (ModelSpec.experts_touched), so `weight_ms_at(tokens)`
    grows with the batch; a dense model's is the constant `weight_ms`.

    Hybrid attention: the `kv` and `attn` features count the full-attention layers at the
    phase's kv_read and the sliding-window layers at their window read
    (methods.window_kv_read: min(W + n_query − 1, C + n_query) per request, in draft and
    verify alike); one coefficient scales both, as the same kernels read both. A model
    without window layers has window_kv_ms_per_token = 0 and its features are as before.
    """

    ms_per_byte: float
    ms_per_flop: float
    weight_ms: float  # weight_bytes(1 token) / BW
    gemm_flop_ms_per_token: float  # 2·matmul_params / F
    logits_ms_per_row: float  # vocab·4 / BW
    kv_ms_per_token: float  # full-attention layers' kv bytes per token / BW
    page_ms: float  # Quest page metadata (min+max keys, all layers/KV heads) / BW
    attn_ms_per_row_key: float  # 4·L_full·Hq·D / F
    collect_ms_per_row_key: float  # Hq·L·2 / BW
    rank_ms_per_key: float  # L·4 / BW
    # MoE: weight_ms_at(t) = shared_weight_ms + expert_ms · experts_touched(t) (0: dense)
    shared_weight_ms: float = 0.0
    expert_ms: float = 0.0  # one expert's weights in every layer / BW
    n_experts: int = 0
    experts_per_token: int = 0
    window: int = 0  # sliding window W (0: no window layers)
    window_kv_ms_per_token: float = 0.0  # window layers' kv bytes per token / BW
    window_attn_ms_per_row_key: float = 0.0  # 4·L_window·Hq·D / F
    group: int = 1  # G = Hq / Hkv: query heads per KV head (the verify kernel packs n_query·G)

    @classmethod
    def of(cls, model: ModelSpec, bandwidth_gbs: float, tflops: float,
           weight_format: str = "bf16") -> Physics:
        ms_per_byte = 1e3 / (bandwidth_gbs * 1e9)
        ms_per_flop = 1e3 / (tflops * 1e12)
        moe: dict[str, Any] = {}
        if model.is_moe:
            one_expert = model.expert_bytes(weight_format)
            shared = model.weight_bytes(1, weight_format) - one_expert * model.experts_touched(1)
            moe = {"shared_weight_ms": shared * ms_per_byte,
                   "expert_ms": one_expert * ms_per_byte, "n_experts": model.n_experts,
                   "experts_per_token": model.experts_per_token}
        per_layer_key = 4.0 * model.n_heads * model.head_dim * ms_per_flop
        if model.window_layers:
            moe.update(window=model.sliding_window,
                       window_kv_ms_per_token=model.window_kv_bytes_per_token() * ms_per_byte,
                       window_attn_ms_per_row_key=model.n_window_layers * per_layer_key)
        return cls(
            ms_per_byte=ms_per_byte,
            ms_per_flop=ms_per_flop,
            weight_ms=model.weight_bytes(1, weight_format) * ms_per_byte,
            gemm_flop_ms_per_token=model.gemm_flops(1) * ms_per_flop,
            logits_ms_per_row=model.vocab * 4 * ms_per_byte,
            kv_ms_per_token=(model.full_kv_bytes_per_token() if model.window_layers
                             else model.kv_bytes_per_token()) * ms_per_byte,
            page_ms=2 * model.n_layers * model.n_kv_heads * model.head_dim * model.dtype_bytes
            * ms_per_byte,
            attn_ms_per_row_key=(model.n_full_layers * per_layer_key if model.window_layers
                                 else model.attn_flops(1, 1.0) * ms_per_flop),
            collect_ms_per_row_key=model.n_heads * model.n_layers * 2 * ms_per_byte,
            rank_ms_per_key=model.n_layers * 4 * ms_per_byte,
            group=max(1, model.n_heads // max(1, model.n_kv_heads)),
            **moe,
        )

    def weight_ms_at(self, tokens: Any) -> Any:
        """Weight-stream ms of a step over `tokens` rows (scalar or array)."""
        if not self.n_experts:
            return self.weight_ms if np.ndim(tokens) == 0 else np.full(np.shape(tokens),
                                                                       self.weight_ms)
        e, k = self.n_experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** np.maximum(np.asarray(tokens, dtype=float), 1.0))
        out = self.shared_weight_ms + self.expert_ms * touched
        return float(out) if np.ndim(tokens) == 0 else out

    def gemm_ms(self, tokens: int | np.ndarray) -> Any:
        """Roofline GEMM time for `tokens` query rows in flight: weight- or FLOP-bound."""
        return np.maximum(self.weight_ms_at(tokens), self.gemm_flop_ms_per_token
                          * np.asarray(tokens))

    def intercept_features(self, batch: int, n_query: int, rows: int = 0) -> np.ndarray:
        """[n_features] the part of the features that does not depend on kv_read."""
        f = np.zeros(len(FEATURES))
        tokens = batch * n_query
        f[FEATURE_INDEX["const"]] = 1.0
        f[FEATURE_INDEX["gemm"]] = float(self.gemm_ms(tokens))
        f[FEATURE_INDEX["logits"]] = tokens * self.logits_ms_per_row
        f[FEATURE_INDEX["tokens"]] = tokens * self.gemm_flop_ms_per_token
        f[FEATURE_INDEX["batched"]] = self.weight_ms_at(tokens) if tokens > 1 else 0.0
        f[FEATURE_INDEX["rows"]] = float(rows)
        return f

    def window_features(self, phase: str, n_query: int) -> np.ndarray:
        """[n_features] features per unit of Σ window read (methods.window_kv_read); zero
        for a model without window layers and for phases that read no window layers' KV."""
        f = np.zeros(len(FEATURES))
        if self.window and phase in WINDOW_PHASES:
            f[FEATURE_INDEX["kv"]] = self.window_kv_ms_per_token
            f[FEATURE_INDEX["attn"]] = n_query * self.window_attn_ms_per_row_key
        return f

    def slope_features(self, phase: str, n_query: int, rows: int, batch: int = 1
                       ) -> np.ndarray:
        """[n_features] features per unit of Σ kv_read (all linear in it) for a batch of
        `batch` requests (per_request is the kv feature over the batch)."""
        f = np.zeros(len(FEATURES))
        f[FEATURE_INDEX["kv"]] = self.page_ms if phase == "quest_meta" else self.kv_ms_per_token
        f[FEATURE_INDEX["per_request"]] = f[FEATURE_INDEX["kv"]] / max(1, int(batch))
        padded = self.tile_query_rows(phase, n_query, rows)
        f[FEATURE_INDEX["attn"]] = padded * self.attn_ms_per_row_key
        f[FEATURE_INDEX["collect"]] = (padded if rows >= n_query else rows) \
            * self.collect_ms_per_row_key
        f[FEATURE_INDEX["rank"]] = self.rank_ms_per_key
        for name in TILE_FEATURES:
            f[FEATURE_INDEX[name]] = f[FEATURE_INDEX["kv"]] * self.on_tile(name, phase, n_query,
                                                                        rows)
        return f

    def m_tile(self, n_query: Any, rows: Any) -> Any:
        """The verify attention call's M tile (`verify_m_tile`; scalar, or elementwise over
        arrays)."""
        if np.ndim(n_query) == 0:
            return verify_m_tile(int(n_query), self.group, int(rows))
        return np.array([verify_m_tile(int(q), self.group, int(r))
                         for q, r in zip(np.asarray(n_query), np.asarray(rows))])

    def tile_query_rows(self, phase: str, n_query: Any, rows: Any) -> Any:
        """Query rows a call's attention computes: n_query, but for verify the rows of its M
        tile (M / G: packed rows padded to the tile), since the kernel runs whole tiles —
        specextend at n_query 9 (G 4, M 64) measures as n_query 8-16 do, not between 4 and 8
        (docs/RESULTS.md, Validation). Collecting every row stores the
        tile's rows too (scalar, or elementwise over arrays)."""
        if phase != "verify":
            return n_query
        return self.m_tile(n_query, rows) / max(1, self.group)

    def on_tile(self, feature: str, phase: str, n_query: Any, rows: Any) -> Any:
        """1 where a call of `phase` runs verify attention on the M tile of `feature`
        (TILE_FEATURES), else 0 (scalar, or elementwise over arrays)."""
        if phase != "verify":
            return np.zeros(np.shape(n_query)) if np.ndim(n_query) else 0.0
        on = self.m_tile(n_query, rows) == TILE_FEATURES[feature]
        return float(on) if np.ndim(on) == 0 else on.astype(float)

    def roofline_ms(self, phase: str, batch: int, n_query: int, kv_sum: float, rows: int = 0,
                    window_sum: float = 0.0) -> tuple[float, float]:
        """(ms of the bytes at the bandwidth, ms of the FLOPs at the matmul rate) that one call
        of `phase` must move and compute at least (ROOFLINE_TERMS), for `batch` requests of
        `n_query` rows reading kv_sum = Σ_b kv_read_b (window_sum: Σ_b window read). The
        same constants as the features, each at efficiency 1."""
        terms = ROOFLINE_TERMS[phase]
        tokens = batch * n_query
        byte_ms = flop_ms = 0.0
        if "weights" in terms:
            byte_ms += float(self.weight_ms_at(tokens))
        if "gemm_flops" in terms:
            flop_ms += tokens * self.gemm_flop_ms_per_token
        if "kv" in terms:
            per_entry = self.page_ms if phase == "quest_meta" else self.kv_ms_per_token
            byte_ms += kv_sum * per_entry + window_sum * self.window_kv_ms_per_token
        if "attn_flops" in terms:
            flop_ms += n_query * (kv_sum * self.attn_ms_per_row_key
                                  + window_sum * self.window_attn_ms_per_row_key)
        if "collect" in terms:
            byte_ms += kv_sum * rows * self.collect_ms_per_row_key
        if "rank" in terms:
            byte_ms += kv_sum * self.rank_ms_per_key
        if "logits" in terms:
            byte_ms += tokens * self.logits_ms_per_row
        return byte_ms, flop_ms

    def features(
        self, phase: str, batch: np.ndarray, n_query: np.ndarray, kv_sum: np.ndarray,
        rows: np.ndarray, window_sum: np.ndarray | None = None,
    ) -> np.ndarray:
        """[n_rows, n_features] for rows of measured points (kv_sum = Σ_b kv_read_b;
        window_sum = Σ_b window read, for a model with window layers)."""
        x = np.zeros((len(batch), len(FEATURES)))
        x[:, FEATURE_INDEX["const"]] = 1.0
        x[:, FEATURE_INDEX["gemm"]] = self.gemm_ms(batch * n_query)
        x[:, FEATURE_INDEX["logits"]] = batch * n_query * self.logits_ms_per_row
        x[:, FEATURE_INDEX["kv"]] = kv_sum * (self.page_ms if phase == "quest_meta" else self.kv_ms_per_token)
        padded = self.tile_query_rows(phase, n_query, rows)
        x[:, FEATURE_INDEX["attn"]] = kv_sum * padded * self.attn_ms_per_row_key
        x[:, FEATURE_INDEX["collect"]] = kv_sum * np.where(rows >= n_query, padded, rows) \
            * self.collect_ms_per_row_key
        x[:, FEATURE_INDEX["rank"]] = kv_sum * self.rank_ms_per_key
        tokens = batch * n_query
        x[:, FEATURE_INDEX["tokens"]] = tokens * self.gemm_flop_ms_per_token
        x[:, FEATURE_INDEX["batched"]] = np.where(tokens > 1, self.weight_ms_at(tokens), 0.0)
        x[:, FEATURE_INDEX["rows"]] = rows
        x[:, FEATURE_INDEX["per_request"]] = x[:, FEATURE_INDEX["kv"]] / np.maximum(batch, 1)
        for name in TILE_FEATURES:
            x[:, FEATURE_INDEX[name]] = x[:, FEATURE_INDEX["kv"]] * self.on_tile(
                name, phase, n_query, rows)
        if window_sum is not None and self.window and phase in WINDOW_PHASES:
            x[:, FEATURE_INDEX["kv"]] += window_sum * self.window_kv_ms_per_token
            x[:, FEATURE_INDEX["attn"]] += window_sum * n_query * self.window_attn_ms_per_row_key
        return x


# The roofline of one phase call (`Physics.roofline_ms`): what its kernels must move through
# device memory and compute at least, each term the physical part of a feature above
#   weights  the weight stream (gemm's bytes; MoE: the experts the rows touch)
#   kv       the KV read (quest_meta: the page metadata scored), window layers included
#   collect  the bf16 scores written (verify) or read (select)
#   rank     the fp32 per-layer weights the top-k ranks
#   logits   the fp32 logits sampling reads
#   gemm_flops, attn_flops  the dense layers' and attention's FLOPs (the physical rows, not
#            the kernel's padded M tile)
# 'other' (index lists, page counts, the metadata update after acceptance) moves a few bytes
# per request: no term.
ROOFLINE_TERMS: dict[str, tuple[str, ...]] = {
    "decode": ("weights", "kv", "gemm_flops", "attn_flops"),
    "draft_step": ("weights", "kv", "gemm_flops", "attn_flops"),
    "verify": ("weights", "kv", "collect", "gemm_flops", "attn_flops"),
    "prefill": ("weights", "kv", "gemm_flops", "attn_flops"),
    "collect": ("collect",),
    "select": ("collect", "rank"),
    "quest_meta": ("kv",),
    "sample": ("logits",),
    "other": (),
}


def feature_mask(phase: str) -> np.ndarray:
    """[n_features] bool: the features phase `phase` is fitted with."""
    active = PHASE_FEATURES[phase]
    return np.array([name in active for name in FEATURES])


def constant_feature(col: np.ndarray) -> bool:
    return bool(np.ptp(col) <= 1e-9 * max(float(np.abs(col).max()), 1e-300))
