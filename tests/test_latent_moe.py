"""Nemotron 3 Super's latent MoE (transformers' NemotronHMoE with ``moe_latent_size``): each MoE block projects a token
from h down to l (``fc1_latent_proj``), runs the routed experts at width l, and projects their sum back to h
(``fc2_latent_proj``); the router and the shared expert stay at h. Parameters by hand and on transformers' meta device,
a training step's FLOPs against FlopCounterMode, and what lmcalc refuses: the training memory and step time, not yet
modelled."""

from __future__ import annotations

import json

import pytest

from lmcalc import api
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import resolve_model
from lmcalc.specs import LATENT_MOE_COUNTED_ONLY, ModelSpec

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


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "super", "test"))


@pytest.mark.fast
def test_super_by_hand_is_its_checkpoint_less_the_mtp_layer():
    h, latent, f_e, f_s, E, V = 4096, 1024, 2688, 5376, 512, 131072
    mamba = h * (2 * 8192 + 2 * 8 * 128 + 128) + (8192 + 2048) * 4 + (8192 + 2048) + 3 * 128 + 8192 + 8192 * h
    attention = h * (32 * 128) + 2 * h * (2 * 128) + (32 * 128) * h
    moe = (
        E * h + 2 * h * latent + E * 2 * f_e * latent + 2 * h * f_s
    )  # router, latent projections, experts at l, shared at h
    total = 2 * V * h + 89 * h + 40 * mamba + 8 * attention + 40 * moe
    assert total == 123_611_012_096 - 2_942_324_736
    counted = count_params(spec_of(SUPER))
    assert counted.total == total
    assert counted.active == total - 40 * E * 2 * f_e * latent + 40 * 22 * 2 * f_e * latent
    assert count_params(resolve_model("nemotron-3-super-120b-a12b").spec).total == total


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


@pytest.mark.fast
def test_serving_counts_it_and_training_refuses_it_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SUPER))
    assert spec_of(SUPER).counted_only == LATENT_MOE_COUNTED_ONLY
    assert (
        api.inference(model=str(path), context=8192, gpus="8xh100").memory.params == count_params(spec_of(SUPER)).total
    )
    for estimate in (
        lambda: api.memory(model=str(path), seq=4096, gpus="64xh100"),
        lambda: api.plan(model=str(path), gpus="64xh100", seq=4096, global_batch=4096 * 64, tokens=1e9),
    ):
        with pytest.raises(LmcalcError, match="latent MoE") as refused:
            estimate()
        assert "\n" not in str(refused.value)
