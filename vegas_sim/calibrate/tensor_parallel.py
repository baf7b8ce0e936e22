"""The model runtime split over a tensor-parallel group of `torch.distributed` processes (NCCL
on GPUs, gloo on the CPU), as vLLM splits it (`ModelSpec.tensor_shard`):

    wqkv   rows of this rank's query heads | its KV heads' k | v (replicated past their count)
    wo     columns of its query heads              → all-reduce of the attention output
    w13    rows of its slice of gate | up           (experts: each expert's slice)
    w2     columns of its slice                     → all-reduce of the MLP output
    embed  rows of its vocabulary slice             → masked lookup, all-reduce
    head   rows of its vocabulary slice             → all-gather of the logits
    norms, router: whole on every rank; output biases on rank 0 only (they are summed)

Every rank runs the same decoding loop on the same inputs and seeds, so their sampled tokens
agree; Vegas-family selection sums the rank weights of every rank's heads first
(`Transformer.all_reduce` in `SpecDecoder.select`), so every rank drafts from the same keys.
Quest and Stream select on each rank's own heads. `collectives` counts the calls and bytes
(a CUDA graph's at every replay: `runtime.GraphedForward` hands them back). With
`collectives_on` False every collective is a no-op of the same shapes (numerically wrong): the
phase's time without them, which calibrate subtracts to time them (calibrate/tp_run.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.models import ModelSpec


@dataclasses.dataclass
class Collectives:
    """What one rank's collectives moved (calls and payload bytes), by kind."""

    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    captured: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    def add(self, kind: str, x: Tensor) -> None:
        """Count one call on `x`; inside a CUDA-graph capture (which runs nothing) it is kept
        for the graph's replays instead (`take_captured`)."""
        nbytes = x.numel() * x.element_size()
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            self.captured.append((kind, nbytes))
        else:
            self.count(kind, nbytes)

    def count(self, kind: str, nbytes: int) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes[kind] = self.bytes.get(kind, 0) + nbytes

    def take_captured(self) -> list[tuple[str, int]]:
        out, self.captured = self.captured, []
        return out

    def total(self) -> tuple[int, int]:
        """(calls, bytes) over every kind so far (a PhaseTimer counter)."""
        return sum(self.calls.values()), sum(self.bytes.values())


def _kv_heads_of(spec: ModelSpec, rank: int, tp: int) -> list[int]:
    """The KV heads rank `rank` holds: its slice, or the one it replicates."""
    kv = spec.n_kv_heads
    if tp <= kv:
        per = kv // tp
        return list(range(rank * per, (rank + 1) * per))
    return [rank // (tp // kv)]


def _heads(w: Tensor, heads: list[int], head_dim: int, dim: int) -> Tensor:
    """The rows (dim 0) or columns (dim 1) of `heads`, each `head_dim` wide."""
    idx = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads])
    return w.index_select(dim, idx.to(w.device))


def _slice(w: Tensor, rank: int, tp: int, dim: int) -> Tensor:
    n = w.shape[dim] // tp
    return w.narrow(dim, rank * n, n)


def _vocab_rows(w: Tensor, rank: int, tp: int) -> Tensor:
    """Rows [rank·n, (rank+1)·n) of a [V, H] table, n = ceil(V / tp), zero-padded past V."""
    n = -(-w.shape[0] // tp)
    rows = w[rank * n: (rank + 1) * n]
    return F.pad(rows, (0, 0, 0, n - rows.shape[0]))


def shard_weights(spec: ModelSpec, weights: dict[str, Tensor], rank: int, tp: int
                  ) -> dict[str, Tensor]:
    """This rank's part of a whole model's weights (our names, `Transformer.param_names`)."""
    d, hq = spec.head_dim, spec.n_heads // tp
    q_heads = list(range(rank * hq, (rank + 1) * hq))
    kv_heads = _kv_heads_of(spec, rank, tp)
    q_dim, kv_dim = spec.n_heads * d, spec.n_kv_heads * d
    out: dict[str, Tensor] = {}
    for name, w in weights.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("wqkv", "bqkv"):
            q, k, v = w[:q_dim], w[q_dim:q_dim + kv_dim], w[q_dim + kv_dim:]
            out[name] = torch.cat([_heads(q, q_heads, d, 0), _heads(k, kv_heads, d, 0),
                                   _heads(v, kv_heads, d, 0)])
        elif leaf == "wo":
            out[name] = _heads(w, q_heads, d, 1)
        elif leaf == "sinks":
            out[name] = w[rank * hq: (rank + 1) * hq]
        elif leaf in ("w13", "b13"):  # [.., 2F(, H)]: gate | up, each sliced
            gate, up = w.chunk(2, dim=-2 if leaf == "w13" else -1)
            dim = gate.dim() - (2 if leaf == "w13" else 1)
            out[name] = torch.cat([_slice(gate, rank, tp, dim), _slice(up, rank, tp, dim)],
                                  dim=dim)
        elif leaf == "w2":  # [.., H, F]
            out[name] = _slice(w, rank, tp, w.dim() - 1)
        elif leaf in ("bo", "b2"):  # summed over the ranks: kept on one
            out[name] = w if rank == 0 else torch.zeros_like(w)
        elif leaf in ("embed", "lm_head"):
            out[name] = _vocab_rows(w, rank, tp)
        else:  # norms, router
            out[name] = w
    return out


class ShardedTransformer(Transformer):
    """One rank's shard of `spec` in the default process group of `tp` ranks."""

    def __init__(self, spec: ModelSpec, weights: dict[str, Tensor], *,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.tp = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        shard = spec.tensor_shard(self.tp)
        super().__init__(shard, shard_weights(spec, weights, self.rank, self.tp),
                         device=device, dtype=dtype)
        self.vocab_shard = shard.vocab  # rows of embed / lm_head on this rank
        self.spec = dataclasses.replace(shard, vocab=spec.vocab)  # logits are whole
        self.collectives = Collectives()
        self.collectives_on = True

    def captured_collectives(self) -> list[tuple[str, int]]:
        return self.collectives.take_captured()

    def replayed(self, collectives: list[tuple[str, int]]) -> None:
        for kind, nbytes in collectives:
            self.collectives.count(kind, nbytes)

    def all_reduce(self, x: Tensor) -> Tensor:
        if not self.collectives_on:
            return x
        self.collectives.add("all_reduce", x)
        dist.all_reduce(x, group=self.group)
        return x

    def _embed(self, tokens: Tensor) -> Tensor:
        local = tokens - self.rank * self.vocab_shard  # [B, NQ]
        held = (local >= 0) & (local < self.vocab_shard)
        x = F.embedding(local.clamp(0, self.vocab_shard - 1), self.embed) * held[..., None]
        return self.all_reduce(x)

    def _logits(self, h: Tensor) -> Tensor:
        part = super()._logits(h).contiguous()  # [B, NQ, V / tp]
        if self.collectives_on:
            parts = [torch.empty_like(part) for _ in range(self.tp)]
            self.collectives.add("all_gather", part)
            dist.all_gather(parts, part, group=self.group)
        else:
            parts = [part] * self.tp
        return torch.cat(parts, dim=-1)[..., : self.spec.vocab]


def run_group(tp: int, body: Callable[[int], None], *, port: int = 29511) -> None:
    """Run body(rank) in `tp` CPU processes joined by gloo (tests, CPU checks); re-raises the
    first rank's failure in the caller."""
    import torch.multiprocessing as mp

    mp.start_processes(_rank_main, args=(tp, port, body), nprocs=tp, start_method="spawn")


def _rank_main(rank: int, tp: int, port: int, body: Callable[[int], None]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp)
    try:
        body(rank)
    finally:
        dist.destroy_process_group()
