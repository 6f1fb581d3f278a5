"""RecurrentGemma (Griffin's recurrent blocks beside local MQA): its parameters, FLOPs and state by hand against the
shapes of transformers 5.24's modeling_recurrent_gemma.py (RecurrentGemmaRecurrentBlock, RecurrentGemmaRglru,
RecurrentGemmaAttention, RecurrentGemmaMlp), and its state and cache against what transformers keeps. transformers'
own counts and FLOPs are tests/test_hf_types.py's and test_validate_hf.py's (tests/hf_tiny.py)."""

from __future__ import annotations

import pytest

from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.model.flops import forward_flops_per_token, local_keys
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

V, h, H, H_KV, f, L, w, K, W = 512, 64, 4, 1, 96, 4, 64, 4, 24
CONFIG = {"model_type": "recurrent_gemma", "vocab_size": V, "hidden_size": h, "num_attention_heads": H,
          "num_key_value_heads": H_KV, "intermediate_size": f, "num_hidden_layers": L, "lru_width": w,
          "conv1d_width": K, "attention_window_size": W}  # fmt: skip
"""Layers 0, 1 and 3 recurrent, layer 2 attending (block_types' default: recurrent, recurrent, attention)."""


def spec_of(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config({**CONFIG, **fields}, "recurrent_gemma", "config"))


def test_parameters_by_hand():
    # a recurrent block: linear_y and linear_x (h → w, biases), the depthwise convolution (w·K and a bias of w), the
    # RG-LRU's decay (w) and two block-diagonal gates (H blocks of (w/H)², biases of w), linear_out (w → h, a bias);
    # an attention block: q (h → H·d), k and v (h → H_kv·d), o (H·d → h) with a bias alone; every layer a GeGLU MLP
    # of f/2 with biases and two RMSNorms; the embedding tied, and a final norm
    d, m, bw = h // H, f // 2, w // H
    recurrent = 2 * (h * w + w) + (w * K + w) + w + 2 * (H * bw * bw + w) + (w * h + h)
    attention = h * H * d + 2 * h * H_KV * d + H * d * h + h
    layer = 3 * h * m + 2 * m + h + 2 * h
    assert count_params(spec_of()).total == V * h + 3 * recurrent + attention + L * layer + h


def test_flops_by_hand():
    # per token: the matmul weights (the gates as block-diagonal products), the recurrent blocks' convolution
    # (2·w·K each), the attention layer's window of keys (causal) at H heads of d, and the head
    s, d, m, bw = 64, h // H, f // 2, w // H
    matmuls = 3 * (3 * h * w + 2 * H * bw * bw) + (h * H * d + 2 * h * H_KV * d + H * d * h) + L * 3 * h * m
    k_w = local_keys(s, W, "sliding")
    expected = 2 * matmuls + 3 * 2 * w * K + 2 * 2 * H * k_w * d + 2 * h * V
    assert forward_flops_per_token(spec_of(), s).total == pytest.approx(expected, rel=1e-12)


def test_state_and_cache_by_hand():
    # a recurrent layer: the convolution's last K − 1 inputs (w, at the cache's bytes) and the RG-LRU's state (w, fp32);
    # the attention layer: K and V of one head of d for the last W tokens
    d = h // H
    memory = inference_memory(Serving(spec_of(), context=1000, batch=2), 80e9)
    assert memory.kv_cache == 2 * (3 * w * ((K - 1) * 2 + 4) + W * 2 * H_KV * d * 2)


@pytest.mark.torch
def test_state_and_cache_are_what_transformers_keeps():
    """The recurrent blocks keep their states on the modules, the attention layer its window in the cache (the last
    W − 1 tokens between steps: lmcalc counts the W the next token attends to)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    from hf_tiny import tiny_config

    config = tiny_config("recurrent_gemma")
    spec = ModelSpec.model_validate(model_from_hf_config(config, "recurrent_gemma", "tiny"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model.to(torch.bfloat16).eval()(torch.randint(3, V, (1, 50)), use_cache=True, cache=cache)
    blocks = [layer.temporal_block for layer in model.model.layers if hasattr(layer.temporal_block, "rg_lru")]
    kept = [t for b in blocks for t in (b.conv1d_state, b.rg_lru.recurrent_states)]
    kept += [
        t
        for layer in cache.layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if t is not None
    ]
    memory = inference_memory(Serving(spec, context=50), 80e9)
    one_token = 2 * spec.kv_heads * spec.head_size * 2
    assert memory.kv_cache == sum(t.numel() * t.element_size() for t in kept) + one_token
