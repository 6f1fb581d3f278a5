"""dots.3 Note's text model (issue #31; transformers 5.24's `dots3_note_text`, and the `dots3_note` wrapper's): MLA in
every layer, the sliding-window layers' at heads and ranks of their own, an RMSNorm on the shared RoPE key, a sigmoid
gate a head, DeepSeek sparse attention's indexer in the other layers, DeepSeek-V3's MoE with one shared MLP.
Parameters by hand at a tiny size and against transformers at the class defaults and as older config.json files
spell them, the attention core and the indexer's FLOPs by hand, the step's FLOPs against FlopCounterMode at the class
defaults cut to six layers (the tiny config's run in tests/test_validate_hf.py), the cache against transformers', and
that every estimate takes it (its training memory: tests/test_dots3_note_memory.py)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

GLOBAL = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
              qk_rope_head_dim=8, v_head_dim=16, head_dim=24)  # fmt: skip
LOCAL = dict(num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=24,
             head_dim=32)  # fmt: skip
TINY = dict(model_type="dots3_note_text", vocab_size=512, hidden_size=64, num_hidden_layers=4, intermediate_size=96,
            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
            shared_experts_intermediate_size=24, index_n_heads=4, index_head_dim=16, index_topk=8, sliding_window=16,
            layer_types=["indexed_attention"] * 2 + ["sliding_attention"] * 2,
            mlp_layer_types=["dense"] + ["sparse"] * 3, per_layer_config={"02": LOCAL, "03": LOCAL}, **GLOBAL,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
"""Layers 0 and 1 indexed (MLA of 4 heads), 2 and 3 sliding over 16 tokens (MLA of 2 heads, ranks 32 and 24, d_nope
24); layer 0 a dense MLP, the others an MoE of 4 experts, top 2, beside a shared MLP of 2 × 24: tests/hf_tiny.py's."""


LEGACY = {
    k: v for k, v in TINY.items() if k not in ("per_layer_config", "layer_types", "mlp_layer_types", "sliding_window")
} | dict(
    swa_num_attention_heads=2,
    swa_num_key_value_heads=2,
    swa_q_lora_rank=32,
    swa_kv_lora_rank=24,
    swa_qk_nope_head_dim=24,
    swa_head_dim=32,
    swa_v_head_dim=16,
    first_k_dense_replace=1,
    sliding_window_size=16,
)
"""TINY as an older config.json spells it (the released checkpoint's fields, which the class's __post_init__ reads)."""


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "dots3_note_text", "test"))


def test_a_tiny_dots3_note_by_hand():
    h = 64

    def mla(H: int, r_q: int, r_kv: int, nope: int, rope: int, v: int) -> int:
        # q_a and its norm, q_b; kv_a (latent and RoPE key) and the latent's norm, kv_b; o; the RoPE key's norm; g_proj
        return h * r_q + r_q + r_q * H * (nope + rope) + h * (r_kv + rope) + r_kv + r_kv * H * (nope + v) + H * v * h \
            + rope + h * H  # fmt: skip

    indexer = 48 * 4 * 16 + h * 16 + 2 * 16 + h * 4  # wq_b from the query latent, wk, k_norm (a LayerNorm), weights
    layers = 2 * (mla(4, 48, 32, 16, 8, 16) + indexer) + 2 * mla(2, 32, 24, 24, 8, 16) + 4 * 2 * h  # and two norms
    mlps = 3 * h * 96 + 3 * (4 * h + 4 * 3 * 32 * h + 3 * h * 2 * 24)  # dense; router, experts and the shared MLP
    total = 512 * h + layers + mlps + h + 512 * h  # embedding, final norm, untied head
    assert count_params(spec_of(TINY)).total == total == 253_616


def test_class_defaults_equal_transformers():
    # 13 indexed layers (0, 1 and every fourth from 5) of 128 heads, 33 sliding ones of 64 at ranks 1,024: counted on
    # the meta device by scripts/hf_coverage.py (docs/hf-types.md)
    assert count_params(spec_of({"model_type": "dots3_note_text"})).total == 279_551_718_016
    wrapper = {"model_type": "dots3_note", "text_config": {"model_type": "dots3_note_text"}}
    assert count_params(spec_of(wrapper)).total == 279_551_718_016
    published = {"model_type": "dots3_note", "num_hidden_layers": 6}  # its text model written at the top
    assert count_params(spec_of(published)).total == 32_797_700_736  # transformers' (below)


def test_the_attention_core_and_the_indexer_by_hand():
    spec, s = spec_of(TINY), 32
    full = forward_flops_per_token(spec, s, "full")
    # every key of every layer: the indexed layers' 4 heads at d_qk 24 and d_v 16, the sliding layers' 2 at 32 and 16
    assert full.attention_scores + full.attention_values == 2 * (2 * s * 4 * (24 + 16)) + 2 * (2 * s * 2 * (32 + 16))
    # the indexer, forward only, in the two indexed layers: its projections, and 4 heads of 16 (and their weights)
    # scoring every key
    assert full.indexer == 2 * (2 * (48 * 64 + 64 * 16 + 64 * 4) + s * 2 * 4 * (16 + 1)) == 26_112
    causal = forward_flops_per_token(spec, s, "causal")
    # query i reads min(i, 8) keys its indexer picks, (8·9/2 + 24·8)/32 = 7.125, and min(i, 16) in the window,
    # (16·17/2 + 16·16)/32 = 12.25
    assert causal.attention_scores == 2 * (2 * 7.125 * 4 * 24) + 2 * (2 * 12.25 * 2 * 32) == 5_872
    assert causal.attention_values == 2 * (2 * 7.125 * 4 * 16) + 2 * (2 * 12.25 * 2 * 16) == 3_392


def test_older_config_files_read_as_the_class_reads_them():
    # no per_layer_config, layer_types or mlp_layer_types: Dots3NoteTextConfig makes them from the swa_* fields,
    # first_k_dense_replace and sliding_window_size; use_dsa false turns the indexed layers into full ones
    assert count_params(spec_of(LEGACY)).total == 253_616
    no_dsa = spec_of(LEGACY | {"use_dsa": False})
    assert no_dsa.indexer is None and count_params(no_dsa).total == 253_616 - 2 * (48 * 4 * 16 + 64 * 16 + 32 + 64 * 4)


def test_layers_of_more_than_two_kinds_are_refused():
    odd = TINY | {"per_layer_config": {"02": LOCAL, "03": LOCAL | {"kv_lora_rank": 16}}}
    with pytest.raises(LmcalcError, match="every sliding_attention layer the same widths"):
        spec_of(odd)
    with pytest.raises(LmcalcError, match="both indexed_attention and full_attention"):
        spec_of(TINY | {"layer_types": ["indexed_attention", "full_attention"] + ["sliding_attention"] * 2})


def test_the_cache_equals_transformers(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    # 2 sequences of 7 tokens: an indexed layer keeps its latent (32), RoPE key (8) and indexer key (16) a token, a
    # sliding one its own latent (24) and RoPE key (8), all 7 within its window; fp32
    expected = 2 * 7 * (2 * (32 + 8 + 16) + 2 * (24 + 8)) * 4
    assert api.inference(model=str(path), context=7, batch=2, kv_dtype="fp32").memory.kv_cache == expected == 9_856


@pytest.mark.torch
def test_the_cache_and_older_files_equal_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_tiny import transformers_model

    with warnings.catch_warnings():  # fp32: its indexer keeps its keys in fp32 whatever the model's dtype
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY)).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, 512, (2, 7)), use_cache=True).cache
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in vars(layer).values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())  # fmt: skip
    assert held == 9_856
    published = {"model_type": "dots3_note", "num_hidden_layers": 6}  # Dots3NoteConfig with no text_config
    for config in (LEGACY, LEGACY | {"use_dsa": False}, LEGACY | {"use_sliding_window": False}, published):
        counted = sum(p.numel() for p in transformers_model(config).parameters())
        assert count_params(spec_of(config)).total == counted


@pytest.mark.torch
def test_class_defaults_cut_to_six_layers_equal_flop_counter_mode():
    transformers = pytest.importorskip("transformers")
    from hf_tiny import transformers_model

    from lmcalc import validate_hf

    # layers 0, 1 and 5 indexed, 2 to 4 sliding, at the full widths: 128 heads, 256 experts of 1,536 (grouped_mm)
    config = transformers.Dots3NoteTextConfig(num_hidden_layers=6).to_diff_dict()
    result = validate_hf.transformers_check(config, 64, 1, model=transformers_model(config))
    assert result.value("params.lmcalc") == result.value("params.pytorch") == 32_797_700_736
    assert result.value("flops.lmcalc") == result.value("flops.pytorch")


def test_every_estimate_takes_it(tmp_path):
    # training memory, LoRA and the planner since what its attention keeps for backward is counted (formulas §2.35;
    # against transformers: tests/test_dots3_note_memory.py); params, FLOPs and serving as before
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 253_616
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
    assert api.memory(model=str(path), seq=32).gpu.activations > 0
    assert api.memory(model=str(path), seq=32, method="lora").gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100", seq=32, global_batch=32 * 64, tokens=1e9).best is not None


def test_tensor_parallelism_must_split_the_sliding_window_layers_heads_too():
    # the tiny model's global layers have 4 heads, its sliding-window layers 2: TP 4 splits the one, not the other
    from lmcalc.engine.parallel.layout_checks import check_tp_heads

    spec = spec_of(TINY)
    check_tp_heads(spec, 2)
    with pytest.raises(LmcalcError, match="TP=4 does not divide the 2 heads of .* sliding-window layers"):
        check_tp_heads(spec, 4)
