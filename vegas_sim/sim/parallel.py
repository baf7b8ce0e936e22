"""Tensor parallelism as a what-if of a latency model measured on one GPU.

A `tp`-way group splits every forward as vLLM does (`ModelSpec.tensor_shard`): each GPU streams
its share of the weights, reads its share of the KV heads (replicated one per GPU past the
model's KV heads) and does its share of the FLOPs, so the fitted roofline features are computed
for the shard and priced at the measured efficiencies. What one GPU never paid is the
communication, which is *modelled, not measured*:

    per forward over R query rows (B · n_query):
      (2 · L + 1) all-reduces of R · hidden · dtype bytes   (attention and MLP outputs of each
                                                            layer, the vocab-parallel embedding)
      1 gather of the logits, R · vocab · dtype bytes       (the vocab-parallel LM head)
    ring all-reduce:  t = α + 2 (N − 1) / N · bytes / link
    gather:           t = α + (N − 1) / N · bytes / link

with α the fixed cost of one collective call (`GpuSpec.allreduce_latency_us`, an assumption)
and `link` the GPU's link bandwidth per direction (`GpuSpec.link_gbs`, datasheet). Only the
phases that run a forward pay it (decode, draft steps, verify, prefill); sampling, selection
and Quest's page scoring run on each GPU's own shard or on one GPU, and keep their measured
cost. The host floor is kept: every rank issues the same kernels one GPU did.

A set calibrated at `--tp N` (`calibrate --tp N`, meta.json `tensor_parallel`) measured one
rank of the group: its phase times hold the collectives as they ran. Its fits are made on the
shard's features and predict at N as measured (`TensorParallel.measured_at`: no modelled
collective is added); another size from it is refused, since its measured collectives cannot
be taken out of the fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vegas_sim.errors import UserInputError
from vegas_sim.gpus import GpuSpec
from vegas_sim.models import ModelSpec, check_tensor_parallel
from vegas_sim.sim.latency_features import Physics

# Phases that run the model's forward, and so its collectives.
FORWARD_PHASES = ("decode", "draft_step", "verify", "prefill")


@dataclass(frozen=True)
class TensorParallel:
    """A tensor-parallel group of `size` GPUs joined by links of `link_gbs` per direction."""

    size: int
    link_gbs: float
    allreduce_latency_us: float
    measured: bool = False  # the set was measured on this group: collectives in its times
    interconnect: str = ""  # as the set's meta records it (measured groups)

    @classmethod
    def measured_at(cls, size: int, interconnect: str) -> TensorParallel:
        """The group a set was calibrated on (size 1: one GPU)."""
        return cls(size, 0.0, 0.0, measured=size > 1, interconnect=interconnect)

    @property
    def what_if(self) -> bool:
        """Whether the group's collectives are modelled (a size > 1 not measured)."""
        return self.size > 1 and not self.measured

    @classmethod
    def of(cls, model: ModelSpec, size: int, gpu: GpuSpec | None) -> TensorParallel:
        """The group for `size` GPUs of `gpu` (its datasheet link); refused when the model
        cannot be split that way or the GPU's link is unknown."""
        check_tensor_parallel(model, size)
        if size == 1:
            return cls(1, 0.0, 0.0)
        if gpu is None or gpu.link_gbs <= 0:
            name = "the measured GPU" if gpu is None else gpu.name
            raise UserInputError(f"no GPU-to-GPU link bandwidth is known for {name}",
                                 where="--tp", fix="describe the GPU in a --gpu-spec file with "
                                 "link_bandwidth_gbs (per direction) and allreduce_latency_us")
        return cls(size, gpu.link_gbs, gpu.allreduce_latency_us)

    @property
    def label(self) -> str:
        if self.measured:
            return (f"tensor parallel {self.size}: measured on one rank of the group "
                    f"({self.interconnect or 'interconnect unknown'}), collectives included")
        return (f"tensor parallel {self.size}: all-reduces modelled at {self.link_gbs:g} GB/s "
                f"per direction + {self.allreduce_latency_us:g} µs a call — NOT measured")

    def _ms(self, nbytes: float, passes: float) -> float:
        n = self.size
        return (self.allreduce_latency_us * 1e-3
                + passes * (n - 1) / n * nbytes / (self.link_gbs * 1e9) * 1e3)

    def phase_comm(self, phase: str, model: ModelSpec, rows: int) -> tuple[float, float]:
        """(ms per call, ms per key of the call's Σ kv_read) of one call of `phase`: a forward
        pays `forward_comm_ms`; Vegas-family selection sums its per-layer fp32 key weights over
        the heads the GPUs hold (one all-reduce of Σ kv_read · L · 4 bytes). Nothing on one
        GPU, and nothing for a measured group (its times hold its collectives)."""
        if self.size == 1 or self.measured:
            return 0.0, 0.0
        if phase in FORWARD_PHASES:
            return self.forward_comm_ms(model, rows), 0.0
        if phase == "select":
            per_key = 2.0 * (self.size - 1) / self.size * model.n_layers * 4 / (
                self.link_gbs * 1e9) * 1e3
            return self.allreduce_latency_us * 1e-3, per_key
        return 0.0, 0.0

    def forward_comm_ms(self, model: ModelSpec, rows: int) -> float:
        """Collective time of one forward over `rows` query rows on the whole `model`."""
        if self.size == 1 or self.measured:
            return 0.0
        activation = rows * model.hidden * model.dtype_bytes
        logits = rows * model.vocab * model.dtype_bytes
        return ((2 * model.n_layers + 1) * self._ms(activation, 2.0)
                + self._ms(logits, 1.0))


def shard_physics(model: ModelSpec, tp: int, bandwidth_gbs: float, tflops: float,
                  weight_format: str) -> Physics:
    """Roofline constants of one GPU's shard; sampling still reads the whole vocabulary's
    logits (gathered on one GPU)."""
    phys = Physics.of(model.tensor_shard(tp), bandwidth_gbs, tflops, weight_format)
    if tp == 1:
        return phys
    return replace(phys, logits_ms_per_row=Physics.of(model, bandwidth_gbs, tflops,
                                                      weight_format).logits_ms_per_row)
