"""RWKV-4 (rwkv's RwkvForCausalLM): its parameters, FLOPs and state by hand against the shapes of transformers 5.24's
modeling_rwkv.py (RwkvSelfAttention, RwkvFeedForward, RwkvBlock, RwkvModel), and its state against what transformers
keeps. transformers' own counts and FLOPs are tests/test_hf_types.py's and test_validate_hf.py's (tests/hf_tiny.py).
What a layer keeps for backward by hand here; against transformers' CPU scan, tests/test_framework_transformers.py
(rwkv-small), tests/test_step_phases.py (rwkv-small, rwkv-wide) and tests/test_finetune_activations.py (LoRA)."""

from __future__ import annotations

import json

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

V, h, a, f, L = 512, 64, 48, 256, 4
CONFIG = {"model_type": "rwkv", "vocab_size": V, "hidden_size": h, "attention_hidden_size": a, "num_hidden_layers": L,
          "context_length": 128}  # fmt: skip


def spec_of(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config({**CONFIG, **fields}, "rwkv", "rwkv config"))


def test_parameters_by_hand():
    # a layer: the time mix's decay and bonus (a each), three token-shift coefficients (h each), r, k, v (h → a) and
    # the output (a → h); the channel mix's two coefficients (h each), its key (h → 4h), value (4h → h) and receptance
    # (h → h); two LayerNorms with biases (2·h each). Once: the embedding, layer 0's pre_ln and ln_out (2·h each), and
    # the untied head
    layer = 2 * a + 3 * h + 3 * h * a + a * h + 2 * h + h * f + f * h + h * h + 2 * 2 * h
    assert count_params(spec_of()).total == V * h + 2 * 2 * h + L * layer + V * h


def test_flops_are_the_matmuls():
    # the WKV recurrence is element-wise: a token's forward FLOPs are twice its matmul weights, and the head's
    s = 64
    fwd = forward_flops_per_token(spec_of(), s)
    per_layer = 3 * h * a + a * h + h * f + f * h + h * h
    assert fwd.total == 2 * L * per_layer + 2 * h * V
    assert fwd.attention_scores == fwd.ssm == 0


def test_state_by_hand():
    # five h-wide states a layer and sequence: two token shifts at the cache's bytes, WKV's three in fp32
    memory = inference_memory(Serving(spec_of(), context=1000, batch=3), 80e9)
    assert memory.kv_cache == 3 * L * h * (2 * 2 + 3 * 4)


@pytest.mark.torch
def test_state_is_what_transformers_keeps():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    config = {**CONFIG, "attention_hidden_size": h}  # transformers' state is h wide: its WKV must be too
    spec = spec_of(attention_hidden_size=h)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        with torch.no_grad():
            state = model.to(torch.bfloat16).eval()(torch.randint(3, V, (2, 7)), use_cache=True).state
    memory = inference_memory(Serving(spec, context=7, batch=2), 80e9)
    assert memory.kv_cache == sum(t.numel() * t.element_size() for t in state)


def test_serving_state_and_training_memory_take_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    assert api.flops(model=str(path), tokens=1e9, seq=64).model_flops > 0
    served = api.inference(model=str(path), context=64).report  # the state is a row of its own, with its formula
    assert served.value("kv_cache.state") == L * h * (2 * 2 + 3 * 4)
    full = api.memory(model=str(path), gpus="1xh100", seq=64, micro_batch=2)
    lora = api.memory(model=str(path), gpus="1xh100", seq=64, micro_batch=2, method="lora")
    assert 0 < lora.gpu.kept.optimizer < full.gpu.kept.optimizer and lora.gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xh100", seq=64, global_batch=8192, tokens=1e9).best is not None
    for degree, message in (({"tp": 2}, "TP=2 would split"), ({"cp": 2}, "CP=2 splits the sequence")):
        with pytest.raises(LmcalcError, match=message) as refused:
            api.memory(model=str(path), gpus="2xh100", seq=64, **degree)
        assert "\n" not in str(refused.value)


def test_the_wkv_scan_and_the_mixes_by_hand():
    # one layer at s = 128, b = 2 in bf16 (2 B), h 64, a 48, f 256, as rwkv_linear_attention_cpu runs it. Time mix:
    # the token-shifted input and the three mixes (4·s·b·h), the value and the receptance's sigmoid (2·s·b·a), each
    # of the 128 steps' 12 fp32 vectors of b·a (the key cast to fp32, k + u, two exponentials, the numerator and
    # denominator, the decayed maximum, the update's two exponentials and the three new states), the WKV output and
    # the gated product (2·s·b·a). Channel mix beyond its MLP: the shifted input, the two mixes, the sigmoid and the
    # MLP's output (5·s·b·h)
    from lmcalc.engine.memory.recurrent import rwkv_saved
    from lmcalc.engine.workload import Workload
    from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision

    w = Workload(spec_of(), resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, 128, 2, "eager",
                 "none", framework=framework_profile("transformers"))  # fmt: skip
    sb = 256
    expected = 4 * sb * h * 2 + 2 * sb * a * 2 + 12 * sb * a * 4 + 2 * sb * a * 2 + 5 * sb * h * 2
    assert sum(t.bytes for t in rwkv_saved(w)) == expected == 131_072 + 49_152 + 589_824 + 49_152 + 163_840
