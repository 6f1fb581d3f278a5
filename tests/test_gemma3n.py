"""Gemma 3n's text model (gemma3n_text): AltUp's streams and LAuReL by hand, and its one MLP width. Its per-layer
embeddings and shared K and V are Gemma 4's, and so is the test of its cache (tests/test_gemma4.py); transformers' own
counts are tests/test_hf_types.py's and test_validate_hf.py's (tests/hf_tiny.py). The shapes are transformers 5.24's
modeling_gemma3n.py: Gemma3nTextAltUp, Gemma3nTextLaurelBlock, Gemma3nTextModel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.outside_layers import layer_checkpoint
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

V, h, H, H_KV, d, f, L = 512, 64, 4, 2, 16, 96, 5
BASE = {
    "model_type": "gemma3n_text", "vocab_size": V, "hidden_size": h, "num_attention_heads": H,
    "num_key_value_heads": H_KV, "head_dim": d, "intermediate_size": f, "num_hidden_layers": L,
    "sliding_window": 24, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "altup_num_inputs": 4,
    "laurel_rank": 8, "tie_word_embeddings": True,
}  # fmt: skip


def spec_of(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config({**BASE, **fields}, "g3n", "gemma 3n config"))


def test_altup_and_laurel_by_hand():
    # AltUp in each layer: the router h → n and its norm (h), prediction coefficients n → n² (n³), correction
    # coefficients n → n, the output scale (h); once, 2·(n − 1) projections h → h. LAuReL: h → r → h and a norm (h).
    # The rest is Gemma 3's layer: q, k, v, o, per-head norms on Q and K (d each), four sandwich norms, the MLP
    n, r = 4, 8
    attention = 2 * h * H * d + 2 * h * H_KV * d + 2 * d
    layer = attention + 4 * h + 3 * h * f + (n * h + h + n**3 + n**2 + h) + (2 * h * r + h)
    assert count_params(spec_of()).total == V * h + L * layer + 2 * (n - 1) * h * h + h


def test_altups_flops_beyond_its_weights_by_hand():
    # the router runs twice a layer (2·h·n more) and the predictions mix n streams of h by an n × n matrix (2·h·n²)
    n, s, r = 4, 64, 8
    weights = L * (3 * h * f + n * h + n**3 + n**2 + 2 * h * r) + 2 * (n - 1) * h * h  # attention's aside
    assert forward_flops_per_token(spec_of(), s).mlp == 2 * weights + L * (2 * h * n + 2 * h * n**2)


def test_one_width_for_every_layer():
    # Gemma3nTextConfig writes intermediate_size as a list, one a layer: lmcalc reads one shared by all
    assert spec_of(intermediate_size=[f] * L).ffn_size == f
    with pytest.raises(LmcalcError, match="intermediate_size differ from layer to layer"):
        spec_of(intermediate_size=[f] * (L - 1) + [2 * f])
    with pytest.raises(LmcalcError, match="intermediate_size gives 4 widths for 5 layers"):
        spec_of(intermediate_size=[f] * (L - 1))


def test_a_list_width_is_refused_for_other_types():
    config = {**BASE, "model_type": "llama", "intermediate_size": [f] * L}
    with pytest.raises(LmcalcError, match="intermediate_size are a list"):
        model_from_hf_config(config, "llama", "llama config")


def test_what_altup_keeps_for_backward_by_hand():
    # transformers 5.24's Gemma3nTextAltUp and Gemma3nTextDecoderLayer, s = 16, b = 2 in bf16: each of the router's
    # two runs upcasts its input (s·b·h, fp32) and keeps the tanh of its n outputs in fp32; the prediction's batched
    # product keeps the n streams (the layer's input, n·s·b·h) and the correction the innovation repeated n times;
    # layer 0's gate (activation_sparsity_pattern 0.95) keeps its output before the cut, s·b·f, in a local layer
    # (layers 0 to 3; layer 4 is global) and at 1/5 in the average one. A checkpoint keeps the n streams
    spec = spec_of(activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0, 0.0])
    assert spec.altup is not None and spec.altup.sparse_layers == 1 and spec_of().altup.sparse_layers == 0
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 16, 2, "flash", "none",
                 framework=framework_profile("transformers"))  # fmt: skip
    sb, n = 16 * 2, 4
    local = {t.label: t.bytes for t in layer_saved_tensors(w, False, "local")}
    for step in ("predict", "correct"):
        assert local[f"AltUp router norm ({step}) input (fp32 copy)"] == sb * h * 4
    assert local["AltUp router tanh (predict, fp32)"] == sb * n * 4
    assert local["AltUp streams (the layer's input), the prediction's product input"] == n * sb * h * 2
    assert local["AltUp innovation, repeated over the streams"] == n * sb * h * 2
    assert local["LAuReL up-projection input"] == sb * 8 * 2
    assert local["sparse gate: its output before the cut (the std's input)"] == sb * f * 2
    average = {t.label: t.bytes for t in layer_saved_tensors(w, False)}
    assert average["sparse gate: its output before the cut (the std's input)"] == pytest.approx(sb * f * 2 / 5)
    glob = {t.label: t.bytes for t in layer_saved_tensors(w, False, "global")}
    assert glob["sparse gate: its output before the cut (the std's input)"] == 0
    assert layer_checkpoint(replace(w, recompute="full")).bytes == n * sb * h * 2
