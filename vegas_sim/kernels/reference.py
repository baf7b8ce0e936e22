"""Pure-torch references for every op of API.md: simple, correct, CPU fp32 or GPU bf16.

These define the semantics the Triton kernels are tested against. They favour clarity over
speed (loops over requests, math in fp32) and are what `ops` falls back to off-GPU.

Layout (API.md): per layer `k_cache`, `v_cache` are `[B, S_max, Hkv, D]`; request b's token at
position p lives at `[b, p]`; `cache_lens[b]` tokens are valid.

Attention sinks (gpt-oss): `sinks` [Hq] is one learned logit per query head that joins every
softmax denominator and has no value: p_j = exp(scale·s_j) / (Σ_j exp(scale·s_j) + exp(sink_h)).
The returned lse then includes it, so exp(scale·s − lse) are the probabilities the model uses.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

QUEST_PAGE = 16  # tokens per Quest page (vegas_sim.methods.QUEST_PAGE)

# Score formats of the collected rows (API.md, DESIGN.md "score contract"):
# "bf16": raw q·k, -inf where masked.
# "fp8": log-domain, `LogScores`: d = x − m (x = scale·log2(e)·q·k, base-2 units) as float8
# e4m3 (≤ 0; FP8_MASKED where masked: e4m3fn has no inf) and one fp32 m per SCORE_TILE keys.
# e4m3 keeps three mantissa bits, so d is exact near 0 (the keys that carry the weight) and
# coarse far below the tile's maximum, where the weight is small anyway.
SCORE_FORMATS = ("bf16", "fp8")
# Keys per m entry: the smallest BLOCK_N a collecting verify launch uses, so every launch
# writes whole m entries and the consumer never depends on the launch.
SCORE_TILE = 32
FP8_MASKED = -448.0  # e4m3fn's most negative finite value
FP8_DTYPE = torch.float8_e4m3fn


class LogScores(NamedTuple):
    """Collected scores in the "fp8" format: d [..., S_max] float8_e4m3fn, m [..., n_tiles]
    fp32 with n_tiles = ceil(S_max / SCORE_TILE). Key j of a line has base-2 logit
    d[j] + m[j // SCORE_TILE]; m is at least the largest visible logit of its tile (the
    reference: exactly that, -inf for a tile with no visible key; the kernel: its split's
    running maximum, -inf only for a tile with no visible key); d == FP8_MASKED marks a
    masked key (weight 0, whatever m is)."""

    d: Tensor
    m: Tensor

    @property
    def shape(self) -> torch.Size:
        return self.d.shape

    def reshape(self, *shape: int) -> LogScores:
        """d reshaped as Tensor.reshape (same last dim, S_max), m to the same leading dims."""
        return LogScores(self.d.reshape(*shape), self.m.reshape(*shape[:-1], self.m.shape[-1]))


def score_tiles(s_max: int) -> int:
    """m entries per line of an "fp8" score buffer of S_max keys."""
    return math.ceil(s_max / SCORE_TILE)


def empty_scores(lead: tuple[int, ...], s_max: int, score_format: str,
                 device: torch.device | str) -> Tensor | LogScores:
    """An uninitialised score buffer [*lead, S_max] of `score_format`."""
    if score_format == "bf16":
        return torch.empty(*lead, s_max, dtype=torch.bfloat16, device=device)
    if score_format == "fp8":
        return LogScores(torch.empty(*lead, s_max, dtype=FP8_DTYPE, device=device),
                         torch.empty(*lead, score_tiles(s_max), dtype=torch.float32,
                                     device=device))
    raise ValueError(f"score_format must be one of {SCORE_FORMATS}, got {score_format!r}")


def to_log_scores(scores: Tensor, scale: float) -> LogScores:
    """Raw q·k [..., S_max] (-inf where masked, any float dtype) → the "fp8" format with
    m = each tile's largest visible logit (-inf for a tile with none)."""
    s_max = scores.shape[-1]
    n_t = score_tiles(s_max)
    x = scores.float() * (scale * math.log2(math.e))
    pad = torch.full((*x.shape[:-1], n_t * SCORE_TILE - s_max), float("-inf"), device=x.device)
    tiles = torch.cat([x, pad], -1).unflatten(-1, (n_t, SCORE_TILE))
    m = tiles.amax(-1)  # [..., n_t]
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    d = (tiles - m_safe[..., None]).clamp_min(FP8_MASKED).flatten(-2)[..., :s_max]
    return LogScores(d.to(FP8_DTYPE), m)


def log_scores_logits(scores: LogScores) -> Tensor:
    """The base-2 logits d + m of an "fp8" buffer, fp32, -inf where masked."""
    s_max = scores.d.shape[-1]
    m = scores.m.repeat_interleave(SCORE_TILE, dim=-1)[..., :s_max]
    d = scores.d.float()
    return torch.where(d <= FP8_MASKED, torch.full_like(d, float("-inf")), d + m)


def _expand_kv(x: Tensor, group: int) -> Tensor:
    # [L, Hkv, D] -> [L, Hq, D]: query head h reads KV head h // group
    return x.repeat_interleave(group, dim=1)


def collect_row_ids(n_query: int, collect: str) -> list[int]:
    """Query rows whose scores are written out for `collect` ("none" | "first_last" | "all")."""
    if collect == "none":
        return []
    if collect == "first_last":
        return [0] if n_query == 1 else [0, n_query - 1]
    if collect == "all":
        return list(range(n_query))
    raise ValueError(f"collect must be 'none', 'first_last' or 'all', got {collect!r}")


def verify_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    scale: float,
    collect: str = "none",
    sinks: Tensor | None = None,
    window: int = 0,
    score_format: str = "bf16",
) -> tuple[Tensor, Tensor, Tensor | LogScores | None]:
    """Causal attention of NQ new rows per request over its KV cache (see API.md).

    q [B, NQ, Hq, D]; caches [B, S_max, Hkv, D]; cache_lens [B] (includes the NQ new tokens);
    sinks [Hq] or None (module docstring); window > 0: row i sees only its `window` newest
    keys (a sliding-window layer; no collection). Returns out [B, NQ, Hq, D] (q's dtype), lse
    [B, NQ, Hq] fp32 (with the sink) and scores [B, R, Hq, S_max] bf16 (raw q·k, -inf where
    masked) or None; with score_format "fp8" the scores are `to_log_scores` of those.
    """
    B, NQ, Hq, _D = q.shape
    S_max, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    rows = collect_row_ids(NQ, collect)
    out = torch.empty_like(q)
    lse = torch.empty(B, NQ, Hq, dtype=torch.float32, device=q.device)
    # "fp8" is encoded from the fp32 q·k, as the kernel does
    raw_dtype = torch.float32 if score_format == "fp8" else torch.bfloat16
    scores = (
        torch.full((B, len(rows), Hq, S_max), float("-inf"), dtype=raw_dtype, device=q.device)
        if rows else None
    )
    lens = cache_lens.tolist()
    for b in range(B):
        L = int(lens[b])
        k = _expand_kv(k_cache[b, :L].float(), group)  # [L, Hq, D]
        v = _expand_kv(v_cache[b, :L].float(), group)  # [L, Hq, D]
        s = torch.einsum("nhd,lhd->hnl", q[b].float(), k)  # [Hq, NQ, L] raw q·k
        # row i is position L - NQ + i and sees keys [0, L - NQ + i]
        limit = L - NQ + torch.arange(NQ, device=q.device)  # [NQ]
        key = torch.arange(L, device=q.device)[None, :]
        masked = key > limit[:, None]  # [NQ, L]
        if window:
            masked |= key <= limit[:, None] - window
        s = s.masked_fill(masked[None], float("-inf"))
        row_lse = torch.logsumexp(scale * s, dim=-1)  # [Hq, NQ]
        if sinks is not None:  # one more term in every row's denominator
            row_lse = torch.logaddexp(row_lse, sinks.float()[:, None])
        p = torch.exp(scale * s - row_lse[..., None])  # [Hq, NQ, L]
        out[b] = torch.einsum("hnl,lhd->nhd", p, v).to(q.dtype)
        lse[b] = row_lse.transpose(0, 1)
        if scores is not None:
            scores[b, :, :, :L] = s[:, rows].transpose(0, 1).to(raw_dtype)
    if scores is not None and score_format == "fp8":
        return out, lse, to_log_scores(scores, scale)
    return out, lse, scores


def sparse_draft_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    indices: Tensor,
    n_idx: Tensor,
    tail_start: Tensor,
    cache_lens: Tensor,
    scale: float,
    sinks: Tensor | None = None,
) -> Tensor:
    """One query row per request over indices[b, :n_idx[b]] plus positions [tail_start, cache_lens).

    q [B, Hq, D]; caches [B, S_max, Hkv, D]; indices [B, K]; sinks [Hq] or None (module
    docstring). Returns [B, Hq, D] in q's dtype.
    """
    B, Hq, _D = q.shape
    group = Hq // k_cache.shape[2]
    out = torch.empty_like(q)
    n_list, t_list, c_list = n_idx.tolist(), tail_start.tolist(), cache_lens.tolist()
    for b in range(B):
        sel = indices[b, : int(n_list[b])].long()
        tail = torch.arange(int(t_list[b]), int(c_list[b]), device=q.device)
        pos = torch.cat([sel, tail])  # [N]
        k = _expand_kv(k_cache[b, pos].float(), group)  # [N, Hq, D]
        v = _expand_kv(v_cache[b, pos].float(), group)
        s = scale * torch.einsum("hd,nhd->hn", q[b].float(), k)  # [Hq, N]
        if sinks is not None:  # the sink column joins the softmax, then is dropped
            p = torch.softmax(torch.cat([s, sinks.float()[:, None]], dim=-1), dim=-1)[:, :-1]
        else:
            p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v).to(q.dtype)
    return out


# Weights inside the ranked range are floored at the smallest normal fp32 so that a key whose
# exp() underflowed still outranks the zeros beyond rank_len (top-k must never pick those).
WEIGHT_FLOOR = float(torch.finfo(torch.float32).tiny)


def score_weights(
    scores: Tensor | LogScores,
    lse: Tensor,
    scale: float,
    rank_len: Tensor,
    rows: Tensor | None = None,
) -> Tensor:
    """Softmax weights exp(scale·s − lse) averaged over heads (and rows): [B, S_max] fp32.
    With an lse that includes the attention sink (verify_attention with sinks) these are the
    model's probabilities, which then sum to less than 1 per row and head.

    scores [B, R, Hq, S_max] bf16 (or `LogScores`: the "fp8" format, weights
    exp2(d + m − lse·log2(e))); lse [B, R, Hq]; rank_len [B]; rows [B] picks one row per
    request (SpecExtend) instead of the mean over all R rows. Zero at positions >= rank_len;
    inside, at least WEIGHT_FLOOR.
    """
    if isinstance(scores, LogScores):
        return _log_score_weights(scores, lse, rank_len, rows)
    B, _R, Hq, S_max = scores.shape
    if rows is not None:
        pick = rows.long().view(B, 1, 1, 1).expand(B, 1, Hq, S_max)
        scores = torch.gather(scores, 1, pick)  # [B, 1, Hq, S_max]
        lse = torch.gather(lse, 1, rows.long().view(B, 1, 1).expand(B, 1, Hq))  # [B, 1, Hq]
    w = torch.exp(scale * scores.float() - lse[..., None].float())  # [B, R', Hq, S_max]
    w = w.mean(dim=(1, 2))  # [B, S_max]
    inside = torch.arange(S_max, device=scores.device)[None, :] < rank_len.long()[:, None]
    return torch.where(inside, w.clamp_min(WEIGHT_FLOOR), torch.zeros_like(w))


def _log_score_weights(scores: LogScores, lse: Tensor, rank_len: Tensor,
                       rows: Tensor | None) -> Tensor:
    """score_weights of the "fp8" format: exp2(d + m − lse·log2(e)), 0 where d is masked."""
    B, _R, Hq, S_max = scores.shape
    x = log_scores_logits(scores)  # [B, R, Hq, S_max]
    if rows is not None:
        x = torch.gather(x, 1, rows.long().view(B, 1, 1, 1).expand(B, 1, Hq, S_max))
        lse = torch.gather(lse, 1, rows.long().view(B, 1, 1).expand(B, 1, Hq))
    w = torch.exp2(x - lse[..., None].float() * math.log2(math.e)).mean(dim=(1, 2))
    inside = torch.arange(S_max, device=x.device)[None, :] < rank_len.long()[:, None]
    return torch.where(inside, w.clamp_min(WEIGHT_FLOOR), torch.zeros_like(w))


def topk_select(weights: Tensor, budget: Tensor) -> Tensor:
    """Top-budget[b] positions per (layer, request): [L, B, K] int32, -1 past budget[b].

    weights [L, B, S_max] fp32; budget [B] (already capped at rank_len). K = max(budget).
    """
    L, B, _S_max = weights.shape
    K = int(budget.max().item()) if budget.numel() else 0
    if K == 0:
        return torch.empty(L, B, 0, dtype=torch.int32, device=weights.device)
    idx = torch.topk(weights, K, dim=-1, sorted=True).indices.to(torch.int32)  # [L, B, K]
    # topk(K) sorted descending: its first budget[b] entries are the top budget[b]
    past = torch.arange(K, device=weights.device)[None, :] >= budget.long()[:, None]  # [B, K]
    return idx.masked_fill(past[None], -1)


def stream_indices(context: Tensor, budget: Tensor, sink: int) -> tuple[Tensor, Tensor]:
    """StreamingLLM indices: first `sink` positions + the last (budget − sink) of [0, context).

    context, budget [B]. Returns indices [B, K] int32 (K = max budget, -1 past n_idx) and
    n_idx [B] int32 = min(budget, context).
    """
    B = context.shape[0]
    ctx = context.long()
    n = torch.minimum(budget.long(), ctx)  # [B]
    K = int(budget.max().item()) if B else 0
    j = torch.arange(K, device=context.device)[None, :]  # [1, K]
    n_sink = torch.clamp(n, max=sink)[:, None]  # [B, 1]
    # j < n_sink: position j; else the window ending at context - 1
    window = ctx[:, None] - (n[:, None] - j)  # [B, K]
    idx = torch.where(j < n_sink, j, window)
    idx = torch.where(j < n[:, None], idx, torch.full_like(idx, -1))
    return idx.to(torch.int32), n.to(torch.int32)


def quest_update_meta(
    kmin: Tensor, kmax: Tensor, k_cache: Tensor, start: Tensor, end: Tensor
) -> None:
    """Recompute, in place, the min/max keys of every page touched by positions [start, end).

    kmin/kmax [B, P, Hkv, D]; k_cache [B, S_max, Hkv, D]. `end` is the request's cache length
    after the append: positions >= end inside a touched page are treated as empty, so the
    same call is right after a rollback too. Requests with start >= end are left alone.
    """
    s_list, e_list = start.tolist(), end.tolist()
    for b in range(kmin.shape[0]):
        s, e = int(s_list[b]), int(e_list[b])
        if s >= e:
            continue
        p0, p1 = s // QUEST_PAGE, (e - 1) // QUEST_PAGE + 1  # pages [p0, p1)
        keys = k_cache[b, p0 * QUEST_PAGE : e]  # [n, Hkv, D]
        pad = p1 * QUEST_PAGE - keys.shape[0] - p0 * QUEST_PAGE
        hi = torch.nn.functional.pad(keys.float(), (0, 0, 0, 0, 0, pad), value=float("-inf"))
        lo = torch.nn.functional.pad(keys.float(), (0, 0, 0, 0, 0, pad), value=float("inf"))
        shape = (p1 - p0, QUEST_PAGE) + tuple(keys.shape[1:])  # [pages, 16, Hkv, D]
        kmax[b, p0:p1] = hi.view(shape).amax(dim=1).to(kmax.dtype)
        kmin[b, p0:p1] = lo.view(shape).amin(dim=1).to(kmin.dtype)


def quest_page_scores(q: Tensor, kmin: Tensor, kmax: Tensor) -> Tensor:
    """score[b, p] = Σ_h Σ_d max(q·kmax, q·kmin) with head h on KV head h // group: [B, P] fp32."""
    B, Hq, D = q.shape
    Hkv = kmin.shape[2]
    qg = q.float().view(B, 1, Hkv, Hq // Hkv, D)  # [B, 1, Hkv, G, D]
    hi = qg * kmax.float()[:, :, :, None, :]  # [B, P, Hkv, G, D]
    lo = qg * kmin.float()[:, :, :, None, :]
    return torch.maximum(hi, lo).sum(dim=(2, 3, 4))


def quest_page_bound(n_pages: Tensor, max_pages: int | None) -> int:
    """Pages the index list has room for: `max_pages` when given (no host sync, so CUDA
    graphs can capture the op), else the largest n_pages (one sync); 0 for an empty batch."""
    if n_pages.numel() == 0:
        return 0
    return max_pages if max_pages is not None else int(n_pages.max().item())


def quest_select(
    q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, n_pages: Tensor,
    max_pages: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Quest: top n_pages[b] full pages inside [0, context) + the current partial page.

    Returns token indices [B, K] int32 (K = 16·(max n_pages + 1), or 16·(max_pages + 1) when
    given; -1 past n_idx) and n_idx [B]. The chosen pages come in ascending page order; of the
    pages tied at the take-th score, the smaller page indices are chosen (a stable sort).
    """
    n_max = quest_page_bound(n_pages, max_pages)
    return quest_pick(quest_page_scores(q, kmin, kmax), context, n_pages, n_max)


def quest_pick(scores: Tensor, context: Tensor, n_pages: Tensor, n_max: int
               ) -> tuple[Tensor, Tensor]:
    """`quest_select`'s list from the page scores [B, P]: per request the top
    min(n_pages, full, n_max) of the full pages by score (ties to the smaller page index) in
    ascending page order, then the partial page, -1 up to K = 16·(n_max + 1)."""
    B, P = scores.shape
    K = QUEST_PAGE * (n_max + 1) if B else 0
    out = torch.full((B, K), -1, dtype=torch.int32, device=scores.device)
    n_out = torch.zeros(B, dtype=torch.int32, device=scores.device)
    c_list, n_list = context.tolist(), n_pages.tolist()
    offs = torch.arange(QUEST_PAGE, device=scores.device)
    for b in range(B):
        ctx = int(c_list[b])
        full = min(ctx // QUEST_PAGE, P)
        take = min(int(n_list[b]), full, n_max)
        order = torch.sort(scores[b, :full], descending=True, stable=True).indices
        pages = order[:take].sort().values  # [take]
        tok = (pages[:, None] * QUEST_PAGE + offs[None, :]).reshape(-1)  # [take*16]
        partial = torch.arange(full * QUEST_PAGE, ctx, device=scores.device)  # the current page
        tok = torch.cat([tok, partial])
        out[b, : tok.numel()] = tok.to(torch.int32)
        n_out[b] = tok.numel()
    return out, n_out


# ---- the model's per-layer glue (runtime ops; the torch code the runtime always ran) ------


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float
                 ) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + delta) · weight, x + delta); no add when delta is None.

    x, delta [..., H] in the model dtype; the sum is rounded to it, the norm runs in fp32 and
    is rounded before the weight multiplies (as HF Llama / Qwen do). Returns (normed, sum).
    """
    if delta is not None:
        x = x + delta
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), x


def silu_mul(gate_up: Tensor) -> Tensor:
    """SwiGLU's middle: [..., 2F] (gate | up) -> silu(gate) · up [..., F]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Half-split ("NeoX", HF rotate_half) RoPE in fp32. x [B, NQ, H, D]; cos/sin [B, NQ, D/2]."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def qkv_rope_append(
    qkv: Tensor, n_heads: int, q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
    cos_table: Tensor, sin_table: Tensor, cache_lens: Tensor, k_cache: Tensor, v_cache: Tensor,
) -> Tensor:
    """Split the fused projection, per-head RMSNorm q and k (Qwen3), rotate them, and append
    k, v to the cache at positions cache_lens[b] + i. Returns q [B, NQ, Hq, D].

    qkv [B, NQ, (Hq + 2·Hkv)·D] (q | k | v); cos/sin_table [positions, D/2] fp32; caches
    [B, S_max, Hkv, D] of one layer; cache_lens [B] int32 *before* the append.
    """
    B, NQ, _ = qkv.shape
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    q, k, v = qkv.split([n_heads * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, NQ, n_heads, D), k.view(B, NQ, Hkv, D), v.view(B, NQ, Hkv, D)
    if q_norm is not None and k_norm is not None:
        q = add_rms_norm(q, None, q_norm, eps)[0]
        k = add_rms_norm(k, None, k_norm, eps)[0]
    pos = cache_lens.long()[:, None] + torch.arange(NQ, device=qkv.device)  # [B, NQ]
    cos, sin = cos_table[pos], sin_table[pos]  # [B, NQ, D/2]
    rows = torch.arange(B, device=qkv.device)[:, None]  # [B, 1]
    k_cache[rows, pos] = apply_rope(k, cos, sin)  # [B, NQ, Hkv, D] at (b, pos[b, i])
    v_cache[rows, pos] = v
    return apply_rope(q, cos, sin)
