"""Training memory of Inkling's text model (``engine.memory.branch_convs``): four fp32 branch convolutions a layer,
the relative logits' dense bias, per-head QK norms, a normed embedding, global scales and an fp32 router that scores
the shared experts. Derived by hand at InklingTextConfig's defaults, then against transformers 5.24 on the CPU
(``scripts/hf_saved.py``'s inkling-small and inkling-wide: a local layer with a dense SwiGLU, a global one with the
MoE; its own eager attention, the only one that adds the bias; built in bf16, which transformers trains on the CPU,
and once in fp32): the bytes saved for backward within 5 % (the whole, the checkpointed forward and the rebuilt
layer), the step's peak (``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, and under
PEFT's LoRA."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from saved_compare import (
    assert_eager_step_peak,
    assert_refused_in_one_line,
    hf_spec,
    takes_memory_lora_and_plan,
    transformers_workload,
)

from lmcalc.engine.finetune.method import Method, adapted_modules, parse_targets
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.gpu_memory import stage_activations
from lmcalc.engine.parallel.layout import Layout

DEFAULTS = {"model_type": "inkling_text"}  # 66 layers, every sixth global (11), the rest local (55); every MLP routed
spec_of = partial(hf_spec, model_type="inkling_text")
workload = partial(transformers_workload, attention="eager")  # the only attention transformers adds the bias in


def test_a_layer_of_each_kind_by_hand():
    # InklingTextConfig's defaults, s = 2,048, b = 1, bf16 (2 B), eager. h 6,144; 64 heads of d = 128 (H·d = 8,192);
    # a global layer's 8 KV heads (1,024 wide), a local one's 16 (2,048); d_rel 16 over 1,024 distances (global) or
    # the window's 512 (local); 256 experts of 3,072, k = 6, 2 shared experts scored beside them (n = 8 weights).
    s, h, H, Hd, d_rel, f, k, n_sh, E = 2048, 6144, 64, 8192, 16, 3072, 6, 2, 258
    sb, sbh, n = s, s * h, k + n_sh
    norm = 4 * sbh + 4 * sb + 2 * sbh  # an RMSNorm's fp32 copy, 1/rms and normalised value (for its weight)

    def attention(kv: int, extent: int) -> int:
        heads = kv // 128
        return (
            norm + 2 * sbh  # the input norm; Q, K, V and r_proj's input
            + (4 * sb * Hd + 4 * sb * H + 2 * sb * Hd) + (4 * sb * kv + 4 * sb * heads + 2 * sb * kv)  # QK norms
            + 3 * 2 * sb * Hd  # Q, and K and V repeated to the 64 heads
            + 4 * H * s * s + 2 * H * s * s  # the softmax in fp32 and cast
            + 2 * sb * Hd  # o_proj's input
            + 2 * 4 * sb * kv  # the K and V convolutions' fp32 inputs
            + 2 * sb * H * d_rel + 2 * H * s * extent + 8 * s * s + s * s  # relative states, logits, index, mask
            + 4 * sbh  # the attention-output convolution's fp32 input
        )  # fmt: skip

    router = (
        4 * sbh + 4 * E * h  # fp32 copies of the input and the weight
        + 4 * sb * E + 8 * sb * k  # the logits, the gather's index
        + 4 * 4 * sb * n + 4 * sb + 4 * sb * n  # logsigmoid's input, buffer, output, exp; logsumexp; × route_scale
        + 3 * 8 * sb * k + 2 * sb * k  # the experts' three index tensors, the weights
    )  # fmt: skip
    experts = 2 * k * sbh + 4 * 2 * k * sb * f + 2 * k * sbh  # gathered tokens; gate, up, SiLU, product; outputs
    shared = 5 * 2 * n_sh * sb * f + 2 * sb * n_sh  # gate, up, SiLU, product and its product with γ; γ
    mlp = norm + 2 * sbh + router + experts + shared + 4 * sbh  # the norm, its output, ..., the output convolution
    global_layer, local_layer = attention(1024, 1024) + mlp, attention(2048, 512) + mlp
    assert (global_layer, local_layer) == (3_277_185_024, 3_172_392_960)
    w = workload(spec_of(DEFAULTS), s, 1)
    for kind, expected in (("global", global_layer), ("local", local_layer)):
        assert sum(t.bytes for t in layer_saved_tensors(w, True, kind)) == expected
    # outside: ids and targets, the embedding's norm, the final norm, the head's input, the loss's fp32 logits; no
    # rotary tables (Inkling has no RoPE)
    V = 201_024
    outside = 16 * sb + norm + norm + 2 * sbh + 4 * sb * V
    total = 11 * global_layer + 55 * local_layer + outside  # the layers averaged over their kinds: to rounding
    assert stage_activations(w, Layout(), 0).total == pytest.approx(total, rel=1e-12)


def test_lora_keeps_nothing_for_the_frozen_scales_table_and_router():
    # under LoRA: the relative states (for the frozen table), the router's fp32 input (its frozen weight) and the
    # scaled weights (the frozen global scale) go, with the frozen norms' normalised values and the linear layers'
    # inputs kept for frozen weights; the routed and the shared experts are 3-D tensors PEFT does not adapt
    spec = spec_of(DEFAULTS)
    lora = Method("lora", 8, parse_targets("all-linear"), fp32_adapters=False)
    assert {m.group for m in adapted_modules(spec, lora)} == {"attention"}
    full = workload(spec, 2048, 1)
    labels = {t.label for t in layer_saved_tensors(replace(full, method=lora), True, "global")}
    dropped = {t.label for t in layer_saved_tensors(full, True, "global")} - labels
    assert {"relative states (r_proj output, for the table's gradient)", "router input (fp32 copy)",
            "weights times route_scale (fp32, for the global scale's gradient)"} <= dropped  # fmt: skip


def test_memory_lora_and_plan_take_it_and_tp_cp_are_refused(tmp_path):
    # four layers of the class's widths with 16 experts: full training fits 8 H100s
    path, best = takes_memory_lora_and_plan(tmp_path, "inkling_text", 2048,
                                            {"num_hidden_layers": 4, "n_routed_experts": 16})  # fmt: skip
    assert (best.layout.tp, best.layout.cp) == (1, 1)
    split = "would split .*'s branch convolutions and relative logits"
    assert_refused_in_one_line(path, 2048, {"tp": f"TP=2 {split}", "cp": f"CP=2 {split}"})


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

workload_of = partial(harness_workload, "inkling_text")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [
    ("inkling-small", 128, 1, False, False, torch.bfloat16),
    ("inkling-small", 128, 1, True, False, torch.bfloat16),
    ("inkling-small", 256, 2, False, True, torch.bfloat16),
    ("inkling-small", 256, 2, True, True, torch.bfloat16),
    ("inkling-small", 256, 2, True, False, torch.float32),
]
"""inkling-small's local layer attends over a window of 64 and its global layer's bias reaches 96 distances, both
shorter than the sequences; layer 1 is the global one with the MoE."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, "eager", lora, dtype == torch.float32)
    layer = None if checkpointing else sum(t.bytes for t in layer_saved_tensors(w, True, "global"))
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing, layer)


PEAKS = [("inkling-wide", True, False), ("inkling-wide", True, True)]
"""inkling-wide checkpointed: the rebuilt MoE layer's forward binds, at its shared experts' fp32 sum, inside the
MLP-output convolution's backward (inkling-small binds at the loss's, and the uncheckpointed wide steps at the final
norm's, all within 0.1 %: docs/memory-accuracy.md)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    assert_eager_step_peak("inkling_text", name, checkpointing, lora)
