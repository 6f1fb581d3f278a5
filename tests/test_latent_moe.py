"""Nemotron 3 Super's latent MoE (transformers' NemotronHMoE with ``moe_latent_size``): each MoE block projects a token
from h down to l (``fc1_latent_proj``), runs the routed experts at width l, and projects their sum back to h
(``fc2_latent_proj``); the router and the shared expert stay at h. Parameters by hand and on transformers' meta device,
a training step's FLOPs against FlopCounterMode, the tensors kept for backward against transformers', and the
dispatch at width l (Megatron-Core's MoELayer and its dispatchers)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcalc import api
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.outside_pool import dispatcher_buffers
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.time.kernels import _layer_gemms
from lmcalc.engine.time.microbatch import _layer_collectives
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hardware_specs import Cluster
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

# Nemotron 3 Super 120B-A12B's config.json (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16), as public parser code
# copies it beside the checkpoint's safetensors totals: BF16 weights 123,611,012,096, of them the MTP layer's
# 2,942,324,736, which NemotronHForCausalLM does not build
PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"  # 40 M, 40 E, 8 *
SUPER = {
    "model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 88, "vocab_size": 131072,
    "hybrid_override_pattern": PATTERN,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
    "chunk_size": 128, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "n_routed_experts": 512,
    "n_shared_experts": 1, "num_experts_per_tok": 22, "moe_latent_size": 1024, "moe_intermediate_size": 2688,
    "moe_shared_expert_intermediate_size": 5376, "mlp_hidden_act": "relu2", "num_nextn_predict_layers": 1,
    "routed_scaling_factor": 5.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "max_position_embeddings": 262144, "intermediate_size": 21504, "tie_word_embeddings": False,
}  # fmt: skip
TINY = {**SUPER, "hidden_size": 256, "num_hidden_layers": 5, "vocab_size": 512, "hybrid_override_pattern": "MEM*E",
        "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 16, "chunk_size": 64,
        "num_attention_heads": 4, "head_dim": 64, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_latent_size": 64, "moe_intermediate_size": 96, "moe_shared_expert_intermediate_size": 192,
        "num_nextn_predict_layers": 0, "max_position_embeddings": 4096, "intermediate_size": 512}  # fmt: skip

# Nemotron 3 Ultra 550B-A55B's config.json (nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16), as public launch scripts,
# READMEs and tests copy its fields (presets/models/nemotron-3-ultra-550b-a55b.yaml names them): 108 blocks in
# layers_block_type, attention at these 12 and the others alternating Mamba-2 and MoE from layer 0
ULTRA_ATTENTION = (7, 14, 23, 32, 39, 48, 57, 64, 73, 82, 89, 98)
_others = iter(("mamba", "moe") * 48)
ULTRA = {
    **SUPER, "hidden_size": 8192, "num_hidden_layers": 108, "hybrid_override_pattern": None,
    "layers_block_type": [("attention" if i in ULTRA_ATTENTION else next(_others)) for i in range(108)],
    "mtp_layers_block_type": ["attention", "moe"], "mamba_num_heads": 256, "num_attention_heads": 64,
    "moe_latent_size": 2048, "moe_intermediate_size": 5120, "moe_shared_expert_intermediate_size": 10240,
    "intermediate_size": 5120,
}  # fmt: skip


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "super", "test"))


def _blocks_by_hand(h: int, latent: int, f_e: int, f_s: int, E: int, inner: int, heads: int, q_heads: int):
    """A Mamba-2 block (8 groups of state 128, a width-4 convolution), an attention block (2 KV heads of 128) and a
    latent-MoE block, each with its norm left out: Nemotron-H's three kinds, counted by hand."""
    xbc = inner + 2 * 8 * 128  # what the convolution runs over: x, B and C
    mamba = h * (inner + xbc + heads) + xbc * 4 + xbc + 3 * heads + inner + inner * h  # in, conv, A D dt, norm, out
    attention = h * (q_heads * 128) + 2 * h * (2 * 128) + (q_heads * 128) * h
    moe = E * h + 2 * h * latent + E * 2 * f_e * latent + 2 * h * f_s  # router, latent projections, experts, shared
    return mamba, attention, moe


def _counted_as(config: dict, preset: str, total: int, inactive: int) -> None:
    """lmcalc's count of ``config`` and of ``preset`` is ``total``, and ``inactive`` of it (the experts a token's
    top-22 leaves out, in every MoE block) is not active."""
    counted = count_params(spec_of(config))
    assert (counted.total, counted.active) == (total, total - inactive)
    assert count_params(resolve_model(preset).spec).total == total


@pytest.mark.fast
def test_super_by_hand_is_its_checkpoint_less_the_mtp_layer():
    h, latent, f_e, f_s, E, V = 4096, 1024, 2688, 5376, 512, 131072
    mamba, attention, moe = _blocks_by_hand(h, latent, f_e, f_s, E, inner=8192, heads=128, q_heads=32)
    total = 2 * V * h + 89 * h + 40 * mamba + 8 * attention + 40 * moe
    assert total == 123_611_012_096 - 2_942_324_736
    _counted_as(SUPER, "nemotron-3-super-120b-a12b", total, inactive=40 * (E - 22) * 2 * f_e * latent)


@pytest.mark.fast
def test_ultra_by_hand_is_its_bf16_checkpoint_less_the_mtp_block():
    h, latent, f_e, f_s, E, V = 8192, 2048, 5120, 10240, 512, 131072
    mamba, attention, moe = _blocks_by_hand(h, latent, f_e, f_s, E, inner=16384, heads=256, q_heads=64)
    total = 2 * V * h + 109 * h + 48 * mamba + 12 * attention + 48 * moe
    assert total == 549_308_968_960  # NVIDIA's "550B total"
    # the MTP block transformers does not build: an attention and an MoE block, the 2h-to-h projection, its norms
    mtp = attention + moe + 2 * h * h + 5 * h
    assert round(2 * (total + mtp) / 1e9) == 1121  # GB: the BF16 checkpoint's size, as a deployment README gives it
    _counted_as(ULTRA, "nemotron-3-ultra-550b-a55b", total, inactive=48 * (E - 22) * 2 * f_e * latent)


@pytest.mark.fast
def test_mamba2s_groups_bound_tp_in_training_not_in_serving():
    # Megatron-Core's MambaMixer asserts that TP divides its 8 groups (mamba_mixer.py at d98e8a64); vLLM's
    # MambaMixer2 replicates the groups instead, and splits only the heads (256)
    with pytest.raises(LmcalcError, match=r"TP=16 does not divide the 8 Mamba-2 groups of nemotron-3-ultra"):
        api.memory(model="nemotron-3-ultra", gpus="1x64xgb200", seq=8192, tp=16, ep=4)
    assert api.memory(model="nemotron-3-ultra", gpus="1x64xgb200", seq=8192, tp=8, ep=8).gpu.total > 0
    assert api.inference(model="nemotron-3-ultra", gpus="16xgb200", tp=16).max_batch >= 1


@pytest.mark.fast
def test_without_its_latent_width_the_experts_work_at_h():
    plain = dict(SUPER, moe_latent_size=None)
    latent = count_params(spec_of(SUPER)).total
    assert count_params(spec_of(plain)).total - latent == 40 * (512 * 2 * 2688 * (4096 - 1024) - 2 * 4096 * 1024)


@pytest.mark.torch
def test_parameters_and_a_steps_flops_equal_transformers():
    pytest.importorskip("transformers")
    from lmcalc.validate_hf import transformers_check

    result = transformers_check(TINY, 128)
    for row in ("params", "flops"):  # the parameters on the meta device; FlopCounterMode's count of a training step
        assert result.term(f"{row}.lmcalc").value == result.term(f"{row}.pytorch").value


@pytest.mark.torch
@pytest.mark.slow
def test_super_on_the_meta_device():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    built = transformers.AutoConfig.for_model(**SUPER)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec_of(SUPER)).total


@pytest.mark.torch
@pytest.mark.slow
def test_ultra_on_the_meta_device():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    built = transformers.AutoConfig.for_model(**{k: v for k, v in ULTRA.items() if v is not None})
    assert [built.layers_block_type.count(b) for b in ("full_attention", "linear_attention", "moe")] == [12, 48, 48]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec_of(ULTRA)).total


def _super(profile: str = "megatron", seq: int = 4096, **settings: object) -> Workload:
    spec = resolve_model("nemotron-3-super-120b-a12b").spec
    args = (spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, seq, 1)
    return Workload(*args, framework=framework_profile(profile), **settings)  # type: ignore[arg-type]


def _saved(w: Workload) -> dict[str, float]:
    return {t.label: t.bytes for t in layer_saved_tensors(w, True)}


@pytest.mark.fast
def test_the_routed_experts_keep_their_tokens_at_the_latent_width():
    # 4,096 tokens, k = 22 rows each, l = 1,024, bf16: the experts' inputs and outputs are l wide, and the projection
    # back to h keeps the experts' combined output (s·b·l); the router's and shared expert's input stays h wide
    saved = _saved(_super("transformers"))
    assert saved["tokens gathered for their experts"] == 4096 * 22 * 1024 * 2
    assert saved["expert outputs (for the routing-weight product)"] == 4096 * 22 * 1024 * 2
    assert saved["latent projection up input (the experts' combined output)"] == 4096 * 1024 * 2
    assert saved["router / shared-expert input (norm output)"] == 4096 * 4096 * 2


@pytest.mark.fast
def test_under_mxfp8_the_projection_to_h_keeps_its_input_quantised():
    # Megatron-Core's fc2_latent_proj is a TELinear (parallel_mode "duplicated"): under MXFP8 it saves its input as
    # one byte an element and an E8M0 scale per 32, 4,096 × 1,024 × 1.03125 B
    w = replace(_super(), precision=resolve_precision("mxfp8").spec)
    saved = _saved(w)
    assert saved["latent projection up input (the experts' combined output), quantised"] == 4096 * 1024 * 1.03125


@pytest.mark.fast
def test_megatron_dispatches_and_buffers_at_the_latent_width():
    # HybridEP on a GB200 rack, EP 64 over 512 experts (8 a rank), 4,096 tokens a rank: G·t·(2l + 4·⌊l/128⌋ + 4·E_l·R)
    # with l = 1,024 (Megatron-Core sizes the buffers by the dispatched tensor, fc1_latent_proj's output)
    w = _super(moe_dispatcher="hybridep", nvlink_domain=72)
    buffers = dispatcher_buffers(w, Layout(dp=64, ep=64))
    assert buffers.nvlink == 64 * 4096 * (2 * 1024 + 4 * 8 + 4 * 8 * 64)
    assert "2l" in buffers.formula
    # NCCL's all-to-all sends k copies of each token at its dispatched width: 22 · 4,096 · 1,024 · 2 B, a quarter of
    # what the same experts at h would send
    rack = Cluster(resolve_hardware("gb200").spec, 64, 64)
    latent = _layer_collectives(w, Grid(ep=64), rack)
    plain = replace(w, model=w.model.model_copy(update={"moe": w.model.moe.model_copy(update={"latent_size": None})}))
    at_h = _layer_collectives(plain, Grid(ep=64), rack)
    assert latent[2] < at_h[2] / 2


@pytest.mark.fast
def test_the_latent_projections_run_on_each_ranks_own_tokens_with_whole_weights():
    # duplicated on every TP rank (Megatron-Core: parallel_mode="duplicated"): under sequence parallelism each rank
    # projects its s·b/TP tokens with the whole h × l weights; the experts' GEMMs are l wide
    w = _super(seq=4096)
    gemms = {g.name: g for g in _layer_gemms(w, Grid(tp=4, sequence_parallel=True), 4096, 4096, True)}
    fc1, fc2 = gemms["latent.fc1.weight"], gemms["latent.fc2.weight"]
    assert (fc1.m, fc1.n, fc1.k) == (1024, 1024, 4096)
    assert (fc2.m, fc2.n, fc2.k) == (1024, 4096, 1024)
    assert gemms["experts.fc.weight"].k == 1024 and gemms["experts.proj.weight"].n == 1024
    assert not any(g.name.startswith("latent") for g in _layer_gemms(w, Grid(), 4096, 4096, False))


@pytest.mark.fast
def test_super_trains_and_plans(tmp_path):
    estimate = api.memory(model="nemotron-3-super-120b-a12b", seq=4096, gpus="64xh100", tp=4, ep=16, zero=1)
    assert estimate.report.term("total.activations").value > 0
    plan = api.plan(model="nemotron-3-super-120b-a12b", gpus="64xh100", seq=4096, global_batch=4096 * 64, tokens=1e9)
    assert plan.best is not None


@pytest.mark.torch
def test_the_latent_layer_keeps_what_transformers_keeps():
    # measured on a two-layer-pair model (h 128, 4 experts top-2, f_e 64) with and without a latent width of 48: the
    # MoE layer keeps k·s·b·(h − l) fewer bytes of gathered tokens and of expert outputs each (bf16), and s·b·l more,
    # the projection back to h's input: at s·b = 128, −2·(2·128·80·2) + 128·48·2 = −69,632 B
    hf_saved = pytest.importorskip("hf_saved")
    kept = {}
    for name in ("nemotron-h-small", "nemotron-h-latent-small"):
        m = hf_saved.measure(name, "sdpa", 128, 1, False, use_cache=False)
        config = hf_saved.CASES[name].config().to_dict()
        spec = ModelSpec.model_validate(model_from_hf_config(config, name, "test"))
        args = (spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 128, 1)
        w = Workload(*args, framework=framework_profile("transformers"))
        kept[name] = (m.per_layer_bytes[3], sum(t.bytes for t in layer_saved_tensors(w, True)))
    measured = kept["nemotron-h-latent-small"][0] - kept["nemotron-h-small"][0]
    predicted = kept["nemotron-h-latent-small"][1] - kept["nemotron-h-small"][1]
    assert measured == predicted == -2 * (2 * 128 * 80 * 2) + 128 * 48 * 2
