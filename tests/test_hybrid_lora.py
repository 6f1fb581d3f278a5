"""LoRA on the hybrids whose mixers lmcalc models (Gated DeltaNet: Qwen3-Next, Qwen3.5; Mamba-2: Bamba, Granite 4;
LFM2's short convolutions; MiniMax's lightning attention; Kimi Delta Attention), against PEFT's own count: the
trainable parameters of a real ``get_peft_model`` on transformers' tiny model, built on the meta device, must equal
lmcalc's adapters, r·(in + out) per targeted linear layer. LFM2 names its attention's output projection out_proj, as
its convolutions': PEFT's out_proj takes both. Qwen3.5 projects q‖k‖v, z, β and α by four modules where Qwen3-Next
uses two: the same weights, more adapters. AFMoE's attention gate, a projection of its own where Qwen3-Next's is half
of q_proj, is checked here too. Routed experts are not targeted: on an MoE, PEFT's ``all-linear`` also adapts the
router and the 3-D experts (transformers 5's) through ``target_parameters``, with adapters of another shape
(tests/test_finetune_peft.py says why), so the MoE hybrids are checked with named targets."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_tiny import tiny_config, transformers_model  # noqa: E402

from lmcalc.engine.finetune.method import Method, adapter_tensors, parse_targets  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

CASES = [
    ("qwen3_5_text", "all-linear"),
    ("qwen3_5_text", "in_proj_qkv,in_proj_z,out_proj"),
    ("qwen3_next", "q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,in_proj_ba,out_proj"),
    ("lara_mini", "q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj"),
    ("olmo_hybrid", "all-linear"),  # its Gated DeltaNet's q, k, v, g, b, a and o projections, attention's alike
    ("olmo_hybrid", "q_proj,v_proj,o_proj"),  # PEFT's suffixes: attention's and the Gated DeltaNet's both
    ("olmo_hybrid", "g_proj,b_proj,a_proj"),
    ("bamba", "all-linear"),
    ("bamba", "in_proj,out_proj"),
    # Falcon-H1: attention and Mamba-2 side by side; PEFT refuses Mamba's out_proj on it (and so all-linear)
    ("falcon_h1", "q_proj,k_proj,v_proj,o_proj,in_proj,gate_proj,up_proj,down_proj"),
    ("granitemoehybrid", "q_proj,v_proj,in_proj,out_proj"),
    ("afmoe", "q_proj,k_proj,v_proj,o_proj"),
    ("beam", "q_proj,k_proj,v_proj,o_proj"),  # PEFT refuses gate_proj without up_proj on an MoE with fused experts
    # Kimi Delta Attention: Kimi's low-rank gates (f_a, f_b, g_a, g_b), Bailing's full ones; Bailing's g_proj is its
    # KDA's output gate and its MLA's head-wise gate both, and PEFT's g_proj takes the two
    ("kimi_linear", "q_proj,k_proj,v_proj,o_proj,f_a_proj,f_b_proj,b_proj,g_a_proj,g_b_proj"),
    ("kimi_linear", "q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj"),  # MLA's and the KDA's q, o alike
    ("bailing_hybrid", "f_proj,g_proj,b_proj,o_proj"),
    ("lfm2", "all-linear"),
    ("lfm2", "q_proj,k_proj,v_proj,out_proj,in_proj,w1,w2,w3"),  # LFM2's model card's targets
    ("lfm3", "all-linear"),  # LFM2's modules and the attention's head gate, g_proj
    ("lfm3", "g_proj,q_proj,in_proj"),
    ("lfm2", "out_proj"),  # its attention's output and its convolutions'
    # MiniMax: its lightning layers' modules alone, then with the softmax layers'; not all-linear, which PEFT extends to
    # the router and the 3-D experts of an MoE (tests/test_finetune_peft.py says why they are not compared)
    ("minimax", "qkv_proj,output_gate,out_proj"),
    ("minimax", "q_proj,k_proj,v_proj,o_proj,qkv_proj"),  # the softmax layers' and the lightning q‖k‖v
    # single blocks: Mamba-2, attention, an MLP, an MoE's shared expert, each alone; PEFT refuses Mamba's out_proj
    # (and so all-linear) on Nemotron-H: _check_lora_target_modules_mamba
    ("nemotron_h", "q_proj,k_proj,v_proj,o_proj,in_proj"),
    ("nemotron_h", "q_proj,v_proj,in_proj"),
    # a two-matrix MLP's up_proj and down_proj: its first and second matrix (lmcalc's fc and proj)
    ("arcee", "up_proj,down_proj"),
    ("nemotron", "up_proj"),
]


@pytest.mark.parametrize(("kind", "targets"), CASES, ids=[f"{k}-{t}" for k, t in CASES])
@pytest.mark.parametrize("rank", [4, 16])
def test_lora_adapters_equal_pefts(kind: str, targets: str, rank: int):
    config = tiny_config(kind)
    model = transformers_model(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lora = peft.LoraConfig(r=rank, target_modules="all-linear" if targets == "all-linear" else targets.split(","))
        trainable, _ = peft.get_peft_model(model, lora).get_nb_trainable_parameters()
    spec = ModelSpec.model_validate(model_from_hf_config(config, kind, kind))
    adapters = sum(t.total for t in adapter_tensors(spec, Method("lora", rank, parse_targets(targets))))
    assert adapters == trainable


@pytest.mark.parametrize("rank", [4, 16])
def test_afmoes_attention_gate_goes_with_the_experts_names(rank: int):
    # AFMoE's gate on the attention's output is a projection of its own (self_attn.gate_proj, h → H·d), where
    # Qwen3-Next's is half of q_proj. PEFT's all-linear on transformers 5's AFMoE maps the names gate_proj, up_proj
    # and down_proj onto the fused experts (tests/test_moe_adapters.py), so that gate, named gate_proj, keeps no
    # adapter, while q_proj keeps r·(h + H·d) = r·(64 + 64) a layer; and gate_proj alone is refused, as PEFT refuses
    # to adapt the experts' gate without their up.
    config = tiny_config("afmoe")
    spec = ModelSpec.model_validate(model_from_hf_config(config, "afmoe", "afmoe"))
    tensors = adapter_tensors(spec, Method("lora", rank, parse_targets("all-linear")))
    assert not [t for t in tensors if t.name.startswith("attn.attn_gate.")]
    assert sum(t.total for t in tensors if t.name.startswith("attn.q.")) == spec.num_layers * rank * (64 + 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="without also targeting up_proj"):
            peft.get_peft_model(transformers_model(config), peft.LoraConfig(r=rank, target_modules=["gate_proj"]))
    with pytest.raises(LmcalcError, match="target both or neither"):
        adapter_tensors(spec, Method("lora", rank, parse_targets("gate_proj")))


@pytest.mark.parametrize(
    "kind",
    ["qwen3_5_text", "qwen3_next", "bamba", "lfm2", "nemotron_h", "olmo_hybrid", "falcon_h1", "minimax", "kimi_linear"],
)
def test_a_hybrid_takes_qlora_and_pipeline_stages(kind: str):
    # each of its layer tensors is placed on a stage by its count symbol (L_lin: the Gated DeltaNet layers): QLoRA's
    # trained adapters and a two-stage pipeline both walk them (a ZeroDivisionError before)
    from lmcalc.api import memory

    spec = ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))
    qlora = memory(model=spec, gpus="1xh100", method="qlora", seq=64, micro_batch=1)
    full = memory(model=spec, gpus="1xh100", seq=64, micro_batch=1)
    assert 0 < qlora.total < full.total  # 4-bit frozen weights and no optimizer state for them
    staged = memory(model=spec, gpus="2xh100", pp=2, seq=64, micro_batch=1)
    assert 0 < staged.gpu.kept.params < full.gpu.kept.params  # the busiest of two stages holds part of the weights
