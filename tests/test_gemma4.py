"""Gemma 4's text models (gemma4_text, gemma4_unified_text): the parameter and FLOP counts by hand, how a config.json
is read, and what lmcalc refuses. transformers' own counts are tests/test_hf_types.py's and test_validate_hf.py's
(tiny configs in tests/hf_tiny.py); these derive the same figures from the modules' shapes
(transformers 5.24 modeling_gemma4.py: Gemma4TextAttention, Gemma4TextMLP, Gemma4TextDecoderLayer,
Gemma4TextModel, Gemma4TextRouter)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lmcalc import api
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.engine.model.flops import attended_widths, forward_flops_per_token, local_keys
from lmcalc.engine.model.params import count_params
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.counts import COUNTED_ONLY_NOTE
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

V, h, H, H_KV, d, f, L = 512, 64, 4, 2, 16, 96, 4
"""A tiny Gemma 4: layers 1 and 3 global (full attention), 0 and 2 local (a window of 24)."""
BASE = {
    "model_type": "gemma4_text", "vocab_size": V, "hidden_size": h, "num_attention_heads": H,
    "num_key_value_heads": H_KV, "head_dim": d, "intermediate_size": f, "num_hidden_layers": L,
    "sliding_window": 24, "layer_types": ["sliding_attention", "full_attention"] * 2,
    "hidden_size_per_layer_input": 0, "tie_word_embeddings": True,
}  # fmt: skip


def spec_of(**fields: object) -> ModelSpec:
    config = {**BASE, **fields}
    return ModelSpec.model_validate(model_from_hf_config(config, "g4", "gemma 4 config"))


def attention(d_: int, kv: int, own_k: bool, own_v: bool) -> int:
    """One layer's: q (h → H·d), k and v (h → H_kv·d) where it makes its own, o (H·d → h), the per-head norms on Q
    and, where it makes K, on K (d each); V's norm has no weight."""
    return h * H * d_ + own_k * (h * kv * d_ + d_) + own_v * h * kv * d_ + H * d_ * h + d_


def test_global_layers_at_their_own_widths_with_k_equal_to_v():
    # global_head_dim 32, one global KV head, K = V: a global layer has no v_proj
    spec = spec_of(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True)
    layers = 2 * attention(d, H_KV, True, True) + 2 * attention(32, 1, True, False)
    norms = L * 4 * h + h  # sandwich norms, and the final one
    mlp = L * 3 * h * f
    assert count_params(spec).total == V * h + layers + norms + mlp


def test_global_kv_heads_apply_only_with_k_equal_to_v():
    # Gemma4TextConfig.__post_init__ takes num_global_key_value_heads into per_layer_config only with K = V
    spec = spec_of(global_head_dim=32, num_global_key_value_heads=1)
    assert spec.global_attention is not None and spec.global_attention.kv_heads is None


def test_the_last_layers_share_k_and_v_and_widen_their_mlps():
    # the last two layers (a local and a global one) reuse layers 0's and 1's K and V: only q, o and q's norm; their
    # MLPs are 2·f wide
    spec = spec_of(global_head_dim=32, num_kv_shared_layers=2, use_double_wide_mlp=True)
    own = attention(d, H_KV, True, True) + attention(32, H_KV, True, True)
    shared = attention(d, H_KV, False, False) + attention(32, H_KV, False, False)
    mlp = 2 * 3 * h * f + 2 * 3 * h * 2 * f
    assert count_params(spec).total == V * h + own + shared + L * 4 * h + h + mlp


def test_per_layer_embeddings_by_hand():
    # the table V_p × L·d_p, h → L·d_p and its norm (d_p) once; a gate h → d_p, a projection d_p → h and a norm (h)
    # in each layer. The table is an embedding: not in the non-embedding count
    plain, ple = spec_of(global_head_dim=d), spec_of(global_head_dim=d, hidden_size_per_layer_input=8,
                                                     vocab_size_per_layer_input=128)  # fmt: skip
    table = 128 * L * 8
    added = table + h * L * 8 + 8 + L * (h * 8 + 8 * h + h)
    assert count_params(ple).total - count_params(plain).total == added
    assert count_params(ple).non_embedding - count_params(plain).non_embedding == added - table


def test_the_moe_block_beside_the_dense_mlp_by_hand():
    # router: proj E × h, scale h, per_expert_scale E; experts: gate_up E × 2f_e × h, down E × h × f_e; three norms
    spec = spec_of(global_head_dim=d, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    plain = spec_of(global_head_dim=d)
    per_layer = 4 * h + h + 4 + 4 * 3 * h * 32 + 3 * h
    counts = count_params(spec)
    assert counts.total - count_params(plain).total == L * per_layer
    assert counts.total - (counts.active or 0) == L * 2 * 3 * h * 32  # two of the four experts unused by a token


def test_a_saved_config_and_a_hub_config_read_alike():
    # transformers writes per_layer_config ({"01": {...}}); a released config.json gives global_head_dim
    wide = {"head_dim": 32, "num_key_value_heads": 1}
    saved = spec_of(per_layer_config={"01": wide, "03": wide}, attention_k_eq_v=True)
    hub = spec_of(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True)
    assert saved.global_attention == hub.global_attention
    assert count_params(saved).total == count_params(hub).total


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"per_layer_config": {"01": {"head_dim": 32}}}, "every full-attention layer"),
        ({"per_layer_config": {"01": {"head_dim": 32}, "03": {"head_dim": 48}}}, "the same head_dim"),
        ({"per_layer_config": {"01": {"sliding_window": 8}, "03": {"sliding_window": 8}}}, "head_dim and num_key"),
        ({"use_bidirectional_attention": "all"}, "no causal mask"),
        ({"layer_types": ["full_attention", "sliding_attention"] * 2, "num_kv_shared_layers": 3},
         "no earlier layer to share from"),
    ],
)  # fmt: skip
def test_what_lmcalc_cannot_read_is_refused_in_one_line(fields: dict, message: str):
    with pytest.raises((LmcalcError, ValueError), match=message):
        spec_of(**fields)


def test_the_last_layer_is_global_whatever_layer_types_says():
    # Gemma4TextConfig.__post_init__ forces it, with a warning
    spec = spec_of(global_head_dim=32, layer_types=["sliding_attention"] * 4)
    assert spec.local_layers == 3 and spec.attention_layers == 4


def test_attention_flops_at_each_kinds_widths_by_hand():
    # causal: a local layer's query sees its window's keys, k_w, at d; a global one's (s+1)/2 at d_g
    s, w = 64, 24
    spec = spec_of(global_head_dim=32)
    k_w = (w * (w + 1) / 2 + (s - w) * w) / s
    assert local_keys(s, w, "sliding") == k_w
    expected = 2 * H * (2 * k_w * d + 2 * (s + 1) / 2 * 32)  # over the four layers
    assert forward_flops_per_token(spec, s).attention_scores == pytest.approx(expected, rel=1e-12)
    assert attended_widths(spec, s, "full") == (s * (2 * d + 2 * 32) / 4,) * 2  # full: every key of every layer


def test_a_global_layer_keeps_its_own_widths_by_hand():
    # Gemma4TextAttention in a global layer (d_g 32, one KV head, K = V): q_norm upcasts Q (s·b·H·d_g, fp32) and
    # keeps it, mean(x²) + ε and its −½ power (torch.pow: two fp32 values a row) and the normalised value; k_norm
    # and v_norm each upcast the one projection's output apart (s·b·1·d_g); the kernel keeps Q, K and V at d_g. A
    # local layer keeps the same at d and H_kv. The global layers' rotary tables are their own, s·d_g each
    spec = spec_of(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True)
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 64, 2, "flash", "none",
                 framework=framework_profile("transformers"))  # fmt: skip
    sb = 64 * 2
    for kind, d_, kv in (("global", 32, 1), ("local", d, H_KV)):
        kept = {t.label: t.elements * t.bytes_per_element for t in layer_saved_tensors(w, False, kind)}
        assert kept["Q-norm input (fp32 copy)"] == sb * H * d_ * 4
        assert kept["Q-norm mean(x²) + ε (fp32)"] == kept["Q-norm 1/rms (fp32)"] == sb * H * 4
        assert kept["K-norm input (fp32 copy)"] == kept["V-norm input (fp32 copy)"] == sb * kv * d_ * 4
        assert "V-norm normalised value (fp32, before the weight)" not in kept  # v_norm has no weight
        assert kept["Q (after RoPE)"] == sb * H * d_ * 2 and kept["V"] == sb * kv * d_ * 2
    tables = [t.elements for t in model_saved_tensors(w) if t.block == "tables"]
    assert tables == [64 * d, 64 * d, 64 * 32, 64 * 32]


def test_the_moe_blocks_norms_and_router_by_hand():
    # Gemma4TextDecoderLayer with enable_moe_block: beside an MoE layer's tensors (the dense MLP as its one shared
    # expert), pre_feedforward_layernorm_2 on the residual and post_feedforward_layernorm_1 and _2 on the branches
    # keep an fp32 copy, mean(x²) + ε, 1/rms and the fp32 normalised value each; Gemma4TextRouter's weightless
    # norm its fp32 copy and the two statistics; the normed value cast back (the scale's product keeps it) and its
    # scaled copy (the projection's input), s·b·h in bf16 each
    spec = spec_of(global_head_dim=32, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8)
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 64, 2, "flash", "none",
                 framework=framework_profile("transformers"))  # fmt: skip
    sb = 64 * 2
    kept = {t.label: t.elements * t.bytes_per_element for t in layer_saved_tensors(w, True, "local")}
    for norm in ("experts' norm", "dense branch's output norm", "experts' output norm"):
        assert kept[f"{norm} input (fp32 copy)"] == kept[f"{norm} normalised value (fp32, before the weight)"]
        assert kept[f"{norm} input (fp32 copy)"] == sb * h * 4 and kept[f"{norm} 1/rms (fp32)"] == sb * 4
    assert kept["router norm input (fp32 copy)"] == sb * h * 4 and "router norm normalised value" not in str(kept)
    router_inputs = (kept["router norm output (for the scale's product)"], kept["router projection input (scaled)"])
    assert router_inputs == (sb * h * 2, sb * h * 2)


def test_layers_reusing_k_and_v_and_per_layer_inputs_by_hand():
    # the last two layers (a local, a global) attend with layers 0's and 1's K and V: no K- or V-norm of their own,
    # and under a fused kernel without the window's mask (the global one) no K or V either; their MLPs are 2·f wide
    # (use_double_wide_mlp). Per-layer inputs of d_p 8: each layer keeps the gate's input (s·b·h), its output, GELU's
    # and the product (s·b·d_p each) and its norm's; before the layers, the projection's input (s·b·h), its norm over
    # each d_p and the s·b·L·d_p inputs. Under full recomputation the layers' arguments keep layers 0's and 1's K and V
    spec = spec_of(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                   use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128)  # fmt: skip
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 16, 2, "flash", "none",
                 framework=framework_profile("transformers"))  # fmt: skip
    sb = 16 * 2  # below the window of 24: no layer is given a mask
    own = {t.label: t.bytes for t in layer_saved_tensors(w, False, "global")}
    reusing = {t.label: t.bytes for t in layer_saved_tensors(w, False, "global_shared")}
    assert own["K (after RoPE)"] == own["V"] == sb * 1 * 32 * 2 and own["V-norm input (fp32 copy)"] == sb * 32 * 4
    assert not [label for label in reusing if label.startswith(("K", "V"))]
    assert own["gate output (GELU input)"] == sb * f * 2 and reusing["gate output (GELU input)"] == sb * 2 * f * 2
    # and the formulas say which widths they count in: a global layer's d_g and H_kv,g, a double-wide MLP's 2·f
    symbols = {t.label: t.symbol for t in (*layer_saved_tensors(w, False, "global"),
                                           *layer_saved_tensors(w, False, "global_shared"))}  # fmt: skip
    assert symbols["V-norm input (fp32 copy)"] == "s·b·H_kv,g·d_g" and symbols["Q (after RoPE)"] == "s·b·H·d_g"
    assert symbols["gate output (GELU input)"] == "s·b·2·f"
    assert own["per-layer gate input (the layer's output so far)"] == sb * h * 2
    for label in ("per-layer gate output (GELU input)", "per-layer projection input (the gated product)"):
        assert own[label] == sb * 8 * 2
    outside = {t.label: t.bytes for t in model_saved_tensors(w)}
    assert outside["per-layer projection input (the scaled embedding)"] == sb * h * 2
    assert outside["per-layer projection norm input (fp32 copy)"] == sb * L * 8 * 4
    assert outside["per-layer inputs (the d_p slices each layer's product reads)"] == sb * L * 8 * 2
    rebuilt = {t.label: t.bytes for t in model_saved_tensors(replace(w, recompute="full"))}
    assert rebuilt["local layers' shared K (kept for the rebuilt layers)"] == sb * H_KV * d * 2
    assert rebuilt["global layers' shared V (kept for the rebuilt layers)"] == sb * 1 * 32 * 2


def test_every_estimate_takes_gemma4(tmp_path):
    # Gemma 4 at all its kinds (global widths, K = V, shared K and V, per-layer inputs): every command
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "global_head_dim": 32, "num_kv_shared_layers": 2,
                                "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128}))  # fmt: skip
    assert COUNTED_ONLY_NOTE not in api.params(model=str(path)).report.notes
    assert api.memory(model=str(path), seq=64).total > 0
    assert api.memory(model=str(path), seq=64, method="qlora").total > 0
    assert api.train_time(model=str(path), gpus="8xH100", method="lora", dataset_tokens=1e6).days > 0
    assert api.plan(model=str(path), gpus="8xH100", tokens=1e9, seq=64).best is not None


def test_gemma4_drafters_are_read_as_drafters():
    # Gemma4UnifiedAssistantForCausalLM: the text model between projections of its own, every layer attending with
    # the backbone's K and V (Gemma4AssistantConfig sets num_kv_shared_layers to every layer): more in
    # tests/test_gemma4_drafter.py
    config = {"model_type": "gemma4_unified_assistant", "text_config": {**BASE, "model_type": "gemma4_unified_text"}}
    spec = ModelSpec.model_validate(model_from_hf_config(config, "drafter", "drafter config"))
    assert spec.drafter is not None and spec.drafter.backbone_width == 3840  # its class's default
    assert spec.kv_sharing is not None and spec.kv_sharing.layers == spec.num_layers


def test_kv_cache_by_hand():
    # a global layer caches K and V (K = V caches both: K normed and rotated, V normed apart) for its one KV head of
    # 32, a local one its window of two heads of 16; the last two layers share and cache nothing. 2 bytes an element
    from lmcalc.engine.inference.serving import Serving, inference_memory

    spec = spec_of(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2)
    seq, w = 50, 24
    memory = inference_memory(Serving(spec, context=seq, batch=3), 80e9)
    per_sequence = seq * 2 * 1 * 32 * 2 + min(w, seq) * 2 * H_KV * d * 2
    assert memory.layers == 2 and memory.local_layers == 1
    assert memory.kv_cache == pytest.approx(3 * per_sequence, rel=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["gemma4_text", "gemma4_unified_text", "gemma3n_text"])
def test_kv_cache_keeps_what_transformers_keeps(kind: str):
    """transformers' cache after a prompt of s tokens: s tokens in a global layer, the last w − 1 in a local one, none
    in a sharing layer (a DummyLayer); lmcalc counts the w a local layer's next token attends to, so one token more
    in each local layer that caches (Gemma 3n's, tests/test_gemma3n.py's tiny model, shares K and V as Gemma 4's)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_tiny import kv_cache_bytes, tiny_config

    from lmcalc.engine.inference.serving import Serving, inference_memory

    spec = ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))
    memory = inference_memory(Serving(spec, context=50, kv_dtype="fp32"), 80e9)
    one_local_token = 2 * spec.kv_heads * spec.head_size * 4
    assert memory.kv_cache == kv_cache_bytes(kind, 50) + memory.local_layers * one_local_token
