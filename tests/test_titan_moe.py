"""torchtitan's MoE layer: what it keeps for backward, against torchtitan 0.3.0 measured on the CPU, and the bytes its
fp32 combine moves.

The measurement (scripts/titan_moe_saved.py, torchtitan 0.3.0 and torch 2.13.0+cpu, 2026-12-07): its ``MoE`` in bf16
over T = 256 tokens of width D = 256, E = 8 experts of hidden width F = 128, k = 2 a token (N = T·k = 512 rows), the
gate run as CUDA's fp32 autocast runs it, saved-tensor hooks counting each storage once, parameters excluded.
"""

from dataclasses import replace

import pytest

from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.gpu_memory import bytes_on_gpu
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.memory_traffic import MemoryTraffic, _moe_permute_traffic, stage_shape
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

pytestmark = pytest.mark.fast

T, D, E, K, F = 256, 256, 8, 2, 128
N = T * K
MEASURED = {"qwen3": 1_606_688, "deepseek": 2_021_408}  # bytes, scripts/titan_moe_saved.py
OFFSETS = E * 4  # the grouped GEMMs' int32 offsets, not counted
GROUPS, KEPT_GROUPS = 4, 2  # the DeepSeek-like case's node-limited routing: its group indices, not counted
GROUP_INDICES = T * GROUPS * 2 * 8 + T * KEPT_GROUPS * 8 + T * GROUPS * 1  # top-2 in each group, groups kept, mask


def moe_workload(shared: int, precision: str = "bf16-mixed") -> Workload:
    spec = ModelSpec.model_validate(
        {
            "name": "titan-moe-small",
            "vocab_size": 2048,
            "hidden_size": D,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "ffn_size": 768,
            "ffn_kind": "swiglu",
            "norm_kind": "rmsnorm",
            "tied_embeddings": False,
            "position_embedding": "rope",
            "max_seq_len": 2048,
            "moe": {"num_experts": E, "experts_per_token": K, "expert_ffn_size": F, "shared_experts": shared},
        }
    )
    precision_spec, adamw = resolve_precision(precision).spec, resolve_optimizer("adamw").spec
    return Workload(spec, precision_spec, adamw, 128, 2, "flash", "none", framework=framework_profile("torchtitan"))


def moe_tensors(w: Workload) -> list:
    """The MLP half of an MoE layer without its norm: what the measured module keeps."""
    return [t for t in layer_saved_tensors(w, True) if t.block == "mlp" and not t.label.startswith("MLP norm")]


def test_the_qwen3_router_layer_keeps_what_torchtitan_keeps() -> None:
    router = T * D * 4 + E * D * 4 + T * E * 4  # fp32 input copy, autocast's fp32 weight copy, softmax output
    # per assignment: top-k index 8, route_norm's numerator 4, argsort 8, token index 8, sorted weight 4; a token's
    # divisor 4
    routing = N * (8 + 4 + 8 + 8 + 4) + T * 4
    experts = N * D * 2 + 4 * N * F * 2  # the gathered tokens; w1's output, its SiLU, w3's output, their product
    combine = N * D * 4  # the fp32 copy of the experts' outputs, for the product with the weights
    by_hand = router + routing + experts + combine
    assert by_hand == MEASURED["qwen3"] - OFFSETS
    assert sum(t.bytes for t in moe_tensors(moe_workload(0))) == by_hand


def test_shared_experts_keep_the_norm_output() -> None:
    qwen3 = sum(t.bytes for t in moe_tensors(moe_workload(0)))
    shared = T * D * 2 + 4 * T * F * 2  # the bf16 norm output their w1 and w3 read, and their SwiGLU
    assert sum(t.bytes for t in moe_tensors(moe_workload(1))) == qwen3 + shared
    assert qwen3 + shared == MEASURED["deepseek"] - OFFSETS - GROUP_INDICES


def test_the_weight_copy_is_whole_on_every_gpu() -> None:
    (weight,) = [t for t in moe_tensors(moe_workload(0)) if t.symbol == "E·h"]
    gathered = next(t for t in moe_tensors(moe_workload(0)) if t.label.startswith("router input"))
    layout = Layout(dp=1, tp=2, cp=2, sequence_parallel=True)
    assert bytes_on_gpu(weight, layout) == E * D * 4
    assert bytes_on_gpu(gathered, layout) == T * D * 4 / 4


def test_in_fp32_the_router_keeps_its_input_once() -> None:
    labels = [t.label for t in moe_tensors(moe_workload(0, "fp32"))]
    assert "router / shared-expert input (norm output)" in labels
    assert not any("fp32 copy" in label and "router" in label for label in labels)


def test_the_fp32_combine_moves_its_round_trip() -> None:
    # torchtitan's combine, per element of the experts' k·s·b·h outputs: forward, the cast up (read 2, write 4), the
    # product with the weights (read 4, write 4), the cast back (read 4, write 2); backward, the cast back's gradient
    # up (read 2, write 4), the outputs' gradient (read 4, write 4), the weights' gradient (read 4 + 4, write 4, then
    # its sum over h, read 4), the cast's gradient back (read 4, write 2). Against the same layer without it.
    w = moe_workload(0)
    plain = replace(w, framework=w.framework.model_copy(update={"moe": w.framework.moe.model_copy(
        update={"outputs_fp32": False})}))  # fmt: skip
    layers, grid = 2, Grid(1, 1, 1, False, 1)
    titan, reference = MemoryTraffic(), MemoryTraffic()
    _moe_permute_traffic(stage_shape(w, grid, StageLayers(0, layers, False, False)), titan)
    _moe_permute_traffic(stage_shape(plain, grid, StageLayers(0, layers, False, False)), reference)
    elements = N * D * layers
    assert titan.forward - reference.forward == (2 + 4) * elements + (4 + 4) * elements + (4 + 2) * elements
    assert titan.backward - reference.backward == (6 + 8 + 12 + 4 + 6) * elements
    assert titan.kernels - reference.kernels == (3 + 5) * layers
