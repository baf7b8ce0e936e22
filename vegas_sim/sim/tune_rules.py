"""tune's selection rules, pure functions of evaluated rows (no model): the stable sparsity
(step 1), the refine window and its widening (step 3), the evidence span a point is ranked
within, the tie-band selection and the ratio CI (`tune` module docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import VANILLA
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.ranking import score

SPARSITY_DIGITS = 6  # sparsity grid values are rounded so that 0.035 is 0.035 in every output


def stable_sparsity(sparsity: Sequence[float] | pd.Series,
                    acceptance_length: Sequence[float] | pd.Series,
                    stable_pct: float) -> float:
    """Smallest s whose acceptance length is within stable_pct % of the maximum over the sweep."""
    s = np.asarray(sparsity, dtype=float)
    acc = np.asarray(acceptance_length, dtype=float)
    order = np.argsort(s, kind="stable")
    s, acc = s[order], acc[order]
    ok = acc >= np.nanmax(acc) * (1.0 - stable_pct / 100.0)
    return float(s[np.argmax(ok)])  # argmax of a bool array: the first True


def refine_window(coarse: Sequence[float], center: float, step: float,
                  bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """The coarse neighbours of `center` (past the ends: half the smallest, 1.5× the largest),
    within `bounds` (the search box)."""
    pts = sorted(coarse)
    i = pts.index(center) if center in pts else int(np.searchsorted(pts, center))
    lo = pts[i - 1] if i > 0 else max(pts[0] / 2.0, step)
    hi = pts[i + 1] if i + 1 < len(pts) else min(pts[-1] * 1.5, 1.0)
    return max(lo, bounds[0]), min(hi, bounds[1])


def window_points(lo: float, hi: float, step: float, *extra: float) -> list[float]:
    """Points `step` apart from `lo` to `hi`, both ends (and `extra`) included, within (0, 1]."""
    n = math.floor((hi - lo) / step + 1e-9)
    grid = {round(lo + k * step, SPARSITY_DIGITS) for k in range(n + 1)}
    grid |= {round(v, SPARSITY_DIGITS) for v in (lo, hi, *extra)}
    return sorted(v for v in grid if 0.0 < v <= 1.0)


def refine_grid(coarse: Sequence[float], center: float, step: float) -> list[float]:
    """Fine grid (spacing `step`) between the coarse neighbours of `center`, both included."""
    lo, hi = refine_window(coarse, center, step)
    return window_points(lo, hi, step, center)


def widen(lo: float, hi: float, best: float, step: float,
          bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float] | None:
    """The next window to search when `best` sits on an edge of [lo, hi]: as wide as [lo, hi],
    just past that edge, clipped to the box `bounds` (and to `step` from below). None when
    `best` is inside, or on an edge that is already the bound."""
    width, eps = hi - lo, 1e-9
    floor, top = max(step, bounds[0]), min(1.0, bounds[1])
    if best <= lo + eps and lo > floor + eps:
        return max(floor, round(lo - width, SPARSITY_DIGITS)), lo
    if best >= hi - eps and hi < top - eps:
        return hi, min(top, round(hi + width, SPARSITY_DIGITS))
    return None


def argbest(df: pd.DataFrame, rank_by: str = "throughput") -> pd.Series:
    """Row with the best rank score (`rank_score` where tune set it — `ranked_score` — else
    `ranking.score`); ties to the smaller γ, then the smaller sparsity."""
    if df.empty:
        raise UserInputError("tune evaluated no configuration in a cell",
                             fix="check the grids (--gamma, --sparsity)")
    sc = df["rank_score"] if "rank_score" in df.columns else score(df, rank_by)
    tied = df[sc >= sc.max() * (1 - 1e-12)]
    return tied.sort_values(["gamma", "sparsity"], kind="stable").iloc[0]


@dataclass(frozen=True)
class Evidence:
    """Per method, the span its acceptance traces support: (largest traced γ, smallest and
    largest traced sparsity). Below the largest traced γ a lookup walks the traced runs again
    at that γ (`acceptance_walk`); between traced sparsities it interpolates; past either it
    extrapolates."""

    spans: dict[str, tuple[int, float, float]]

    @classmethod
    def of(cls, acceptance: AcceptanceModel) -> Evidence:
        per = acceptance.coverage()["per_method"]
        return cls({str(m): (int(max(v["gamma"])), float(min(v["sparsity"])),
                             float(max(v["sparsity"])))
                    for m, v in per.items()})  # type: ignore[attr-defined]

    def reason(self, method: str, gamma: int, sparsity: float) -> str:
        """'' when (γ, s) lies in `method`'s span, else why not."""
        if method == VANILLA or method not in self.spans:
            return ""
        g_max, s_lo, s_hi = self.spans[method]
        why = []
        if gamma > g_max:
            why.append(f"γ {gamma} > traced {g_max}")
        if sparsity < s_lo - 1e-9:
            why.append(f"sparsity {sparsity:g} < traced {s_lo:g}")
        if sparsity > s_hi + 1e-9:
            why.append(f"sparsity {sparsity:g} > traced {s_hi:g}")
        return ", ".join(why)

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """[rows] bool: the row's (γ, s) lies in its method's span."""
        return np.array([not self.reason(str(m), int(g), float(s)) for m, g, s in
                         zip(df["method"], df["gamma"], df["sparsity"])], dtype=bool)


def lower_score(df: pd.DataFrame, rank_by: str) -> pd.Series:
    """The score at the low end of the prediction interval: score × pi_low / throughput
    (the score itself where a row has no interval). The low end is `pi_low_shape` where the
    rows carry it: pi_low without an anchored acceptance's shape-transfer term and a GPU
    what-if's term, which move every speculative configuration of a method together
    (`sim.uncertainty`)."""
    sc = score(df, rank_by)
    col = "pi_low_shape" if "pi_low_shape" in df.columns else "pi_low"
    if col not in df.columns:
        return sc
    thr = df["throughput_tok_s"].astype(float)
    low = df[col].astype(float)
    if col != "pi_low" and "pi_low" in df.columns:
        low = low.fillna(df["pi_low"].astype(float))
    ratio = (low / thr.where(thr > 0)).clip(lower=0.0)
    return (sc * ratio.fillna(1.0)).astype(float)


def ranked_score(df: pd.DataFrame, rank_by: str, on_evidence: np.ndarray) -> pd.Series:
    """What ranks a row: its score on the evidence, its pi_low-scaled score off it."""
    return score(df, rank_by).where(on_evidence, lower_score(df, rank_by))


@dataclass(frozen=True)
class Selection:
    """A cell's choice: the best speculative row by the rule, and whether to speculate."""

    row: pd.Series
    speculate: bool
    why: str


def selection_rule(rank_by: str, tie_pct: float, outside_evidence: str) -> str:
    """The rule `select` applies, in one sentence (printed and exported)."""
    outside = ("ranked by its pi_low" if outside_evidence == "pi_low" else "not searched")
    return (f"among the speculative configurations whose pi_low beats vanilla, the best by "
            f"{rank_by} (a point outside the traced γ/sparsity span {outside}; pi_low here "
            f"leaves out the anchors' shape-transfer term and a GPU what-if's, which move every "
            f"speculative configuration of a method together); those within "
            f"{tie_pct:g} % of the best go to the smaller K, then the smaller sparsity; K = 0 "
            f"where none beats vanilla by its interval, or vanilla is within {tie_pct:g} % "
            f"of the best")


def select(rows: pd.DataFrame, vanilla: pd.Series, rank_by: str, tie_pct: float) -> Selection:
    """The selection rule (`selection_rule`) on one cell's speculative rows (with
    `rank_score`) and its vanilla row. Where it says K = 0 the row is the best speculative
    configuration by the same rule over all rows (what speculation would have been)."""
    if rows.empty:
        raise UserInputError("tune evaluated no configuration in a cell",
                             fix="check the grids (--gamma, --sparsity)")
    van = float(score(pd.DataFrame([vanilla]), rank_by).iloc[0])
    beats = rows[lower_score(rows, rank_by).to_numpy() > van]
    pick, best = _best_in_band(beats if not beats.empty else rows, rank_by, tie_pct)
    if beats.empty:
        low = float(lower_score(rows, rank_by).max())
        return Selection(pick, False, f"no speculative configuration's pi_low beats vanilla "
                                      f"(best {low:.4g} <= vanilla {van:.4g}, {rank_by})")
    if van >= best * (1.0 - tie_pct / 100.0):
        return Selection(pick, False, f"vanilla is within {tie_pct:g} % of the best "
                                      f"({van:.4g} vs {best:.4g}, {rank_by})")
    return Selection(pick, True, "")


def _best_in_band(rows: pd.DataFrame, rank_by: str, tie_pct: float) -> tuple[pd.Series, float]:
    """(the smallest-γ, then smallest-sparsity row within tie_pct % of the best, the best)."""
    sc = rows["rank_score"] if "rank_score" in rows.columns else score(rows, rank_by)
    best = float(sc.max())
    band = rows[sc >= best * (1.0 - tie_pct / 100.0) - 1e-12]
    return band.sort_values(["gamma", "sparsity"], kind="stable").iloc[0], best


def ratio_ci(num: float, num_lo: float, num_hi: float, den: float, den_lo: float,
             den_hi: float) -> tuple[float, float, float]:
    """num/den with a 95 % CI from the two CIs, log half-widths added in quadrature."""
    ratio = num / den

    def half(lo: float, hi: float) -> float:
        if not (lo > 0 and hi > 0) or any(map(math.isnan, (lo, hi))):
            return 0.0
        return 0.5 * math.log(hi / lo)

    h = math.hypot(half(num_lo, num_hi), half(den_lo, den_hi))
    return ratio, ratio * math.exp(-h), ratio * math.exp(h)
