"""LFM2's gated short convolutions (transformers' Lfm2ShortConv), against transformers. The parameter count is exact
(tests/test_hf_types.py) and the bytes kept for backward are measured on a small real model
(tests/test_framework_transformers.py, lfm2-small: every layer within 0.01 %). Here: the FLOPs of a training step
equal FlopCounterMode's on transformers' PyTorch path, in full training and under LoRA, with the convolution's
padding stated; the same by hand; the state a sequence keeps at inference is the cache transformers allocates; and a
hybrid's layer rebuilt under full recomputation is its larger kind, not the average."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_tiny import cached_state_bytes, tiny_config  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcalc.engine.finetune.flops import method_step_flops  # noqa: E402
from lmcalc.engine.finetune.method import Method, adapter_tensors, parse_targets  # noqa: E402
from lmcalc.engine.inference.serving import state_bytes  # noqa: E402
from lmcalc.engine.model.mixer_flops import ssm_flops  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402
from lmcalc.validate_hf import convolution_backward_flops, transformers_check  # noqa: E402

pytestmark = pytest.mark.torch


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "lfm2", "lfm2"))


def test_the_tiny_model_has_both_kinds_of_layer():
    # tests/hf_tiny.py: four layers, the second attends; SwiGLU of int(2·96/3) = 64, × 1.3 = 83, rounded up to a
    # multiple of 32: 96; biases on the convolution and its projections (conv_bias)
    spec = spec_of(tiny_config("lfm2"))
    assert [spec.is_attention_layer(i) for i in range(4)] == [False, True, False, False]
    assert spec.ffn_size == 96 and spec.short_conv is not None and spec.short_conv.bias


@pytest.mark.parametrize(("kind", "seq", "batch"), [("lfm2", 7, 1), ("lfm2", 16, 2), ("lfm2", 100, 3), ("lfm3", 20, 1),
                                                     ("lfm3", 64, 2)])  # fmt: skip
def test_training_flops_equal_flopcountermode(kind: str, seq: int, batch: int):
    # LFM3: LFM2's convolutions, attention within a window and fully, a sigmoid gate a head from g_proj, sandwich norms
    result = transformers_check(tiny_config(kind), seq, batch)
    assert result.value("params.error") == 0
    assert abs(result.value("flops.error")) < 1e-12


def test_the_convolutions_forward_flops_by_hand():
    # beyond its projections a convolution layer convolves B·x over h = 64 channels with K = 3 taps: 2·64·3 a token,
    # whatever the length (its two gates are element-wise)
    spec = spec_of(tiny_config("lfm2"))
    assert ssm_flops(spec, 7) == ssm_flops(spec, 1000) == 2 * 64 * 3


def test_the_state_a_sequence_keeps_is_transformers_cache():
    # after a prefill, transformers' cache holds per convolution layer its last K = 3 inputs of B·x, h = 64 wide, in
    # the model's dtype (2 bytes): 3 layers × 64 × 3 × 2 B a sequence
    spec = spec_of(tiny_config("lfm2"))
    assert state_bytes(spec, 2) == 3 * 64 * 3 * 2
    assert cached_state_bytes("lfm2", [0, 2, 3], batch=2) == 2 * state_bytes(spec, 2)


LORA = ["all-linear", "q_proj,k_proj,v_proj,out_proj,in_proj,w1,w2,w3", "in_proj", "q_proj,v_proj"]


def counted(config: dict, targets: str | None, seq: int, batch: int, frozen_layers: int = 0) -> float:
    """FlopCounterMode's count of one forward and backward of a model of ``config`` (fp32, eager) with PEFT's LoRA
    adapters on ``targets``, or with its embedding and lowest ``frozen_layers`` layers frozen."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = transformers.AutoConfig.for_model(**config)
        model = transformers.AutoModelForCausalLM.from_config(built, attn_implementation="eager").float()
        if targets is None:
            model.get_input_embeddings().requires_grad_(False)
            for layer in model.model.layers[:frozen_layers]:
                layer.requires_grad_(False)
        else:
            modules = "all-linear" if targets == "all-linear" else targets.split(",")
            model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=modules))
    model.train()
    ids = torch.randint(0, config["vocab_size"], (batch, seq))
    corrected = {torch.ops.aten.convolution_backward: convolution_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=corrected) as counter:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("targets", LORA)
def test_lora_step_flops_equal_flopcountermode(targets: str):
    # a frozen convolution computes its input's gradient where its input projection's output needs one (an adapter
    # on in_proj, or a gradient from above), never its weight's; transformers' path convolves s + K − 1 positions:
    # 2·b·h·K·(K − 1) more a layer forward, as much again for the input's gradient where it is computed
    config, seq, batch = tiny_config("lfm2"), 32, 2
    spec = spec_of(config)
    method = Method("lora", 8, parse_targets(targets))
    ours = method_step_flops(spec, method, seq, "none", "full", batch).model * seq * batch
    pad = 2 * batch * 64 * 3 * 2
    # layer 0's input (the frozen embedding's) needs no gradient: its convolution's input needs one only through an
    # adapter on in_proj; layers 2 and 3 sit above a layer whose output needs a gradient
    first = pad * (2 if "in_proj" in targets or targets == "all-linear" else 1)
    assert ours + first + 2 * 2 * pad == pytest.approx(counted(config, targets, seq, batch), rel=1e-12)


@pytest.mark.parametrize("frozen", [1, 2])
def test_freeze_step_flops_equal_flopcountermode(frozen: int):
    # the lowest layers frozen (a ZeroDivisionError for any hybrid before): the frozen convolution of layer 0 runs
    # forward only; a trained one computes its weight's gradient and, above the lowest trained layer, its input's;
    # with transformers' padding, forward and each gradient 2·b·h·K·(K − 1) more a layer
    config, seq, batch = tiny_config("lfm2"), 32, 2
    spec = spec_of(config)
    ours = method_step_flops(spec, Method("freeze", freeze_layers=frozen), seq, "none", "full", batch).model
    pad = 2 * batch * 64 * 3 * 2
    # the convolution layers: 0 frozen (forward alone); 2 and 3 trained, forward and both gradients (above a trained
    # layer its input needs one; as the lowest trained layer its trained norm's weight does)
    passes = 1 + 3 + 3
    assert ours * seq * batch + passes * pad == pytest.approx(counted(config, None, seq, batch, frozen), rel=1e-12)


def test_pefts_out_proj_adapts_lfm2s_attention_output_too():
    # LFM2 names its attention's output projection out_proj, as its convolutions' (Lfm2Attention.out_proj): PEFT's
    # out_proj, LFM2's own recommended target, adapts both; by hand, r·(in + out) = 8·(64 + 64) in each of 4 layers
    spec = spec_of(tiny_config("lfm2"))
    tensors = adapter_tensors(spec, Method("lora", 8, parse_targets("out_proj")))
    assert sum(t.total for t in tensors) == 4 * 8 * (64 + 64)
    assert {t.name.split(".lora")[0] for t in tensors} == {"attn.o", "conv.out_proj"}


def test_a_hybrids_rebuilt_layer_is_its_larger_kind():
    # under full recomputation the backward rebuilds one layer at a time, each of its own kind: the peak holds the
    # larger of LFM2's attention layer (eager: its b·H·s² scores) and its convolution layer, never their average
    from lmcalc.engine.memory.activations import layer_saved_tensors
    from lmcalc.engine.memory.gpu_memory import stage_activations
    from lmcalc.engine.parallel.layout import Layout
    from lmcalc.engine.workload import Workload
    from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision

    spec = spec_of(tiny_config("lfm2"))
    precision, optimizer = resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec
    w = Workload(spec, precision, optimizer, 256, 2, "eager", "full", framework=framework_profile("transformers"))
    attention, conv = (sum(t.bytes for t in layer_saved_tensors(w, False, kind)) for kind in ("attention", "other"))
    average = sum(t.bytes for t in layer_saved_tensors(w, False))
    assert conv < average < attention
    assert average == pytest.approx((attention + 3 * conv) / 4)
    checkpoint_kept = stage_activations(w, Layout(), 0).rebuilt
    assert checkpoint_kept == pytest.approx(attention - 2 * 256 * 64, rel=0.01)  # less its checkpointed input


def test_lfm3s_layers_and_the_state_a_sequence_keeps():
    # tests/hf_tiny.py: convolutions in layers 0 and 2 (their last K = 7 inputs of B·x, 64 wide, 2 bytes each),
    # attention within the window in layer 1, fully in layer 3: q and o 64 × 64, k and v 32 × 64, QK-norms of 16,
    # and the gate's projection of h = 64 to H = 4
    spec = spec_of(tiny_config("lfm3"))
    assert [spec.is_attention_layer(i) for i in range(4)] == [False, True, False, True]
    assert [spec.is_local_layer(i) for i in (1, 3)] == [True, False]
    assert count_params(spec).by_group["attention"] == 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 16 + 64 * 4)
    assert state_bytes(spec, 2) == 2 * 64 * 7 * 2
    assert cached_state_bytes("lfm3", [0, 2], batch=2) == 2 * state_bytes(spec, 2)
