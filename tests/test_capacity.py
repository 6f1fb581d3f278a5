"""MoE expert capacity (``--capacity-factor``): each routed expert keeps at most C times its balanced share of the
tokens, padded to it or not (Switch Transformer, Fedus et al. 2021 §2.1; Megatron-Core's
``moe_expert_capacity_factor`` and ``moe_pad_expert_input_to_capacity``).

The memory is checked against PyTorch's saved tensors of the reference MoE layer at a capacity, padded: whatever the
routing, every expert then computes exactly ⌈k·T·C/E⌉ rows. The time is checked by hand: the expert GEMMs' rows, the
permutation's bytes and the all-to-all's bytes all scale by ρ."""

import pytest

from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

MIXTRAL_LIKE = ModelSpec(
    name="mixtral-like", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=160,
    max_seq_len=256, ffn_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope", tied_embeddings=False,
    moe=dict(num_experts=4, experts_per_token=2, expert_ffn_size=96),
)  # fmt: skip


def workload(spec: ModelSpec, seq: int, batch: int, **capacity) -> Workload:
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec  # fp32: 4-byte activations
    return Workload(spec, fp32, adamw, seq, batch, "flash", "none", mask_bytes=4, framework=framework_profile(),
                    **capacity)  # fmt: skip


@pytest.mark.parametrize(
    "capacity_factor,pad,share",
    [(None, True, 1.0), (1.25, True, 1.25), (0.5, True, 0.5), (1.25, False, 1.0), (0.5, False, 0.5)],
)
def test_the_routed_share_is_the_capacity_padded_or_not(capacity_factor, pad, share):
    w = workload(MIXTRAL_LIKE, 64, 1, capacity_factor=capacity_factor, pad_to_capacity=pad)
    assert w.routed_share == share
    assert w.routed_copies == 2 * share  # k = 2


@pytest.mark.parametrize("framework,copies", [("megatron", 2.0), ("transformers", 4.0)])
def test_a_model_that_runs_every_expert_routes_every_token_to_each_under_its_own_code(framework, copies):
    # Llama4TextMoe (dense_dispatch) sends every token through all E = 4 experts: E rows a token where transformers'
    # own code runs; Megatron-Core's dispatcher sends each token to its k = 2; zero-computation experts (LongCat-Flash's
    # 2 beside 4, top-3) take k·E/(E + Z) = 2 of 3 under either
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec
    dense = MIXTRAL_LIKE.model_copy(update={"moe": MIXTRAL_LIKE.moe.model_copy(update={"dense_dispatch": True})})
    w = Workload(dense, fp32, adamw, 64, 1, "flash", "none", framework=framework_profile(framework))
    assert w.routed_copies == copies
    zero = MIXTRAL_LIKE.moe.model_copy(update={"zero_experts": 2, "experts_per_token": 3})
    w = Workload(MIXTRAL_LIKE.model_copy(update={"moe": zero}), fp32, adamw, 64, 1, "flash", "none",
                 framework=framework_profile(framework))  # fmt: skip
    assert w.routed_copies == 2.0


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "1", True])
def test_a_capacity_factor_must_be_a_positive_number(value):
    with pytest.raises(LmcalcError, match="capacity_factor.*positive number"):
        workload(MIXTRAL_LIKE, 64, 1, capacity_factor=value)


def test_a_capacity_factor_needs_routed_experts():
    dense = MIXTRAL_LIKE.model_copy(update={"moe": None, "name": "dense"})
    with pytest.raises(LmcalcError, match="applies to routed experts; dense has none"):
        workload(dense, 64, 1, capacity_factor=1.0)


@pytest.mark.torch
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("seq,batch", [(64, 1), (128, 2)])
def test_padded_capacity_matches_pytorchs_saved_tensors(capacity_factor, seq, batch):
    torch = pytest.importorskip("torch")
    from lmcalc import measure
    from lmcalc.reference_model import with_capacity

    # k·T·C/E whole, so that ⌈k·T·C/E⌉ rows an expert is exactly ρ = C of the balanced share
    assert (2 * seq * batch * capacity_factor / 4).is_integer()
    torch.manual_seed(0)
    tokens = torch.randint(0, MIXTRAL_LIKE.vocab_size, (batch, seq))
    dropless = measure.peak_saved_bytes(measure.build(MIXTRAL_LIKE, "flash", seq, "cpu"), tokens, "none")
    model = with_capacity(measure.build(MIXTRAL_LIKE, "flash", seq, "cpu"), capacity_factor)
    measured = measure.peak_saved_bytes(model, tokens, "none")

    def engine(**capacity):
        return gpu_memory(workload(MIXTRAL_LIKE, seq, batch, **capacity), Layout(), 0).held.with_rebuilt

    # the dropless count is PyTorch's to 4 bytes (a scalar the loss keeps; test_validate.py holds it to its
    # tolerance); the capacity adds or takes away exactly what PyTorch's does
    assert engine(capacity_factor=capacity_factor) - engine() == measured - dropless
    assert engine(capacity_factor=capacity_factor) == pytest.approx(measured, abs=4)


@pytest.mark.torch
def test_the_capacity_path_is_what_changes_the_saved_bytes():
    # the same model dropless and at C = 1.5: PyTorch keeps more, by what the engine counts for the padding
    torch = pytest.importorskip("torch")
    from lmcalc import measure
    from lmcalc.reference_model import with_capacity

    torch.manual_seed(0)
    tokens = torch.randint(0, MIXTRAL_LIKE.vocab_size, (1, 64))
    dropless = measure.peak_saved_bytes(measure.build(MIXTRAL_LIKE, "flash", 64, "cpu"), tokens, "none")
    padded = with_capacity(measure.build(MIXTRAL_LIKE, "flash", 64, "cpu"), 1.5)
    extra = measure.peak_saved_bytes(padded, tokens, "none") - dropless
    # per MoE layer, 0.5 · k·T = 64 more rows: gathered tokens, expert outputs and weighted outputs (3·h); the
    # unfused SwiGLU's gate output, SiLU(gate), up output and product (4·f_e), all fp32; and each row's int64 token
    # index and fp32 weight (12 bytes)
    rows, h, f_e, layers = 0.5 * 2 * 64, 64, 96, 2
    assert extra == layers * rows * (4 * (3 * h + 4 * f_e) + 12)


def test_padded_rows_are_what_the_expert_gemms_and_the_dispatch_move():
    # Qwen3-30B-A3B on one GPU of EP 8: T = 4,096 tokens, k = 8, E = 128, 16 experts a GPU.
    model = resolve_model("qwen3-30b-a3b").spec
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    grid, built = Grid(1, 1, 8, False, 1), StageLayers(0, 1, False, False)

    def work(**capacity):
        w = Workload(model, bf16, adamw, 4096, 1, framework=framework_profile("megatron"), **capacity)
        return stage_work(w, grid, built)

    dropless, padded = work(), work(capacity_factor=1.25)
    experts = {g.name: g for g in dropless.gemms if g.count == 16}
    # each local expert's rows: the expert group's tokens · k · EP / E = 4,096 · 8 · 8 / 128 = 2,048
    assert {g.m for g in experts.values()} == {2048}
    assert {g.m for g in padded.gemms if g.count == 16} == {2048 * 1.25}
    others = {(g.name, g.m) for g in dropless.gemms if g.count != 16}
    assert others == {(g.name, g.m) for g in padded.gemms if g.count != 16}  # attention and router unchanged


def test_the_dispatch_sends_the_padded_rows():
    # Megatron-Core's drop-and-pad dispatcher sends capacity · E rows (num_out_tokens): k·ρ copies of each token
    from lmcalc.engine.time.comm import group_time
    from lmcalc.engine.time.microbatch import _layer_collectives
    from lmcalc.presets import parse_cluster

    model = resolve_model("qwen3-30b-a3b").spec
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    cluster = parse_cluster("8xH100")
    grid = Grid(1, 1, 8, False, 1)
    for capacity_factor, share in ((None, 1.0), (1.25, 1.25), (0.5, 0.5)):
        w = Workload(model, bf16, adamw, 4096, 1, framework=framework_profile("megatron"),
                     capacity_factor=capacity_factor)  # fmt: skip
        size = 4096 * 2048 * 2 * 8 * share  # tokens · h · 2 bytes · k · ρ
        assert _layer_collectives(w, grid, cluster)[2] == group_time("all-to-all", size, 8, 1, cluster)


def test_megatron_keeps_no_expert_output():
    # Megatron-Core 0.16.1 multiplies by the routing weight inside the experts' fused SwiGLU (experts.py,
    # TEGroupedMLP: weighted_bias_swiglu_impl) and combines with an unpermute that keeps only indices
    # (token_dispatcher.py, token_combine). Against lmcalc's reference layer under the same profile, one MoE layer of
    # Qwen3-30B-A3B at s = 4,096 keeps two k·s·b·h bf16 tensors fewer: the expert outputs and the weighted outputs.
    from lmcalc.engine.memory.activations import layer_saved_tensors

    model = resolve_model("qwen3-30b-a3b").spec
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    megatron = framework_profile("megatron")
    reference = megatron.model_copy(
        update={"moe": megatron.moe.model_copy(update={"probs_in_activation": False, "weighted_outputs": True})}
    )

    def moe_layer(framework, **capacity):
        w = Workload(model, bf16, adamw, 4096, 1, framework=framework, **capacity)
        return sum(t.bytes for t in layer_saved_tensors(w, moe_layer=True))

    k, tokens, h = 8, 4096, 2048
    assert moe_layer(reference) - moe_layer(megatron) == 2 * k * tokens * h * 2
    # the same two tensors at every capacity: k·ρ rows of them
    assert moe_layer(reference, capacity_factor=1.5) - moe_layer(megatron, capacity_factor=1.5) == (
        2 * k * 1.5 * tokens * h * 2
    )
