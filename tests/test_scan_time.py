"""The step-time model's scans: a state-space or linear-attention mixer's core beyond its projections, timed at a
measured fraction of the matmul rate (engine.time.rates.SCAN_FRACTION, docs/formulas.md §8.21)."""

from dataclasses import replace

import pytest

from lmcalc.engine.model.mixer_flops import mamba2_flops
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time import rates
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.memory_traffic import (
    MemoryTraffic,
    _layout_copy_traffic,
    _mixer_traffic,
    _mlp_activation_traffic,
    _norm_traffic,
    _residual_traffic,
    _rotary_traffic,
    stage_shape,
)
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


def _workload(model: str, micro_batch: int = 1) -> Workload:
    return Workload(
        resolve_model(model).spec,
        resolve_precision("bf16-mixed").spec,
        resolve_optimizer("adamw").spec,
        4096,
        micro_batch,
        framework=framework_profile("megatron"),
    )


def _work(model: str, tp: int = 1):
    w = _workload(model)
    grid = Grid(tp, 1, 1, False, 1)
    return w, stage_work(w, grid, StageLayers(0, 40, False, False))


def _tally(rule, model: str, *, micro_batch: int = 1, tp: int = 1, moe: int = 40) -> MemoryTraffic:
    """One memory-bound rule's bytes (forward, backward) and kernels alone, into an empty tally, on one GPU of a
    40-layer stage, ``moe`` of them MoE (all of Granite 4.0 H Tiny's and Qwen3-Next's are), at s = 4,096."""
    out = MemoryTraffic()
    grid = Grid(tp, 1, 1, tp > 1, 1)
    rule(stage_shape(_workload(model, micro_batch), grid, StageLayers(40 - moe, moe, False, False)), out)
    return out


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
    # backward: each product's two gradients, and what mamba_ssm's _mamba_chunk_scan_combined_bwd runs again first
    # (ssd_combined.py: _bmm_chunk_fwd, C·Bᵀ in each chunk, 2·256·128 a head and token; _chunk_state_fwd, each
    # chunk's state, 2·64·128), not the output (2·256·64 + 2·64·128)
    redone = 48 * (2 * 256 * 128 + 2 * 64 * 128)
    assert redone == 3_932_160
    assert work.scan_backward == pytest.approx(2 * work.scan_forward + 36 * 4096 * redone, rel=1e-12)
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
        36 * 4096 * (2 * per_token + redone) / rate + launch, rel=1e-9
    )
    assert with_scans.gemm == without.gemm and with_scans.memory == without.memory


def test_tensor_parallelism_splits_the_scans_heads_and_attention_alone_has_none():
    _, one = _work("granite-4.0-h-tiny")
    _, two = _work("granite-4.0-h-tiny", tp=2)
    assert two.scan_forward == pytest.approx(one.scan_forward / 2, rel=1e-12)
    _, dense = _work("llama-3.1-8b")
    assert dense.scan_forward == dense.scan_layers == 0.0


def test_a_mamba2_layers_convolution_and_norm_move_what_megatron_cores_training_path_moves():
    # Granite 4.0 H Tiny: 36 Mamba-2 layers of 40; inner I = 3,072 (48 heads of 64), one group of state 128, so the
    # convolution runs over C = 3,072 + 2·128 = 3,328 channels; a gated RMSNorm over I. bf16, 2 bytes an element.
    # Forward (mamba_split_conv1d_scan_combined, then the norm): the convolution reads and writes C, the norm reads
    # and writes I: 2·3,328 + 2·3,072 = 12,800 elements a token. Backward: the convolution again (2C), its backward
    # (read x and the gradient, write dx: 3C), the norm's backward (read x and the gradient, write dx: 3I):
    # 5·3,328 + 3·3,072 = 25,856. Kernels: 2 forward, 3 backward a layer.
    tokens = 36 * 4096
    one = _tally(_mixer_traffic, "granite-4.0-h-tiny")
    assert (one.forward, one.backward, one.kernels) == (2 * 12_800 * tokens, 2 * 25_856 * tokens, 36 * 5)
    # Two sequences a micro-batch: the in-projection's output (P = 2·3,072 + 2·128 + 48 = 6,448) laid out
    # batch-first and the scan's output (I) back, a copy each way: 2·6,448 + 2·3,072 = 19,040 more each pass.
    two = _tally(_mixer_traffic, "granite-4.0-h-tiny", micro_batch=2)
    elements = (2 * (12_800 + 19_040) * 2 * tokens, 2 * (25_856 + 19_040) * 2 * tokens, 36 * 9)
    assert (two.forward, two.backward, two.kernels) == elements
    # TP 2 splits the channels, not the tokens (the mixer sees the whole sequence, gathered under SP)
    halved = _tally(_mixer_traffic, "granite-4.0-h-tiny", tp=2)
    assert (halved.forward, halved.backward) == (one.forward / 2, one.backward / 2)


def test_a_gated_deltanet_layers_memory_bound_kernels_by_hand():
    # Qwen3-Next: 3 of 4 layers run Gated DeltaNet (30 of a 40-layer stage); q and k in 16 heads of 128, v in 32 of
    # 128: the convolution over C = 2·16·128 + 32·128 = 8,192 channels, the value width D = 4,096. Forward: the
    # convolution (R C + W C), the compiled preparation of q, k and v (R C + W C), the gated norm (R 2D + W D):
    # 4·8,192 + 3·4,096 = 45,056 elements a token; backward 6·8,192 + 5·4,096 = 69,632; 3 kernels each way.
    tokens = 30 * 4096
    one = _tally(_mixer_traffic, "qwen3-next-80b-a3b")
    assert (one.forward, one.backward, one.kernels) == (2 * 45_056 * tokens, 2 * 69_632 * tokens, 30 * 6)
    # two sequences: the norm's output copied back sequence-first, R D + W D each way
    two = _tally(_mixer_traffic, "qwen3-next-80b-a3b", micro_batch=2)
    assert (two.forward, two.kernels) == (2 * (45_056 + 2 * 4096) * 2 * tokens, 30 * 8)


def test_a_model_without_a_chunked_mixer_moves_nothing_for_one():
    tally = _tally(_mixer_traffic, "llama-3.1-8b", moe=0)
    assert (tally.forward, tally.backward, tally.kernels) == (0.0, 0.0, 0.0)


def test_rotary_and_the_qk_copies_run_in_a_hybrids_attention_layers_alone():
    # Qwen3-Next attends in 12 of its 48 layers (every fourth), so 10 of a 40-layer stage: 16 query heads and 2 KV
    # heads of 256. Megatron's fused RoPE (no tables) reads and writes Q and K once: 2 bytes in, 2 out, over
    # 4,096 · (16 + 2) · 256 elements a layer. Its Q and K copies for the kernel (q_copies 2, k_copies 2 in
    # presets/frameworks/megatron.yaml): one more Q and one more K, read and written.
    rotary, copies = _tally(_rotary_traffic, "qwen3-next-80b-a3b"), _tally(_layout_copy_traffic, "qwen3-next-80b-a3b")
    assert rotary.forward == rotary.backward == 2 * 2 * 10 * 4096 * (16 + 2) * 256
    assert rotary.kernels == 10 * 4
    assert copies.forward == copies.backward == 2 * 2 * 10 * 4096 * 256 * (16 + 2)
    assert copies.kernels == 2 * 10 * 2


def test_a_layer_that_is_a_mixer_alone_has_one_norm_one_residual_and_no_mlp():
    # Codestral Mamba: 64 layers, each a Mamba-2 mixer behind one RMSNorm, no FFN (its config's ffn_size is unused).
    # A 40-layer stage at s = 4,096, b = 1, TP 1, bf16, Megatron's fused norm: one norm a layer over h = 4,096, 2 bytes
    # read and written forward, 3 backward, a kernel each way; one residual add a layer, 3 bytes an element each way,
    # a kernel each way; no MLP activation at all.

    def tally(model: str, rule, moe: int = 0) -> MemoryTraffic:
        return _tally(rule, model, moe=moe)

    elements = 40 * 4096 * 4096
    norms = tally("codestral-mamba-7b", _norm_traffic)
    assert (norms.forward, norms.backward, norms.kernels) == (2 * 2 * elements, 3 * 2 * elements, 40 * 2)
    residual = tally("codestral-mamba-7b", _residual_traffic)
    assert (residual.forward, residual.backward, residual.kernels) == (3 * 2 * elements, 3 * 2 * elements, 40 * 2)
    mlp = tally("codestral-mamba-7b", _mlp_activation_traffic)
    assert (mlp.forward, mlp.backward, mlp.kernels) == (0.0, 0.0, 0.0)
    # Llama 3.1 8B, for contrast: two norms and two residual adds a layer
    assert tally("llama-3.1-8b", _norm_traffic).kernels == 40 * 2 * 2
    assert tally("llama-3.1-8b", _residual_traffic).kernels == 40 * 2 * 2
    # Nemotron 3 Nano: 52 blocks, each one norm and one mixer or FFN (23 Mamba-2, 6 attention, 23 MoE, no dense MLP):
    # a stage of 40 blocks, 18 of them MoE, has 40 norms
    assert tally("nemotron-3-nano-30b-a3b", _norm_traffic, moe=18).kernels == 40 * 2
    # its 22 other blocks of the stage are Mamba-2 or attention alone: the activation's kernels are the MoE blocks'
    assert tally("nemotron-3-nano-30b-a3b", _mlp_activation_traffic, moe=18).kernels == 18 * 2


def test_tensor_parallelism_gathers_the_blocks_a_layer_has():
    # Megatron's TP gathers (or all-reduces) each block's activations: a dense layer's mixer and MLP (2), an MoE
    # layer's mixer and shared experts (the routed experts are the expert TP group's). Nemotron 3 Nano's 52 blocks are
    # each one of them alone: 23 Mamba-2 and 6 attention blocks (1 each, counted as the dense layers) and 23 MoE blocks
    # with a shared expert and no mixer (1 each). Codestral Mamba: a Mamba-2 mixer alone in every layer.
    def tp_blocks(model: str) -> tuple[float, float]:
        return resolve_model(model).spec.tp_blocks

    assert tp_blocks("nemotron-3-nano-30b-a3b") == (1.0, 1.0)
    assert tp_blocks("codestral-mamba-7b")[0] == 1.0
    assert tp_blocks("llama-3.1-8b")[0] == 2.0
    assert tp_blocks("deepseek-v3") == (2.0, 2.0)  # 3 dense layers; 58 MoE with a shared expert
    assert tp_blocks("qwen3-30b-a3b")[1] == 1.0  # no shared expert
