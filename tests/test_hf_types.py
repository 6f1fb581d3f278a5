"""Every model type lmcalc reads from config.json, against transformers itself: each type's tiny config
(tests/hf_tiny.py) is read by lmcalc, once as transformers writes it and once without ``tie_word_embeddings`` (each
config class's own default then applies), and lmcalc's count must equal the parameters transformers builds from it
on the meta device, exactly (issue #17's target: 0 parameters off)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import MULTIMODAL, TINY, multimodal_config, multimodal_model, tiny_config, transformers_model  # noqa: E402

from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import SUPPORTED, model_from_hf_config  # noqa: E402
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
    assert count_params(lmcalc_spec(config, kind)).total == transformers_count(config)


def test_phi3_fuses_its_projections():
    assert lmcalc_spec(tiny_config("phi3"), "phi3").fused_linears == ("qkv", "gate_up")


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


def absent_cases() -> list[tuple[str, str]]:
    from lmcalc.hf_defaults import CLASS_DEFAULTS

    return [(kind, field) for kind, fields in CLASS_DEFAULTS.items() for field in fields]


@pytest.mark.parametrize(("kind", "field"), absent_cases())
def test_a_field_config_json_leaves_out_takes_its_class_default(kind: str, field: str):
    # issue #31: a config.json without attention_bias builds gpt-oss with biases (GptOssConfig's default), one without
    # head_dim builds Qwen3 at 128, ...: lmcalc reads lmcalc/hf_defaults.py, written from transformers' own classes
    from lmcalc.hf_defaults import CLASS_DEFAULTS

    config = tiny_config(kind)
    if field not in config:
        pytest.skip(f"the tiny {kind} config leaves {field} out already")
    config.pop(field)
    default = CLASS_DEFAULTS[kind][field]
    heads = config.get("num_attention_heads", 0)
    if field == "num_key_value_heads" and heads % default:
        pytest.skip(f"{kind}'s default {default} KV heads do not divide the tiny config's {heads} heads")
    assert count_params(lmcalc_spec(config, kind)).total == transformers_count(config)


def test_heads_that_do_not_tile_the_hidden_size_floor_the_head_dim():
    # issue #31: Glm4MoeConfig's own defaults, hidden 4096 and 96 heads without a head_dim, were refused; transformers'
    # attention takes 4096 // 96 = 42 (three layers here, on the meta device)
    config = transformers.Glm4MoeConfig(num_hidden_layers=3).to_dict()
    spec = lmcalc_spec(config, "glm4_moe")
    assert spec.head_dim == 42
    assert count_params(spec).total == transformers_count(config)
