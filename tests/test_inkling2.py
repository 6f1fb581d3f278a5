"""Inkling 2's text model (issue #31; transformers 5.24's `inkling2_text`): Inkling's outline with clipped and scaled
queries and relative states, dynamic K and V convolutions in the global layers, a sink logit a head from each token,
a gated output, block attention residuals and an unpadded head. Parameters by hand at a tiny size and at the class
defaults, the block residuals' FLOPs by hand, the cache against transformers', and what lmcalc refuses. The tiny
config's FLOPs against FlopCounterMode run in tests/test_validate_hf.py (its attention eager: no SDPA gap)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.model.branch_convs import block_flops
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

TINY = dict(model_type="inkling2_text", vocab_size=512, unpadded_vocab_size=500, hidden_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4,
            swa_num_key_value_heads=2, swa_head_dim=16, sliding_window_size=16, rel_extent=32,
            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_layers_per_attn_res_block=2,
            layer_types=["hybrid_sliding", "hybrid"] * 2, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
"""Layers 0 and 2 local (a window of 16), 1 and 3 global; blocks of two layers; every layer an MoE of 4 experts."""


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "inkling2_text", "test"))


def test_a_tiny_inkling2_by_hand():
    h, f, E, H, H_kv, d, d_rel, K = 64, 32, 4, 4, 2, 16, 16, 4

    def layer(i: int, global_: bool) -> int:
        # q, k, v, the output gate and o; sink_proj; r_proj; the query and relative-state scales; the bias table
        # over 32 distances (global) or the window's 16; the K and V convolutions (a static weight each)
        attention = 2 * h * H * d + 2 * h * H_kv * d + H * d * h + h * H + h * H * d_rel + H * d + H * d_rel
        attention += d_rel * (32 if global_ else 16) + 2 * H_kv * d * K
        if global_:  # dynamic convolutions: weight_proj h → H_kv·K for K and V; K's and V's input norms
            attention += 2 * h * H_kv * K + 2 * h
        residuals = h + (0 if i == 0 else 3 * h if global_ else h)  # the MLP's query, the attention's (Q, K, V)
        return attention + 2 * h * K + 2 * h + E * h + E * 3 * f * h + residuals  # convolutions, norms, router, MoE

    total = sum(layer(i, i % 2 == 1) for i in range(4)) + 512 * h + h + h + h + 500 * h  # embedding and its norm,
    assert count_params(spec_of(TINY)).total == total == 255_872  # the final query and norm, a head of 500 rows


def test_class_defaults_equal_transformers():
    assert count_params(spec_of({"model_type": "inkling2_text"})).total == 593_718_478_848  # transformers' count


def test_the_block_residuals_by_hand():
    # blocks of 2: layer 0 opens one (its MLP reads 2 states), layer 1's attention (3 queries) and MLP read 2,
    # layer 2 opens one (attention 2 states, MLP 3), layer 3 reads 3 and 3; the final input 3. 2·2·m·h a query
    h = 64
    queries_by_states = (1 * 2) + (3 * 2 + 2) + (1 * 2 + 3) + (3 * 3 + 3) + 3
    assert block_flops(spec_of(TINY)) == 4 * h * queries_by_states


@pytest.mark.torch
def test_the_cache_equals_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():  # in fp32: its router multiplies fp32 inputs by its weight, which bf16 breaks
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY)).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, 512, (2, 7)), use_cache=True).cache
    held = sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values, *layer.conv_states.values()))  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    # 4 layers: K and V of 2 heads of 16 for 7 tokens, and four convolutions' last 4 inputs (32, 32, 64, 64)
    expected = 2 * 4 * (7 * 2 * 2 * 16 + (32 + 32 + 64 + 64) * 4) * 4
    assert held == expected == api.inference(model=str(path), context=7, batch=2, kv_dtype="fp32").memory.kv_cache


def test_params_flops_serving_and_training_memory_take_it(tmp_path):
    # training memory, LoRA and the planner since engine.memory.inkling2 (tests/test_inkling2_memory.py)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 255_872
    full, lora = api.memory(model=str(path), seq=32), api.memory(model=str(path), seq=32, method="lora")
    assert 0 < lora.gpu.kept.optimizer < full.gpu.kept.optimizer and lora.gpu.activations > 0
