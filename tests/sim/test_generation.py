"""Acceptance along a long generation: the segments, the stitched replay, and a prediction
of an anchor's own setting reproducing the anchor."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vegas_sim import api
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import AcceptanceDist
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.sim.generation import (
    GenerationDist,
    generation_dist,
    segment_starts,
    token_shares,
)
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.io import load_trace_set

SHAPE = "smollm2-135m-real"


@pytest.fixture(scope="module")
def shape() -> AcceptanceModel:
    return api.fit_acceptance(load_trace_set(SHAPE))


def test_segments_double_the_context_after_the_traced_tokens() -> None:
    assert segment_starts(4096, 256, 150) == [(0, 4096)]  # short next to its prompt
    segs = segment_starts(182, 20000, 150)
    starts, contexts = zip(*segs)
    assert starts[0] == 0 and contexts[0] == 182
    assert starts[1] == 182  # the prompt's own lookup covers a context doubling
    assert starts[-1] < 20000 <= 2 * (182 + starts[-1])  # the last reaches the end
    assert all(c1 > c0 for c0, c1 in itertools.pairwise(contexts))
    # each later segment spans an octave and is looked up at its geometric middle
    for (b0, c0), (b1, _) in itertools.pairwise(segs):
        assert 182 + b1 == pytest.approx(2 * (182 + b0), abs=1)
        assert c0 == pytest.approx(np.sqrt((182 + b0) * (182 + b1)), abs=1)
    assert segment_starts(100, 400, 300)[1][0] == 300  # the traced runs' coverage first


def test_token_shares_cover_the_generation() -> None:
    assert token_shares([0, 100, 300], 200).tolist() == [0.5, 0.5, 0.0]
    assert token_shares([0, 100, 300], 1000).sum() == pytest.approx(1.0)


def _fixed(gamma: int, accepted: int) -> AcceptanceDist:
    """A dist that accepts exactly `accepted` drafts every iteration."""
    return AcceptanceDist("vegas", gamma, np.array([1.0] * accepted + [0.0] * (gamma - accepted)))


def test_replay_switches_segment_where_the_tokens_reach_it() -> None:
    dist = GenerationDist("vegas", 4, np.zeros(4), starts=[0, 10, 40],
                          segments=[_fixed(4, 0), _fixed(4, 4), _fixed(4, 1)])
    acc = dist.sample(np.random.default_rng(0), 3, 20)
    # 1 token a column until 10 generated, then 5 until 40, then 2
    expected = [0] * 10 + [4] * 6 + [1] * 4
    assert (acc == np.array(expected)).all()


def test_a_short_generation_is_the_prompt_lookup_itself(shape: AcceptanceModel) -> None:
    def at(c: int) -> AcceptanceDist:
        return shape.lookup("vegas", 6, 0.07, c, "longdoc", 0.6, output_len=128)

    dist = generation_dist(at, 4096, 128, 128)
    assert not isinstance(dist, GenerationDist)
    a = dist.sample(np.random.default_rng(3), 8, 40)
    b = at(4096).sample(np.random.default_rng(3), 8, 40)
    assert (a == b).all()


def test_a_long_generation_replays_its_segments_rates(shape: AcceptanceModel) -> None:
    def at(c: int) -> AcceptanceDist:
        return shape.lookup("magicdec-stream", 6, 0.07, c, "reasoning", 0.6, output_len=20000)

    dist = generation_dist(at, 182, 20000, 20000)
    assert isinstance(dist, GenerationDist) and len(dist.segments) >= 5
    lengths = [d.mean_length for d in dist.segments]
    assert lengths[-1] > lengths[0] + 0.3  # this shape accepts more at long context
    acc = dist.sample(np.random.default_rng(1), 400, 20000 // 3)
    tokens = np.cumsum(acc + 1, axis=1)
    ran = tokens - (acc + 1) < 20000  # [R, W] the iterations a 20K-token request runs
    replayed = 20000 * ran.shape[0] / ran.sum()  # tokens per iteration over the generations
    assert replayed == pytest.approx(dist.mean_length, rel=0.03)


def test_an_anchor_is_reproduced_over_its_own_generation(shape: AcceptanceModel) -> None:
    """A prediction of the anchor's setting (prompt at the range's start, output to its end)
    averages, token by token, to the anchored length; the prompt's lookup alone does not."""
    anchor = Anchor("magicdec-stream", 6, 0.07, (182, 20000), "reasoning", 0.6, 4.92)
    model = AnchoredAcceptance(shape, SHAPE, [AnchorSet("m", "test", (anchor,), "t")])

    def at(c: int) -> AcceptanceDist:
        return model.lookup("magicdec-stream", 6, 0.07, c, "reasoning", 0.6, output_len=19818)

    gen = generation_dist(at, 182, 19818, 19818)
    assert gen.mean_length == pytest.approx(4.92, rel=0.03)
    assert at(182).mean_length < 4.92 * 0.95
