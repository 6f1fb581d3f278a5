"""The Byte Latent Transformer (issue #31; transformers 5.24's `blt`, Pagnoni et al. 2024): a local encoder over the
bytes (each byte's embedding plus its hashed n-gram embeddings), cross-attention from each patch's k queries to its
bytes, a global transformer over the patches, cross-attention from the decoder's bytes to the patches' k keys, a local
decoder and its head; beside them a frozen entropy model that cuts the bytes into patches in every forward pass.
Parameters and FLOPs by hand at a tiny size, against transformers at the class defaults (meta count) and on its own
training step (FlopCounterMode, with the entropy model on the CPU), the cache against what transformers keeps, and
what lmcalc refuses."""

from __future__ import annotations

import json
import warnings

import pytest

from lmcalc import api
from lmcalc.engine.model.flops import step_flops
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

STACK = dict(num_attention_heads=2, num_hidden_layers=1, intermediate_size=64, hidden_size=32)
TINY = dict(model_type="blt", vocab_size=260, encoder_hash_byte_group_vocab=1000, encoder_hash_byte_group_size=[3, 4],
            cross_attn_k=2, local_attention_window_len=16, patcher_config=STACK, encoder_config=STACK,
            decoder_config=dict(STACK, num_key_value_heads=1, num_hidden_layers=2, intermediate_size=48,
                                hidden_size_global=64),
            global_config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                               intermediate_size=96))  # fmt: skip
"""Bytes of 32 wide through one encoder layer (2 heads of 16) and one cross-attention after it, a global transformer
of two layers at 64 (4 heads of 16, 2 KV heads) over the patches (their k = 2 states of 32 side by side: 64, no
projection), a decoder of two layers (2 heads, 1 KV head), each after a cross-attention; two hash tables of 1,000 rows;
an entropy model of one layer at 32; windows of 16 bytes."""
NO_PATCHER = TINY | {"patch_in_forward": False}


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "blt", "test"))


def llama_layer(h: int, heads: int, kv_heads: int, f: int) -> int:
    """q and o (h·H·d), k and v (h·H_kv·d) at d = h/H, the SwiGLU's three matrices, two RMSNorms."""
    d = h // heads
    return 2 * h * heads * d + 2 * h * kv_heads * d + 3 * h * f + 2 * h


def test_a_tiny_blt_by_hand():
    h, k, P_rows = 32, 2, 2 * 1000
    embeddings = 260 * h + P_rows * h  # the byte embedding and the two hash tables
    encoder = llama_layer(h, 2, 2, 64) + h * k * h  # its layer and its patch projection (h → k·h)
    encoder += 2 * h * h + 2 * h * h + 2 * h  # its cross-attention: q, o; k, v (2 KV heads of 16); q and k norms
    latent = 2 * llama_layer(64, 4, 2, 96)  # k·h = 64 = h_g: no projection into it
    decoder = 64 * k * h + 2 * (2 * h * h + 2 * h * 16 + 2 * h)  # h_g → k·h; two cross-attentions (1 KV head)
    decoder += 2 * llama_layer(h, 2, 1, 48) + h + 260 * h  # its layers, final norm, head
    patcher = 260 * h + llama_layer(h, 2, 2, 64) + h + 260 * h  # embedding, layer, norm, head
    total = embeddings + encoder + latent + decoder
    assert count_params(spec_of(NO_PATCHER)).total == total == 184_736
    assert count_params(spec_of(TINY)).total == total + patcher == 211_712


def test_class_defaults_equal_transformers():
    # BltConfig(): hash tables 6 × 500,002 × 1,024 (3,072,012,288 of the 4.6 B), an encoder layer, 25 global layers of
    # 2,048, 9 decoder layers each after a cross-attention, the entropy model's 14 layers of 768: counted on the meta
    # device by scripts/hf_coverage.py (docs/hf-types.md), in full and as save_pretrained writes them
    spec = spec_of({"model_type": "blt"})
    assert count_params(spec).total == 4_633_127_680
    assert count_params(spec).by_group["hash_embedding"] == 6 * 500_002 * 1_024
    # Kaplan's N leaves out the hash tables with the byte embedding (260 × 1,024); the untied head stays in
    assert count_params(spec).non_embedding == 4_633_127_680 - 6 * 500_002 * 1_024 - 260 * 1_024 == 1_560_849_152
    assert count_params(spec_of({"model_type": "blt", "patch_in_forward": False})).total == 4_633_127_680 - 99_512_064


def test_a_training_step_by_hand():
    s, P, h = 32, 33, 32  # every byte its own patch, and one more: P = s + 1
    d = 16

    def layers(n: int, tokens: int, width: int, heads: int, kv_heads: int, f: int, keys: int) -> int:
        # weights 2 FLOPs an element a token, QKᵀ and AV 2·keys·H·d each
        weights = 2 * width * heads * d + 2 * width * kv_heads * d + 3 * width * f
        return n * tokens * (2 * weights + 4 * keys * heads * d)

    def cross(queries: int, keys: int, heads: int, kv_heads: int) -> int:
        # q and o over the queries, k and v over the keys, every query against every key
        return 2 * queries * 2 * h * heads * d + 2 * keys * 2 * h * kv_heads * d + 4 * queries * keys * heads * d

    encoder = layers(1, s, h, 2, 2, 64, s) + 2 * P * h * 2 * h + cross(2 * P, s, 2, 2)
    latent = layers(2, P, 64, 4, 2, 96, P)
    decoder = 2 * P * 64 * 2 * h + 2 * cross(s, 2 * P, 2, 1) + layers(2, s, h, 2, 1, 48, s) + 2 * s * h * 260
    forward = encoder + latent + decoder
    assert forward == 9_327_104
    assert step_flops(spec_of(NO_PATCHER), s, convention="full").model * s == 3 * forward == 27_981_312
    # the entropy model runs forward alone (frozen): its layer over the bytes and its head
    patcher = layers(1, s, h, 2, 2, 64, s) + 2 * s * h * 260
    assert step_flops(spec_of(TINY), s, convention="full").model * s == 3 * forward + patcher == 29_300_224


def test_the_local_layers_attend_their_window_under_the_causal_convention():
    # 64 bytes over a window of 16: query i of the encoder's and decoder's layers reads min(i, 16) keys,
    # (16·17/2 + 48·16)/64 = 14.125 of the 64; a global query (s+1)/2 = 33 of the 65 patches; QKᵀ 2·keys·H·d a query
    full, causal = (step_flops(spec_of(NO_PATCHER), 64, convention=c).forward for c in ("full", "causal"))
    assert full.attention_scores - causal.attention_scores == 2 * 2 * 2 * 16 * (64 - 14.125)  # the decoder's layers
    encoder = 64 * 4 * 2 * 16 * (64 - 14.125)  # a sequence's: QKᵀ and AV of its layer's 2 heads, 64 queries
    latent = 2 * 65 * 4 * 4 * 16 * (65 - 33)  # two layers of 4 heads, 65 queries
    assert (full.byte_latent - causal.byte_latent) * 64 == pytest.approx(encoder + latent)


def test_the_cache_holds_every_byte_of_the_local_layers(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    # 2 sequences of 40 bytes, past the window of 16: the encoder's layer keeps K and V of 2 heads of 16, each decoder
    # layer of 1 head, for every byte; the global transformer and the cross-attention nothing; fp32
    expected = 2 * 40 * (1 * 2 * 2 * 16 + 2 * 2 * 1 * 16) * 4
    assert api.inference(model=str(path), context=40, batch=2, kv_dtype="fp32").memory.kv_cache == expected == 40_960


def tiny_model(transformers, **options):  # noqa: ANN001, ANN201 (transformers and its model, imported by the test)
    """TINY as transformers' BltForCausalLM builds it, on the CPU (``options``: ``from_config``'s)."""
    config = {key: value for key, value in TINY.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(transformers.BltConfig(**config), **options)


@pytest.mark.torch
def test_the_cache_equals_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = tiny_model(transformers).eval()
    ids = torch.randint(1, 260, (2, 40))
    with torch.no_grad(), pytest.raises(AttributeError, match="num_hidden_layers"):
        model(input_ids=ids, use_cache=True)  # 5.24 builds no cache of its own (DynamicCache(config=BltConfig))
    cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
    with torch.no_grad():
        kept = model(input_ids=ids, use_cache=True, cache=cache).cache
    held = sum(t.numel() * t.element_size() for part in (kept.self_attention_cache, kept.cross_attention_cache)
               for layer in part.layers for t in (layer.keys, layer.values))  # fmt: skip
    assert held == 40_960


@pytest.mark.torch
def test_a_step_with_the_entropy_model_equals_flop_counter_mode():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    # on the CPU (the meta device cannot cut patches: their count is data), eager attention (its two matmuls are the
    # fused kernel's FLOPs); the untrained entropy model's every byte exceeds the threshold: P = s + 1
    model = tiny_model(transformers, attn_implementation="eager").train()
    ids = torch.randint(0, 260, (1, 32))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert counter.get_total_flops() == 29_300_224
    assert sum(p.numel() for p in model.parameters()) == 211_712


@pytest.mark.torch
def test_class_defaults_cut_to_two_global_layers_equal_flop_counter_mode():
    transformers = pytest.importorskip("transformers")
    from hf_tiny import transformers_model

    from lmcalc import validate_hf

    # BltConfig's widths, two global and two decoder layers, without the entropy model (patches of one byte)
    config = transformers.BltConfig(patch_in_forward=False, global_config={"num_hidden_layers": 2},
                                    decoder_config={"num_hidden_layers": 2}).to_dict()  # fmt: skip
    result = validate_hf.transformers_check(config, 64, 1, model=transformers_model(config))
    assert result.value("params.lmcalc") == result.value("params.pytorch")
    assert result.value("flops.lmcalc") == result.value("flops.pytorch")


def test_what_transformers_forward_could_not_run_is_refused():
    with pytest.raises(LmcalcError, match="encoder as wide as its decoder"):
        spec_of(TINY | {"encoder_config": STACK | {"hidden_size": 48}})
    with pytest.raises(LmcalcError, match="needs one"):
        spec_of(TINY | {"encoder_config": STACK | {"cross_attn_k": 4}})


def test_params_flops_and_serving_work(tmp_path):
    # training memory, fine-tuning and the planner take it too: tests/test_blt_memory.py
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 211_712
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
