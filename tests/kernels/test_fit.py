"""Launch configurations that fit a GPU with less shared memory than the H200 (kernels/fit.py).

CPU: the fallback order, the remembered configuration, the error when nothing fits, and
verify attention through the interpreter with its largest launches refused (as Triton refuses
them on a 99 KB GPU) against the reference. GPU (`-m gpu`): the real thing, on the H200 with
Triton's shared-memory limit lowered to an L40S's in a subprocess, so every default launch of
the verify kernel that does not fit is refused by Triton itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.kernels.conftest import HAS_CUDA
from tests.kernels.test_attention import OUT_TOL, check_scores, make_kv, rel_err
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import reference
from vegas_sim.kernels import verify_launch as vl

ROOT = Path(__file__).resolve().parents[2]
L40S_SHARED = 101376  # sm_89's opt-in shared memory per block (99 KB)


@pytest.fixture
def fit(use_triton: None) -> Iterator[Any]:
    from vegas_sim.kernels import fit as module

    module.forget_fitted()
    yield module
    module.forget_fitted()


def refuse_above(fit: Any, limit: int, tried: list[int]) -> Any:
    """A launch that Triton would refuse for configs (sizes) above `limit`."""
    too_big = fit.out_of_resources()

    def launch(size: int) -> str:
        tried.append(size)
        if size > limit:
            raise too_big(size, limit, "shared memory")
        return f"ran {size}"
    return launch


def test_first_config_that_loads_runs_and_is_remembered(fit: Any) -> None:
    tried: list[int] = []
    launch = refuse_above(fit, 100, tried)
    assert fit.launch_fitted("k", [300, 200, 90, 50], launch, "op") == "ran 90"
    assert tried == [300, 200, 90]
    tried.clear()
    assert fit.launch_fitted("k", [300, 200, 90, 50], launch, "op") == "ran 90"
    assert tried == [90]  # straight to the remembered one
    tried.clear()
    assert fit.launch_fitted("other", [80], launch, "op") == "ran 80"  # keys apart


def test_a_remembered_config_that_stops_loading_is_searched_again(fit: Any) -> None:
    tried: list[int] = []
    fit.launch_fitted("k", [90, 50], refuse_above(fit, 100, tried), "op")
    tried.clear()
    assert fit.launch_fitted("k", [90, 50], refuse_above(fit, 60, tried), "op") == "ran 50"
    assert tried == [90, 90, 50]


def test_nothing_fits_is_a_clear_error(fit: Any) -> None:
    with pytest.raises(UserInputError, match="no launch configuration of verify attention "
                       r"fits this GPU \(2 tried") as e:
        fit.launch_fitted("k", [300, 200], refuse_above(fit, 100, []), "verify attention")
    assert "shared memory" in str(e.value) and "fix:" in str(e.value)


def test_other_errors_are_not_swallowed(fit: Any) -> None:
    def launch(size: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal"):
        fit.launch_fitted("k", [1, 2], launch, "op")


def test_smaller_configs_shrink_stages_then_tiles(use_triton: None) -> None:

    cfg = vl.VerifyConfig(16, 128, 4, 3, tma=True)
    got = [(c.block_n, c.num_stages) for c in vl.smaller_configs(cfg)]
    assert got == [(128, 3), (128, 2), (64, 3), (64, 2), (32, 3), (32, 2), (16, 3), (16, 2)]
    assert all(c.splits == 16 and c.num_warps == 4 and c.tma for c in vl.smaller_configs(cfg))
    one = vl.VerifyConfig(1, 32, 4, 1)
    assert [(c.block_n, c.num_stages) for c in vl.smaller_configs(one)] == [(32, 1), (16, 1)]


class Refusing:
    """Stands in for `_verify_attention_kernel`: refuses launches whose BLOCK_N x stages is
    above `limit` with Triton's OutOfResources, runs the real kernel otherwise."""

    def __init__(self, kernel: Any, too_big: type[Exception], limit: int) -> None:
        self.kernel, self.too_big, self.limit = kernel, too_big, limit
        self.launched: list[tuple[int, int]] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kw: Any) -> Any:
            size = kw["BLOCK_N"] * kw["num_stages"]
            if size > self.limit:
                raise self.too_big(size, self.limit, "shared memory")
            self.launched.append((kw["BLOCK_N"], kw["num_stages"]))
            return self.kernel[grid](*args, **kw)
        return launch


@pytest.mark.parametrize("collect,NQ,splits", [("none", 3, 1), ("first_last", 4, 2),
                                               ("all", 2, 3)])
def test_verify_attention_refused_launches_fall_back_to_the_same_result(
    collect: str, NQ: int, splits: int, fit: Any, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vegas_sim.kernels import verify_attention as va

    refusing = Refusing(va._verify_attention_kernel, fit.out_of_resources(), limit=32 * 2)
    monkeypatch.setattr(va, "_verify_attention_kernel", refusing)
    gen = torch.Generator().manual_seed(zlib.crc32(collect.encode()))
    B, Hq, Hkv, D, S = 2, 8, 2, 32, 160
    dtype = torch.bfloat16
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k, v = make_kv(gen, B, S, Hkv, D, dtype, device)
    lens = torch.tensor([150, 61], dtype=torch.int32, device=device)
    for _ in range(2):  # the second call goes straight to the fitted launch
        out, lse, scores = va.verify_attention(q, k, v, lens, D ** -0.5, collect, splits=splits,
                                               block_n=64, num_stages=3)
        r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5, collect)
        assert rel_err(out, r_out) < OUT_TOL[dtype]
        assert (lse - r_lse).abs().max() < 1e-3
        check_scores(scores, r_scores)
    # 64x3, 64x2 and 32x3 refused; 32x2 fits, and the second call reuses it
    assert refusing.launched == [(32, 2), (32, 2)]


GPU_SCRIPT = """
import torch, triton.compiler.compiler as cc
cc.max_shared_mem = lambda device: {limit}
from tests.kernels.test_attention import check_scores
from vegas_sim.kernels import fit, reference, verify_attention as va
gen = torch.Generator(device="cuda").manual_seed(3)
Hq, Hkv, D, C = 32, 8, 128, 32768
for B, NQ, collect in [(1, 1, "none"), (1, 8, "none"), (1, 16, "first_last"), (4, 8, "first_last"),
                       (2, 12, "all")]:
    q = torch.randn(B, NQ, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, C + 128, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    out, lse, scores = va.verify_attention(q, k, v, lens, D ** -0.5, collect)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5, collect)
    err = ((out.float() - r_out.float()).norm() / r_out.float().norm()).item()
    print(B, NQ, collect, f"err={{err:.2e}}", f"lse={{(lse - r_lse).abs().max().item():.1e}}")
    assert err < 1e-2 and (lse - r_lse).abs().max() < 1e-3
    check_scores(scores, r_scores)
fitted = [(next(k for k in key if hasattr(k, "label")).label(), cfg.label())
          for key, cfg in fit._FITTED.items()]  # (the config asked for, the one that loaded)
print("fitted", fitted)
assert any(a != b for a, b in fitted), "no launch was refused: the limit did not take"
"""


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_verify_attention_under_an_l40s_shared_memory_limit() -> None:
    """Triton itself refuses the H200 launches above 99 KB; the results stay the reference's."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", GPU_SCRIPT.format(limit=L40S_SHARED)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_an_old_interpreter_is_a_clean_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gpu extra admits triton 3.6 (the measured GPU stack); its CPU interpreter cannot
    run the kernels, so their tests skip saying so instead of failing."""
    import triton

    from tests.kernels import conftest

    monkeypatch.setattr(conftest, "HAS_CUDA", False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    reason = conftest.interpreter_too_old()
    assert reason is not None and "3.6.0" in reason and ">= 3.7" in reason
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert conftest.interpreter_too_old() is None
