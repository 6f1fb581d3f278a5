"""Adapters counted by lmcalc against PEFT's own: the trainable and total parameters of a real ``get_peft_model``.

Each case builds a Hugging Face model from a small config on the meta device (no weights), wraps it with PEFT's
``LoraConfig`` for a target set, and reads ``get_nb_trainable_parameters()``. lmcalc reads the same config.json
(``hf_config``) and counts its adapters (``engine.finetune.method``): r·(in + out) per targeted linear layer, fused
weights (GPT-2's c_attn) adapted as one. Both numbers must be equal, not close.

Not compared: LoRA on routed experts. transformers 5 stores a Mixtral layer's experts as 3-D parameters, which
PEFT adapts through ``target_parameters`` with adapters of another shape; lmcalc counts per-expert adapters, as PEFT
gives models whose experts are ``nn.Linear`` modules. The Mixtral cases target attention only.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_small import lmcalc_model as model_of  # noqa: E402
from hf_small import small_config  # noqa: E402

from lmcalc.engine.finetune.method import Method, adapter_tensors, parse_targets  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

LAYERS = 2
TARGETS = {
    "llama": ["all-linear", "q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj", "gate_proj,up_proj,down_proj"],
    "mistral": ["all-linear", "q_proj,v_proj"],
    "qwen2": ["all-linear", "k_proj,o_proj,down_proj"],
    "qwen3": ["all-linear", "q_proj,v_proj"],
    "olmo2": ["all-linear", "v_proj,up_proj"],
    "gpt2": ["all-linear", "c_attn", "c_attn,c_proj", "c_fc"],
    "phi3": ["all-linear", "qkv_proj", "gate_up_proj,down_proj"],  # fused weights, one adapter each
    "gemma": ["all-linear", "q_proj,v_proj"],
    "gemma4_text": ["all-linear", "q_proj,v_proj", "k_proj,o_proj"],  # its global layer has no v_proj (K = V)
    "gemma3n_text": ["all-linear", "q_proj,v_proj"],  # all-linear: AltUp's and LAuReL's linear layers too
    "mixtral": ["q_proj,k_proj,v_proj,o_proj"],
    "deepseek_v3": ["q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj", "q_b_proj,kv_b_proj"],
}
CASES = [(arch, targets, rank) for arch, sets in TARGETS.items() for targets in sets for rank in (4, 16)]
DORA = [("llama", "all-linear"), ("llama", "q_proj,v_proj"), ("qwen2", "k_proj,o_proj,down_proj"), ("gpt2", "c_attn")]


def peft_counts(arch: str, targets: str, rank: int, dora: bool = False) -> tuple[int, int]:
    config = small_config(arch, LAYERS)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    target_modules = "all-linear" if targets == "all-linear" else targets.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = peft.LoraConfig(r=rank, target_modules=target_modules, use_dora=dora)
        wrapped = peft.get_peft_model(model, config)
    return wrapped.get_nb_trainable_parameters()


def lmcalc_model(arch: str) -> ModelSpec:
    return model_of(small_config(arch, LAYERS))


@pytest.mark.parametrize(("arch", "targets", "rank"), CASES, ids=[f"{a}-{t}-r{r}" for a, t, r in CASES])
def test_trainable_and_total_parameters_equal_pefts(arch: str, targets: str, rank: int):
    trainable, total = peft_counts(arch, targets, rank)
    model = lmcalc_model(arch)
    method = Method("lora", rank, parse_targets(targets))
    adapters = sum(t.total for t in adapter_tensors(model, method))
    assert adapters == trainable
    # DeepSeek-V3's router bias (e_score_correction_bias) is a buffer in transformers, a parameter in lmcalc's count
    router_bias = model.moe.num_experts * model.moe_layers if model.moe and model.moe.router_bias else 0
    assert count_params(model).total - router_bias + adapters == total


def test_gpt2_fused_qkv_is_one_adapter_not_three():
    # Hand derivation for GPT-2 small (h = 768, 12 layers), r = 8 on c_attn only: one adapter per layer on the
    # (768 → 2304) fused weight: 8·(768 + 2304) = 24,576, × 12 layers = 294,912. Three separate Q, K, V adapters
    # would be 3·8·(768 + 768)·12 = 442,368.
    from lmcalc.presets import resolve_model

    gpt2 = resolve_model("gpt2-124m").spec
    method = Method("lora", 8, parse_targets("c_attn"))
    assert sum(t.total for t in adapter_tensors(gpt2, method)) == 294_912


@pytest.mark.parametrize(("arch", "targets"), DORA, ids=[f"{a}-{t}" for a, t in DORA])
def test_dora_adds_one_magnitude_per_output(arch: str, targets: str):
    # Liu et al. 2024 (DoRA): each adapted module also trains a magnitude vector of its out features
    trainable, _ = peft_counts(arch, targets, 8, dora=True)
    model = lmcalc_model(arch)
    method = Method("lora", 8, parse_targets(targets), dora=True)
    assert sum(t.total for t in adapter_tensors(model, method)) == trainable
