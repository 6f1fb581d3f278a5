"""The Llama-shaped model types lmcalc reads besides the first eight, against transformers itself: for each type
a small config is written out as config.json would hold it, once as transformers writes it and once without
``tie_word_embeddings`` (each config class's own default then applies), and lmcalc's count must equal the
parameters transformers builds from it on the meta device, exactly."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lmcalc.engine.params import count_params  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

BASE = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=352, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
TYPES = {
    "gemma": ("GemmaConfig", dict(head_dim=48)),
    "granite": ("GraniteConfig", {}),
    "smollm3": ("SmolLM3Config", {}),
    "phi3": ("Phi3Config", {}),
    "ernie4_5": ("Ernie4_5Config", {}),
    "ernie4_5-bias": ("Ernie4_5Config", dict(use_bias=True)),
}


def transformers_count(config: dict, class_name: str) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = getattr(transformers, class_name).from_dict(config)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(built)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("drop_tie", [False, True], ids=["as-written", "tie-absent"])
@pytest.mark.parametrize("kind", list(TYPES))
def test_parameters_equal_transformers(kind: str, drop_tie: bool):
    class_name, extra = TYPES[kind]
    config = getattr(transformers, class_name)(**BASE, **extra).to_dict()
    if drop_tie:
        config.pop("tie_word_embeddings", None)
    ours = ModelSpec.model_validate(model_from_hf_config(config, kind, kind))
    assert count_params(ours).total == transformers_count(config, class_name)


def test_phi3_fuses_its_projections():
    config = transformers.Phi3Config(**BASE).to_dict()
    assert ModelSpec.model_validate(model_from_hf_config(config, "phi3", "phi3")).fused_linears == ("qkv", "gate_up")
