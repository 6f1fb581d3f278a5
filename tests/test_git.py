"""GIT (issue #31): an image encoder's tokens before the text (Wang et al. 2022; microsoft/git-base's shape at
transformers 5.24's class defaults). The decoder's parameters and the CLIP encoder's, apart, by hand; a step's FLOPs
by hand, with the encoder and the image's positions in every layer and the head; the cache the image adds against
transformers'; and what lmcalc refuses. The tiny config's count and FLOPs against transformers and
FlopCounterMode run in tests/test_hf_types.py and tests/test_validate_hf.py."""

from __future__ import annotations

import json
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

DEFAULTS = {"model_type": "git"}  # GitConfig's defaults: a 6-layer decoder of 768, a ViT-B/16 at 224 pixels
h, L, f, V = 768, 6, 3072, 30522
v, Lv, fv, n = 768, 12, 3072, 197  # the encoder: width, layers, MLP, tokens ((224/16)² patches and a class token)


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "git", "test"))


def test_class_defaults_by_hand():
    # the decoder: tokens, 1,024 positions and a LayerNorm; BERT's layer, every matrix biased, a LayerNorm after each
    # residual add; the head with a bias (untied)
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    decoder = V * h + 1024 * h + 2 * h + L * layer + h * V + V
    # the encoder: a class token, the patch convolution (no bias), n positions, LayerNorms before and after, pre-norm
    # layers; the projection to the decoder and its LayerNorm
    vision_layer = 2 * 2 * v + 4 * (v * v + v) + (v * fv + fv) + (fv * v + v)
    encoder = v + 3 * 16 * 16 * v + n * v + 2 * v + Lv * vision_layer + 2 * v + (v * h + h) + 2 * h
    spec = spec_of(DEFAULTS)
    assert count_params(spec).total == decoder
    assert spec.vision_params == encoder
    assert decoder + encoder == 176_619_066  # transformers' meta-device count of GitForCausalLM


def test_a_step_runs_the_encoder_and_the_images_tokens_everywhere():
    s = 32
    whole = s + n  # the decoder computes the image's 197 tokens before the text's, and the head every position
    decoder = L * (2 * (4 * h * h + 2 * h * f) * whole + 2 * 2 * whole * whole * h) + 2 * h * V * whole
    stem = 2 * 3 * 16 * 16 * v * (n - 1)  # the patch convolution: its input needs no gradient
    encoder = stem + Lv * (2 * (4 * v * v + 2 * v * fv) * n + 2 * 2 * n * n * v) + 2 * v * h * n
    expected = 3 * (decoder + encoder) - stem  # forward and backward; the stem's backward its weight's alone
    assert fl.step_flops(spec_of(DEFAULTS), s, convention="full").model * s == pytest.approx(expected, rel=1e-12)


def test_the_images_tokens_are_cached_before_the_text():
    assert state_bytes(spec_of(DEFAULTS), 2) == n * L * 2 * h * 2  # 197 tokens' K and V in each layer, bf16
    frames = spec_of(DEFAULTS | {"num_image_with_embedding": 6})  # a video of six frames: 6 × 197 tokens
    assert state_bytes(frames, 2) == 6 * n * L * 2 * h * 2


@pytest.mark.torch
def test_the_cache_equals_transformers():
    torch = pytest.importorskip("torch")
    from hf_tiny import prefill_cache_bytes, tiny_config

    config, batch, tokens = tiny_config("git"), 2, 7
    pixels = torch.zeros(batch, 3, 32, 32, dtype=torch.bfloat16)  # the tiny encoder's 32-pixel image: 17 tokens
    held = prefill_cache_bytes(config, batch, tokens, pixel_values=pixels)
    spec = spec_of(config)
    per_token = cache_layers(spec, None) * kv_elements_per_token_per_layer(spec) * 2
    assert held == batch * (tokens * per_token + state_bytes(spec, 2)) == batch * (tokens + 17) * per_token


def test_every_estimate_takes_it(tmp_path):
    # training memory, fine-tuning and the planner since the image encoder's and the image tokens' saved tensors are
    # counted (formulas §2.31; against transformers: tests/test_git_memory.py); params, FLOPs and serving as before
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert api.params(model=str(path)).total == 90_227_514  # the decoder; the encoder apart
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
    assert api.memory(model=str(path), seq=512).gpu.activations > 0
    assert api.memory(model=str(path), seq=512, method="lora").gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100", seq=512, global_batch=512 * 64, tokens=1e9).best is not None
