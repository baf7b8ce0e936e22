"""Batched self-speculative decoding for every method of DESIGN.md "Methods".

Iteration semantics (one iteration = γ sparse draft steps + one full-attention verify pass):

- State per request: the verified context C (tokens in the KV cache whose K/V came from full
  attention) and t0, the token sampled at the end of the previous iteration: not yet in the
  cache, its position is C.
- Draft: step j = 1..γ feeds the previous token (t0, then d1, ...) at position C+j−1 through the
  model with the method's sparse attention policy, writing its (sparse-computed) K/V, and
  proposes d_j: argmax (greedy) or a draw from q_j (temperature/top-p/top-k), q_j kept.
- Verify: roll the cache back to C, feed [t0, d1..dγ] (γ+1 rows, positions C..C+γ) with full
  attention (ops.verify_attention) plus the method's score collection. Row i's distribution p_i
  verifies d_{i+1}; acceptance is sequential (greedy: d == argmax p; sampled: accept with
  probability min(1, p/q), on rejection draw from normalise(max(p − q, 0)); after γ accepts the
  bonus is drawn from p_γ). accept_prob = min(1, p/q) per drafted position (1/0 greedy).
- Then C' = C + 1 + a, the cache is rolled back to C' (verify wrote the right K/V for t0 and the
  a accepted drafts) and t0' is the correction/bonus token. a + 1 tokens are emitted (capped at
  max_new_tokens).
- Selection, for the *next* iteration's drafts:
  * vegas / vegas-all: the verify pass collects the raw scores of rows first+last / all; they
    become per-position weights (ops.score_weights, rank_len = C + 1: positions [0, C], the
    context plus t0) — vegas: every layer's scores in one launch after the last layer;
    vegas-all: per layer, right after attention — then one ops.topk_select over all
    layers with budget = methods.budget(s, C + 1, max_len, min_tokens). The drafts attend the
    selected keys plus every position > C of the selecting iteration (tail_start = C + 1):
    accepted drafts, the new t0 and each new draft.
  * specextend: verify collects all rows, each row's weights are kept; after acceptance the
    row a (the last accepted token's) is used; then as vegas.
  * After prefill (vegas types): selection from the prompt's last row (its scores collected by
    ops.verify_attention on that one row), rank_len = tail_start = prompt length.
  * magicdec-stream: ops.stream_indices(C, budget, sink) over [0, C); tail from C.
  * magicdec-quest: page min/max metadata (ops.quest_update_meta) over verified tokens; at
    every draft step and layer, ops.quest_select with that step's query (top budget/16 pages +
    the current page of [0, C)); tail from C.
- vanilla: one token per step with full attention — the reference for losslessness.

Prefill: every prompt but its last token is prefilled densely (runtime.prefill), then the last
prompt tokens go through one batched single-row step (with score collection for the vegas
types). Vanilla does the same, so the first sampled token t0 is computed identically.

Batching: B requests with their own C, t0, emitted tokens; all tensors batched. A request that
has emitted max_new_tokens is frozen (its C stops growing) and keeps running harmlessly until
the batch ends; it records nothing more.

Acceptance replay (replay.AcceptanceReplay): the accepted count comes from a recorded trace
instead of the comparison (random-weight latency runs at 8B/128K with realistic acceptance);
drafting, verifying, rollback and emission still run for real. accept_prob is then recorded
as 1 for the a replayed accepts and 0 after.

Timing (timers.PhaseTimer): draft_step (each step; eagerly, its Quest page scoring excluded and
timed as quest_meta — inside a CUDA graph it cannot be, see measure_latency.quest_scoring_ms),
quest_meta (page scoring + metadata update of newly verified tokens), verify (with
its score collection), sample (acceptance, emission and rollback), select (top-k), decode and
sample (vanilla), prefill, collect (the prompt's last-row collection), other.

Phase-level API (latency grid runner): `init_state(batch, context, max_seq)` builds a synthetic
state (random K/V at `context`, no prefill) on which draft / verify / accept_and_rollback /
select / decode can be timed one by one; a synthetic state keeps its context fixed (every
iteration is rolled back to the same C) so that repeated timings measure the same point.

Why one module for the loop: the draft, verify, acceptance and rollback steps share one
per-request state and one CUDA-graph capture; split apart, each would reach into the others'
buffers. The records they share (`SpecConfig`, `BatchState`, ...) are in `spec_state`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vegas_sim import methods
from vegas_sim.calibrate.policies import (
    CollectingVerifyAttention,
    QuestDraftAttention,
    SparseDraftAttention,
)
from vegas_sim.calibrate.replay import AcceptanceReplay
from vegas_sim.calibrate.runtime import DenseAttention, GraphedForward, Transformer
from vegas_sim.calibrate.sampling import (
    TokenProbs,
    TopKProbs,
    greedy_accept,
    rejection_accept,
    sample,
    stack_rows,
    token_probs,
)
from vegas_sim.calibrate.spec_state import (
    BatchState,
    GenerationResult,
    IterationRecord,
    SpecConfig,
    graphs_default,
    state_headroom,
)
from vegas_sim.calibrate.timers import PhaseTimer
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops

def _count_overflow(state: BatchState, dist: TokenProbs) -> None:
    if isinstance(dist, TopKProbs):
        n = dist.overflow.sum()
        state.tie_overflows = n if state.tie_overflows is None else state.tie_overflows + n


class SpecDecoder:
    """Runs one method (SpecConfig) on a model; see the module docstring for the semantics.

    graphs: replay the draft step, the verify pass and the vanilla decode step as CUDA graphs
    (runtime.GraphedForward, captured per state at first use or by `prepare_graphs`), so that
    the per-step CPU cost is a graph launch instead of ~15 kernel launches per layer. Default:
    on for CUDA.
    """

    def __init__(self, model: Transformer, config: SpecConfig,
                 timer: PhaseTimer | None = None, graphs: bool | None = None) -> None:
        self.model = model
        self.config = config
        self.timer = timer if timer is not None else PhaseTimer(model.device, enabled=False)
        self.spec = model.spec
        self.device = model.device
        self.dense = DenseAttention()
        self.graphs = graphs_default(self.device) if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise UserInputError("CUDA graphs need a CUDA model", where="graphs",
                                 fix="pass graphs=False on the CPU")

    # ---- helpers --------------------------------------------------------------------------
    def _budget(self, state: BatchState, length: np.ndarray) -> np.ndarray:
        c = self.config
        s = state.sparsity if state.sparsity is not None else c.sparsity
        return methods.budget(s, length, self.spec.max_positions, c.min_tokens)

    def _dev(self, x: np.ndarray, dtype: torch.dtype = torch.int32) -> Tensor:
        return torch.as_tensor(np.asarray(x), dtype=dtype).to(self.device, non_blocking=True)

    def _capacity(self, max_seq: int, sparsity: float) -> int:
        """Index-list capacity: the largest budget any context up to max_seq can get."""
        c = self.config
        top = methods.budget(sparsity, max_seq, self.spec.max_positions, c.min_tokens)
        return int(top) + methods.QUEST_PAGE

    def _new_state(self, batch: int, max_seq: int,
                   sparsity: np.ndarray | None = None) -> BatchState:
        c, s = self.config, self.spec
        top_sparsity = float(sparsity.max()) if sparsity is not None else c.sparsity
        cache = self.model.new_cache(batch, max_seq)
        kmin = kmax = None
        draft_policy: Any = None
        if c.spec.quest_pages:
            pages = -(-max_seq // methods.QUEST_PAGE)
            shape = (s.n_layers, batch, pages, s.n_kv_heads, s.head_dim)
            kmin = torch.zeros(shape, dtype=self.model.dtype, device=self.device)
            kmax = torch.zeros(shape, dtype=self.model.dtype, device=self.device)
            max_pages = self._capacity(max_seq, top_sparsity) // methods.QUEST_PAGE
            draft_policy = QuestDraftAttention(kmin, kmax, batch, self.device, self.timer.phase,
                                               max_pages=max_pages)
        elif c.spec.drafts:
            draft_policy = SparseDraftAttention(s.n_layers, batch,
                                                self._capacity(max_seq, top_sparsity),
                                                self.device,
                                                shared=c.spec.streaming)
        gamma = max(c.gamma, 1)
        verify = CollectingVerifyAttention(
            s.n_layers, batch, max_seq, self.device, c.collect,
            per_row=c.spec.selects_from == "last_accepted", max_rows=gamma + 1, n_heads=s.n_heads,
            fold_layer=max(i for i in range(s.n_layers) if s.layer_kind(i) == "full"),
            score_format=c.score_format or "bf16")
        return BatchState(
            cache=cache,
            context=torch.zeros(batch, dtype=torch.int32, device=self.device),
            ctx_host=np.zeros(batch, dtype=np.int64),
            t0=torch.zeros(batch, dtype=torch.long, device=self.device),
            drafts=torch.zeros(batch, gamma, dtype=torch.long, device=self.device),
            draft_probs=None, draft_policy=draft_policy, verify_policy=verify,
            kmin=kmin, kmax=kmax,
            accepted=torch.zeros(batch, dtype=torch.long, device=self.device),
            req_iteration=np.zeros(batch, dtype=np.int64),
            done=np.zeros(batch, dtype=bool),
            emitted=[[] for _ in range(batch)],
            sparsity=sparsity,
        )

    # ---- CUDA graphs ----------------------------------------------------------------------
    def _step_roles(self, state: BatchState) -> list[tuple[str, int, Any, bool]]:
        """(role, n_query, policy, last_only) of the forwards one iteration replays."""
        if not self.config.spec.drafts:
            return [("decode", 1, self.dense, True)]
        return [("draft", 1, state.draft_policy, True),
                ("verify", self.config.gamma + 1, state.verify_policy, False)]

    def prepare_graphs(self, state: BatchState) -> None:
        """Capture this state's step graphs now (otherwise each is captured at its first use),
        so that a timed window pays for no capture. No-op without graphs.

        Safe at any point between iterations: the warm-up forwards inside GraphedForward only
        write K/V past the cache's lengths (rewritten by the next step before anything reads
        them) and the verify weights (recomputed by the next verify before selection)."""
        if not self.graphs:
            return
        for role, nq, policy, last_only in self._step_roles(state):
            self._graph(state, role, nq, policy, last_only)

    def _graph(self, state: BatchState, role: str, n_query: int, policy: Any,
               last_only: bool) -> GraphedForward:
        key = (role, n_query)
        generation = getattr(policy, "generation", 0)  # policy buffers reallocated since?
        graph, captured_at = state.graphs.get(key, (None, -1))
        if graph is None or captured_at != generation:
            # No phase may record CUDA events inside a capture (Quest's nested quest_meta).
            enabled, self.timer.enabled = self.timer.enabled, False
            try:
                graph = GraphedForward(self.model, state.cache, policy, state.batch, n_query,
                                       last_only=last_only, pool=state.graph_pool)
            finally:
                self.timer.enabled = enabled
            state.graphs[key], state.graph_pool = (graph, generation), graph.pool
        return graph

    def _forward(self, state: BatchState, role: str, tokens: Tensor, policy: Any,
                 last_only: bool = False) -> Tensor:
        """model(tokens) with `policy`: a graph replay (its logits are a static buffer, valid
        until this role's next replay) or an eager forward."""
        if not self.graphs:
            return self.model(tokens, state.cache, policy, last_only=last_only)
        return self._graph(state, role, tokens.shape[1], policy, last_only)(tokens)

    def _set_context(self, state: BatchState, ctx: np.ndarray) -> None:
        state.ctx_host = ctx.astype(np.int64)
        state.context.copy_(self._dev(ctx))

    # ---- prefill --------------------------------------------------------------------------
    def prefill_state(self, prompts: list[Tensor], max_new_tokens: int, *,
                      generator: torch.Generator | None = None,
                      replay: AcceptanceReplay | None = None,
                      sparsity: Sequence[float] | None = None) -> BatchState:
        """Prefill `prompts` (1-D int64, >= 2 tokens each), sample t0, make the first selection.

        sparsity: one per prompt, to draft each request at its own sparsity (acceptance
        calibration batches a grid's sparsities); default: the config's for all.
        """
        if not prompts:
            raise UserInputError("no prompts", fix="pass at least one prompt")
        lengths = np.array([int(p.numel()) for p in prompts], dtype=np.int64)
        if lengths.min() < 2:
            raise UserInputError("a prompt has fewer than 2 tokens", where="prompts",
                                 fix="give every prompt at least 2 tokens")
        if max_new_tokens < 1:
            raise UserInputError("max_new_tokens must be >= 1", where="max_new_tokens",
                                 fix="ask for at least one token")
        c = self.config
        max_seq = int(lengths.max()) + max_new_tokens + state_headroom(c.gamma)
        state = self._new_state(len(prompts), max_seq, self._per_request(sparsity, len(prompts)))
        state.generator, state.replay, state.max_new_tokens = generator, replay, max_new_tokens
        with self.timer.phase("prefill"):
            self.model.prefill([p.reshape(-1)[:-1] for p in prompts], state.cache)
        last = torch.stack([p.reshape(-1)[-1] for p in prompts]).to(self.device)[:, None]
        with self.timer.phase("collect" if c.spec.selects_keys else "prefill"):
            state.verify_policy.rank_len.copy_(self._dev(lengths))
            policy = state.verify_policy if c.spec.selects_keys else self.dense
            first = self.verify_collect_prefill(last, state, policy)
        self._set_context(state, lengths)
        with self.timer.phase("sample"):
            t0 = sample(first, c.temperature, c.top_p, c.top_k, generator)
        state.t0.copy_(t0)
        for b, tok in enumerate(t0.tolist()):
            state.emitted[b].append(int(tok))
        state.done = np.array([len(e) >= max_new_tokens for e in state.emitted])
        # The prompt's last row plays the verify pass of a virtual iteration at C = P − 1.
        state.collect_ctx = lengths - 1
        if c.spec.quest_pages:
            self._quest_meta(state, np.zeros_like(lengths), lengths)
        if c.spec.selects_keys:
            self.select(state)
        return state

    @staticmethod
    def _per_request(sparsity: Sequence[float] | None, batch: int) -> np.ndarray | None:
        if sparsity is None:
            return None
        if len(sparsity) != batch:
            raise UserInputError(f"{len(sparsity)} sparsities for {batch} prompts",
                                 where="sparsity", fix="give one sparsity per prompt")
        for s in sparsity:
            methods.check_sparsity(s)
        return np.asarray(sparsity, dtype=np.float64)

    def verify_collect_prefill(self, last: Tensor, state: BatchState, policy: Any) -> Tensor:
        """The last prompt token as one row; returns its logits [B, V]."""
        # With one row, collect="all" / "first_last" both collect that row: rank over the
        # prompt (rank_len = P), which the verify policy's rank_len already says.
        return self.model(last, state.cache, policy, last_only=True)[:, 0]

    # ---- synthetic state (latency grid) ---------------------------------------------------
    def init_state(self, batch: int, context: int, max_seq: int, *, seed: int = 0,
                   replay: AcceptanceReplay | None = None,
                   max_new_tokens: int | None = None) -> BatchState:
        """A state at verified context `context` for every request, with random K/V and no
        prefill: the drafts' selection is made from random weights (vegas types), Quest
        metadata from the random keys. Context stays fixed across iterations — unless
        `max_new_tokens` is given: then the state evolves like a real one (contexts grow,
        tokens are emitted, requests finish), which `validate` uses at 128K contexts."""
        c = self.config
        if context < 1 or max_seq < context + state_headroom(c.gamma):
            raise UserInputError(
                f"context {context} does not fit max_seq {max_seq}", where="init_state",
                fix=f"use max_seq >= context + 2*gamma + 2 = {context + state_headroom(c.gamma)}")
        gen = torch.Generator(self.device).manual_seed(seed)
        state = self._new_state(batch, max_seq)
        state.synthetic, state.replay, state.generator = max_new_tokens is None, replay, gen
        # Synthetic: emission is bookkept (and forgotten) every iteration; nobody finishes.
        state.max_new_tokens = max_new_tokens if max_new_tokens is not None else 1 << 30
        ctx = np.full(batch, context, dtype=np.int64)
        state.cache.fill_random(self._dev(ctx), gen)
        self._set_context(state, ctx)
        state.t0.copy_(torch.randint(0, self.spec.vocab, (batch,), generator=gen,
                                     device=self.device))
        state.collect_ctx = ctx - 1
        enabled, self.timer.enabled = self.timer.enabled, False  # setup is not a phase
        try:
            if c.spec.quest_pages:
                self._quest_meta(state, np.zeros_like(ctx), ctx)
            if c.spec.selects_keys:
                w = state.verify_policy.weights
                w.uniform_(0.0, 1.0, generator=gen)
                w[..., context:] = 0.0  # nothing beyond rank_len = C
                self.select(state)
        finally:
            self.timer.enabled = enabled
        return state

    # ---- phases ---------------------------------------------------------------------------
    def _prepare_draft(self, state: BatchState) -> None:
        """Index lists that depend only on C (stream) or per-step page counts (quest)."""
        c = self.config
        if c.spec.streaming:
            b = self._budget(state, state.ctx_host)
            idx, n_idx = ops.stream_indices(state.context, self._dev(b), c.sink)
            state.draft_policy.set(idx, n_idx, state.context)
            state.budget_host = np.minimum(b, state.ctx_host)
        elif c.spec.quest_pages:
            b = self._budget(state, state.ctx_host)
            pages = np.maximum(b // methods.QUEST_PAGE, 1)
            state.draft_policy.set(state.context, self._dev(pages))
            partial = state.ctx_host % methods.QUEST_PAGE
            state.budget_host = np.minimum(pages * methods.QUEST_PAGE + partial, state.ctx_host)

    def draft(self, state: BatchState) -> None:
        """γ sparse draft steps from t0; fills state.drafts (and q for sampling)."""
        c = self.config
        with self.timer.phase("other"):
            self._prepare_draft(state)
        probs: list[TokenProbs] = []
        tok = state.t0[:, None]  # [B, 1]
        for j in range(c.gamma):
            with self.timer.phase("draft_step"):
                logits = self._forward(state, "draft", tok, state.draft_policy,
                                       last_only=True)[:, 0]
                if c.greedy:
                    d = logits.argmax(-1)  # [B]
                else:
                    q = token_probs(logits, c.temperature, c.top_p, c.top_k)  # [B] rows
                    d = q.draw(state.generator)
                    probs.append(q)
                state.drafts[:, j] = d
            tok = state.drafts[:, j:j + 1]
        state.draft_probs = stack_rows(probs) if probs else None  # [B, γ] rows

    def verify(self, state: BatchState) -> None:
        """Roll back to C, verify [t0, d1..dγ] with full attention and score collection."""
        with self.timer.phase("verify"):
            state.cache.rollback(state.context)
            tokens = torch.cat([state.t0[:, None], state.drafts], dim=1)  # [B, γ+1]
            state.verify_policy.rank_len.copy_(state.context + 1)  # rank [0, C]
            state.target_logits = self._forward(state, "verify", tokens, state.verify_policy)
            state.collect_ctx = state.ctx_host.copy()

    def accept_and_rollback(self, state: BatchState) -> None:
        """Acceptance ('sample' phase): emit tokens, roll the cache back to C' = C + 1 + a."""
        c = self.config
        if state.target_logits is None:
            raise UserInputError("accept_and_rollback before verify",
                                 fix="call draft() and verify() first")
        with self.timer.phase("sample"):
            accepted, next_tok, accept_prob = self._decide(state)
            assert state.done is not None and state.req_iteration is not None
            active = torch.as_tensor(~state.done, device=self.device)
            if state.synthetic:
                active = torch.zeros_like(active)
            step = torch.where(active, accepted + 1, torch.zeros_like(accepted))  # [B]
            new_ctx = state.context + step.to(torch.int32)
            state.cache.rollback(new_ctx)
            state.t0.copy_(torch.where(active, next_tok, state.t0))
            state.context.copy_(new_ctx)
            state.accepted = accepted
            # One host transfer per iteration: records and emission need the values.
            a_h, step_h = accepted.cpu().numpy(), step.cpu().numpy()
            drafts_h, next_h = state.drafts.cpu().numpy(), next_tok.cpu().numpy()
            prob_h = accept_prob.float().cpu().numpy()
        old_ctx = state.ctx_host
        state.ctx_host = old_ctx + step_h
        # A synthetic state does the same host bookkeeping as a real one (its cost is part of
        # an iteration's time) and then forgets it; replay still advances per request.
        self._emit(state, old_ctx, a_h, drafts_h, next_h, prob_h)
        if state.synthetic:
            self._forget_emission(state)
        if c.spec.quest_pages:
            # Synthetic states roll back to C, but still pay the update a real iteration pays
            # (pages of [C, C + 1 + a)); quest_select never reads past C's full pages.
            end = old_ctx + (a_h + 1 if state.synthetic else step_h)
            self._quest_meta(state, old_ctx, end)
        state.iteration += 1

    def _decide(self, state: BatchState) -> tuple[Tensor, Tensor, Tensor]:
        """(accepted [B], next token [B], accept probabilities [B, γ]) of this iteration.

        Replay: the real decision is still computed — under sampling, target probabilities
        (top-p / top-k sort) of all γ+1 rows and the rejection test, whose cost is part of
        a real iteration (a large one at large B and γ) — and then its outcome is replaced
        by the recorded accept count, the next token drawn from the target row there. That
        draw reuses the decision's processed probabilities: a second top-p pass over B rows
        (which a real iteration does not make) would give replayed iterations more "sample"
        than the calibration grid measures."""
        c = self.config
        logits = state.target_logits
        assert logits is not None
        accepted, nxt, prob, p = self._accept(state, logits)
        if state.replay is None:
            return accepted, nxt, prob
        assert state.req_iteration is not None
        a = self._dev(state.replay.batch(list(state.req_iteration), c.gamma), torch.long)
        rows = torch.arange(state.batch, device=self.device)
        nxt = logits[rows, a].argmax(-1) if p is None else p.rows(rows, a).draw(state.generator)
        prob = (torch.arange(c.gamma, device=self.device)[None, :] < a[:, None]).float()
        return a, nxt, prob

    def _accept(self, state: BatchState, logits: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, TokenProbs | None]:
        """The lossless acceptance rule: greedy match, or rejection sampling against q.
        Returns accepted, next token, accept probabilities, and the target distributions
        ([B, γ+1] rows) it sampled from (None when greedy)."""
        c = self.config
        if c.greedy:
            return (*greedy_accept(state.drafts, logits), None)
        assert state.draft_probs is not None
        p = token_probs(logits, c.temperature, c.top_p, c.top_k)  # [B, γ+1] rows
        for dist in (state.draft_probs, p):  # once per iteration, not in the draft loop
            _count_overflow(state, dist)
        return (*rejection_accept(state.drafts, state.draft_probs, p, state.generator), p)

    def _emit(self, state: BatchState, old_ctx: np.ndarray, a_h: np.ndarray,
              drafts_h: np.ndarray, next_h: np.ndarray, prob_h: np.ndarray) -> None:
        assert state.done is not None and state.req_iteration is not None
        budget = state.budget_host if state.budget_host is not None else old_ctx
        for b in range(state.batch):
            if state.done[b]:
                continue
            a = int(a_h[b])
            new = [int(t) for t in drafts_h[b, :a]] + [int(next_h[b])]
            room = state.max_new_tokens - len(state.emitted[b])
            new = new[:room]
            state.emitted[b].extend(new)
            state.records.append(IterationRecord(
                request=b, iteration=int(state.req_iteration[b]), context=int(old_ctx[b]),
                budget=int(budget[b]), accepted=a, accept_prob=[float(x) for x in prob_h[b]],
                emitted=len(new)))
            state.req_iteration[b] += 1
            state.done[b] = len(state.emitted[b]) >= state.max_new_tokens

    @staticmethod
    def _forget_emission(state: BatchState) -> None:
        """Synthetic states: drop what _emit recorded; nobody ever finishes."""
        state.records.clear()
        for tokens in state.emitted:
            tokens.clear()
        assert state.done is not None
        state.done[:] = False

    def _quest_meta(self, state: BatchState, start: np.ndarray, end: np.ndarray) -> None:
        """Page min/max over newly verified positions [start, end) of every layer."""
        assert state.kmin is not None and state.kmax is not None
        with self.timer.phase("quest_meta"):
            s, e = self._dev(start), self._dev(end)
            for layer in range(self.spec.n_layers):
                ops.quest_update_meta(state.kmin[layer], state.kmax[layer],
                                      state.cache.k[layer], s, e)

    def select(self, state: BatchState) -> None:
        """Top-k selection for the next drafts (vegas, vegas-all, specextend); else nothing."""
        c = self.config
        if not c.spec.selects_keys:
            return
        assert state.collect_ctx is not None
        with self.timer.phase("select"):
            rank_len = state.collect_ctx + 1  # positions [0, C] of the selecting iteration
            b = self._budget(state, rank_len)
            # [L, B, S] or [L, B, R, S]; a tensor-parallel shard's weights cover its own heads
            weights = self.model.all_reduce(state.verify_policy.weights)
            if c.spec.selects_from == "last_accepted":
                assert state.accepted is not None
                rows = torch.arange(state.batch, device=self.device)
                weights = weights[:, rows, state.accepted]  # row a: the last accepted token
            idx = ops.topk_select(weights, self._dev(b))  # [L, B, K]
            state.draft_policy.set(idx, self._dev(b), self._dev(rank_len))
            state.budget_host = b

    def decode(self, state: BatchState) -> None:
        """One vanilla step for every request: full attention, sample, advance by one."""
        c = self.config
        with self.timer.phase("decode"):
            logits = self._forward(state, "decode", state.t0[:, None], self.dense,
                                   last_only=True)
        with self.timer.phase("sample"):
            nxt = sample(logits[:, 0], c.temperature, c.top_p, c.top_k, state.generator)
            if not state.synthetic:
                state.t0.copy_(nxt)
            nxt_h = nxt.cpu().numpy()  # emission needs the tokens on the host: one sync
        assert state.done is not None
        for b in range(state.batch):
            if not state.done[b]:
                state.emitted[b].append(int(nxt_h[b]))
                state.done[b] = len(state.emitted[b]) >= state.max_new_tokens
        if state.synthetic:  # same host work as a real step, then back to C
            self._forget_emission(state)
            state.cache.rollback(state.context)
            return
        state.ctx_host = state.ctx_host + 1
        state.context.copy_(state.cache.lens)
        state.iteration += 1

    def step(self, state: BatchState) -> None:
        """One iteration of the configured method."""
        if not self.config.spec.drafts:
            self.decode(state)
            return
        self.draft(state)
        self.verify(state)
        self.accept_and_rollback(state)
        self.select(state)

    # ---- end to end -----------------------------------------------------------------------
    @staticmethod
    def tie_overflow_rows(state: BatchState) -> int:
        """How many sampled rows of `state` so far had a tie group at the k-th logit longer
        than the slots (0 for real logits in practice; a host sync)."""
        return 0 if state.tie_overflows is None else int(state.tie_overflows)

    @torch.no_grad()
    def generate(self, prompts: list[Tensor], max_new_tokens: int, *,
                 generator: torch.Generator | None = None,
                 replay: AcceptanceReplay | None = None,
                 sparsity: Sequence[float] | None = None) -> GenerationResult:
        """Decode `max_new_tokens` new tokens for each prompt (batched); tokens + records.
        sparsity: one per prompt (see prefill_state)."""
        state = self.prefill_state(prompts, max_new_tokens, generator=generator, replay=replay,
                                   sparsity=sparsity)
        assert state.done is not None
        while not state.done.all():
            self.step(state)
        return GenerationResult(tokens=state.emitted, records=state.records)
