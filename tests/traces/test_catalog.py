"""catalog.resolve: which sets answer a prediction, and the refusals."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.traces import catalog, io
from vegas_sim.traces.synthetic import make_synthetic_trace_set

TINY = {"methods": ("vanilla", "vegas"), "gammas": (2,), "sparsities": (0.07,), "contexts": (1024,),
            "batches": (1,), "requests": 2, "iterations": 2}


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("catalog")
    out = {
        "qwen-random": root / "qwen3-8b-synth-random",
        "qwen-real": root / "qwen3-8b-synth-real",
        "small-real": root / "smollm2-135m-synth-real",
        "qwen-latency-only": root / "qwen3-8b-synth-latency-only",
    }
    make_synthetic_trace_set(out["qwen-random"], weights_kind="random", **TINY)  # type: ignore
    make_synthetic_trace_set(out["qwen-real"], **TINY)  # type: ignore[arg-type]
    make_synthetic_trace_set(out["small-real"], model="smollm2-135m", **TINY)  # type: ignore
    make_synthetic_trace_set(out["qwen-latency-only"], acceptance=False,
                             **TINY)  # type: ignore[arg-type]
    return out


def _defaults(tmp_path: Path, *paths: Path) -> Path:
    """A stand-in for vegas_sim/traces/default/ holding copies of `paths`."""
    d = tmp_path / "default"
    d.mkdir()
    for p in paths:
        shutil.copytree(p, d / p.name)
    return d


def test_nothing_packaged_says_so(tmp_path: Path) -> None:
    with pytest.raises(UserInputError) as info:
        catalog.resolve("qwen3-8b", None, default_dir=tmp_path / "default")
    msg = str(info.value)
    assert "no default trace set is packaged" in msg
    assert "vegas-sim calibrate" in msg and "--traces" in msg


def test_packaged_sets_lists_directories_with_meta(tmp_path: Path, sets: dict[str, Path]) -> None:
    d = _defaults(tmp_path, sets["qwen-real"])
    (d / "not-a-set").mkdir()
    assert io.packaged_sets(d) == [d / sets["qwen-real"].name]
    assert io.packaged_sets(tmp_path / "missing") == []


def test_traces_with_real_acceptance_serves_both(sets: dict[str, Path], tmp_path: Path) -> None:
    lat, acc, notes = catalog.resolve("qwen3-8b", sets["qwen-real"],
                                      default_dir=tmp_path / "none")
    assert lat is acc and lat.model_name == "qwen3-8b"
    assert notes[0].startswith("latency: qwen3-8b-synth-real (real weights, SYNTHETIC")
    assert notes[1].startswith("acceptance: qwen3-8b-synth-real")
    assert any("SYNTHETIC test data" in n for n in notes)


def test_random_traces_fall_back_to_packaged_real(sets: dict[str, Path], tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["small-real"])
    lat, acc, notes = catalog.resolve("qwen3-8b", sets["qwen-random"], default_dir=d)
    assert lat.weights_kind == "random" and acc.weights_kind == "real"
    assert acc.model_name == "smollm2-135m"
    text = "\n".join(notes)
    assert "has random weights" in text and "smollm2-135m-synth-real" in text
    assert "proxy" in text


def test_latency_only_traces_fall_back(sets: dict[str, Path], tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["small-real"], sets["qwen-real"])
    _lat, acc, notes = catalog.resolve("qwen3-8b", sets["qwen-latency-only"], default_dir=d)
    assert acc.name == "qwen3-8b-synth-real"  # the predicted model's own set is preferred
    assert "has no acceptance rows" in "\n".join(notes)


def test_random_acceptance_without_fallback_is_refused(sets: dict[str, Path],
                                                      tmp_path: Path) -> None:
    with pytest.raises(TraceSetError) as info:
        catalog.resolve("qwen3-8b", sets["qwen-random"], default_dir=tmp_path / "none")
    msg = str(info.value)
    assert "random-weight model's acceptance is meaningless" in msg
    assert "--weights real" in msg and "meta.json" in msg


def test_explicit_random_acceptance_is_refused(sets: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(TraceSetError, match="acceptance is meaningless"):
        catalog.resolve("qwen3-8b", sets["qwen-real"], acceptance=sets["qwen-random"],
                        default_dir=tmp_path / "none")
    io.require_real_acceptance(io.load_trace_set(sets["qwen-real"]))  # the real one is fine


def test_model_mismatch_lists_models(sets: dict[str, Path], tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["small-real"])
    with pytest.raises(UserInputError) as info:
        catalog.resolve("llama-3.1-8b", sets["qwen-real"], default_dir=d)
    msg = str(info.value)
    assert "'qwen3-8b'" in msg and "'llama-3.1-8b'" in msg
    assert "qwen3-8b" in msg.split("fix:")[1] and "smollm2-135m" in msg.split("fix:")[1]
    assert "--model-what-if llama-3.1-8b" in msg  # a preset: its shape can be priced


def test_a_preset_without_a_set_is_pointed_to_the_what_if(sets: dict[str, Path],
                                                          tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["qwen-random"], sets["small-real"])
    with pytest.raises(UserInputError) as info:
        catalog.resolve("qwen3-4b", None, default_dir=d)
    assert "--model-what-if qwen3-4b" in str(info.value)
    with pytest.raises(UserInputError) as info:
        catalog.resolve("no-such-model", None, default_dir=d)
    assert "--model-what-if" not in str(info.value)  # not a preset: nothing to price


def test_default_resolution_by_model(sets: dict[str, Path], tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["qwen-random"], sets["small-real"])
    lat, acc, _notes = catalog.resolve("qwen3-8b", None, default_dir=d)
    assert lat.name == "qwen3-8b-synth-random" and acc.name == "smollm2-135m-synth-real"
    lat2, acc2, _ = catalog.resolve("smollm2-135m", None, default_dir=d)
    assert lat2 is acc2 or lat2.name == acc2.name == "smollm2-135m-synth-real"
    with pytest.raises(UserInputError) as info:
        catalog.resolve("llama-3.1-8b", None, default_dir=d)
    assert "qwen3-8b" in str(info.value) and "smollm2-135m" in str(info.value)


def _time_nothing(root: Path) -> None:
    """Empty a set's latency table, as a real-weights set that measured acceptance only."""
    latency = root / "latency.parquet"
    pd.read_parquet(latency).iloc[:0].to_parquet(latency)
    meta = json.loads((root / "meta.json").read_text())
    meta["content_hash"]["latency.parquet"] = hashlib.sha256(latency.read_bytes()).hexdigest()
    meta.get("expected_rows", {})["latency"] = 0
    (root / "meta.json").write_text(json.dumps(meta))


def test_a_model_with_acceptance_only_is_pointed_to_another_models_latency(
        sets: dict[str, Path], tmp_path: Path) -> None:
    d = _defaults(tmp_path, sets["qwen-random"], sets["small-real"])
    _time_nothing(d / sets["small-real"].name)
    with pytest.raises(UserInputError) as info:
        catalog.resolve("smollm2-135m", None, default_dir=d)
    msg = str(info.value)
    assert "measured acceptance only" in msg and "no latency rows" in msg
    assert "--model qwen3-8b --acceptance-traces smollm2-135m-synth-real" in msg
    lat, acc, _ = catalog.resolve("qwen3-8b", None, acceptance="smollm2-135m-synth-real",
                                  default_dir=d)
    assert lat.name == "qwen3-8b-synth-random" and acc.name == "smollm2-135m-synth-real"


def test_model_none_uses_traces_model(sets: dict[str, Path], tmp_path: Path) -> None:
    lat, _, _ = catalog.resolve(None, sets["small-real"], default_dir=tmp_path / "none")
    assert lat.model_name == "smollm2-135m"


def test_shipped_defaults_are_valid_and_measured() -> None:
    # Guards the real package directory: whatever is shipped must load and be measured.
    for path in io.packaged_sets():
        ts = io.load_trace_set(path)
        assert not ts.synthetic, f"{path} is synthetic: never ship synthetic sets"


def test_packaged_latency_sets_are_this_runtimes() -> None:
    """Every packaged latency set was measured on this code's runtime, or on one that differs
    only in the phases CHANGED_PHASES lists — and then the note names those methods alone."""
    from vegas_sim.traces.schema import CHANGED_PHASES, RUNTIME_REVISION

    for model in ("qwen3-8b", "smollm2-135m", "gpt-oss-20b", "qwen3-30b-a3b"):
        latency, _acc, notes = catalog.resolve(model, None)
        revision = latency.runtime_revision
        later = [str(r) for r in range(int(revision) + 1, int(RUNTIME_REVISION) + 1)]
        assert all(r in CHANGED_PHASES for r in later), latency.name
        said = [n for n in notes if "runtime revision" in n]
        assert len(said) == (1 if later else 0)
        if later:
            assert "only magicdec-quest (quest_meta) changed" in said[0]


def test_a_revision_that_changed_every_method_asks_for_a_new_set() -> None:
    from vegas_sim.traces.schema import RUNTIME_REVISION

    note = catalog.runtime_note("old-set", "3")
    assert f"revision 3, this code's is {RUNTIME_REVISION}" in note and "only" not in note
    assert "only magicdec-quest" in catalog.runtime_note("old-set", "4")
    newer = catalog.runtime_note("new-set", str(int(RUNTIME_REVISION) + 1))  # a later runtime's
    assert "re-calibrate to predict this one" in newer and "only" not in newer


def test_an_older_runtime_revision_is_named_in_the_notes(tmp_path: Path) -> None:
    """A measured set whose meta has no software.runtime is revision 1, and predict says so."""
    import json

    from vegas_sim.traces.schema import RUNTIME_REVISION

    packaged = next(p for p in io.packaged_sets() if p.name == "smollm2-135m-h200")
    old = tmp_path / packaged.name
    shutil.copytree(packaged, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["software"]["runtime"]
    (old / "meta.json").write_text(json.dumps(meta))
    latency, _acc, notes = catalog.resolve(None, old)
    assert latency.runtime_revision == "1"
    assert any(f"runtime revision 1, this code's is {RUNTIME_REVISION}" in n for n in notes)


def test_the_packaged_set_measured_on_the_gpu_asked_for_answers() -> None:
    """qwen3-8b, gpt-oss-20b and qwen3-30b-a3b have sets from two GPUs: --gpu h100-sxm takes
    the H100's, no --gpu (or a GPU nothing was measured on) the default GPU's; a model measured
    on one GPU keeps it."""
    assert catalog.resolve("qwen3-8b", None)[0].name == f"qwen3-8b-{catalog.DEFAULT_GPU}"
    assert catalog.resolve("qwen3-8b", None, gpu="h100-sxm")[0].name == "qwen3-8b-h100"
    assert catalog.resolve("qwen3-8b", None, gpu="a100")[0].name == "qwen3-8b-h200"
    for model in ("gpt-oss-20b", "qwen3-30b-a3b"):
        assert catalog.resolve(model, None, gpu="h100-sxm")[0].name == f"{model}-h100"
        assert catalog.resolve(model, None)[0].name == f"{model}-h200"
    assert catalog.resolve("smollm2-135m", None, gpu="h100-sxm")[0].name == "smollm2-135m-h200"
    h100 = catalog.resolve("qwen3-8b", None, gpu="h100-sxm")[0]
    assert catalog.measured_on(h100, "h100-sxm") and not catalog.measured_on(h100, "h100-nvl")


def test_a_note_on_another_methods_runtime_is_left_out_of_a_prediction_without_it() -> None:
    """The packaged Qwen3-8B set prices magicdec-quest as an older runtime ran it: a prediction
    of Vegas alone does not say so, one of Quest does, and tune (which ranks every method's
    baseline) keeps the note."""
    import vegas_sim

    def said(methods: list[str]) -> list[str]:
        table = vegas_sim.predict(methods=methods, engine="analytic")
        return [n for n in table.attrs["notes"] if "runtime revision" in n]

    latency, _acc, notes = catalog.resolve("qwen3-8b", None)
    stale = [n for n in notes if isinstance(n, catalog.MethodsNote)]
    assert [n.methods for n in stale] == [frozenset({"magicdec-quest"})]
    assert said(["vegas"]) == []
    assert said(["vegas", "magicdec-quest"]) == [stale[0]]
    from vegas_sim.api import models_for
    from vegas_sim.sim.options import defaults

    assert stale[0] in models_for({**defaults("tune"), "method": "vegas"})[2]
