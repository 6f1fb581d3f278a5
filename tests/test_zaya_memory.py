"""Training memory of ZAYA's layer (``engine.memory.cca``): its terms derived by hand at ZayaConfig's defaults
(ZAYA1-8B's shape), then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s zaya-small, zaya-mha and
zaya-wide, two layers, built in bf16, which transformers trains on the CPU): the bytes saved for backward within 5 %
(the whole, a layer above the lowest, the checkpointed forward and the rebuilt layer), with eager attention and SDPA,
and the step's peak (``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, fully trained
and under PEFT's LoRA on every linear layer (the router's four included)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from saved_compare import assert_eager_step_peak, hf_spec, transformers_workload

from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.cca import (
    cca_attention_saved,
    cca_checkpoint,
    mlp_router_saved,
    residual_scaling_saved,
)
from lmcalc.engine.workload import Workload

DEFAULTS = {"model_type": "zaya"}  # ZayaConfig's defaults: h 2048, 8 heads and 2 KV heads of 128, r 256, 16 experts


spec_of = partial(hf_spec, model_type="zaya")
workload = transformers_workload


def total(tensors) -> float:
    return sum(t.bytes for t in tensors)


def test_a_zaya_layer_by_hand():
    # ZayaConfig's defaults at s = 4,096, b = 1, bf16 (2 B): H 8, H_kv 2, d 128, so C = (8 + 2)·128 = 1,280 channels
    # of q‖k; convolutions of t0 = t1 = 2 taps. The depthwise convolution keeps q‖k padded by t0 + t1 − 2 = 2 on the
    # left (1,280 × 4,098), the grouped one the depthwise's s + t1 − 1 outputs (1,280 × 4,097); v_proj_delayed one
    # zero token (h). The L2 norms keep Q (s·H·d) and K (s·H_kv·d) and three values a head and token each (‖x‖, its
    # reciprocal, √d/‖x‖); the key scale the normalised K.
    s, h, H, Hkv, d, C = 4096, 2048, 8, 2, 128, 1280
    convs = 2 * (C * (s + 2) + C * (s + 1))
    norms = 2 * (s * H * d + 3 * s * H + s * Hkv * d + 3 * s * Hkv + s * Hkv * d)
    assert convs + 2 * h + norms == 20_979_200 + 4_096 + 12_828_672
    w = workload(spec_of(DEFAULTS), s, 1)
    assert total(cca_attention_saved(w)) == 33_811_968
    # each residual scaling keeps its branch plus bias (bf16) and the fp32 stream plus bias: 2 × s·h·(2 + 4)
    assert total(residual_scaling_saved(w, "attention") + residual_scaling_saved(w, "mlp")) == 2 * s * h * 6
    # the router, r = 256: the previous layer's state (s·r), its RMSNorm written in fp32 (an fp32 copy, 1/rms, the
    # normalised value), the inputs of fc1, both GELUs, fc2 and the output layer (5·s·r), the softmax over 17
    # classes, the gather's int64 index and masked_fill's booleans (9 B a token), three int64 row indices and the
    # weight a pick (26 B), the 16 experts' int32 offsets
    r = 256
    router = 2 * s * r + (4 * s * r + 4 * s + 2 * s * r) + 2 * 5 * s * r + 2 * s * 17 + 9 * s + 26 * s + 16 * 4
    assert router == 19_173_440
    assert total(mlp_router_saved(w)) == router
    # full recomputation keeps each layer's fp32 input and the router state: s·(4h + 2r)
    assert cca_checkpoint(w).bytes == s * (4 * h + 2 * r) == 35_651_584
    # in fp32 the stream's and the branch's sums are both 4 B
    fp32 = workload(spec_of(DEFAULTS), s, 1, precision="fp32")
    assert total(residual_scaling_saved(fp32, "mlp")) == s * h * 8


def test_lora_frozen_scales_keep_nothing():
    # under LoRA the residual scales, the key scale and the router state's scale are frozen: their products keep
    # nothing for them; the convolutions keep their inputs (convolution_backward keeps them for either gradient)
    w = workload(spec_of(DEFAULTS), 4096, 1)
    lora = replace(w, method=Method("lora", 8, parse_targets("all-linear"), fp32_adapters=False))
    kept = {t.label for t in _layer(lora)}
    assert not any("residual scale" in label or "key scale" in label or "router state" in label for label in kept)
    assert {t.label for t in cca_attention_saved(w)[:2]} <= kept


ZAYA_WIDE = {"model_type": "zaya", "vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
             "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "num_experts": 4,
             "moe_intermediate_size": 512, "router_hidden_size": 128, "tie_word_embeddings": False}  # fmt: skip
"""scripts/hf_saved.py's zaya-wide, written out: h 512, 8 heads of 64 over 2 KV heads, 4 experts of 512 top 1, a
router of 128, V 256, two layers."""


def test_a_rebuilt_zaya_layer_peaks_at_its_forwards_end_by_hand():
    # zaya-wide checkpointed at s = 256, b = 2 (t = 512 tokens, h 512, bf16): the top layer, rebuilt inside the
    # backward of its output, peaks in its MLP's residual scaling, every tensor it keeps made. Beside them: the fp32
    # stream between the halves (the scaling's residual, t·h·4), the MLP's output and its scaled product (2·t·h·2),
    # and the output's gradient, fp32 with its bf16 cast for the MLP's branch (t·h·(4 + 2))
    from lmcalc.engine.memory.gpu_memory import gpu_memory
    from lmcalc.engine.memory.phases import step_phases
    from lmcalc.engine.parallel.layout import Layout

    t, h = 512, 512
    forward_end, output_gradient = t * h * (4 + 2 + 2), t * h * (4 + 2)
    assert (forward_end, output_gradient) == (2_097_152, 1_572_864)
    gpu = gpu_memory(workload(spec_of(ZAYA_WIDE), 256, 2, checkpointing=True), Layout(), 0)
    held = gpu.held
    phases = step_phases(held, gpu.transients, gpu.kept.step_transient)
    assert phases.layer_forward == held.total - held.head + held.rebuilt + forward_end + output_gradient
    # its backward then frees the MLP scaling's sums (the branch's plus its bias in bf16, the stream's plus its bias
    # in fp32: t·h·(2 + 4)) before the MoE combine's backward, which holds three fp32 gradients a token's one pick
    # (t·h·3·4; the rebuilt expert outputs are freed before their gradient's cast back) beside the output's fp32
    # gradient (t·h·4): the forward's end binds
    mlp_scaling = t * h * (2 + 4)
    assert gpu.transients.layer == t * h * 3 * 4 + t * h * 4 - mlp_scaling == 2_621_440
    assert phases.binding.startswith("a layer's forward") and phases.busiest == 28_948_496  # transformers: 28,938,264
    # under LoRA the scales are frozen and their products keep no sums, but the rebuild stops as the stream's product
    # packs its scale, the stream plus its bias (fp32, t·h·4) just made: the forward's end binds there too
    full = workload(spec_of(ZAYA_WIDE), 256, 2, checkpointing=True)
    frozen = gpu_memory(replace(full, method=Method("lora", 8, parse_targets("all-linear"))), Layout(), 0)
    assert frozen.transients.forward == forward_end + t * h * 4 == 3_145_728
    lora_phases = step_phases(frozen.held, frozen.transients, frozen.kept.step_transient)
    assert lora_phases.binding.startswith("a layer's forward")  # transformers: 24,555,576 B there (lmcalc -2.09 %)


def _layer(w: Workload):
    from lmcalc.engine.memory.activations import layer_saved_tensors

    return layer_saved_tensors(w, True)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.memory.gpu_memory import stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "zaya")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [("zaya-small", "eager", 128, 1, ck, False) for ck in (False, True)]
SAVED += [("zaya-small", "eager", 256, 2, ck, lora) for ck in (False, True) for lora in (False, True)]
SAVED += [("zaya-mha", "eager", 128, 1, False, False), ("zaya-small", "sdpa", 256, 2, False, False),
          ("zaya-mha", "sdpa", 256, 2, True, False), ("zaya-wide", "eager", 256, 2, True, True)]  # fmt: skip
"""zaya-small: GQA 4/2, convolutions of 2 taps; zaya-mha: every head its own KV head, convolutions of 3 and 4 taps;
zaya-wide: h 512. SDPA on the CPU runs its flash kernel (no mask: causal), which keeps its output and log-sum-exp."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch", "checkpointing", "lora"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, attention, seq, batch, checkpointing, lora):  # noqa: PLR0913
    m = hf_saved.measure(name, attention, seq, batch, checkpointing, use_cache=False, lora=LORA if lora else None)
    w = workload_of(name, seq, batch, checkpointing, attention, lora)
    acts = stage_activations(w, Layout(), 0)
    # without checkpointing a layer above the lowest too (the lowest has no router state from a layer before)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, True))
    assert_saved_match(m, acts, checkpointing, layer)


PEAKS = [pytest.param("zaya-small", False, False), pytest.param("zaya-small", True, True)]
PEAKS += [pytest.param("zaya-wide", ck, lora) for ck, lora in ((False, False), (False, True), (True, True))]
PEAKS += [pytest.param("zaya-wide", True, False)]  # the end of the last layer's rebuilt forward binds (by hand above)


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2, eager: zaya-small's vocabulary binds at the loss's backward, zaya-wide's final norm or, checkpointed,
    # the end of the last layer's rebuilt forward. Each model is built afresh: one a checkpointed measurement ran is
    # otherwise reused
    assert_eager_step_peak("zaya", name, checkpointing, lora)
