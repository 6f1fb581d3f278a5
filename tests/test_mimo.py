"""MiMo-V2-Flash (issue #31): attention whose sliding-window layers have KV heads and sinks of their own, and values
narrower than the keys. Checked by hand, against transformers' MiMoV2FlashAttention layer by layer, and against
PEFT's adapters; its saved tensors and step peak against transformers' own step in tests/test_framework_transformers.py
and tests/test_step_phases.py (mimo-v2-flash-small), its FLOPs in tests/test_validate_hf.py."""

from __future__ import annotations

import warnings

import pytest

from lmcalc.engine.finetune.method import Method, parse_targets, trained_params
from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout_checks import check_tp_heads
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import resolve_model
from lmcalc.specs import ModelSpec

GB = 1e9


def mimo() -> ModelSpec:
    return resolve_model("mimo-v2-flash").spec


def test_total_and_active_by_hand():
    V, h, L, H, kv, kv_local, d, dv = 152576, 4096, 48, 64, 4, 8, 192, 128
    f, f_e, E, k = 16384, 2048, 256, 8
    global_layers = [0, 5, 11, 17, 23, 29, 35, 41, 47]  # hybrid_layer_pattern's 0s
    G, S = len(global_layers), L - len(global_layers)
    attention = L * (h * H * d + H * dv * h) + G * h * kv * (d + dv) + S * (h * kv_local * (d + dv) + H)  # + sinks
    norms = 2 * L * h + h
    dense = 3 * h * f  # layer 0
    moe = (L - 1) * E * h  # routers, bias-free; the correction bias is a buffer
    expert = 3 * h * f_e
    total = 2 * V * h + attention + norms + dense + moe + (L - 1) * E * expert
    active = total - (L - 1) * (E - k) * expert
    counts = count_params(mimo())
    assert (counts.total, counts.active) == (total, active) == (308_778_768_832, 15_445_924_288)
    assert round(total / 1e9) == 309 and round(active / 1e9) == 15  # the release: 309B total, 15B activated


@pytest.mark.torch
def test_the_preset_is_what_transformers_reads_from_its_class_defaults():
    transformers = pytest.importorskip("transformers")
    config = transformers.MiMoV2FlashConfig().to_dict()
    read = ModelSpec.model_validate(model_from_hf_config(config, "mimo", "MiMoV2FlashConfig"))
    preset = mimo()
    for field in ("kv_heads", "local_kv_heads", "head_size", "v_head_dim", "sliding_window", "attention_sinks",
                  "sinks_local_only", "rotary_fraction"):  # fmt: skip
        assert getattr(read, field) == getattr(preset, field), field
    assert [read.is_local_layer(i) for i in range(48)] == [preset.is_local_layer(i) for i in range(48)]
    routes = [False] + [True] * 47
    assert [read.is_moe_layer(i) for i in range(48)] == [preset.is_moe_layer(i) for i in range(48)] == routes
    assert read.moe and preset.moe and (read.moe.k, read.moe.router_fp32) == (preset.moe.k, preset.moe.router_fp32)
    assert count_params(read) == count_params(preset)


@pytest.mark.torch
def test_each_layers_kv_heads_and_sinks_are_those_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.MiMoV2FlashConfig(num_hidden_layers=12, hidden_size=64, num_attention_heads=8,
                                            num_key_value_heads=2, head_dim=16, v_head_dim=8, intermediate_size=64,
                                            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                            vocab_size=128)  # fmt: skip
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layers = transformers.AutoModelForCausalLM.from_config(config).model.layers
    spec = ModelSpec.model_validate(model_from_hf_config(config.to_dict(), "mimo", "tiny"))
    kv_heads = [spec.local_kv_heads if spec.is_local_layer(i) else spec.kv_heads for i in range(12)]
    assert (
        kv_heads
        == [layer.self_attn.k_proj.out_features // 16 for layer in layers]
        == [2, 4, 4, 4, 4, 2] + [4] * 5 + [2]
    )
    assert kv_heads == [layer.self_attn.v_proj.out_features // 8 for layer in layers]
    assert [spec.is_local_layer(i) for i in range(12)] == [layer.self_attn.sinks is not None for layer in layers]


@pytest.mark.torch
def test_the_release_window_is_one_token_wider_as_transformers_reads_it():
    transformers = pytest.importorskip("transformers")
    config = transformers.MiMoV2FlashConfig().to_dict() | {"sliding_window_size": 128}
    assert ModelSpec.model_validate(model_from_hf_config(config, "m", "c")).sliding_window == 129
    assert transformers.MiMoV2FlashConfig(sliding_window_size=128).sliding_window == 129


def test_kv_cache_by_hand():
    # a global layer caches 4 heads of K (192) and V (128) for every token, a local one 8 heads for its last 129
    spec, s = mimo(), 32768
    per_sequence = 9 * s * 4 * (192 + 128) * 2 + 39 * 129 * 8 * (192 + 128) * 2
    memory = inference_memory(Serving(spec, context=s, batch=4), 1e15)
    assert memory.kv_cache == pytest.approx(4 * per_sequence, rel=1e-12)
    # TP 8: each GPU keeps one of the 4 global heads (replicated over 2 GPUs) and one of the 8 local ones
    on_gpu = 9 * s * 1 * 320 * 2 + 39 * 129 * 1 * 320 * 2
    tp8 = inference_memory(Serving(spec, context=s, batch=4, tp=8), 200 * GB)
    assert tp8.kv_cache_per_gpu == pytest.approx(4 * on_gpu, rel=1e-12)


@pytest.mark.parametrize(("tp", "budget"), [(1, 40 * GB), (2, 40 * GB), (8, 40 * GB), (1, 0.06 * GB), (8, 0.01 * GB)])
def test_the_longest_context_is_the_last_that_fits(tp: int, budget: float):
    # past the window only the global layers' caches grow; the local layers weigh twice a global one's per token
    # (once on a GPU of TP 8, where each keeps one head); the small budgets end within the window
    spec = mimo()
    unused = inference_memory(Serving(spec, context=1, tp=tp), 1e15)
    capacity = unused.weights_per_gpu + unused.overhead + budget
    longest = inference_memory(Serving(spec, context=1, batch=3, tp=tp), capacity).max_context
    assert (longest > 129) == (budget > GB)
    fits = inference_memory(Serving(spec, context=longest, batch=3, tp=tp), capacity)
    over = inference_memory(Serving(spec, context=longest + 1, batch=3, tp=tp), capacity)
    assert fits.total_per_gpu <= capacity < over.total_per_gpu


def test_tp_must_suit_the_local_layers_kv_heads_too():
    spec = mimo().model_copy(update={"num_heads": 24, "num_kv_heads": 4, "local_kv_heads": 3})
    check_tp_heads(spec.model_copy(update={"local_kv_heads": 8}), 8)  # 8 and 4 both suit TP 8
    with pytest.raises(LmcalcError, match="TP=8 is not a multiple of the 3 KV heads"):
        check_tp_heads(spec, 8)


@pytest.mark.torch
def test_lora_adapters_equal_pefts():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from hf_tiny import tiny_config

    config = tiny_config("mimo_v2_flash")
    spec = ModelSpec.model_validate(model_from_hf_config(config, "mimo", "tiny"))
    targets = "q_proj,k_proj,v_proj,o_proj"
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.MiMoV2FlashConfig(**config))
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets.split(",")))
    trainable, _ = wrapped.get_nb_trainable_parameters()
    assert trained_params(spec, Method("lora", 4, parse_targets(targets))) == trainable


def test_local_kv_heads_need_local_layers():
    with pytest.raises(ValueError, match="local_kv_heads 8 must divide num_heads 64, and needs local layers"):
        mimo().model_copy(update={"sliding_window": None, "global_layer_ids": [], "attention_sinks": False,
                                  "sinks_local_only": False})  # fmt: skip
