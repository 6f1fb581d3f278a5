"""Every model type lmcalc reads from config.json, against transformers itself: each type's tiny config
(tests/hf_tiny.py) is read by lmcalc, once as transformers writes it and once without ``tie_word_embeddings`` (each
config class's own default then applies), and lmcalc's count must equal the parameters transformers builds from it
on the meta device, exactly (issue #17's target: 0 parameters off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import MULTIMODAL, TINY, multimodal_config, multimodal_model, tiny_config, transformers_model  # noqa: E402

from lmcalc import api  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import LLAMA_LIKE, SUPPORTED, model_from_hf_config  # noqa: E402
from lmcalc.hf_layers import transformers_unused  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch


def lmcalc_spec(config: dict, kind: str) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, kind, f"{kind} config"))


def transformers_count(config: dict) -> int:
    return sum(p.numel() for p in transformers_model(config).parameters())


def test_every_supported_type_has_a_tiny_config():
    assert set(SUPPORTED) <= set(TINY)


@pytest.mark.parametrize("drop_tie", [False, True], ids=["as-written", "tie-absent"])
@pytest.mark.parametrize("kind", list(TINY))
def test_parameters_equal_transformers(kind: str, drop_tie: bool):
    config = tiny_config(kind)
    if drop_tie:
        config.pop("tie_word_embeddings", None)
    spec = lmcalc_spec(config, kind)  # LongCat-Flash: transformers also builds weights its model never reads
    apart = spec.vision_params or 0  # GIT's image encoder, counted beside its decoder
    assert count_params(spec).total + transformers_unused(spec) + apart == transformers_count(config)


def test_phi3_fuses_its_projections():
    assert lmcalc_spec(tiny_config("phi3"), "phi3").fused_linears == ("qkv", "gate_up")


def test_a_null_top_k_is_counted_and_what_needs_k_is_refused(tmp_path):
    # DeepseekV2Config's class default num_experts_per_tok is None: transformers builds the model (no tensor's
    # shape depends on k) but cannot route a token through it. lmcalc counts it and refuses the rest in one line.
    config = tiny_config("deepseek_v2") | {"num_experts_per_tok": None}
    counts = count_params(lmcalc_spec(config, "deepseek_v2"))
    assert counts.total == transformers_count(config) and counts.active is None
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    counted = api.params(model=str(path))
    assert counted.total == counts.total and counted.active is None
    assert "active" not in [t.key for section in counted.report.sections for t in section.terms]
    for estimate in (api.flops, api.memory):
        with pytest.raises(LmcalcError, match="num_experts_per_tok. is null"):
            estimate(model=str(path))


@pytest.mark.parametrize("kind", ["deepseek_v3", "deepseek_v32"])
def test_an_moe_config_whose_every_layer_is_dense_builds_no_experts(kind: str):
    # first_k_dense_replace at the layer count: transformers builds a dense MLP in every layer and no router; lmcalc
    # reads a dense model (it refused one with an MoE of no MoE layer before)
    config = tiny_config(kind) | {"first_k_dense_replace": 4, "mlp_layer_types": ["dense"] * 4}
    spec = lmcalc_spec(config, kind)
    assert spec.moe is None and count_params(spec).total == transformers_count(config)


def test_axk1_is_deepseek_v3_with_a_norm_on_each_moe_output():
    # A.X K1's one delta (AXK1MoE.post_mlp_layernorm): h per MoE layer over DeepSeek-V3 at the same shapes; at its class
    # defaults 60 MoE layers × 7,168
    config = tiny_config("axk1")
    v3 = tiny_config("deepseek_v3") | {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")}
    spec = lmcalc_spec(config, "axk1")
    assert spec.moe is not None and spec.moe.output_norm
    assert count_params(spec).total - transformers_count(v3) == spec.moe_layers * spec.hidden_size == 3 * 64
    defaults = lmcalc_spec(bare_config("axk1"), "axk1")
    assert defaults.moe_layers * defaults.hidden_size == 60 * 7168


def test_a_string_boolean_is_refused():
    config = tiny_config("llama") | {"tie_word_embeddings": "false"}  # "false" is a true string in Python
    with pytest.raises(LmcalcError, match="tie_word_embeddings must be true or false"):
        lmcalc_spec(config, "llama")


@pytest.mark.parametrize("kind", list(MULTIMODAL))
def test_multimodal_counts_the_text_model_and_reports_the_tower(kind: str):
    """A multimodal config is read as its text model, whose count equals transformers' text model; the vision
    tower and projector, reported apart, make up the rest of transformers' image-text model."""
    config = multimodal_config(kind)
    ours = lmcalc_spec(config, kind)
    text = count_params(ours).total
    assert text == transformers_count(config["text_config"] | {"tie_word_embeddings": config["tie_word_embeddings"]})
    whole = sum(p.numel() for p in multimodal_model(config).parameters())
    assert ours.vision_params == whole - text
    assert "vision tower" in ours.notes[0]


BUILD_FIELDS = {
    "dots1": {"n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6},
    "nemotron": {"num_key_value_heads": 8},
    "ministral": {"head_dim": 128},
    "hunyuan_v1_dense": {"head_dim": 128},
    "hunyuan_v1_moe": {"head_dim": 128},
    "dbrx": {"attn_config": {"rope_theta": 500000.0}},
    "lfm2_moe": {"layer_types": ["full_attention" if i % 4 == 3 else "conv" for i in range(32)]},
}
"""Dots1Config leaves its expert counts null, NemotronConfig its key-value heads, MinistralConfig and
the HunYuan configs their head_dim, DbrxConfig its attention's rope_theta, Lfm2MoeConfig its layer_types, and
transformers cannot build them without."""


WRAPPED = {"emu3_text_model": "Emu3Config", "mllama_text_model": "MllamaConfig"}
"""Text types transformers builds only under their wrapper's config (Emu3ForCausalLM from Emu3Config,
MllamaForCausalLM from MllamaConfig)."""


def bare_config(kind: str) -> dict:
    """``kind``'s class defaults as a config.json that leaves out every field lmcalc reads: model_type and the rest."""
    from transformers.models.auto import configuration_auto

    from lmcalc.hf_fields import READ_FIELDS

    built = BUILD_FIELDS.get(kind, {})  # what transformers needs to build the class defaults at all
    config = getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[kind])(**built).to_dict()
    return {key: value for key, value in config.items() if key not in READ_FIELDS or key in built}


@pytest.mark.parametrize("kind", [*SUPPORTED, "exaone", "internlm3", "iquestcoder", "sarvam_mla", "sarvam_moe"])
def test_a_field_config_json_leaves_out_takes_its_class_default(kind: str):
    # issue #31: a config.json without attention_bias builds gpt-oss with biases (GptOssConfig's default), one without
    # head_dim builds Qwen3 at 128, one without num_hidden_layers builds Llama with 32: lmcalc reads
    # lmcalc/hf_defaults.py, written from transformers' own classes. Here every field lmcalc reads is left out at once.
    config = bare_config(kind)
    assert "hidden_size" not in config and "vocab_size" not in config
    built = getattr(transformers, WRAPPED[kind])(text_config=config).to_dict() if kind in WRAPPED else config
    spec = lmcalc_spec(config, kind)
    apart = spec.vision_params or 0  # GIT's image encoder, counted beside its decoder
    assert count_params(spec).total + transformers_unused(spec) + apart == transformers_count(built)


def test_heads_that_do_not_tile_the_hidden_size_floor_the_head_dim():
    # issue #31: Glm4MoeConfig's own defaults, hidden 4096 and 96 heads without a head_dim, were refused; transformers'
    # attention takes 4096 // 96 = 42 (three layers here, on the meta device)
    config = transformers.Glm4MoeConfig(num_hidden_layers=3).to_dict()
    spec = lmcalc_spec(config, "glm4_moe")
    assert spec.head_dim == 42
    assert count_params(spec).total == transformers_count(config)


@pytest.mark.parametrize(
    ("kind", "renamed"),
    [
        ("exaone", {"num_hidden_layers": "num_layers", "hidden_act": "activation_function"}),
        ("internlm3", {"attention_bias": "qkv_bias", "mlp_bias": "bias"}),
        ("sarvam_moe", {"attention_bias": "use_qkv_bias", "n_shared_experts": "num_shared_experts"}),
    ],
)
def test_a_field_spelt_by_its_class_alias_is_read(kind: str, renamed: dict[str, str]):
    # issue #31: EXAONE 3's own config.json says num_layers and activation_function, which ExaoneConfig's attribute_map
    # reads as num_hidden_layers and hidden_act; lmcalc/hf_defaults.py's ATTRIBUTE_MAPS does the same
    config = tiny_config(kind) | {"num_hidden_layers": 3}
    config = {renamed.get(key, key): value for key, value in config.items()}
    assert count_params(lmcalc_spec(config, kind)).total == transformers_count(config)


def test_a_type_that_builds_another_types_model_is_read_as_that_type():
    # issue #31: transformers' causal-LM mapping gives exaone, internlm3 and iquestcoder LlamaForCausalLM itself,
    # sarvam_mla DeepseekV3ForCausalLM and sarvam_moe Glm4MoeForCausalLM
    from transformers.models.auto import configuration_auto, modeling_auto

    from lmcalc.hf_defaults import BUILDS_AS

    models, configs = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, configuration_auto.CONFIG_MAPPING_NAMES
    for kind, home in BUILDS_AS.items():
        assert models[kind] == models[home]
        assert getattr(transformers, models[kind]).config_class.__name__ == configs[home]
    assert {"exaone", "internlm3", "iquestcoder", "sarvam_mla", "sarvam_moe"} <= set(BUILDS_AS)


def test_the_class_defaults_are_what_the_installed_transformers_gives():
    # lmcalc/hf_defaults.py is data written by scripts/hf_class_defaults.py from transformers' configuration classes:
    # a type added to the reader without rewriting it reads a config.json without its class's defaults
    import hf_class_defaults

    written = (Path(__file__).resolve().parent.parent / "lmcalc" / "hf_defaults.py").read_text(encoding="utf-8")
    assert hf_class_defaults.source() == written, "run python scripts/hf_class_defaults.py"


@pytest.mark.slow
def test_no_decoder_only_type_is_counted_wrong():
    # issue #31's held-out measure (scripts/hf_coverage.py): every decoder-only type transformers registers, at its
    # class defaults and in a variant, written in full and as save_pretrained writes it. lmcalc may refuse a type it
    # cannot read; it must never give a count that differs from transformers'
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import hf_coverage

    cases = hf_coverage.run()
    assert len({case.kind for case in cases}) >= 160
    assert [case for case in cases if case.outcome == "off"] == []
    assert sum(case.outcome == "exact" for case in cases) >= 130
    # and docs/hf-types.md is what `hf_coverage.py --write` writes: its table, counts and generated prose (the part
    # written by hand, from hf_coverage.HAND_WRITTEN on, is kept as it is)
    page = Path(__file__).resolve().parent.parent / "docs" / "hf-types.md"
    assert hf_coverage.page(cases) == page.read_text(encoding="utf-8"), "run python scripts/hf_coverage.py --write"


@pytest.mark.parametrize("kind", ["cwm", "gemma2", "gemma3_text", "cohere2", "olmo3", "gpt_oss", "vaultgemma"])
def test_the_local_layers_are_those_transformers_gives_a_window(kind: str):
    # issue #31: Code World Model attends globally at layers 0, 4, 8, … (i a multiple of 4: global_from_first), Gemma 3
    # at 5, 11, … ((i + 1) a multiple of 6); each layer's attention module says which it is
    config = tiny_config(kind) | {"num_hidden_layers": 8}
    config.pop("layer_types", None)  # the class's own pattern, for 8 layers
    spec = lmcalc_spec(config, kind)
    windows = [layer.self_attn.sliding_window for layer in transformers_model(config).model.layers]
    assert [spec.is_local_layer(i) for i in range(8)] == [window is not None for window in windows]


def test_exaone4s_pattern_of_letters_gives_its_local_layers():
    # EXAONE 4.0's config.json spells its pattern "LLLG" (three local layers, then a global one); transformers needs
    # layer_types to build it, which the class writes as every fourth layer global
    config = transformers.Exaone4Config(**BASE_SMALL, sliding_window=24).to_dict()
    sliding = [layer.self_attn.is_sliding for layer in transformers_model(config).model.layers]  # Exaone4Attention
    config.pop("layer_types")
    spec = lmcalc_spec(config | {"sliding_window_pattern": "LLLG"}, "exaone4")
    assert [spec.is_local_layer(i) for i in range(8)] == sliding == [True, True, True, False] * 2
    with pytest.raises(LmcalcError, match='sliding_window_pattern must be an integer or "L"s and "G"s'):
        lmcalc_spec(config | {"sliding_window_pattern": "LXG"}, "exaone4")


BASE_SMALL = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=8,
                  intermediate_size=96)  # fmt: skip


@pytest.mark.parametrize("kind", [*(k for k in SUPPORTED if k in LLAMA_LIKE), "gpt_neox", "gpt_neox_japanese"])
def test_the_share_of_each_head_rope_rotates_is_the_classs(kind: str):
    # partial_rotary_factor decides what a Llama-template attention keeps (a partial RoPE's Q is a concatenation:
    # tests/test_framework_transformers.py). transformers 5 writes it in rope_parameters, older files beside it, and a
    # file with neither takes the class's default (hf_config.PARTIAL_ROTARY: GLM's 0.5, StableLM's 0.25, ...)
    config = bare_config(kind)
    rope = config.get("rope_parameters")
    # one a layer type (MiMo-V2-Flash's, ZAYA's): their common share (MiMo-V2-Flash's 0.334), else the whole head
    if isinstance(rope, dict) and rope and all(isinstance(r, dict) for r in rope.values()):
        factors = {(r or {}).get("partial_rotary_factor", 1.0) for r in rope.values()}
        rope = {"rope_type": "default", "partial_rotary_factor": factors.pop() if len(factors) == 1 else 1.0}
    factor = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) and "rope_type" in rope else 1.0
    absent = {k: v for k, v in config.items() if k not in ("rope_parameters", "partial_rotary_factor")}
    assert lmcalc_spec(config, kind).rotary_fraction == factor
    assert lmcalc_spec(absent, kind).rotary_fraction == factor
    older = absent | {"partial_rotary_factor": 0.5}
    # Dots3NoteTextConfig writes qk_rope_head_dim / head_dim over whatever share the file gives
    assert lmcalc_spec(older, kind).rotary_fraction == (factor if kind == "dots3_note_text" else 0.5)
    if kind == "gpt_neox":  # Pythia's config.json: rotary_pct, which GPTNeoXConfig reads as partial_rotary_factor
        assert (
            transformers.AutoConfig.for_model(**absent, rotary_pct=0.5).rope_parameters["partial_rotary_factor"] == 0.5
        )
        assert lmcalc_spec(absent | {"rotary_pct": 0.5}, kind).rotary_fraction == 0.5


@pytest.mark.parametrize(
    ("kind", "attends", "local"),
    [
        # ModernBertDecoderConfig: layer i full when i % 3 == 0, the others within local_attention / 2 = 64 tokens
        ("modernbert-decoder", list(range(22)), [i for i in range(22) if i % 3]),
        # BeamConfig: every sixth layer full, and the last; sliding in the others
        ("beam", list(range(52)), [i for i in range(52) if (i + 1) % 6 and i != 51]),
        # Lfm3Config: full in 2, 6, 10, …; sliding in 4, 8, …; a convolution in the others
        ("lfm3", [i for i in range(24) if i % 2 == 0 and i], [i for i in range(24) if i % 4 == 0 and i]),
        # LaraMiniConfig: linear, sliding, linear, full, sliding, repeated
        ("lara_mini", [i for i in range(34) if i % 5 in (1, 3, 4)], [i for i in range(34) if i % 5 in (1, 4)]),
    ],
)
def test_a_class_writes_its_own_layer_pattern_where_config_json_gives_none(kind: str, attends: list, local: list):
    # config.json without layer_types (nor sliding_window): the layers that attend and those within a window, as each
    # class's __post_init__ writes them (lmcalc/hf_config.py CLASS_LAYER_TYPES), by hand from its source
    spec = lmcalc_spec(bare_config(kind), kind)
    layers = range(spec.num_layers)
    assert [i for i in layers if spec.is_attention_layer(i)] == attends
    assert [i for i in layers if spec.is_attention_layer(i) and spec.is_local_layer(i)] == local


def test_modernberts_decoder_by_hand():
    # ModernBERT's decoder at tiny size: the embedding 512·64 (the decoder tied to it) and its bias-free LayerNorm 64;
    # per layer q, k, v and Wo 4·64², the MLP norm 64, Wi 64·2·96 (input and gate) and Wo 96·64; the attention norm
    # 64 in layers 1 and 2 only (layer 0's is an Identity: first_attention_norm); the final norm 64; the prediction
    # head's dense 64² and norm 64 (head_transform); the decoder's bias 512
    config = dict(model_type="modernbert-decoder", vocab_size=512, hidden_size=64, num_hidden_layers=3,
                  num_attention_heads=4, intermediate_size=96, max_position_embeddings=128)  # fmt: skip
    spec = lmcalc_spec(config, "modernbert-decoder")
    layer = 4 * 64 * 64 + 64 + 3 * 96 * 64
    assert count_params(spec).total == 512 * 64 + 64 + 3 * layer + 2 * 64 + 64 + 64 * 64 + 64 + 512
    assert count_params(spec).by_group["head_transform"] == 64 * 64 + 64
