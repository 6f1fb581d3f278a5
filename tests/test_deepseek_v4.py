"""DeepSeek-V4 (issue #31): its parameters by hand at transformers 5.24's class defaults (the V4-Flash shape) and on
the meta device, the layer kinds as DeepseekV4Config writes them, the keys a query reads by hand, the known gap below
one compressed entry, and what lmcalc refuses for it. FLOPs against FlopCounterMode on the tiny config run in
tests/test_validate_hf.py (every TINY type)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmcalc import api
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.compressed_attention import entries_read, layer_keys
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.estimates.counts import COUNTED_ONLY_NOTE
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

# DeepseekV4Config's defaults, as its save_pretrained writes them (no field but the type): V4-Flash's shape
DEFAULTS = {"model_type": "deepseek_v4"}


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "v4", "test"))


def test_class_defaults_by_hand():
    h, L, H, d, r_q, g, r_o, V = 4096, 43, 64, 512, 1024, 8, 1024, 129280
    E, f, k, n, H_I, c, m, m2 = 256, 2048, 6, 4, 64, 128, 4, 128
    csa, hca = 20, 23  # two HCA layers, then HCA and CSA in turn: CSA at 3, 5, …, 41
    attention = h * r_q + r_q + r_q * H * d + h * d + d + H * d * r_o + g * r_o * h + H  # q_a…o_b, the sinks
    csa_compressor = 2 * h * 2 * d + m * 2 * d + d  # values and gates of two series, a position bias, a norm
    hca_compressor = 2 * h * d + m2 * d + d
    indexer = 2 * h * 2 * c + m * 2 * c + c + r_q * H_I * c + h * H_I
    hyper = 2 * ((2 + n) * n * n * h + (2 + n) * n + 3)  # attn_hc and ffn_hc
    moe = E * h + E * 3 * h * f + 3 * h * f  # router, experts, one shared expert
    layers = L * (attention + hyper + 2 * h + moe) + csa * (csa_compressor + indexer) + hca * hca_compressor
    total = 2 * V * h + h + n * n * h + n + 1 + layers  # embedding, head, final norm, hc_head
    counted = count_params(spec_of(DEFAULTS))
    assert counted.total == total == 284_325_869_015  # transformers' meta-device count (test_hf_types, the coverage)
    assert counted.active == total - L * (E - k) * 3 * h * f


def test_the_flash_preset_is_the_released_layer_pattern():
    # presets/models/deepseek-v4-flash.yaml: the class's widths, and the released compress_ratios (a window alone in
    # layers 0 and 1, then CSA and HCA in turn); read from a config.json of those ratios it counts the same, which is
    # transformers' meta-device count of that config too (284,332,230,231); DeepSeek publishes 284B and 13B active
    from lmcalc.presets import resolve_model

    ratios = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]
    flash = resolve_model("deepseek-v4-flash").spec
    counted = count_params(flash)
    assert counted.total == count_params(spec_of(DEFAULTS | {"compress_ratios": ratios})).total == 284_332_230_231
    assert counted.active == counted.total - 43 * (256 - 6) * 3 * 4096 * 2048  # 6 of the 256 routed experts a token


@pytest.mark.torch
def test_the_layer_kinds_are_the_classs():
    transformers = pytest.importorskip("transformers")
    for layers in (1, 2, 7, 43):
        config = transformers.DeepseekV4Config(num_hidden_layers=layers)
        c = spec_of(config.to_diff_dict() | {"num_hidden_layers": layers}).compressed_attention
        assert c is not None
        kinds = ["csa" if i in c.csa_layer_ids else "hca" if i in c.hca_layer_ids else "sliding" for i in range(layers)]
        short = {"compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}
        assert kinds == [short.get(t, "sliding") for t in config.layer_types]


def test_legacy_fields_are_read_as_the_class_folds_them():
    # older checkpoints: compress_ratios (0, 4 or 128 a layer), compress_rate_csa, qk_rope_head_dim
    legacy = {"model_type": "deepseek_v4", "num_hidden_layers": 3, "compress_ratios": [0, 4, 128],
              "compress_rate_csa": 8, "qk_rope_head_dim": 128}  # fmt: skip
    spec = spec_of(legacy)
    c = spec.compressed_attention
    assert c is not None
    assert (c.csa_layer_ids, c.hca_layer_ids, c.csa_rate, c.hca_rate) == ((1,), (2,), 8, 128)
    assert spec.rotary_fraction == 128 / 512
    with pytest.raises(LmcalcError, match="compress_ratios has 5, not 0, 4 or 128"):
        spec_of(legacy | {"compress_ratios": [0, 5, 128]})
    with pytest.raises(LmcalcError, match="layer_types has 'full_attention'"):
        spec_of({"model_type": "deepseek_v4", "num_hidden_layers": 1, "layer_types": ["full_attention"]})


@given(st.integers(1, 600), st.integers(1, 40), st.one_of(st.none(), st.integers(1, 30)))
def test_entries_read_is_the_sum_over_queries(seq: int, rate: int, cap: int | None):
    by_query = [j // rate if cap is None else min(cap, j // rate) for j in range(1, seq + 1)]
    assert entries_read(seq, rate, cap) == sum(by_query)


def test_the_keys_a_query_reads_by_hand():
    # s 16, a window of 8; CSA: an entry per 4 tokens, the top 4; HCA: an entry per 8
    kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
    spec = spec_of({"model_type": "deepseek_v4", "num_hidden_layers": 3, "sliding_window": 8, "index_topk": 4,
                    "layer_types": kinds, "compress_rates": rates})  # fmt: skip
    window = (8 * 9 / 2 + 8 * 8) / 16  # queries 1..8 see 1..8 keys, 9..16 see 8
    csa = (4 * 1 + 4 * 2 + 4 * 3 + 1 * 4) / 16  # ⌊j/4⌋ for j = 1..16, none above the top 4
    hca = (8 * 1 + 1 * 2) / 16  # ⌊j/8⌋
    assert [layer_keys(spec, i, 16, "causal") for i in range(3)] == [window, window + csa, window + hca]
    assert [layer_keys(spec, i, 16, "full") for i in range(3)] == [16, 16 + 4, 16 + 2]
    assert fl.attended_keys(spec, 16, "causal") == (3 * window + csa + hca) / 3


@pytest.mark.torch
def test_below_one_entry_transformers_trains_no_compressor():
    # with fewer than m' tokens no HCA entry closes: transformers still projects the values and gates, but no gradient
    # reaches them, so its step is 2 x 2 x (h·d + h·d) FLOPs a token short of lmcalc's count (docs/formulas.md §2.24)
    pytest.importorskip("transformers")
    from hf_tiny import tiny_config, transformers_model

    from lmcalc import validate_hf

    config = tiny_config("deepseek_v4")  # h 64, d 32, one HCA layer of m' 8
    spec = spec_of(config)
    for seq in (6, 7):
        counted = fl.step_flops(spec, seq, convention="full").model * seq * 2
        measured = validate_hf.training_step_flops(transformers_model(config), seq, 2)
        assert counted - measured == 2 * 2 * (64 * 32 + 64 * 32) * seq * 2


def cache_held(model, seq: int) -> int:  # noqa: ANN001 (a transformers model)
    """The bytes transformers' DeepSeek-V4 cache holds after a prompt of ``seq`` tokens, tensor by tensor (a layer's
    values are its keys; views counted at their own size: after a prompt they keep the prompt's whole projection
    alive, which a serving engine does not)."""
    import torch

    with torch.no_grad():
        cache = model(torch.randint(3, 120, (1, seq)), use_cache=True).past_key_values
    held = {}
    for layer in cache.layers:
        tensors = [layer.keys, layer.values]
        for name in ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv", "overlap_gate"):
            tensors += getattr(layer, name, {}).values()
        held |= {(t.data_ptr(), t.numel()): t.numel() * t.element_size() for t in tensors if t is not None}
    return sum(held.values())


@pytest.mark.torch
def test_the_serving_cache_is_what_transformers_keeps():
    # the tiny model's layers: one of the window alone, two CSA, one HCA (fp32). Two differences, both transformers':
    # its window layers keep w − 1 tokens where lmcalc counts the next step's too, and its plain sliding layer (layer
    # 0) keeps K and V as two copies of the one head
    transformers = pytest.importorskip("transformers")
    from hf_tiny import tiny_config

    from lmcalc.engine.inference.serving import Serving, inference_memory

    config = tiny_config("deepseek_v4")
    built = transformers.AutoConfig.for_model(**config)
    spec, model = spec_of(config), transformers.AutoModelForCausalLM.from_config(built).eval()
    L, d, w, element = 4, 32, 8, 4
    for seq in (5, 8, 13, 16, 30, 33):  # before and after windows of 4 and 8 close, and tokens left over
        counted = inference_memory(Serving(spec, context=seq, kv_dtype="fp32"), 1e12).kv_cache
        next_token = L * d * element if seq >= w else 0
        second_copy = min(seq, w - 1) * d * element
        assert counted == cache_held(model, seq) + next_token - second_copy


def test_the_serving_cache_by_hand():
    # V4-Flash's shape at 1,048,576 tokens, bf16: the window's 128 entries of 512 in each of 43 layers; each of the 20
    # CSA layers 262,144 entries of 512 + 128, each of the 23 HCA layers 8,192 of 512; 1,048,576 closes every window,
    # so the CSA layers hold only the last window's first series, 2 × 4 × (512 + 128) elements
    from lmcalc.engine.inference.serving import Serving, inference_memory

    s = 1_048_576
    memory = inference_memory(Serving(spec_of(DEFAULTS), context=s, tp=8), 141e9)
    window = 43 * 128 * 512 * 2
    entries = (20 * (s // 4) * (512 + 128) + 23 * (s // 128) * 512) * 2
    overlap = 20 * 2 * 4 * (512 + 128) * 2
    assert memory.kv_cache == memory.kv_cache_per_gpu == window + entries + overlap  # one head: whole on every rank
    budget = memory.cache_budget
    assert memory.max_batch == budget // (window + entries + overlap)


def test_the_longest_context_by_hand():
    # 64 sequences: the longest context s whose cache, the compressors' state at its fullest (3 tokens of a CSA window
    # and 127 of an HCA window pending, a CSA window closed before), fits the budget, and s + 1 does not
    from lmcalc.engine.inference.serving import Serving, inference_memory

    memory = inference_memory(Serving(spec_of(DEFAULTS), context=4096, batch=64, tp=8), 141e9)

    def most(s: int) -> int:
        window = min(128, s) * 43 * 512
        entries = 20 * (s // 4) * (512 + 128) + 23 * (s // 128) * 512
        fullest = 20 * (3 * 2 * (2 * 512 + 2 * 128) + 2 * 4 * (512 + 128)) + 23 * 127 * 2 * 512
        return 64 * (window + entries + fullest) * 2

    longest = memory.max_context
    assert 4096 < longest < 1_048_576
    assert most(longest) <= memory.cache_budget < most(longest + 1)


def test_every_estimate_takes_it_and_tp_or_cp_is_refused_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    counted = api.params(model=str(path))
    assert counted.total == count_params(spec_of(DEFAULTS)).total
    assert COUNTED_ONLY_NOTE not in counted.report.notes
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    assert api.train_time(model=str(path), gpus="8xH100", tokens=1e9).days > 0
    assert api.inference(model=str(path), context=4096, gpus="8xH200").memory.kv_cache > 0
    # training memory and LoRA take its compressed attention and mHC streams (tests/test_compressed_memory.py)
    assert api.memory(model=str(path), gpus="8xH200").gpu.activations > 0
    assert api.memory(model=str(path), method="lora", gpus="1xH200").gpu.activations > 0
    for degree in ({"tp": 2}, {"cp": 2}):
        with pytest.raises(LmcalcError, match="would split .* compressors, indexers and one K=V head"):
            api.memory(model=str(path), gpus="8xH200", **degree)


def test_a_layer_of_two_kinds_is_refused():
    fields = model_from_hf_config(DEFAULTS, "v4", "test")
    fields["compressed_attention"] |= {"csa_layer_ids": [3], "hca_layer_ids": [3]}
    with pytest.raises(ValueError, match="layer 3 is in both csa_layer_ids and hca_layer_ids"):
        ModelSpec.model_validate(fields)
