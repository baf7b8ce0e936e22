"""Merge trace sets measured separately — parallel calibration processes, several sessions —
into one.

The sources must describe the same model (all of meta['model'], weights included), those with
latency rows on the same GPU model (an acceptance-only source may come from another GPU:
acceptance is the model's and the sampler's, not the GPU's; `merged_from` names each source's
GPU), and must not measure the same thing twice: a latency row key (phase, method, batch,
context, n_query, kv_read, collect_rows, temperature) or an acceptance run (method, γ,
sparsity, temperature, workload, request) found in two sources is refused, since the merged set
would weight it double. Latency whose methods' sampling phases were timed in different modes
(one only sampled, another only greedy) is refused too: the merged grid would price a method in
a mode nobody timed for it. Latency of different runtime revisions (schema.RUNTIME_REVISION)
merges only where the older sources hold no method whose phases a later revision changed
(CHANGED_PHASES): one method measured again, merged over a `traces subset` of the rest; the
merged set records the newest revision. One acceptance group in two sources with different requests is the
group run on more prompts (`calibrate --first-prompt`: a workload's later prompts, under their
own request ids) and merges as such. The merged meta keeps the first source's meta, with every
list-valued grid entry the sorted union over the sources, the workload list the union, the
latest date, and `merged_from` naming each source. run_log.json lists every source's sessions.

`replicates=True` pools repeated calibrations of the same acceptance grid instead: an
acceptance group found in several sources keeps every source's requests, renumbered so that
they stay distinct (source k's request ids follow source k-1's), as if the point had been
run with more prompts — the sampling error of a point's acceptance falls as 1/√requests.
`grid.acceptance_replicates`
records how many sources were pooled. Latency rows must still be disjoint.

Either way one set named twice (the same directory, however spelled) or two copies of one
measurement (a data file with rows whose content hash equals another source's) is refused:
pooled, the copy would pass for an independent replicate and understate the sampling error.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from vegas_sim.errors import TraceSetError
from vegas_sim.files import nearest_existing
from vegas_sim.traces.io import (
    TraceSet,
    TraceSetWriter,
    acceptance_summary,
    load_trace_set,
)
from vegas_sim.traces.schema import (
    CALIBRATION_KEY,
    EXPECTED_ROWS_KEY,
    ACCEPTANCE_FILE,
    ACCEPTANCE_POINT_KEYS,
    CHANGED_PHASES,
    LATENCY_FILE,
    RUN_LOG_FILE,
    SAMPLING_PHASES,
    UNRECORDED_TEMPERATURE,
    sampling_mode,
)

LATENCY_KEY = ["phase", "method", "batch", "context", "n_query", "kv_read", "collect_rows",
               "temperature"]
ACCEPTANCE_KEY = [*ACCEPTANCE_POINT_KEYS, "request"]  # one run: the group on one prompt


def merge_trace_sets(out: str | Path, sources: Sequence[str | Path],
                     replicates: bool = False) -> TraceSet:
    """Write the union of `sources` (finalized trace-set directories) to the new directory
    `out` and return it, finalized; `replicates`: pool acceptance points measured in several
    sources (see the module docstring). A source may be a packaged set's name."""
    out = Path(out)
    if len(sources) < 2:
        raise TraceSetError("merge needs at least two trace sets", where="SOURCES",
                            fix="name two or more trace-set directories")
    _check_output(out)
    sets = [_with_temperatures(load_trace_set(s)) for s in sources]
    _check_distinct(sources, sets)
    _check_same_model_and_gpu(sets)
    _check_same_sampling_modes(sets)
    _check_disjoint(sets, "latency", LATENCY_KEY)
    if not replicates:
        _check_disjoint(sets, "acceptance", ACCEPTANCE_KEY)
    revision = merged_runtime_revision(sets)
    meta = merged_meta(sets)
    if revision is not None:
        meta["software"] = {**meta.get("software", {}), "runtime": revision}
    if replicates:
        meta["grid"]["acceptance_replicates"] = len(sets)
    meta[EXPECTED_ROWS_KEY] = {"latency": sum(len(ts.latency) for ts in sets),
                               "acceptance": sum(len(ts.acceptance) for ts in sets)}
    writer = TraceSetWriter(out, meta)
    offset = 0
    for ts in sets:
        if len(ts.latency):
            writer.append_latency(ts.latency)
        if len(ts.acceptance):
            acc = ts.acceptance
            if replicates:
                acc = acc.assign(request=acc["request"] + offset)
                offset = int(acc["request"].max()) + 1
            writer.append_acceptance(acc)
    merged = writer.finalize()
    _write_run_log(out, sets, merged)
    return merged


def _with_temperatures(ts: TraceSet) -> TraceSet:
    """`ts` with its latency rows' unrecorded temperatures set to its grid's
    latency_temperature: merged under another set's grid, they keep what they were timed at."""
    lat = ts.latency
    unrecorded = lat["temperature"] == UNRECORDED_TEMPERATURE
    if unrecorded.any():
        temps = lat["temperature"].mask(unrecorded, ts.info.grid.latency_temperature)
        ts = dataclasses.replace(ts, _latency=lat.assign(temperature=temps))
    return ts


def _check_output(out: Path) -> None:
    """`out` must be a new or empty directory that can be created (before the slow loads)."""
    fix = "name a new directory for the merged set"
    if out.exists() and not out.is_dir():
        raise TraceSetError("the output exists and is a file, not a directory",
                            where=str(out), fix=fix)
    if out.is_dir() and any(out.iterdir()):
        raise TraceSetError("the output directory exists and is not empty", where=str(out),
                            fix=fix)
    base = nearest_existing(out)
    if not base.is_dir():
        raise TraceSetError(f"cannot create the output directory: {base} is a file",
                            where=str(out), fix=fix)


def _check_distinct(sources: Sequence[str | Path], sets: list[TraceSet]) -> None:
    """Refuse a set named twice or two copies of one measurement (see the module docstring).
    Data files are compared by the content hash of meta.json (verified by the load); an
    empty file is skipped, since every latency-only set has the same empty acceptance file."""
    by_dir: dict[Path, str] = {}
    by_hash: dict[tuple[str, str], str] = {}
    for given, ts in zip(sources, sets):
        real = ts.path.resolve()
        if real in by_dir:
            raise TraceSetError(
                f"{by_dir[real]} and {given} are the same trace set ({real})",
                where="SOURCES", fix="name each trace set once")
        by_dir[real] = str(given)
        for file, rows in ((LATENCY_FILE, ts.latency), (ACCEPTANCE_FILE, ts.acceptance)):
            if rows.empty:
                continue
            key = (file, str(ts.meta["content_hash"][file]))
            if key in by_hash:
                raise TraceSetError(
                    f"{by_hash[key]} and {given} hold identical {file} (sha256 "
                    f"{key[1][:12]}…): copies of one measurement, not independent ones",
                    where="SOURCES", fix="drop the copy from the merge; replicates must come "
                    "from separate calibrations")
            by_hash[key] = str(given)


def _check_same_model_and_gpu(sets: list[TraceSet]) -> None:
    first = sets[0]
    for ts in sets[1:]:
        if ts.meta["model"] != first.meta["model"]:
            raise TraceSetError(
                f"different models: {first.path} has {first.model_name!r} "
                f"({first.weights_kind} weights), {ts.path} has {ts.model_name!r} "
                f"({ts.weights_kind} weights)", where=f"{ts.path}/meta.json, key 'model'",
                fix="merge only sets of the same model and weights")
    timed = [ts for ts in sets if len(ts.latency)]  # latency is the GPU's
    for ts in timed[1:]:
        if ts.gpu_name != timed[0].gpu_name:
            raise TraceSetError(
                f"different GPUs: {timed[0].path} was measured on {timed[0].gpu_name!r}, "
                f"{ts.path} on {ts.gpu_name!r}", where=f"{ts.path}/meta.json, key 'gpu.name'",
                fix="merge only latency measured on the same GPU model (acceptance-only sets "
                    "may come from another GPU)")
    for ts in sets[1:]:
        if ts.meta.get("tensor_parallel") != first.meta.get("tensor_parallel"):
            raise TraceSetError(
                f"different tensor-parallel groups: {first.path} has "
                f"{first.meta.get('tensor_parallel')}, {ts.path} has "
                f"{ts.meta.get('tensor_parallel')}", where=f"{ts.path}/meta.json, key "
                "'tensor_parallel'", fix="merge only sets measured on the same group")


def _check_same_sampling_modes(sets: list[TraceSet]) -> None:
    """Every method of the merged latency must have its sampling phases timed in the same
    modes (greedy, sampled or both): the merged grid prices a run in a mode wherever the set
    timed it, so a method timed only sampled beside one timed greedy would be priced greedy
    from its sampled rows, under a label that says measured (or find no fit in its mode)."""
    rows = [ts.latency for ts in sets if len(ts.latency)]
    if not rows:
        return
    lat = pd.concat(rows)
    lat = lat[lat["phase"].isin(list(SAMPLING_PHASES))]
    modes = {str(m): tuple(sorted({sampling_mode(float(t)) for t in g["temperature"]}))
             for m, g in lat.groupby("method")}
    if len(set(modes.values())) > 1:
        said = "; ".join(f"{m}: {' and '.join(v)}" for m, v in sorted(modes.items()))
        raise TraceSetError(
            f"the methods' sampling phases were timed in different modes ({said})",
            where="SOURCES, latency column temperature",
            fix="calibrate every source at the same --temperature (and all with or all "
                "without --greedy-latency), then merge")


def _check_disjoint(sets: list[TraceSet], table: str, key: list[str]) -> None:
    seen: dict[tuple[Any, ...], Path] = {}
    for ts in sets:
        frame: pd.DataFrame = getattr(ts, table)
        if frame.empty:
            continue
        for k in frame[key].drop_duplicates().itertuples(index=False, name=None):
            if k in seen:
                raise TraceSetError(
                    f"{seen[k]} and {ts.path} both measured {table} "
                    f"{dict(zip(key, k))}: merged, it would count twice",
                    where=str(ts.path), fix="drop one of the two sets from the merge, or "
                    "re-calibrate one of them without that grid point")
            seen[k] = ts.path


def merged_runtime_revision(sets: list[TraceSet]) -> str | None:
    """The runtime revision (schema.RUNTIME_REVISION) the merged latency is of: None when the
    timed sources agree (the first source's meta says it). Where they differ, the newest, if
    no older source holds latency of a method whose phases a later revision changed
    (CHANGED_PHASES): one method measured again on today's runtime, merged over a `traces
    subset` of the older set without it. Else a TraceSetError: the merged set would price
    that method as two runtimes ran it under one revision."""
    timed = [ts for ts in sets if len(ts.latency)]
    revisions = {ts.runtime_revision for ts in timed}
    if len(revisions) <= 1:
        return None
    if not all(r.isdigit() for r in revisions):
        raise TraceSetError(f"runtime revisions {sorted(revisions)} cannot be ordered",
                            where="SOURCES, meta.json software.runtime",
                            fix="merge sets calibrated on one runtime revision")
    newest = max(revisions, key=int)
    for ts in timed:
        later = [str(r) for r in range(int(ts.runtime_revision) + 1, int(newest) + 1)]
        if not all(r in CHANGED_PHASES for r in later):
            raise TraceSetError(
                f"{ts.path} was measured on runtime revision {ts.runtime_revision}, another "
                f"source on {newest}, and a revision between changed every method",
                where=str(ts.path), fix="re-calibrate it on this runtime, then merge")
        changed = {m for r in later for m in CHANGED_PHASES[r]}
        stale = sorted(changed & set(ts.latency["method"].astype(str)))
        if stale:
            raise TraceSetError(
                f"{ts.path} (runtime revision {ts.runtime_revision}) holds latency of "
                f"{', '.join(stale)}, whose phases changed by revision {newest}",
                where=str(ts.path), fix=f"merge a `traces subset --where \"method in ...\"` "
                f"of it without {', '.join(stale)}, beside {stale[0]} measured again")
    return newest


def merged_meta(sets: list[TraceSet]) -> dict[str, Any]:
    """The first set's meta, grid lists unioned, workloads unioned, the latest date."""
    # a calibration was of the first set's rows alone: the merged rows need their own
    meta = {k: v for k, v in sets[0].meta.items()
            if k not in ("content_hash", "parts", CALIBRATION_KEY)}
    grid = dict(meta["grid"])
    for ts in sets[1:]:
        for k, v in ts.meta["grid"].items():
            if isinstance(v, list) and isinstance(grid.get(k), list):
                grid[k] = _union(grid[k], v)
            elif k not in grid:
                grid[k] = v
    meta["grid"] = grid
    meta["workload"] = _union(*(ts.meta.get("workload", []) for ts in sets))
    meta["date"] = max(str(ts.meta["date"]) for ts in sets)
    # a source that was itself merged keeps its own sources' list: each one's GPU stays named
    meta["merged_from"] = [{"path": str(ts.path), "date": ts.meta["date"],
                            "gpu": ts.gpu_name, "grid": ts.meta["grid"],
                            **({"merged_from": ts.meta["merged_from"]}
                               if "merged_from" in ts.meta else {})} for ts in sets]
    return meta


def _union(*lists: list[Any]) -> list[Any]:
    """Values of all lists, each once, sorted where they compare, else in first-seen order."""
    out: list[Any] = []
    for values in lists:
        out += [v for v in values if v not in out]
    try:
        return sorted(out)
    except TypeError:
        return out


def _write_run_log(out: Path, sets: list[TraceSet], merged: TraceSet) -> None:
    """Every source's run log, the GPU minutes over all of them, and the merged set's
    acceptance summary.

    total_gpu_minutes is wall time on the GPU: sources measured at the same time (parallel
    processes on one GPU) overlap, so the sessions' [started, started + wall_s] intervals are
    unioned; a source whose log has no sessions adds its own total. process_minutes is the
    plain sum over sources."""
    logs = []
    for ts in sets:
        path = ts.path / RUN_LOG_FILE
        log = json.loads(path.read_text()) if path.is_file() else {}
        logs.append({"source": str(ts.path), **log})
    intervals: list[tuple[float, float]] = []
    unsessioned = sum(_collect_sessions(log, intervals) for log in logs)
    data = {"merged_from": logs,
            "total_gpu_minutes": union_seconds(intervals) / 60.0 + unsessioned,
            "process_minutes": sum(float(log.get("process_minutes", _log_minutes(log)))
                                   for log in logs),
            "acceptance_summary": acceptance_summary(merged.acceptance)}
    # compact JSON: a merged log repeats every source's sessions (docs/RESULTS.md, Calibration)
    (out / RUN_LOG_FILE).write_text(json.dumps(data, sort_keys=True, separators=(",", ":"))
                                    + "\n")


def _collect_sessions(log: dict[str, Any], intervals: list[tuple[float, float]]) -> float:
    """Append the log's session intervals (recursing into merged logs); returns the minutes
    of logs that have no sessions (rebuilt ones), which can only be added as they are."""
    if "merged_from" in log:
        return sum(_collect_sessions(inner, intervals) for inner in log["merged_from"])
    sessions = log.get("sessions") or []
    for session in sessions:
        start = dt.datetime.fromisoformat(session["started"]).timestamp()
        intervals.append((start, start + float(session.get("wall_s", 0.0))))
    return 0.0 if sessions else _log_minutes(log)


def _log_minutes(log: dict[str, Any]) -> float:
    return float(log.get("total_gpu_minutes", log.get("total_gpu_minutes_lower_bound", 0.0)))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
