"""Llama 3.2 Vision's text model (mllama's MllamaForCausalLM): cross-attention layers whose weights count and which
text alone never runs. By hand against the shapes of transformers 5.24's modeling_mllama.py
(MllamaCrossAttentionDecoderLayer, MllamaTextCrossAttention, MllamaTextModel); transformers' own counts and FLOPs are
tests/test_hf_types.py's and test_validate_hf.py's (tests/hf_tiny.py)."""

from __future__ import annotations

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import resolve_model
from lmcalc.specs import WIDTHS_COUNTED_ONLY, ModelSpec

LLAMA_31_8B = 8_030_261_248
"""Llama 3.1 8B's parameters: meta-llama/Llama-3.1-8B's safetensors total (its 32 layers, h 4,096, 8 KV heads,
f 14,336, V 128,256, untied)."""


def spec_of(text: dict) -> ModelSpec:
    config = {"model_type": "mllama", "text_config": {"model_type": "mllama_text_model", **text}}
    return ModelSpec.model_validate(model_from_hf_config(config, "mllama", "mllama config"))


def test_the_class_defaults_are_llama_31_8b_and_eight_idle_layers():
    # MllamaTextConfig's defaults: 40 layers, of which 3, 8, ..., 38 cross-attend; the other 32 are Llama 3.1 8B's.
    # A cross layer: q and o (h·h each), k and v (h·H_kv·d each), Q- and K-norms (d each), two gates (1 each), two
    # norms (h) and the MLP (3·h·f); the embedding has 8 rows more than the vocabulary
    spec = spec_of({})
    h, kv, d, f = 4096, 8 * 128, 128, 14336
    cross = 2 * h * h + 2 * h * kv + 2 * d + 2 + 2 * h + 3 * h * f
    counts = count_params(spec)
    assert spec.num_layers == 32 and counts.active == LLAMA_31_8B
    assert counts.total == LLAMA_31_8B + 8 * cross + 8 * h == 9_775_192_080


def test_text_computes_the_self_attention_layers_alone():
    # FLOPs of a text step: the 32 self-attention layers and the head, as Llama 3.1 8B's (lmcalc's preset, from Meta's
    # shapes); the idle layers none
    llama = resolve_model("llama-3.1-8b").spec
    assert forward_flops_per_token(spec_of({}), 8192) == forward_flops_per_token(llama, 8192)


def test_text_caches_the_self_attention_layers_alone():
    # no image: the cross-attention layers keep nothing; 32 layers of 2 × 8 × 128 × 2 bytes a token
    memory = inference_memory(Serving(spec_of({}), context=1000), 80e9)
    assert memory.kv_cache == 1000 * 32 * 2 * 8 * 128 * 2


def test_every_layer_cross_attending_is_refused():
    with pytest.raises(LmcalcError, match="no layer that attends to the text"):
        spec_of({"num_hidden_layers": 2, "cross_attention_layers": [0, 1]})


def test_training_memory_is_refused_in_one_line():
    # the cross-attention layers' weights are held and no text step updates them: what a trainer keeps for them is
    # not modelled yet, so training memory says so in one line
    with pytest.raises(LmcalcError, match="training memory, fine-tuning and step-time model") as refused:
        api.memory(model=spec_of({"num_hidden_layers": 5, "cross_attention_layers": [3]}), seq=64)
    assert WIDTHS_COUNTED_ONLY in str(refused.value) and "\n" not in str(refused.value)
