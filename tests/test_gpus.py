"""--gpu-spec FILE: a what-if GPU described by a JSON or TOML file, and --gpu's errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.sim.test_latency import GPU, MODEL, synthetic_latency
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.gpus import get_gpu, load_gpu_spec, resolve_gpu
from vegas_sim.sim.latency import LatencyModel

H100 = get_gpu("h100-sxm")


@pytest.fixture(scope="module")
def fitted() -> LatencyModel:
    return LatencyModel.fit(synthetic_latency(np.random.default_rng(0)), MODEL, GPU)


def write_spec(tmp_path: Path, text: str, suffix: str = ".json") -> Path:
    path = tmp_path / f"gpu{suffix}"
    path.write_text(text)
    return path


def test_a_spec_with_datasheet_numbers_predicts_as_the_datasheet_entry(
        tmp_path: Path, fitted: LatencyModel) -> None:
    spec = load_gpu_spec(write_spec(tmp_path, json.dumps(
        {"name": "my-h100", "memory_gb": H100.memory_gb, "hbm_bandwidth_gbs": H100.bandwidth_gbs,
         "bf16_tflops": H100.bf16_tflops})))
    assert spec.source == f"spec file {tmp_path / 'gpu.json'}"
    assert spec.label().startswith("GPU my-h100: what-if (spec file ")
    kv = np.full(4, 30_000)
    by_spec, by_name = fitted.what_if(spec), fitted.what_if(H100)
    assert by_spec.phase_ms("verify", "vegas", 8, kv) == by_name.phase_ms("verify", "vegas", 8, kv)
    assert by_spec.gpu_label == "my-h100 (what-if, not measured)"


def test_toml_and_a_measured_copy_bandwidth_used_as_is(tmp_path: Path,
                                                       fitted: LatencyModel) -> None:
    spec = load_gpu_spec(write_spec(tmp_path, 'name = "half-bw"\nmemory_gb = 141\n'
                                    f"copy_bandwidth_gbs = {GPU.copy_bandwidth_gbs / 2}\n"
                                    f"bf16_tflops = {get_gpu('h200').bf16_tflops}\n", ".toml"))
    assert spec.copy_bandwidth_gbs == GPU.copy_bandwidth_gbs / 2
    wi = fitted.what_if(spec)
    # half the measured copy rate, the same bf16 datasheet rate: a memory-bound phase slows
    kv = np.full(2, 20_000)
    assert wi.phase_ms("draft_step", "vegas", 1, kv) > fitted.phase_ms("draft_step", "vegas", 1,
                                                                        kv)


@pytest.mark.parametrize(("text", "message"), [
    ('{"name": "x", "memory_gb": 80, "bf16_tflops": 900}', "missing hbm_bandwidth_gbs"),
    ('{"memory_gb": 80, "hbm_bandwidth_gbs": 3000, "bf16_tflops": 900}', "missing name"),
    ('{"name": "x", "memory_gb": 80, "hbm_bandwidth_gbs": -1, "bf16_tflops": 900}',
     "hbm_bandwidth_gbs must be a number > 0"),
    ('{"name": "x", "memory_gb": 80, "hbm_bw": 3000, "bf16_tflops": 900}', "unknown key(s) hbm_bw"),
    ("{not json", "not a readable JSON or TOML file"),
    ("[1, 2]", "one object"),
])
def test_a_bad_spec_names_the_file_and_the_problem(tmp_path: Path, text: str,
                                                   message: str) -> None:
    path = write_spec(tmp_path, text)
    with pytest.raises(UserInputError) as e:
        load_gpu_spec(path)
    assert message in e.value.message() and f"--gpu-spec {path}" in e.value.message()
    assert e.value.fix, "every refusal says what to do"


def test_unknown_gpu_names_the_option_the_list_and_gpu_spec() -> None:
    with pytest.raises(UserInputError) as e:
        get_gpu("mi300x")
    text = e.value.message()
    assert text.startswith("--gpu: unknown GPU 'mi300x'")
    assert "h100-sxm" in text and "--gpu-spec FILE" in text
    with pytest.raises(UserInputError, match="both"):
        resolve_gpu("h200", Path("gpu.json"))


def test_predict_with_gpu_spec_says_it_is_a_spec_file_what_if(tmp_path: Path) -> None:
    path = write_spec(tmp_path, json.dumps({"name": "mi300x", "memory_gb": 192,
                                            "hbm_bandwidth_gbs": 5300, "bf16_tflops": 1307}))
    result = CliRunner().invoke(cli, ["predict", "--engine", "analytic", "--gamma", "4",
                                      "--gpu-spec", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert f"GPU mi300x: what-if (spec file {path}) — NOT measured" in notes
