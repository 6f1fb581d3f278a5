"""The step-time model's MoE router: the memory-bound kernels Megatron-Core's fused router and torchtitan's eager
router launch around the router's matmul (the profiles' ``speed.router``; engine.time.memory_traffic._router_traffic,
docs/formulas.md §8.5), derived here from the kernels' inputs and outputs."""

import pytest

from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.memory_traffic import MemoryTraffic, _router_traffic, stage_shape
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.fast

BF16, BOOL, FP32 = 2, 1, 4


def _workload(framework: str = "megatron", **capacity) -> Workload:
    return Workload(
        resolve_model("qwen3-30b-a3b").spec,
        resolve_precision("bf16-mixed").spec,
        resolve_optimizer("adamw").spec,
        4096,
        1,
        framework=framework_profile(framework),
        **capacity,
    )


def _router(w: Workload, tp: int = 1) -> MemoryTraffic:
    """The router's kernels alone, on one GPU of a stage of 48 MoE layers (all of Qwen3 30B-A3B's)."""
    out = MemoryTraffic()
    _router_traffic(stage_shape(w, Grid(tp, 1, 1, tp > 1, 1), StageLayers(0, 48, False, False)), out)
    return out


# Per (token, expert) score, from each kernel's inputs and outputs (Transformer Engine's fused router allocates its
# outputs empty, so each fused function is one kernel): the top-k reads the bf16 logits and writes bf16 probs, a
# bool routing map and an fp32 intermediate; the loss's scores read the logits and write fp32 scores, a map and an
# intermediate; the tokens per expert read the map; the loss reads the fp32 scores. Its logging divides and adds
# scalars (three kernels, no bytes per score).
FORWARD = (BF16 + BF16 + BOOL + FP32) + (BF16 + FP32 + BOOL + FP32) + BOOL + FP32
# The auto-scaler's ones and scale (scalars); the loss's backward writes the scores' fp32 gradient; the scores'
# backward reads the intermediate and that gradient and writes the logits' bf16 gradient; the top-k's reads the map,
# the intermediate and the probs' gradient and writes the logits'; the two logits' gradients are added.
BACKWARD = FP32 + (FP32 + FP32 + BF16) + (BOOL + FP32 + BF16 + BF16) + 3 * BF16


def test_the_fused_router_of_one_moe_layer_by_hand():
    assert (FORWARD, BACKWARD) == (25, 29)
    t = _router(_workload())
    scores = 4096 * 128 * 48  # s·b tokens, E = 128 experts' scores each, 48 MoE layers
    assert t.forward == pytest.approx(scores * FORWARD, rel=1e-12)
    assert t.backward == pytest.approx(scores * BACKWARD, rel=1e-12)
    assert t.kernels == 48 * (7 + 6)


def test_an_expert_capacity_adds_the_drop_mask():
    # apply_router_token_dropping, drop policy probs: torch.topk over each expert's column reads the bf16 probs
    # (counted as one launch), the mask's zeros write bf16, the out-of-place scatter copies them (read and write),
    # the mask becomes bool (read bf16, write bool), the probs are multiplied by it (bf16 and bool in, bf16 out);
    # backward, the product's gradient (bf16 and bool in, bf16 out). Not padded, logical_and(map, mask) comes first.
    mask_forward = BF16 + BF16 + 2 * BF16 + (BF16 + BOOL) + (BF16 + BOOL + BF16)
    mask_backward = BF16 + BOOL + BF16
    scores = 4096 * 128 * 48
    padded = _router(_workload(capacity_factor=1.0))
    assert padded.forward == pytest.approx(scores * (FORWARD + mask_forward), rel=1e-12)
    assert padded.backward == pytest.approx(scores * (BACKWARD + mask_backward), rel=1e-12)
    assert padded.kernels == 48 * (7 + 6 + 6 + 1)
    dropped = _router(_workload(capacity_factor=1.0, pad_to_capacity=False))
    assert dropped.forward == pytest.approx(
        padded.forward + scores * (BOOL + BOOL + BOOL), rel=1e-12
    )  # two maps in, one out
    assert dropped.kernels == padded.kernels + 48


def test_sequence_parallelism_splits_the_routers_tokens():
    # with SP the router sees the TP rank's share of the tokens (its input is the sequence-parallel hidden state)
    full, split = _router(_workload()), _router(_workload(), tp=4)
    assert split.forward == pytest.approx(full.forward / 4, rel=1e-12)
    assert split.kernels == full.kernels


def test_a_profile_that_has_not_read_its_router_counts_none_and_a_dense_model_has_none():
    assert framework_profile("nanotron").speed.router is None
    assert _router(_workload("nanotron")) == MemoryTraffic()
    dense = Workload(
        resolve_model("llama3-8b").spec,
        resolve_precision("bf16-mixed").spec,
        resolve_optimizer("adamw").spec,
        4096,
        1,
        framework=framework_profile("megatron"),
    )
    out = MemoryTraffic()
    _router_traffic(stage_shape(dense, Grid(1, 1, 1, False, 1), StageLayers(32, 0, False, False)), out)
    assert out == MemoryTraffic()


def test_the_routers_kernels_reach_the_stages_memory_kernels():
    with_router = stage_work(_workload(), Grid(1, 1, 1, False, 1), StageLayers(0, 48, False, False))
    none = framework_profile("megatron").model_copy(
        update={"speed": framework_profile("megatron").speed.model_copy(update={"router": None})}
    )
    without = stage_work(
        Workload(
            resolve_model("qwen3-30b-a3b").spec,
            resolve_precision("bf16-mixed").spec,
            resolve_optimizer("adamw").spec,
            4096,
            1,
            framework=none,
        ),
        Grid(1, 1, 1, False, 1),
        StageLayers(0, 48, False, False),
    )
    assert with_router.memory_kernels - without.memory_kernels == 48 * 13
    assert with_router.memory_forward - without.memory_forward == pytest.approx(4096 * 128 * 48 * FORWARD, rel=1e-9)


def test_torchtitans_router_by_hand():
    # torchtitan/models/common/moe.py: the gate under an fp32 autocast casts its bf16 input (read 2, write 4 an
    # element of h); the fp32 softmax reads and writes each score; expert_bias is added for the choice (read, write);
    # topk reads the sum; the bool routing map's zeros are written and its column sums read. Backward: the gather's
    # fp32 zeros are written, the softmax's backward reads its output and the gradient and writes one, and the fp32
    # input gradient is cast back (read 4, write 2). Every other kernel works on k-wide tensors or the weight.
    per_score = (FP32 + FP32) + (FP32 + FP32) + FP32 + BOOL + BOOL, FP32 + 3 * FP32
    per_input = BF16 + FP32, FP32 + BF16
    t = _router(_workload("torchtitan"))
    tokens, layers, h, experts = 4096, 48, 2048, 128
    assert t.forward == pytest.approx(tokens * layers * (experts * per_score[0] + h * per_input[0]), rel=1e-12)
    assert t.backward == pytest.approx(tokens * layers * (experts * per_score[1] + h * per_input[1]), rel=1e-12)
    # forward: the two casts, the score function, the bias's add, topk, the gather, route_norm's sum, add and
    # division, route_scale, the map's zeros, scatter and sum, tokens_per_expert's add, the argsort, the weights'
    # index and the token index; backward: two for the weights' index, route_scale's, three for the division, the
    # sum's add, the gather's zeros and scatter_add, the score function's, the two casts back
    assert t.kernels == layers * (17 + 12)
