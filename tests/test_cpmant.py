"""CPM-Ant (issue #31): a prompt of P tokens prepended to every sequence, its rows in the embedding, a segment
embedding and a learned bias on the scores. Parameters and FLOPs by hand at transformers 5.24's class defaults (the
openbmb/cpm-ant-10b shape), the cache its prompt adds against transformers', and what lmcalc refuses. The tiny config's
count and FLOPs against transformers and FlopCounterMode run in tests/test_hf_types.py and tests/test_validate_hf.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import cache_layers, kv_elements_per_token_per_layer, state_bytes
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

DEFAULTS = {"model_type": "cpmant"}  # CpmAntConfig's defaults


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "cpmant", "test"))


def test_class_defaults_by_hand():
    h, L, H, d, f, V = 4096, 48, 32, 128, 10240, 30720
    P, T, segments, buckets = 32, 32, 32, 512
    layer = 2 * h + 4 * h * H * d + 3 * h * f  # two RMSNorms; q, k, v, o without biases; the GeGLU
    embeddings = (V + T * P) * h + segments * h + (segments**2 + buckets) * H  # tokens and prompts; segments; bias
    total = embeddings + L * layer + h + V * h  # the output norm, the head (never tied)
    assert count_params(spec_of(DEFAULTS)).total == total == 9_517_453_312  # transformers' meta-device count


def test_every_layer_computes_the_prompt_too():
    # at s tokens a sequence runs s + 32: the layers' matmuls and the full convention's s + 32 keys, per text token
    # times (s + 32)/s; the head reads the s alone
    spec, s = spec_of(DEFAULTS), 512
    h, L, Hd, f, V, whole = 4096, 48, 4096, 10240, 30720, 512 + 32
    layer = 2 * (4 * h * Hd + 3 * h * f) + 2 * 2 * whole * Hd
    forward = L * layer * whole / s + 2 * h * V
    assert fl.step_flops(spec, s, convention="full").model == pytest.approx(3 * forward, rel=1e-12)


def test_the_prompt_is_cached_before_every_sequence():
    spec = spec_of(DEFAULTS)
    assert state_bytes(spec, 2) == 32 * 48 * 2 * 32 * 128 * 2  # P tokens' K and V, every layer, bf16


@pytest.mark.torch
def test_the_cache_equals_transformers():
    from hf_tiny import prefill_cache_bytes, tiny_config

    config, batch, tokens = tiny_config("cpmant"), 2, 7
    spec = spec_of(config)  # the 8 prompt tokens' K and V and the 7 tokens' own, in each of 4 layers
    per_token = cache_layers(spec, None) * kv_elements_per_token_per_layer(spec) * 2
    held = prefill_cache_bytes(config, batch, tokens)
    assert held == batch * (tokens * per_token + state_bytes(spec, 2)) == batch * (tokens + 8) * per_token


def test_params_flops_and_serving_work(tmp_path):
    # training memory, fine-tuning and the planner take it since its layers' saved tensors are counted (formulas
    # §2.30; tests/test_cpmant_memory.py)
    path = tmp_path / "config.json"  # the context's cache and the prompt's
    path.write_text('{"model_type": "cpmant"}')
    assert api.params(model=str(path)).total == 9_517_453_312
    assert api.inference(model=str(path), context=1024).memory.kv_cache == (1024 + 32) * 48 * 2 * 32 * 128 * 2
