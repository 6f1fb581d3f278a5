"""GPUs below the clock their rates were measured at (``--clock-fraction``: a power cap or a locked clock). A
compute-bound kernel's cycles take 1/F as long at F of the clock, so the matmul and attention rates scale by F; HBM
and the links run on their own clocks and do not. The MFU stays a share of the spec sheet's peak."""

from __future__ import annotations

import pytest

from lmcalc.engine.time.rates import (
    CALIBRATION,
    UNMEASURED_MATMUL_FRACTION,
    attention_rate,
    gemm_seconds,
    matmul_rate,
    memory_seconds,
)
from lmcalc.errors import LmcalcError
from lmcalc.estimates.training import at_clock
from lmcalc.presets import parse_cluster, resolve_hardware

H100 = resolve_hardware("h100-sxm").spec
SLOW = H100.model_copy(update={"clock_fraction": 0.8})


def test_the_rates_scale_with_the_clock():
    assert matmul_rate(SLOW, "bf16").flops_per_s == pytest.approx(0.8 * H100.matmul_tflops["bf16"] * 1e12)
    unmeasured = "fp64"  # the preset has a peak but no measured rate for it
    assert unmeasured not in H100.matmul_tflops
    assert matmul_rate(SLOW, unmeasured).flops_per_s == pytest.approx(
        0.8 * UNMEASURED_MATMUL_FRACTION * H100.peak_flops(unmeasured)
    )
    fast = attention_rate(H100, "flash3", "bf16", matmul_rate(H100, "bf16"))
    slow = attention_rate(SLOW, "flash3", "bf16", matmul_rate(SLOW, "bf16"))
    assert slow.forward == pytest.approx(0.8 * fast.forward) and slow.backward == pytest.approx(0.8 * fast.backward)


def test_a_compute_bound_gemm_takes_longer_and_a_memory_bound_kernel_does_not():
    t0 = CALIBRATION.kernel_overhead_s
    shape = (8192.0, 8192.0, 8192.0)  # 1.1 PFLOP-scale arithmetic, far above its 0.4 GB of traffic
    fast = gemm_seconds(H100, matmul_rate(H100, "bf16").flops_per_s, shape, 2)
    slow = gemm_seconds(SLOW, matmul_rate(SLOW, "bf16").flops_per_s, shape, 2)
    assert slow - t0 == pytest.approx((fast - t0) / 0.8)
    assert memory_seconds(SLOW, 1e9, 3) == memory_seconds(H100, 1e9, 3)


def test_the_plan_runs_slower_and_its_mfu_counts_the_spec_sheets_peak(lmcalc_run):
    def best(*extra: str) -> dict:
        pins = ["--tp", "1", "--pp", "1", "--zero", "1", "--micro-batch", "1", "--recompute", "selective"]
        argv = ["plan", "-m", "llama-3-8b", "--gpus", "8xH100", "--global-batch", "1M", *pins, "--top", "1", *extra,
                "--json"]  # fmt: skip
        return lmcalc_run(argv).json["results"]["rank1"]

    full, slow = best(), best("--clock-fraction", "0.8")
    ratio = slow["tokens_per_s_per_gpu"]["value"] / full["tokens_per_s_per_gpu"]["value"]
    assert 0.8 < ratio < 1  # the matmuls and attention slow down, the memory-bound kernels and links do not
    assert slow["mfu"]["value"] / full["mfu"]["value"] == pytest.approx(ratio)  # the same FLOPs over the same peak


def test_bad_fractions_are_refused():
    cluster = parse_cluster("8xH100")
    assert at_clock(cluster, 1) is cluster
    assert "at 50% of its clock" in at_clock(cluster, 0.5).hardware.label
    for bad in (0, 1.2, -0.5, True):
        with pytest.raises(LmcalcError, match="clock.fraction must be above 0 and at most 1"):
            at_clock(cluster, bad)


def test_nvfp4_gemms_run_at_the_fp4_peak_where_nobody_measured_them():
    b200 = resolve_hardware("b200").spec
    assert b200.peak_tflops_dense["fp4"] == 9000  # HGX B200 'FP4 18 PFLOPS' sparse, halved
    assert "fp4" not in b200.matmul_tflops
    assert matmul_rate(b200, "fp4").flops_per_s == pytest.approx(UNMEASURED_MATMUL_FRACTION * 9000e12)
