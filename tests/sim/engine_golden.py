"""Engine runs with KV to spare, fingerprinted: the golden file pins their exact results.

``python -m tests.sim.engine_golden > tests/sim/data/engine_golden_kv_to_spare.csv`` wrote the
committed file with the engine before block-granular KV admission and preemption existed (commit
2a3076b); `test_engine_kv.py` reruns every case and compares the fingerprints byte for byte.
The Poisson case's throughput column was rewritten (its fingerprint was not) when open loops
got their own steady window (`sim.metrics`: the served rate from the end of the warm-up
arrivals on, in place of the closed-batch window): the engine's timeline is unchanged, the
metric's window is not.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np

from tests.sim.test_engine import FixedDist, LinearCost, RatesDist, geometric_rates
from vegas_sim.sim.engine import Arrivals, EngineConfig, EngineResult, Lengths, simulate
from vegas_sim.sim.metrics import summarize

ARRAYS = ("input_len", "output_len", "arrival_ms", "admit_ms", "first_token_ms", "finish_ms",
          "iter_start_ms", "iter_ms", "iter_batch", "iter_tokens", "iter_new", "accepted_hist")


def _prefill(lens: np.ndarray) -> float:
    return float(0.5 + 0.002 * lens.sum())


# name -> (config kwargs without kv capacity, acceptance factory, co-located)
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "vegas_closed_fixed": ({"method": "vegas", "gamma": 4, "max_batch": 8, "n_requests": 40,
                                "lengths": Lengths(300, 120)},
                           lambda: RatesDist(geometric_rates(0.8, 4))),
    "vanilla_closed_uniform": ({"method": "vanilla", "gamma": 1, "max_batch": 6, "n_requests": 30,
                                    "lengths": Lengths(500, 90, kind="uniform", spread=0.5)},
                               lambda: None),
    "vegas_poisson_lognormal": ({"method": "vegas", "gamma": 6, "max_batch": 16, "n_requests": 60,
                                     "lengths": Lengths(1000, 200, kind="lognormal", spread=0.6),
                                     "arrivals": Arrivals("poisson", rate_per_s=40.0)},
                                lambda: RatesDist(geometric_rates(0.7, 6))),
    "vegas_colocated_users": ({"method": "vegas", "gamma": 3, "max_batch": 8, "n_requests": 24,
                                   "lengths": Lengths(200, 64), "arrivals": Arrivals("closed", users=5),
                                   "prefill": "co-located"},
                              lambda: FixedDist(3, 2)),
    "vanilla_trace_dataset": ({"method": "vanilla", "gamma": 1, "max_batch": 4, "n_requests": 6,
                                   "lengths": Lengths.dataset([(10, 20), (30, 5)]),
                                   "arrivals": Arrivals.trace([0, 0.001, 0.002, 0.1, 0.1, 0.5])},
                              lambda: None),
}
CAPACITIES = {"unlimited": None, "spare": 10**9}


def fingerprint(res: EngineResult) -> str:
    h = hashlib.sha256()
    for name in ARRAYS:
        h.update(np.ascontiguousarray(getattr(res, name)).tobytes())
    return h.hexdigest()


def run_case(name: str, capacity: str, seed: int = 7) -> EngineResult:
    kwargs, make_dist = CASES[name]
    c = EngineConfig(**kwargs, kv_capacity_tokens=CAPACITIES[capacity])
    pre = _prefill if c.prefill == "co-located" else None
    return simulate(c, LinearCost(2.0, 0.001), make_dist(), seed=seed, prefill_fn=pre)


def rows() -> list[tuple[str, str, str, str]]:
    out = []
    for name in CASES:
        for capacity in CAPACITIES:
            res = run_case(name, capacity)
            out.append((name, capacity, fingerprint(res),
                        repr(summarize(res).throughput_tok_s)))
    return out


if __name__ == "__main__":
    sys.stdout.write("case,kv,sha256,throughput_tok_s\n")
    for row in rows():
        sys.stdout.write(",".join(row) + "\n")
