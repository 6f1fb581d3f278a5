"""How fast one GPU runs each kind of kernel: a roofline per kernel, from the hardware's measured figures.

A kernel takes the longer of its arithmetic at an achievable rate and its memory traffic at an achievable
bandwidth (Williams et al. 2009, "Roofline"), plus a fixed cost every kernel pays on the GPU:

    t = max(FLOPs / (R · w), bytes / (B · η)) + t₀

* **GEMMs.** R is the maximum achievable matmul rate measured at the best shape (the hardware preset's
  ``matmul_tflops``, stas00's MAMF tables, or ``lmcalc bench``), not the spec sheet's peak. w is wave
  quantisation: a GEMM is cut into output tiles of ``GEMM_TILE`` and the GPU runs one tile per
  streaming multiprocessor at a time, so the last wave runs part-empty; w = tiles / (waves · SMs). When a GEMM
  has fewer tiles than SMs, cuBLAS splits the K dimension (split-K / stream-K) to fill the GPU, so w = 1 and
  the small size shows as t₀ and the memory bound instead. A skinny GEMM (few tokens, a large weight)
  is memory-bound: it must read its weight once.
* **Attention** (fused, FlashAttention) runs at a fraction of the dense peak that depends on the kernel and
  the chip: ``ATTENTION_FRACTIONS``, read off the FlashAttention-2 and -3 papers' benchmarks.
* **Memory-bound kernels** (norms, activations, residual adds, rotary, softmax, cross-entropy, the optimizer)
  run at η = ``HBM_EFFICIENCY`` of the HBM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lmcalc.errors import LmcalcError
from lmcalc.framework_specs import AttentionKernel
from lmcalc.specs import Cluster, HardwareSpec

GEMM_TILE = (128, 128)
"""Output tile of a bf16 GEMM on Ampere and Hopper tensor cores, the common CUTLASS/cuBLAS choice (128 × 128
per thread block; cuBLAS also uses 128 × 256 on Hopper, which only makes quantisation coarser)."""


@dataclass(frozen=True)
class Calibration:
    """The few constants of the kernel model that no spec sheet gives, fitted on the published runs of
    ../shared/reference (``scripts/fit_time.py``; each run's error and a leave-one-out column in
    docs/plan-accuracy.md)."""

    gemm_fractions: tuple[tuple[str, float], ...] = ()
    """Per chip generation: the fraction of the best-shape matmul rate (MAMF) a training step's GEMMs sustain.
    Their shapes are not the sweep's best, their inputs arrive from cold caches between other kernels, and eight
    GPUs under sustained load run below the clock a single warmed-up GPU reaches in a benchmark (stas00 warms up
    for 30 s before measuring for that reason); the fit finds Hopper further from its MAMF than Ampere."""
    gemm_fraction: float = 0.8
    """The same for a chip generation no published run measured: the mean of the fitted ones."""
    hbm_efficiency: float = 0.85
    """Fraction of the spec HBM bandwidth that element-wise and reduction kernels reach (a streaming copy
    reaches about 90 % on H100 and A100)."""
    kernel_overhead_s: float = 4e-6
    """Seconds every kernel costs on the GPU beyond its work: the gap between dependent kernels, the prologue
    and the tail of the last wave (a few µs between kernels in Nsight traces of a PyTorch step)."""
    attention_fraction: float = 1.0
    """Multiplies the fused attention rates of ``ATTENTION_FRACTIONS`` (benchmarks of the kernel alone, at
    its best batch and head counts)."""

    def gemm_fraction_for(self, hardware: HardwareSpec) -> float:
        return dict(self.gemm_fractions).get(hardware.architecture or "", self.gemm_fraction)


CALIBRATION = Calibration(
    gemm_fractions=(("ampere", 0.847), ("blackwell", 0.635), ("hopper", 0.708)),
    gemm_fraction=0.730,
    hbm_efficiency=0.894,
    kernel_overhead_s=4.5e-6,
    attention_fraction=0.60,
)
"""The fitted constants (scripts/fit_time.py, docs/plan-accuracy.md)."""


@dataclass(frozen=True)
class Machine:
    """What a step is timed on: the cluster (its chips, their links, the nodes) and the calibration of the kernel
    model. A step time's cached figures are keyed by it, so its hash is computed once, when it is made."""

    cluster: Cluster
    calibration: Calibration = CALIBRATION
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.cluster, self.calibration)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def hardware(self) -> HardwareSpec:
        return self.cluster.hardware


LOW_PRECISION_OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5625}
"""Bytes per operand element of a GEMM in a low-precision dtype, scales included: fp8, one byte (a per-tensor scale);
fp4, NVFP4's half-byte E2M1 values and an E4M3 scale per 16 (transformer_engine/pytorch/tensor/nvfp4_tensor.py).
Attention stays in the activation dtype (Transformer Engine's default, fp8_dpa off)."""


UNMEASURED_MATMUL_FRACTION = 0.75
"""Where a chip's preset has no measured maximum achievable matmul rate, the rate assumed: this fraction of the
dense peak (measured chips reach 0.51-0.97 of it, most 0.73-0.87: ../shared/reference hardware_facts.yaml,
``achievable``). Always stated with the estimate."""

ATTENTION_FRACTIONS: dict[tuple[str, str], tuple[float, float, str]] = {
    ("flash2", "ampere"): (
        0.60,
        0.50,
        "FlashAttention-2 on A100: 50-73 % of the peak, forward fastest (Dao 2023, arXiv:2307.08691 §4.1)",
    ),
    ("flash2", "hopper"): (
        0.36,
        0.30,
        "FlashAttention-2 on H100: 35 % of the peak (Shah et al. 2024, arXiv:2407.08608 abstract; 368 TFLOP/s "
        "forward at 4k, head dim 128, Fig. 5)",
    ),
    ("flash3", "hopper"): (
        0.63,
        0.50,
        "FlashAttention-3 / cuDNN on H100: 609-638 TFLOP/s forward at 4k, head dim 128 (Shah et al. 2024 Fig. 5); "
        "backward 1.5-1.75x FlashAttention-2's (§4.1)",
    ),
    ("flash3", "blackwell"): (
        0.63,
        0.50,
        "FlashAttention-4 on B200: 1,418 TFLOP/s forward and 1,118 backward at 8k, causal, head dim 128 "
        "(Dao-AILab/flash-attention PR #2280, 1-CTA backward); Transformer Engine calls cuDNN, which the "
        "FlashAttention-4 paper puts up to 1.3x slower forward (Zadouri et al. 2026, arXiv:2603.05451)",
    ),
}
"""(forward, backward) fraction of the dense bf16 peak a fused attention kernel reaches at training sequence
lengths (2k-8k) and head dimension 128, per kernel and chip generation."""

SCAN_TOKENS_PER_S = 1.29244e7
SCAN_FLOPS_PER_TOKEN = 2 * 128 * (256 * 128 + 256 * 64 + 2 * 64 * 128)
SCAN_FRACTION = SCAN_TOKENS_PER_S * SCAN_FLOPS_PER_TOKEN / 794.5e12
"""A state-space or linear-attention mixer's chunked scan, forward and backward: this fraction (0.273) of the chip's
measured matmul rate in the activation dtype. Measured for Mamba-2's SSD: vLLM PR 27299 (a comment of 2025-10-25,
one H100 SXM) ran ``mamba_chunk_scan_combined`` forward at 1.29244e7 tokens/s on 16,384 tokens of granite-4.0-h-small's
shape (128 heads of 64, one group, state 128, chunks of 256), where lmcalc's chunked count
(``mixer_flops.mamba2_flops``: 2·H·(Q·N + Q·P + 2·P·N)) is 16,777,216 FLOPs a token: 216.8 TFLOP/s, 0.273 of H100
SXM's measured 794.5 (presets/hardware/h100-sxm.yaml). Assumed: the backward at the same rate, other chips at the
same fraction of theirs, and Gated DeltaNet's, Lightning attention's and mLSTM's chunked kernels (the fla family's
Triton kernels) too."""

ATTENTION_FALLBACK = (0.45, 0.38)
"""Where no benchmark of the kernel on that chip generation is known (FlashAttention-2 on Blackwell; AMD, Gaudi, TPU;
``flash3``, the chip's own fused kernel, falls back to FlashAttention-2's figures where it has no entry): the assumed
(forward, backward) fraction of the chip's measured matmul rate, between FlashAttention-2 on H100 and on A100."""


@dataclass(frozen=True)
class MatmulRate:
    flops_per_s: float
    source: str
    measured: bool


def matmul_rate(hardware: HardwareSpec, dtype: str) -> MatmulRate:
    """The maximum achievable matmul rate: measured (the preset's ``matmul_tflops``), else a stated fraction of the
    dense peak; at a lower clock (``clock_fraction``: a power cap, a locked clock) in proportion, as a compute-bound
    kernel's cycles take longer. A dtype the chip has no peak for is refused."""
    if dtype not in hardware.peak_tflops_dense:
        have = ", ".join(hardware.peak_tflops_dense) or "none"
        raise LmcalcError(f"{hardware.name} has no {dtype} peak on its spec sheet (it has: {have})")
    clock = hardware.clock_fraction
    at_clock = f"; × {clock:g}, the clock it runs at" if clock != 1 else ""
    measured = hardware.matmul_tflops.get(dtype)
    if measured:
        return MatmulRate(measured * 1e12 * clock, hardware.sources.get("matmul", "measured") + at_clock, True)
    peak = hardware.peak_flops(dtype)
    return MatmulRate(
        UNMEASURED_MATMUL_FRACTION * peak * clock,
        f"assumed {UNMEASURED_MATMUL_FRACTION:g} of the dense peak: no measured {dtype} matmul rate for "
        f"{hardware.name}{at_clock}",
        False,
    )


def wave_efficiency(hardware: HardwareSpec, m: float, n: float) -> float:
    """w = tiles / (waves · SMs) for an m × n output; 1 with fewer tiles than SMs (split-K fills the GPU) or where
    the SM count is unknown."""
    units = hardware.compute_units
    if not units:
        return 1.0
    tiles = math.ceil(m / GEMM_TILE[0]) * math.ceil(n / GEMM_TILE[1])
    if tiles < units:
        return 1.0
    return tiles / (math.ceil(tiles / units) * units)


def hbm_bandwidth(hardware: HardwareSpec, cal: Calibration = CALIBRATION) -> float:
    """Achievable HBM bandwidth in bytes/s: η · the spec sheet's."""
    return hardware.memory_bandwidth_tbps * 1e12 * cal.hbm_efficiency


def gemm_seconds(
    hardware: HardwareSpec,
    rate: float,
    shape: tuple[float, float, float],
    element_bytes: float | tuple[float, float],
    extra_bytes: float = 0.0,
    cal: Calibration = CALIBRATION,
) -> float:
    """One (m × k) · (k × n) GEMM, ``shape`` = (m, n, k): max(2mnk / (φ·R·w), bytes / (B·η)) + t₀, reading both
    operands and writing the output once (``extra_bytes``: an fp32 accumulator read and written in the epilogue).
    ``element_bytes``: of the operands and the output alike, or (the operands', the output's): an fp8 or fp4 GEMM
    reads one-byte or half-byte operands and writes its output in the activation dtype (Transformer Engine's bf16)."""
    m, n, k = shape
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2 * m * n * k
    read, written = element_bytes if isinstance(element_bytes, tuple) else (element_bytes, element_bytes)
    moved = read * (m * k + k * n) + written * m * n + extra_bytes
    arithmetic = flops / (cal.gemm_fraction_for(hardware) * rate * wave_efficiency(hardware, m, n))
    return max(arithmetic, moved / hbm_bandwidth(hardware, cal)) + cal.kernel_overhead_s


def memory_seconds(hardware: HardwareSpec, moved: float, kernels: float, cal: Calibration = CALIBRATION) -> float:
    """``kernels`` memory-bound kernels that move ``moved`` bytes in all: bytes / (B·η) + kernels · t₀."""
    return moved / hbm_bandwidth(hardware, cal) + kernels * cal.kernel_overhead_s


@dataclass(frozen=True)
class AttentionRate:
    forward: float  # FLOP/s
    backward: float
    source: str


def attention_rate(
    hardware: HardwareSpec, kernel: AttentionKernel, dtype: str, matmul: MatmulRate, cal: Calibration = CALIBRATION
) -> AttentionRate:
    """The fused attention kernel's forward and backward rates on this chip: a measured fraction of its dense peak,
    else a stated fraction of its matmul rate."""
    arch = hardware.architecture or ""
    if kernel == "flash3" and ("flash3", arch) not in ATTENTION_FRACTIONS:
        kernel = "flash2"  # no native fused kernel measured on this chip: the FlashAttention-2 figures apply
    known = ATTENTION_FRACTIONS.get((kernel, arch))
    if known and dtype in hardware.peak_tflops_dense:
        peak = hardware.peak_flops(dtype) * hardware.clock_fraction  # the kernel runs at the clock the GPU runs at
        forward = min(known[0] * peak, matmul.flops_per_s) * cal.attention_fraction
        backward = min(known[1] * peak, matmul.flops_per_s) * cal.attention_fraction
        return AttentionRate(forward, backward, known[2])
    return AttentionRate(
        ATTENTION_FALLBACK[0] * matmul.flops_per_s * cal.attention_fraction,
        ATTENTION_FALLBACK[1] * matmul.flops_per_s * cal.attention_fraction,
        f"assumed {ATTENTION_FALLBACK[0]:g}/{ATTENTION_FALLBACK[1]:g} of the matmul rate (forward/backward): no "
        f"benchmark of {kernel} on {arch or hardware.name}",
    )
