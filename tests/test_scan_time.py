"""The step-time model's scans: a state-space or linear-attention mixer's core beyond its projections, timed at a
measured fraction of the matmul rate (engine.time.rates.SCAN_FRACTION, docs/formulas.md §8.21)."""

from dataclasses import replace

import pytest

from lmcalc.engine.model.mixer_flops import mamba2_flops
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time import rates
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.microbatch import kernel_times
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.fast


def test_the_scan_fraction_is_vllms_measured_ssd_over_h100s_measured_matmul_rate():
    # vLLM PR 27299 (2025-10-25, one H100 SXM): mamba_chunk_scan_combined forward, 16,384 tokens of
    # granite-4.0-h-small's shape (128 heads of 64, one group, state 128, chunks of 256), 1.292440e+07 tokens/s.
    # The chunked SSD a token, per head: C·Bᵀ in its chunk 2·Q·N, times x 2·Q·P, the chunk's state 2·P·N and its
    # read by C 2·P·N: 2·(256·128 + 256·64) + 4·64·128 = 131,072; 128 heads: 16,777,216 FLOPs.
    per_token = 128 * (2 * 256 * 128 + 2 * 256 * 64 + 4 * 64 * 128)
    assert per_token == 16_777_216 == rates.SCAN_FLOPS_PER_TOKEN
    # and lmcalc's Mamba-2 count for that shape, less its convolution and transformers' inter-chunk einsum, agrees
    small = resolve_model("granite-4.0-h-small").spec.mamba2
    assert (small.heads, small.head_dim, small.groups, small.state, small.chunk) == (128, 64, 1, 128, 256)
    conv = 2 * small.conv_channels * small.conv_kernel
    inter_chunk = 2 * 128 * 64 * 128 * (16384 // 256 + 1) ** 2 / 16384
    assert mamba2_flops(small, 16384) - conv - inter_chunk == pytest.approx(per_token, rel=1e-12)
    # 216.8 TFLOP/s of H100 SXM's measured 794.5 (stas00's MAMF, the preset's matmul_tflops)
    assert resolve_hardware("h100-sxm").spec.matmul_tflops["bf16"] == 794.5
    assert pytest.approx(1.29244e7 * 16_777_216 / 794.5e12, rel=1e-12) == rates.SCAN_FRACTION
    assert pytest.approx(0.2729, abs=5e-5) == rates.SCAN_FRACTION


def _work(model: str, tp: int = 1):
    w = Workload(
        resolve_model(model).spec,
        resolve_precision("bf16-mixed").spec,
        resolve_optimizer("adamw").spec,
        4096,
        1,
        framework=framework_profile("megatron"),
    )
    grid = Grid(tp, 1, 1, False, 1)
    return w, stage_work(w, grid, StageLayers(0, 40, False, False))


def test_a_hybrids_stage_times_its_mamba_layers_scans_by_hand():
    w, work = _work("granite-4.0-h-tiny")
    # Granite 4.0 H Tiny: 36 of its 40 layers run Mamba-2 (inner 3,072 = 48 heads of 64, one group, state 128,
    # chunks of 256, convolution of 4 over x‖B‖C = 3,072 + 2·128 = 3,328 channels). A token at s = 4,096 (16 chunks):
    # the convolution 2·3,328·4 = 26,624; per head 2·(256·128 + 256·64) + 4·64·128 = 131,072, 48 heads 6,291,456;
    # transformers' inter-chunk pass 2·48·64·128·17² / 4,096 = 55,488.
    per_token = 2 * 3328 * 4 + 48 * (2 * 256 * 128 + 2 * 256 * 64 + 4 * 64 * 128) + 2 * 48 * 64 * 128 * 17**2 / 4096
    assert per_token == 26_624 + 6_291_456 + 55_488
    assert work.scan_layers == 36
    assert work.scan_forward == pytest.approx(36 * 4096 * per_token, rel=1e-12)
    assert work.scan_backward == pytest.approx(2 * work.scan_forward, rel=1e-12)  # each product's two gradients
    assert work.scan_recomputed == 0.0

    # timed at 0.273 of B200's measured bf16 matmul rate, with one launch each way a Mamba-2 layer, in the attention
    # slot (the sequence mixers' cores), on top of what the stage's attention layers take
    hardware, cal = resolve_hardware("b200").spec, rates.CALIBRATION
    with_scans = kernel_times(work, hardware, "bf16", "flash3", 2, cal)
    without = kernel_times(replace(work, scan_forward=0.0, scan_backward=0.0, scan_layers=0.0), hardware, "bf16",
                           "flash3", 2, cal)  # fmt: skip
    rate = rates.SCAN_FRACTION * 1745.0e12  # presets/hardware/b200.yaml matmul_tflops bf16
    launch = 36 * cal.kernel_overhead_s
    assert with_scans.attention_forward - without.attention_forward == pytest.approx(
        36 * 4096 * per_token / rate + launch, rel=1e-9
    )
    assert with_scans.attention_backward - without.attention_backward == pytest.approx(
        2 * 36 * 4096 * per_token / rate + launch, rel=1e-9
    )
    assert with_scans.gemm == without.gemm and with_scans.memory == without.memory


def test_tensor_parallelism_splits_the_scans_heads_and_attention_alone_has_none():
    _, one = _work("granite-4.0-h-tiny")
    _, two = _work("granite-4.0-h-tiny", tp=2)
    assert two.scan_forward == pytest.approx(one.scan_forward / 2, rel=1e-12)
    _, dense = _work("llama-3.1-8b")
    assert dense.scan_forward == dense.scan_layers == 0.0
