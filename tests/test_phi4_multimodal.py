"""Phi-4-multimodal (issue #31): Phi-3's text model (fused qkv_proj and gate_up_proj) with its image and audio
encoders inside the causal LM, counted apart. The encoders by hand at transformers 5.24's class defaults; the text
model as every command reads it. The tiny config's count and FLOPs against transformers and FlopCounterMode run in
tests/test_hf_types.py and tests/test_validate_hf.py."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

DEFAULTS = {"model_type": "phi4_multimodal"}  # Phi4MultimodalConfig's defaults: Phi-4-multimodal-instruct's shape


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "phi4_multimodal", "test"))


def linear(inputs: int, outputs: int) -> int:
    return inputs * outputs + outputs  # every encoder matrix has a bias


def test_the_encoders_by_hand():
    T = 3072  # the text model's width, which both encoders project to
    # SigLIP at 448 pixels in patches of 14 (1,024 positions), 27 layers of 1,152 with an MLP of 4,304, its pooling
    # head; the global and sub-image separators; the projection 1,152 → 3,072 → 3,072
    v, fv = 1152, 4304
    layer = 2 * 2 * v + 4 * linear(v, v) + linear(v, fv) + linear(fv, v)
    siglip = 3 * 14 * 14 * v + v + 1024 * v + 27 * layer + 2 * v + (v + linear(v, 3 * v) + linear(v, v) + 2 * v
                                                                       + linear(v, fv) + linear(fv, v))  # fmt: skip
    image = siglip + 2 * v + linear(v, T) + linear(T, T)
    # the Conformer: NeMo's subsampling by 8 (a 3 × 3 convolution to 1,024 channels, then two depthwise 3 × 3 and
    # pointwise pairs, and 1,024 × 10 → 1,024), 2,000 relative-position buckets of 16 heads, 24 blocks of 1,024
    # (two macaron MLPs with a LayerNorm, h → 2 × 1,536 → h; attention; the convolution module: a LayerNorm, the GLU
    # pointwise convolution h → 2 × 1,024 and its two biases, depthwise 3 taps and pointwise, a last pointwise; two
    # LayerNorms); the speech and vision-speech projections 1,024 → 3,072 → 3,072
    a, fa, c = 1024, 1536, 1024
    subsampling = (9 * c + c) + 2 * (9 * c + c + linear(c, c)) + linear(c * 10, a)
    mlp = 2 * a + linear(a, 2 * fa) + linear(fa, a)
    conv = 2 * a + linear(a, 2 * 1024) + 2 * 1024 + (3 * a + a) + linear(a, 1024) + linear(a, 1024)
    block = 2 * mlp + 4 * linear(a, a) + conv + 2 * 2 * a
    audio = subsampling + 2000 * 16 + 24 * block + 2 * (linear(a, T) + linear(T, T))
    spec = spec_of(DEFAULTS)
    assert (image, audio) == (441_550_016, 466_432_256)  # transformers' modules on the meta device
    assert spec.vision_params == image + audio
    assert count_params(spec).total + image + audio == 5_308_268_992  # transformers' Phi4MultimodalForCausalLM
    assert "image and audio encoders and projections (907,982,272 parameters) are apart" in spec.notes[0]
    assert "all-linear" in spec.notes[0]  # what PEFT adapts beyond the text model (below)


def test_the_text_model_is_phi3s(tmp_path):
    spec = spec_of(DEFAULTS)
    assert spec.fused_linears == ("qkv", "gate_up")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    served = api.inference(model=str(path), context=4096).memory
    assert served.params == count_params(spec).total  # the weights a text model serves; the encoders apart


@pytest.mark.torch
@pytest.mark.parametrize("targets", ["qkv_proj", "qkv_proj,gate_up_proj,down_proj,o_proj", "all-linear"])
def test_lora_adapters_against_peft(targets):
    # the text model's own names (qkv_proj) give PEFT's count; names the encoders share, and all-linear, give PEFT
    # more: their linear layers too, which the note says lmcalc leaves out
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    sys.path.insert(0, str(Path(__file__).parent))
    from hf_tiny import tiny_config

    from lmcalc.engine.finetune.method import Method, adapter_tensors, parse_targets

    config = tiny_config("phi4_multimodal")
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        modules = "all-linear" if targets == "all-linear" else targets.split(",")
        trainable, _ = peft.get_peft_model(
            model, peft.LoraConfig(r=4, target_modules=modules)
        ).get_nb_trainable_parameters()
    ours = sum(t.total for t in adapter_tensors(spec_of(config), Method("lora", 4, parse_targets(targets))))
    assert ours == trainable if targets == "qkv_proj" else ours < trainable
