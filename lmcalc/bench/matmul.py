"""Matrix-multiply throughput: one shape, a sweep of shapes, or the exact shapes of a model's layers.

Benchmark hygiene after stas00's mamf-finder and AMD's max-achievable-FLOPs method: random normal
inputs (never zeros, which draw less power and run faster), rotated among enough buffers that together
they exceed the device's cache (so the cache is not what is measured), warm-up calls before timing,
every call timed on its own, the median reported with the fastest and slowest, and the product checked
against a float64 reference on a sample of rows (a wrong fast kernel is a failure, not a record).
A matmul of (m × k) by (k × n) is 2·m·n·k FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lmcalc.bench.choices import MATMUL_DTYPES
from lmcalc.bench.device import Device
from lmcalc.bench.dtypes import DTYPES
from lmcalc.bench.timing import Stats, time_calls
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import ModelSpec

# Largest relative error (Frobenius norm, against float64) a correct kernel shows on random normal inputs:
# a product's rounding error grows like sqrt(k) · unit roundoff of the inputs' format.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 3e-2, "fp8": 1.5e-1}
GPU_CACHE_FLUSH_BYTES = 256 * 2**20  # mamf-finder: larger than any GPU's last-level cache seen (MI300X)
CPU_CACHE_FLUSH_BYTES = 64 * 2**20
MAX_BUFFER_BYTES = 2 * 2**30
SAMPLE_ROWS = 64
GPU_DEFAULT_SIZE = 8192  # a square matmul large enough to reach a GPU's sustained rate
CPU_DEFAULT_SIZE = 1024

Shape = tuple[int, int, int]
"""(m, n, k): an (m × k) by (k × n) product."""
Progress = Callable[[int, int], object]
"""Told (shapes measured, shapes in all) before the first shape and after each."""


@dataclass(frozen=True)
class MatmulSettings:
    """How each shape is timed: in ``dtype``, after ``warmup`` untimed calls, over ``repeats`` timed ones."""

    dtype: str
    warmup: int = 10
    repeats: int = 50


@dataclass(frozen=True)
class MatmulMeasurement:
    m: int
    n: int
    k: int
    dtype: str
    stats: Stats
    relative_error: float
    tf32: bool

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.stats.median

    @property
    def best_flops_per_s(self) -> float:
        return self.flops / self.stats.fastest


def _fp8_supported(device: Device) -> bool:
    return (
        device.torch_device.type == "cuda"
        and hasattr(torch, "_scaled_mm")
        and torch.cuda.get_device_capability() >= (8, 9)
    )


def _operands(m: int, n: int, k: int, dtype: str, device: Device) -> tuple[int, Callable[[], tuple]]:
    """How many buffer sets to rotate through, and a maker of one (A, B) pair."""
    dev = device.torch_device
    if dtype not in MATMUL_DTYPES:
        raise LmcalcError(f"{setting('dtype')} must be one of {', '.join(MATMUL_DTYPES)}; got {dtype!r}")
    if dtype == "fp8" and not _fp8_supported(device):
        raise LmcalcError(
            f"fp8 matmuls need torch._scaled_mm on a GPU of compute capability 8.9 or newer; "
            f"{device.name} has none (try {setting('dtype')} bf16)"
        )
    element = DTYPES[dtype].bytes
    if dev.type == "cpu" and dtype == "fp16" and not torch.backends.mkldnn.is_available():
        raise LmcalcError(
            f"fp16 matmuls are not supported on this CPU build of torch (try {setting('dtype')} fp32 or bf16)"
        )
    per_set = (m * k + k * n) * element
    if per_set > MAX_BUFFER_BYTES:
        raise LmcalcError(
            f"shape {m}x{n}x{k} needs {per_set / 2**30:.1f} GiB of inputs; the limit is "
            f"{MAX_BUFFER_BYTES / 2**30:.0f} GiB"
        )
    flush = GPU_CACHE_FLUSH_BYTES if dev.type != "cpu" else CPU_CACHE_FLUSH_BYTES
    sets = max(2, min(math.ceil(2 * flush / per_set), MAX_BUFFER_BYTES // per_set))

    torch_dtype = DTYPES[dtype].torch()

    def make() -> tuple:
        if dtype == "fp8":  # drawn in fp32, then rounded: randn has no fp8 kernel
            a = torch.randn(m, k, device=dev).to(torch_dtype)
            b = torch.randn(n, k, device=dev).to(torch_dtype).t()  # column-major, as _scaled_mm wants
            return a, b
        return torch.randn(m, k, device=dev, dtype=torch_dtype), torch.randn(k, n, device=dev, dtype=torch_dtype)

    return sets, make


def _product(dtype: str, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if dtype == "fp8":
        scale = torch.ones((), device=device)
        return lambda a, b: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    return torch.matmul


def measure(shape: Shape, settings: MatmulSettings, device: Device) -> MatmulMeasurement:
    """Time ``(m × k) @ (k × n)`` as ``settings`` say on ``device``, then check it against float64."""
    m, n, k = shape
    dtype = settings.dtype
    for size, name in ((m, "M"), (n, "N"), (k, "K")):
        if size < 1:
            raise LmcalcError(f"matmul {name} must be a positive integer, got {size}")
    sets, make = _operands(m, n, k, dtype, device)
    buffers = [make() for _ in range(sets)]
    product = _product(dtype, device.torch_device)
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"  # explicit: fp32 means fp32, tf32 means tf32
    try:
        seconds = time_calls(
            lambda i: product(*buffers[i % sets]), device.torch_device, settings.warmup, settings.repeats
        )
        a, b = (t.float() if dtype == "fp8" else t for t in buffers[0])  # fp8 widens through fp32
        result = product(*buffers[0]).double()
        rows = torch.randperm(m, device=a.device)[:SAMPLE_ROWS]
        reference = a[rows].double() @ b.double()
        error = ((result[rows] - reference).norm() / reference.norm()).item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    if not error <= TOLERANCE[dtype]:
        raise LmcalcError(
            f"the {dtype} matmul {m}x{n}x{k} on {device.name} is wrong: relative error {error:.3g} "
            f"against float64 exceeds {TOLERANCE[dtype]:g} (a fast wrong kernel is not a record)"
        )
    return MatmulMeasurement(m, n, k, dtype, Stats.of(seconds), error, dtype == "tf32")


def measure_shapes(
    shapes: Sequence[Shape], settings: MatmulSettings, device: Device, progress: Progress | None = None
) -> list[MatmulMeasurement]:
    """Each distinct shape of ``shapes`` measured once, in their order; ``progress`` is told how many are done."""
    unique = list(dict.fromkeys(shapes))
    measured: list[MatmulMeasurement] = []
    for shape in unique:
        if progress is not None:
            progress(len(measured), len(unique))
        measured.append(measure(shape, settings, device))
    if progress is not None:
        progress(len(measured), len(unique))
    return measured


def default_shape(device: Device) -> Shape:
    """The one shape measured when none is given: 8192³ on CUDA, 1024³ elsewhere."""
    size = GPU_DEFAULT_SIZE if device.torch_device.type == "cuda" else CPU_DEFAULT_SIZE
    return size, size, size


def sweep_shapes(device: Device) -> list[Shape]:
    """The grid ``--sweep`` searches: sizes that tile well, larger on GPUs than on CPUs."""
    sizes = (1024, 2048, 4096, 8192) if device.torch_device.type != "cpu" else (128, 256, 512, 1024)
    return [(m, n, k) for m in sizes for n in sizes for k in sizes]


@dataclass(frozen=True)
class ModelMatmul:
    """One matmul of a layer: name, shape and how many of it run per training step per GPU."""

    name: str
    m: int
    n: int
    k: int
    count: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def model_matmuls(spec: ModelSpec, tokens: int, tp: int = 1) -> list[ModelMatmul]:
    """The weight matmuls of one training step on one tensor-parallel rank: for each forward y = x·W
    (x: tokens × k, W: k × n), backward computes dx = dy·Wᵀ and dW = xᵀ·dy. Fused QKV and gate/up
    projections, as Megatron runs them. Attention's score and value products are not weight matmuls
    and are left to the attention kernel."""
    if spec.mla or spec.moe or spec.local_kv_heads:
        raise LmcalcError(
            f"bench {setting('model')} supports dense models with standard attention; {spec.name} is not one"
        )
    h, d, dv, heads, kv = spec.hidden_size, spec.head_size, spec.v_head_dim, spec.num_heads, spec.kv_heads
    for what, size in (
        ("heads", heads),
        ("KV heads", kv),
        ("FFN size", spec.ffn_size),
        ("vocabulary", spec.vocab_size),
    ):
        if size % tp:
            raise LmcalcError(f"{setting('tp')} {tp} does not divide the {size} {what} of {spec.name}")
    L = spec.num_layers
    up = 2 * spec.ffn_size if spec.ffn_kind != "gelu_mlp" else spec.ffn_size
    forward = [
        ("QKV projection", h, (heads * d + kv * (d + dv)) // tp, L),
        ("attention output", heads * dv // tp, h, L),
        ("MLP up" + (" + gate" if spec.ffn_kind != "gelu_mlp" else ""), h, up // tp, L),
        ("MLP down", spec.ffn_size // tp, h, L),
        ("logits", h, spec.vocab_size // tp, 1),
    ]
    matmuls = []
    for name, k, n, count in forward:
        matmuls += [
            ModelMatmul(f"{name} (forward)", tokens, n, k, count),
            ModelMatmul(f"{name} (backward, input grad)", tokens, k, n, count),
            ModelMatmul(f"{name} (backward, weight grad)", k, n, tokens, count),
        ]
    return matmuls


def flop_weighted_rate(measured: Sequence[tuple[ModelMatmul, MatmulMeasurement]]) -> float:
    """Σ FLOPs / Σ time: the rate the whole set of matmuls runs at (slow shapes weigh by their FLOPs)."""
    flops = sum(mm.flops for mm, _ in measured)
    seconds = sum(mm.flops / meas.flops_per_s for mm, meas in measured)
    return flops / seconds


@dataclass(frozen=True)
class ModelShapes:
    """The weight matmuls of one training step of ``model`` on one tensor-parallel rank of ``tp``, with
    ``tokens`` (micro-batch × seq) rows in each activation. Refused when made if ``model_matmuls`` refuses."""

    model: ModelSpec
    tokens: int
    tp: int = 1

    def __post_init__(self) -> None:
        self.matmuls()

    def matmuls(self) -> list[ModelMatmul]:
        return model_matmuls(self.model, self.tokens, self.tp)


@dataclass(frozen=True)
class ModelMeasurement:
    """A model's matmuls, each with the measurement of its shape."""

    shapes: ModelShapes
    measured: tuple[tuple[ModelMatmul, MatmulMeasurement], ...]

    @property
    def dtype(self) -> str:
        return self.measured[0][1].dtype

    @property
    def flops_per_s(self) -> float:
        """The FLOP-weighted rate of the whole step's matmuls (``flop_weighted_rate``)."""
        return flop_weighted_rate(self.measured)


def measure_model(
    shapes: ModelShapes, settings: MatmulSettings, device: Device, progress: Progress | None = None
) -> ModelMeasurement:
    """Each distinct shape of the model's matmuls measured once (``measure_shapes``), paired with every
    matmul of that shape."""
    matmuls = shapes.matmuls()
    measured = measure_shapes([(mm.m, mm.n, mm.k) for mm in matmuls], settings, device, progress)
    by_shape = {(meas.m, meas.n, meas.k): meas for meas in measured}
    return ModelMeasurement(shapes, tuple((mm, by_shape[(mm.m, mm.n, mm.k)]) for mm in matmuls))
