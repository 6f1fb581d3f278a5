"""ZAYA (issue #31): compressed convolutional attention (CCA), residual scaling and an MLP router over experts and a
skip class. Parameters by hand at a tiny size and at transformers 5.24's class defaults (ZAYA1-8B's shape), a step's
FLOPs by hand, the serving state against transformers' cache, and that every estimate takes it (its training memory:
tests/test_zaya_memory.py). The tiny config's count and FLOPs against transformers and FlopCounterMode run in
tests/test_hf_types.py and tests/test_validate_hf.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lmcalc.engine.inference.serving import cache_layers, kv_elements_per_token_per_layer, state_bytes
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

TINY = dict(model_type="zaya", vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=1,
            router_hidden_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "zaya", "test"))


def test_a_tiny_zaya_by_hand():
    # h 64, 4 heads and 2 KV heads of 16: q 64·64, k 64·32, the current and delayed values 64·16 each, the q‖k
    # convolutions over 96 channels (depthwise 96·2 and grouped 96·16·2, each with a bias of 96), a key scale a KV
    # head, o 64·64; two norms and two residual scalings of four vectors; the router: down 64 → 16 with a bias,
    # after layer 0 a scale of 16, its MLP (a norm of 16, two 16 × 16 with biases, out to the 4 experts and a skip);
    # 4 experts of 32; the embedding (tied head), the embedding's scale and bias, the final norm
    attention = 64 * 64 + 64 * 32 + 2 * 64 * 16 + (96 * 2 + 96) + (96 * 16 * 2 + 96) + 2 + 64 * 64
    router = 64 * 16 + 16 + 16 + (16 * 16 + 16) * 2 + 16 * 5
    experts = 4 * 3 * 32 * 64
    layers = 2 * (attention + 2 * 64 + 2 * 4 * 64 + router + experts) + 16  # layer 1's router scale
    assert count_params(spec_of(TINY)).total == layers + 512 * 64 + 2 * 64 + 64 == 118_260  # transformers' count


def test_class_defaults_equal_transformers():
    assert count_params(spec_of({"model_type": "zaya"})).total == 8_840_488_784  # transformers' meta-device count


def test_a_step_by_hand():
    # per token and layer, forward: q, k, both values and o; the depthwise convolution over the s + 1 outputs its
    # padding gives and the grouped one; QKᵀ and AV over s keys (full convention); the router (64 → 16, 16 → 16 twice,
    # 16 → 5) and one expert (every pick runs: transformers sends the skip to expert 0 at weight 0); the logits. A
    # sequence's one zero token through the delayed value's projection trains its weight alone: 2×, not 3×
    spec, s = spec_of(TINY), 32
    projections = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64)
    convs = 2 * 96 * 2 * (s + 1) / s + 2 * 96 * 16 * 2
    core = 2 * 2 * s * 4 * 16
    moe = 2 * (64 * 16 + 2 * 16 * 16 + 16 * 5) + 2 * 3 * 64 * 32
    zero_token = 2 * 64 * 16 / s
    forward = 2 * (projections + convs + core + moe + zero_token) + 2 * 64 * 512
    expected = 3 * forward - 2 * zero_token
    assert fl.step_flops(spec, s, convention="full").model == pytest.approx(expected, rel=1e-12)


@pytest.mark.torch
def test_the_state_equals_transformers_cache():
    from hf_tiny import prefill_cache_bytes

    batch, tokens = 2, 7  # K and V; the convolutions' last inputs and the delayed value
    held = prefill_cache_bytes(TINY, batch, tokens)
    spec = spec_of(TINY)
    per_token = cache_layers(spec, None) * kv_elements_per_token_per_layer(spec) * 2
    assert state_bytes(spec, 2) == 2 * (96 * 2 + 16) * 2  # two layers: 96 channels × 2 taps, 16 delayed, bf16
    assert held == batch * (tokens * per_token + state_bytes(spec, 2))


def test_every_estimate_takes_it(tmp_path):
    # training memory, LoRA and the planner since what its layers keep for backward is counted (formulas §2.32;
    # against transformers: tests/test_zaya_memory.py); params, FLOPs and serving as before
    from lmcalc import api

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 118_260
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
    assert api.memory(model=str(path), seq=32).gpu.activations > 0
    assert api.memory(model=str(path), seq=32, method="lora").gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100", seq=32, global_batch=32 * 64, tokens=1e9).best is not None


@pytest.mark.parametrize(("degree", "said"), [({"tp": 2}, "TP=2 would split"), ({"cp": 2}, "CP=2 would split")])
def test_tensor_and_context_parallelism_are_refused_in_one_line(tmp_path, degree, said):
    # the CCA convolutions reach tokens back across a CP rank's boundary, and the router state is kept whole
    from lmcalc import api
    from lmcalc.errors import LmcalcError

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    with pytest.raises(LmcalcError, match=said) as refused:
        api.memory(model=str(path), gpus="2xH100", seq=32, **degree)
    assert "CCA convolutions" in str(refused.value) and "\n" not in str(refused.value)
