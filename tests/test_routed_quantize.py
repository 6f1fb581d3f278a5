"""The routed experts' fp8 and fp4 casts (docs/formulas.md §8.13.1). Where a framework fuses the casts into their
producers (Transformer Engine's norm and activation kernels), only the transposes cost a pass (§8.13). The routed
experts' operands come from the token permutation, the experts' activation and the combine's backward, and the
grouped GEMM module quantises them itself (Transformer Engine's ``GroupedLinear``: ``tex.split_quantize``). So each
tensor it quantises is read once more, in the activation dtype."""

import pytest

from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import kernel_workload, stage_work
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

ADAMW = resolve_optimizer("adamw").spec
MOE_LAYER, DENSE_LAYER = StageLayers(0, 1, False, False), StageLayers(1, 0, False, False)


def workload(model: str, precision: str) -> Workload:
    spec, recipe = resolve_model(model).spec, resolve_precision(precision).spec
    return kernel_workload(Workload(spec, recipe, ADAMW, 4096, 1, framework=framework_profile("megatron")))


def transposes(work) -> float:
    """§8.13: the fused casts' transposes, read q and write q (q = 1 byte in fp8) an element of each GEMM's input
    and output gradient."""
    return sum(2 * 1.0 * (g.m * g.k + g.m * g.n) * g.count for g in work.gemms + work.head)


def test_qwen3_30b_routed_experts_read_their_operands_once_more():
    """Qwen3 30B-A3B, micro-batch 1 of 4,096 tokens, top-8, EP 8: each GPU's 16 experts take R = 4,096 × 8 =
    32,768 rows (2,048 each). Quantised: the shared input of gate and up, R × 2,048 = 67,108,864 elements; the down
    projection's input, R × 768 = 25,165,824; the output gradients of gate and up, 2 × R × 768 = 50,331,648, and of
    down, R × 2,048 = 67,108,864. That is 209,715,200 elements read at 2 bytes: 419,430,400 B a layer, 60.93 µs at
    0.894 × 7.7 TB/s on B200."""
    work = stage_work(workload("qwen3-30b-a3b", "mxfp8"), Grid(1, 1, 8, False, 1), MOE_LAYER)
    assert work.fp8_cast_bytes - transposes(work) == pytest.approx(419_430_400)


def test_only_the_routed_experts_and_only_low_precision_gemms():
    """A dense layer's casts are the transposes alone, as before; bf16 GEMMs cast nothing."""
    dense = stage_work(workload("qwen3-30b-a3b", "mxfp8"), Grid(1, 1, 8, False, 1), DENSE_LAYER)
    assert dense.fp8_cast_bytes == pytest.approx(transposes(dense))
    assert stage_work(workload("qwen3-30b-a3b", "bf16-mixed"), Grid(1, 1, 8, False, 1), MOE_LAYER).fp8_cast_bytes == 0
