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
from lmcalc.specs import ModelSpec

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


CROSS_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 2 + 2 * 4096 + 3 * 4096 * 14336  # 218,112,258
"""One cross-attention layer's parameters at the class defaults (test_the_class_defaults_are_llama_31_8b_...)."""


def test_a_text_step_trains_what_it_computes():
    # Full training under transformers, bf16 weights and AdamW's two bf16 moments (bf16-pure). Every weight is held:
    # 9,775,192,080 × 2 B = 19,550,384,160 B. Autograd makes a gradient for what the step computed alone: the 8 idle
    # layers' 8 × 218,112,258 = 1,744,898,064 weights get none, the embedding's 8 extra rows get theirs (they are rows
    # of its one weight), so (9,775,192,080 − 1,744,898,064) × 2 B = 8,030,294,016 × 2 B = 16,060,588,032 B; AdamW
    # makes states only for a gradient: 8,030,294,016 × 4 B = 32,121,176,064 B (tests/test_mllama_memory.py checks
    # the same on a real step of a small model, to the byte)
    spec = spec_of({})
    kept = api.memory(model=spec, seq=2048, gpus="1xH200", framework="transformers", precision="bf16-pure").gpu.kept
    computed = 9_775_192_080 - 8 * CROSS_LAYER
    assert computed == LLAMA_31_8B + 8 * 4096
    assert kept.params == 9_775_192_080 * 2 == 19_550_384_160
    assert kept.grads == computed * 2 == 16_060_588_032
    assert kept.optimizer == computed * 4 == 32_121_176_064


def test_megatrons_buffers_hold_every_weights_gradient():
    # Megatron's contiguous gradient buffer and its optimizer cover every parameter that requires a gradient, run or
    # not (grads_lifetime: run): 9,775,192,080 × 4 B of fp32 gradients
    w = api.memory(model=spec_of({}), seq=2048, gpus="1xH200", framework="megatron", precision="bf16-pure")
    assert w.gpu.kept.grads == 9_775_192_080 * 4


def test_lora_adapters_on_the_idle_layers_are_held_without_gradients():
    # LoRA r 16 on every linear layer (lmcalc's default, PEFT's all-linear): a layer's adapters r·(in + out) each,
    # q and o 16 × 8,192, k and v 16 × 5,120, gate, up and down 16 × 18,432: 1,310,720 a layer. PEFT adapts the cross
    # layers' projections too (40 layers, 52,428,800 held), and a text step trains the 32 others' (41,943,040):
    # gradients 41,943,040 × 2 B = 83,886,080 B under bf16-mixed, whose fp32 copy of every adapter is held
    per_layer = 16 * (2 * 8192 + 2 * 5120 + 3 * 18432)
    estimate = api.memory(model=spec_of({}), seq=2048, gpus="1xRTX4090", method="lora")
    assert per_layer == 1_310_720
    assert estimate.gpu.kept.grads == 32 * per_layer * 2 == 83_886_080
    assert estimate.gpu.kept.master == 40 * per_layer * 4 == 209_715_200
    assert any("a step of text alone" in note for note in estimate.report.notes)


def test_the_optimizer_step_reads_only_what_a_text_step_trains():
    # The optimizer's step is timed as memory traffic over the states it updates (formulas §8.12): per parameter the
    # gradient read twice (the clip's norm, then the step), the master weights and AdamW's states read and written,
    # the weights written. Under transformers the 1,744,898,064 idle weights have no gradient and no state, so the
    # step covers 8,030,294,016 parameters; under Megatron, whose buffers cover every parameter, all 9,775,192,080
    from lmcalc.engine.parallel.layout import Layout
    from lmcalc.engine.parallel.pipeline import stage_layers
    from lmcalc.engine.parallel.sharding import states_workload
    from lmcalc.engine.time import rates
    from lmcalc.engine.time.state_traffic import FOREACH_PASSES, state_traffic

    def seconds(framework: str, params: int) -> tuple[float, float]:
        estimate = api.memory(model=spec_of({}), seq=2048, gpus="1xH200", framework=framework, precision="bf16-pure")
        w, layout, machine = estimate.workload, Layout(), rates.Machine(estimate.cluster)
        timed = state_traffic(states_workload(w), layout.state_shards, 1, stage_layers(w.model, layout, 0), machine)
        states = 2 * w.precision.optimizer_state_bytes  # AdamW's two moments
        per_param = 2 * w.grad_bytes + 2 * (w.precision.master_bytes + states) + w.precision.param_bytes
        passes = FOREACH_PASSES if w.framework.optimizer_step.temporaries == "foreach" else 1
        by_hand = rates.memory_seconds(machine.hardware, params * per_param * passes, 4 * passes, machine.calibration)
        return timed.optimizer, by_hand

    timed, by_hand = seconds("transformers", 9_775_192_080 - 8 * CROSS_LAYER)
    assert timed == pytest.approx(by_hand, rel=1e-12)
    timed, by_hand = seconds("megatron", 9_775_192_080)
    assert timed == pytest.approx(by_hand, rel=1e-12)
