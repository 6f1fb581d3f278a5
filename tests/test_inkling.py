"""Inkling's text model (issue #31; Thinking Machines' Inkling, transformers 5.24's `inkling_text`): four branch
convolutions a layer, relative logits on the scores, local layers with KV heads of their own, a normed embedding,
global scales and a router that scores the shared expert too. Parameters by hand at a tiny size and at the class
defaults, the convolutions' and relative logits' FLOPs by hand, the serving state against transformers' cache, and
what lmcalc refuses. The tiny config's FLOPs against FlopCounterMode run in tests/test_validate_hf.py, with the gap
of the count's SDPA stand-in stated (validate_hf.mask_gradient_flops)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import state_bytes
from lmcalc.engine.model.branch_convs import branch_conv_flops
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec
from lmcalc.validate_hf import mask_gradient_flops

sys.path.insert(0, str(Path(__file__).parent))

TINY = dict(model_type="inkling_text", vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=1,
            swa_head_dim=16, sliding_window_size=16, rel_extent=32, intermediate_size=96,
            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            local_layer_ids=[0], mlp_layer_types=["dense", "sparse"], pad_token_id=0, bos_token_id=1,
            eos_token_id=2)  # fmt: skip
"""Layer 0 local (a window of 16, one KV head) with a dense MLP, layer 1 global (two KV heads) with the MoE."""


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "inkling_text", "test"))


def test_a_tiny_inkling_by_hand():
    h, d, K = 64, 16, 4
    # both layers: q, r_proj (4 heads × d_rel 16) and o, h × h each; QK norms of d; two norms; the attention-output
    # and MLP-output convolutions, h × K; the K and V convolutions over the layer's H_kv·d, and its bias table
    both = 3 * h * h + 2 * d + 2 * h + 2 * h * K
    local = both + 2 * h * d + 2 * d * K + 16 * 16 + 3 * h * 96 + 1  # one KV head; 16 distances; the MLP, its scale
    experts = 4 * 3 * 32 * h + 3 * 32 * h  # four routed, one shared
    moe = (4 + 1) * h + 1 + experts  # the router scores the shared expert too; its scale
    global_ = both + 2 * h * 2 * d + 2 * 2 * d * K + 16 * 32 + moe  # two KV heads; 32 distances
    total = local + global_ + 512 * h + h + h + 512 * h  # embedding and its norm, the final norm, the head (untied)
    assert count_params(spec_of(TINY)).total == total == 148_354  # transformers' meta-device count


def test_class_defaults_equal_transformers():
    assert count_params(spec_of({"model_type": "inkling_text"})).total == 975_340_270_146  # transformers' meta count


def test_the_branch_convolutions_and_relative_logits_by_hand():
    s, K = 32, 4
    outputs = (s + K - 1) / s  # padded by K − 1 on both sides, the first s kept
    convs = 2 * K * outputs * ((16 + 16) + (32 + 32) + 4 * 64)  # K and V of each layer, and both h-wide a layer
    relative = 2 * 4 * 16 * (16 + 32)  # the local layer's 16 distances, the global layer's 32
    assert branch_conv_flops(spec_of(TINY), s) == pytest.approx(convs + relative, rel=1e-12)
    # the count's SDPA stand-in gives the bias no gradient: r_proj's and the tables' backward, 2 × their forward
    assert mask_gradient_flops(spec_of(TINY), s) == -2 * (2 * 2 * 64 * 64 + relative) * s


@pytest.mark.torch
def test_the_state_equals_transformers_cache(tmp_path):
    from hf_tiny import prefill_cache_bytes

    batch, tokens = 2, 7
    held = prefill_cache_bytes(TINY, batch, tokens)  # K and V; the four convolutions' last K inputs, fp32
    assert state_bytes(spec_of(TINY), 2) == ((16 + 16 + 128) + (32 + 32 + 128)) * 4 * 4  # channels × 4 taps × 4 B
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    # K and V of one head of 16 in the local layer and two in the global one, the state beside them
    kv = tokens * (2 * 16 + 2 * 2 * 16) * 2
    assert held == batch * (kv + state_bytes(spec_of(TINY), 2)) == api.inference(
        model=str(path), context=tokens, batch=batch).memory.kv_cache  # fmt: skip


def test_local_layers_of_other_widths_are_refused():
    with pytest.raises(LmcalcError, match="swa_head_dim differs from head_dim"):
        spec_of(TINY | {"swa_head_dim": 32})


def test_params_flops_serving_and_training_memory_take_it(tmp_path):
    # training memory, fine-tuning and the planner take it since engine.memory.branch_convs counts what its layers keep
    # (tests/test_inkling_memory.py)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 148_354
    full = api.memory(model=str(path), seq=32)
    lora = api.memory(model=str(path), seq=32, method="lora")
    assert 0 < lora.gpu.kept.optimizer < full.gpu.kept.optimizer and lora.gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100", seq=32, global_batch=32 * 64, tokens=1e9).best is not None
