"""Sliding-window and chunked local attention (issue #17 item 2), each figure against something that did not
produce it: the keys a windowed causal kernel computes against transformers' own mask functions, enumerated
pair by pair; the whole model's attention FLOPs against the masks lmcalc's PyTorch reference model builds; the
KV cache against the caches transformers keeps when it runs a tiny model on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import tiny_config  # noqa: E402

from lmcalc.engine.inference.serving import InferenceMemory, Serving, inference_memory  # noqa: E402
from lmcalc.engine.model import flops as fl  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import resolve_model  # noqa: E402
from lmcalc.reference_model import ReferenceModel  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch


def spec_of(kind: str) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))


def transformers_visible_keys(kind: str, seq: int, window: int) -> float:
    """Keys per query, averaged over the positions, that transformers' mask function lets through."""
    from transformers import masking_utils as mu

    if kind == "sliding":
        allowed = mu.sliding_window_causal_mask_function(window)
    else:  # chunked masks are applied on top of the causal one
        chunk = mu.chunked_causal_mask_function(window, torch.zeros(1, dtype=torch.long))
        allowed = mu.and_masks(mu.causal_mask_function, chunk)
    q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return float(allowed(torch.tensor(0), torch.tensor(0), q, k).sum()) / seq


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
@pytest.mark.parametrize("seq, window", [(7, 16), (16, 16), (17, 16), (100, 16), (131, 24), (1000, 128)])
def test_local_keys_equal_transformers_masks(kind: str, seq: int, window: int):
    assert fl.local_keys(seq, window, kind) == pytest.approx(transformers_visible_keys(kind, seq, window), rel=1e-12)


def test_sliding_keys_by_hand():
    # Mistral 7B at 32,768 tokens, window 4,096: the first 4,096 queries see 1..4,096 keys, the rest 4,096 each
    s, w = 32768, 4096
    assert fl.local_keys(s, w, "sliding") == (w * (w + 1) / 2 + (s - w) * w) / s


@pytest.mark.parametrize("kind", ["gemma2", "gemma3_text", "gpt_oss", "mistral", "cohere2", "llama4_text"])
def test_attention_flops_count_the_reference_models_masks(kind: str):
    """Causal attention FLOPs of the whole model equal 2·(d_qk + d_v)·H per unmasked (query, key) pair of every
    layer's mask, as the reference model builds them (local layers: its sliding or chunked bias)."""
    spec = spec_of(kind)
    seq = 96
    model = ReferenceModel(spec, "eager", max_seq=seq)
    pairs = 0
    for i in range(spec.num_layers):
        bias = model.get_buffer("local_bias") if spec.is_local_layer(i) else model.get_buffer("causal_bias")
        pairs += int(torch.isfinite(bias).sum())
    fwd = fl.forward_flops_per_token(spec, seq, "causal")
    per_pair = 2 * spec.num_heads * (spec.qk_head_dim + spec.v_head_dim)
    assert (fwd.attention_scores + fwd.attention_values) * seq == pytest.approx(per_pair * pairs, rel=1e-12)
    full = fl.forward_flops_per_token(spec, seq, "full")  # what FlopCounterMode counts: every pair
    assert (full.attention_scores + full.attention_values) * seq == per_pair * spec.num_layers * seq * seq


@pytest.mark.parametrize("kind", ["gemma2", "mistral", "gpt_oss", "llama4_text"])
def test_kv_cache_keeps_what_transformers_keeps(kind: str):
    """After a prompt of s tokens transformers keeps all s in a global layer and the last w − 1 in a local one
    (the token being generated makes the w it attends to); lmcalc counts the cache as the next step needs it: s
    per global layer, min(w, s) per local one."""
    import warnings

    config = tiny_config(kind)
    spec = spec_of(kind)
    seq = 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
        with torch.no_grad():
            cache = model(torch.randint(3, 500, (1, seq)), use_cache=True).past_key_values
    kept = [layer.keys.shape[-2] for layer in cache.layers]
    w = spec.sliding_window
    assert w is not None and w < seq
    expected = [min(w, seq) - 1 if spec.is_local_layer(i) else seq for i in range(spec.num_layers)]
    assert kept == expected
    memory = inference_memory(Serving(spec, context=seq), 80e9)
    assert memory.cached_tokens(seq) * spec.num_layers == sum(expected) + spec.local_layers


def test_max_context_by_hand():
    """Past the window only the global layers' caches grow: with T tokens' worth of budget per layer (averaged),
    L·T = L_global·c + L_local·w."""
    memory = InferenceMemory(
        params=0, weights=0.0, quant_scales=0.0, kv_per_token_per_layer=1.0, kv_per_token_per_layer_per_gpu=1.0,
        layers=6, batch=1, context=10, tp=1, overhead=0.0, capacity=6 * 1000.0, local_layers=5, window=100,
        max_seq_len=10**6,
    )  # fmt: skip
    # budget 6,000 bytes at 6 bytes per token (one per layer): T = 1,000 > w, so c = (6·1000 − 5·100) / 1 = 5,500
    assert memory.max_context == 5500
    assert memory.kv_cache == 6 * 10  # 10 tokens < window: every layer keeps them all


def test_mistral_preset_cache_stops_at_the_window():
    spec = resolve_model("mistral-7b").spec
    short, long = (inference_memory(Serving(spec, context=c), 80e9) for c in (4096, 32768))
    assert long.kv_cache == short.kv_cache == 4096 * 32 * 2 * 8 * 128 * 2  # s_w · L · 2·H_kv·d · 2 bytes
