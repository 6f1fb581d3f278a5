"""gpt-oss as Megatron-Core runs it: the clamped SwiGLU's clamps and the experts' output bias are element-wise PyTorch
ops outside the fused kernels, and ``moe_act`` recomputation runs the activation again in backward.

Read from NVIDIA/Megatron-LM (core_r0.16.0, b0cc2706, the NeMo 26.02 container; unchanged at d98e8a64):
``megatron/core/fusions/fused_bias_geglu.py`` ``weighted_bias_quick_geglu_impl`` clamps the gate and the up halves of
the first linear's output and concatenates them before its compiled kernel; ``megatron/core/transformer/moe/
experts.py`` ``TEGroupedMLP._apply_bias`` adds the second linear's bias expert by expert, ``t + b·p``, and
concatenates the experts' rows. Each figure below is counted by hand from those ops."""

import pytest

from lmcalc.engine.memory.activations import layer_kept_tensors, layer_saved_tensors
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

SEQ, BATCH, K, F_E, H, E = 64, 2, 2, 96, 64, 4
PLAIN = ModelSpec(
    name="moe-like", vocab_size=256, hidden_size=H, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=160,
    max_seq_len=256, ffn_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope", tied_embeddings=False,
    moe=dict(num_experts=E, experts_per_token=K, expert_ffn_size=F_E),
)  # fmt: skip
CLAMPED = PLAIN.model_copy(update={"swiglu_limit": 7.0})
BIASED = PLAIN.model_copy(update={"mlp_bias": True})
FP32 = 4  # bytes an activation: the fp32 recipe
ROWS = SEQ * BATCH * K  # an MoE layer's routed rows, k·s·b: on each GPU at EP 2 under balanced routing too
ONE_MOE_LAYER = StageLayers(0, 1, False, False)


def workload(spec: ModelSpec, framework: str = "megatron", **recompute) -> Workload:
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec
    mode = recompute.pop("recompute", "none")
    return Workload(spec, fp32, adamw, SEQ, BATCH, "flash", mode, framework=framework_profile(framework), **recompute)


def traffic(spec: ModelSpec, **recompute) -> tuple[float, float]:
    work = stage_work(workload(spec, **recompute), Grid(1, 1, 2, False, 1), ONE_MOE_LAYER)
    return work.memory_forward, work.memory_backward


def test_the_clamps_move_eight_widths_forward_and_ten_backward():
    # forward: clamp(gate) and clamp(up) read and write f_e each (2 + 2), the concatenation reads and writes 2·f_e (4);
    # backward: each clamp's gradient reads its input and the incoming gradient and writes its own (3 + 3), and the
    # halves' gradients are concatenated (4): per routed row of f_e, in fp32
    width = ROWS * F_E
    (forward, backward), (plain_forward, plain_backward) = traffic(CLAMPED), traffic(PLAIN)
    assert forward - plain_forward == pytest.approx(8 * FP32 * width)
    assert backward - plain_backward == pytest.approx(10 * FP32 * width)


def test_the_experts_output_bias_is_added_expert_by_expert():
    # b·p writes a row (1), t + b·p reads two and writes one (3), the concatenation reads and writes one (2): 6 passes
    # over each routed row's h-wide output forward; backward the bias's gradient (grad·p, then a sum: 3) and the
    # routing weight's (grad·b, then a sum: 3)
    elements = ROWS * H
    (forward, backward), (plain_forward, plain_backward) = traffic(BIASED), traffic(PLAIN)
    assert forward - plain_forward == pytest.approx(6 * FP32 * elements)
    assert backward - plain_backward == pytest.approx(6 * FP32 * elements)


def test_moe_act_recomputation_runs_the_routed_activation_again():
    # CheckpointWithoutOutput runs the routed experts' activation again before its backward: Megatron's fused SwiGLU
    # reads 2·f_e and writes f_e (3 passes of f_e), and the clamps before it add their 8
    width = ROWS * F_E
    _, none = traffic(CLAMPED)
    _, redone = traffic(CLAMPED, recompute="selective", recompute_modules=("moe_act",))
    assert redone - none == pytest.approx((3 + 8) * FP32 * width)


def test_megatron_keeps_the_clamps_inputs_unless_moe_act_drops_them():
    # the clamps keep their input, the first linear's whole output (k·s·b·2·f_e), beside the clamped halves the fused
    # kernel keeps; moe_act's checkpoint keeps the first linear's output once, as its own input, and drops both the
    # clamps' inputs and the product
    def routed_bytes(spec: ModelSpec, **recompute) -> float:
        w = workload(spec, **recompute)
        return sum(t.bytes for t in layer_kept_tensors(w, moe_layer=True))

    assert routed_bytes(CLAMPED) - routed_bytes(PLAIN) == pytest.approx(ROWS * 2 * F_E * FP32)  # k·s·b·2·f_e, fp32
    saved = {t.label for t in layer_saved_tensors(workload(CLAMPED), moe_layer=True)}
    assert "gate and up outputs before the clamps (the clamps' inputs)" in saved
    moe_act = {"recompute": "selective", "recompute_modules": ("moe_act",)}
    assert routed_bytes(CLAMPED, **moe_act) == pytest.approx(routed_bytes(PLAIN, **moe_act))


def test_transformers_counts_its_own_clamps_not_megatrons():
    # Hugging Face's experts run the whole clamped SwiGLU op by op: its tensors are the unfused rule's, with no extra
    # copy of the first linear's output
    saved = {t.label for t in layer_saved_tensors(workload(CLAMPED, "transformers"), moe_layer=True)}
    assert "gate and up outputs before the clamps (the clamps' inputs)" not in saved
    assert "gate and up outputs (the clamps' inputs)" in saved
