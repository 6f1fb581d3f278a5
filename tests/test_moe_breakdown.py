"""scripts/moe_breakdown.py, the per-term analysis of docs/plan-accuracy.md's "Why MoE runs are predicted too fast":
its terms add up to the predicted step, the published step follows from the printed throughput, and its two bounds
follow the hand derivations written here."""

from __future__ import annotations

import math

import pytest
from accuracy import load_runs
from fit_time import HELDOUT
from moe_breakdown import REPRESENTATIVE, breakdown, forced_balance_bound, grouped_launch_change, one_launch_seconds

from lmcalc.engine.time import rates
from lmcalc.presets import resolve_hardware

pytestmark = pytest.mark.data

RUNS = {r.id: r for r in load_runs(HELDOUT, None) if r.id in REPRESENTATIVE}
QWEN3_B200 = "nemo-26.02-qwen3-30b-a3b-8gpus-b200-mxfp8"


@pytest.mark.parametrize("run_id", REPRESENTATIVE)
def test_the_terms_add_up_to_the_predicted_step(run_id):
    b = breakdown(RUNS[run_id])
    parts = (b.experts, b.other_gemms, b.attention, b.memory, b.all_to_all, b.tp_cp, b.host, b.pipeline, b.states)
    assert sum(parts) == pytest.approx(b.predicted, rel=1e-9)
    assert min(parts) >= 0


def test_the_published_step_follows_from_the_printed_throughput():
    """Megatron-Bridge 26.02, Qwen3 30B-A3B on 8 DGX-B200: GBS 512 of 4,096 tokens = 2,097,152 tokens a step, at
    9,691 tokens/s per GPU × 8 GPUs = 77,528 tokens/s: 27.0503 s a step."""
    assert breakdown(RUNS[QWEN3_B200]).published == pytest.approx(2_097_152 / 77_528, rel=1e-9)


def test_forced_balance_bound_for_qwen3_on_b200():
    """Micro-batch 1 of 4,096 tokens, top-8, EP 8: each GPU's experts receive R = 4,096 × 8 = 32,768 routed rows
    when balanced (16 experts of 2,048). Random logits make each token's 8 experts a uniform 8-subset of 128, so a
    rank's rows have variance R·(1 − 1/8)·(128 − 8)/(128 − 1) = 32,768 × 0.875 × 0.944882 = 27,090.1, σ = 164.59;
    the busiest of 8 ranks exceeds R by at most σ·√(2 ln 8) = 164.59 × 2.03933 = 335.66 rows, 1.0244 % of R, so
    at most 1.0244 % of the routed experts' GEMM time."""
    run = RUNS[QWEN3_B200]
    b = breakdown(run)
    assert b.routed_rows == pytest.approx(32_768)
    assert forced_balance_bound(run, b) / b.experts == pytest.approx(0.010244, rel=1e-3)


def test_one_grouped_launch_of_qwen3_experts_on_b200():
    """The gate weight's forward for B200's 16 local experts, 2,048 rows each, (2,048 × 2,048)·(2,048 × 768) in fp8:
    each expert alone has 16 × 6 = 96 tiles, under the 148 SMs, so lmcalc counts it at w = 1: 2·2048·768·2048 =
    6.44245e9 FLOPs at 0.635 × 3,432.5 TFLOP/s = 2.95579 µs (its 7,340,032 bytes at 0.894 × 7.7 TB/s take
    1.0663 µs), + 4.5 µs = 7.45579 µs, 119.293 µs for 16. As one launch: 1,536 tiles in ⌈1536/148⌉ = 11 waves,
    w = 1536/1628 = 0.943489, 16 × 6.44245e9 / (2,179.64e12 × 0.943489) = 50.1255 µs + 4.5 = 54.6255 µs."""
    b200 = resolve_hardware("b200").spec
    rate = rates.matmul_rate(b200, "fp8").flops_per_s
    apart = 16 * rates.gemm_seconds(b200, rate, (2048, 768, 2048), 1.0)
    assert apart == pytest.approx(119.293e-6, rel=1e-4)
    assert one_launch_seconds(b200, rate, (2048, 768, 2048), 16, 1.0) == pytest.approx(54.6255e-6, rel=1e-4)
    # over the step's 3 weights × 3 passes × 48 layers × 64 micro-batches, one launch is faster, not slower
    assert grouped_launch_change(RUNS[QWEN3_B200]) < 0
    assert math.isclose(1536 / (11 * 148), 0.943489, rel_tol=1e-5)
