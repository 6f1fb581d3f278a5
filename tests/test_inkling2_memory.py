"""Training memory of Inkling 2's text model (``engine.memory.inkling2``): block attention residuals over the blocks'
states, fp32 norms, scaled and clipped Q and relative states, dynamic K and V convolutions in the global layers, a
sink a head, a gated output, an fp32 router and softcapped experts. Derived by hand at Inkling2TextConfig's defaults,
then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s inkling2-small and inkling2-wide: a local layer
and a global one, both MoE; eager, the only attention Inkling 2 runs; bf16, and once fp32): the bytes saved for
backward within 5 % (the whole, the checkpointed forward and the rebuilt layer), the step's peak
(``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, and under PEFT's LoRA."""

from __future__ import annotations

import math
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

from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.gpu_memory import stage_activations
from lmcalc.engine.parallel.layout import Layout

DEFAULTS = {"model_type": "inkling2_text"}  # 48 layers, every sixth global (8), the rest local (40); all MoE
spec_of = partial(hf_spec, model_type="inkling2_text")
workload = partial(transformers_workload, attention="eager")  # Inkling 2 supports neither SDPA nor flash


def test_the_step_by_hand():
    # Inkling2TextConfig's defaults, s = 2,048, b = 1, bf16 (2 B), eager. h 4,608; 48 heads of d = 128 (H·d = 6,144)
    # over 8 KV heads in both kinds; d_rel 16 over 1,024 distances (global) or the window's 1,024 (local); K 4;
    # 384 experts of 2,304, k = 8; blocks of 6 layers; the head's 200,058 rows.
    s, h, H, d, kv, dr, E_rel, K, f, E, k = 2048, 4608, 48, 128, 8, 16, 1024, 4, 2304, 384, 8
    T, Hd, n = s, H * d, 6

    def residual(states: int, queries: int) -> int:  # fp32 stack, 1/rms, normalised stack, probabilities
        return 8 * T * states * h + 4 * T * states + 4 * T * queries * states

    def clip(width: int, logged: bool) -> int:  # scale copy, fp32 copy, scaled value, norm/reciprocal/clamp ×2
        return 4 * H * width + 2 * 4 * T * H * width + 16 * T * H + (4 * s if logged else 0)

    def layer(i: int) -> int:
        glob = (i + 1) % 6 == 0
        norms = 3 if glob else 1
        attention = residual(math.ceil(i / n) + 1, 3 if glob else 1) if i else 0
        attention += norms * (4 * T * h + 4 * T + 4 * T * h + 2 * T * h)  # fp32 input, 1/rms, normalised; output
        attention += clip(d, glob)  # Q
        attention += 2 * (2 * 4 * T * kv * d * K if glob else 4 * T * kv * d)  # K and V convolutions
        attention += 4 * T * kv * d + 16 * T * kv + 4 * T * kv * d + 4 * T * kv  # K's clip, V's norm
        attention += clip(dr, glob) + 2 * T * H * dr + 2 * H * s * E_rel + 8 * s * s + s * s  # relative bias
        attention += 2 * T * Hd + 2 * 2 * T * Hd  # Q, and K and V repeated to the 48 heads
        attention += 4 * H * s * (s + 1) + 2 * H * s * s  # the softmax with the sink (fp32), cast without it
        attention += 4 * T * Hd + 4 * T * Hd + 2 * T * Hd + 4 * T * h  # gate, fp32 output, product; convolution
        mlp = residual(i // n + 2, 1) + 4 * T * h + 4 * T + 4 * T * h  # the block residual, the norm
        mlp += 4 * T * h + 4 * T * E + 8 * T * k + 4 * T * (k + 1)  # the router
        mlp += 2 * k * T * h + 6 * 4 * k * T * f + 2 * k * T * f + 2 * k * T * h  # gathered, SwiGLU, down in, out
        mlp += 4 * k * T + 3 * 8 * k * T + 4 * E + 4 * T * h  # weights, indices, offsets; the convolution
        return attention + mlp

    layers = [layer(i) for i in range(48)]
    assert layers[:2] == [3_523_629_568, 3_674_657_280] and layers[5] == 3_980_907_008  # the first global one
    w = workload(spec_of(DEFAULTS), s, 1)
    for kind, ids in (("global", [i for i in range(48) if (i + 1) % 6 == 0]),
                      ("local", [i for i in range(48) if (i + 1) % 6])):  # fmt: skip
        assert sum(t.bytes for t in layer_saved_tensors(w, True, kind)) == pytest.approx(
            sum(layers[i] for i in ids) / len(ids), rel=1e-12
        )
    # outside: ids and targets, the embedding's norm, the final block residual over 9 states, the final norm, the
    # head's input, the fp32 soft-capped logits and the loss's; no rotary tables (no RoPE)
    V = 200_058
    outside = 16 * T + (8 * T * h + 4 * T) + residual(48 // n + 1, 1) + (8 * T * h + 4 * T) + 2 * T * h + 2 * 4 * T * V
    assert sum(layers) + outside == 207_654_330_368  # 193 GiB
    assert stage_activations(w, Layout(), 0).total == pytest.approx(sum(layers) + outside, rel=1e-12)


def test_lora_keeps_nothing_for_the_frozen_scales_table_router_and_experts():
    spec = spec_of(DEFAULTS)
    lora = Method("lora", 8, parse_targets("all-linear"), fp32_adapters=False)
    full = workload(spec, 2048, 1)
    labels = {t.label for t in layer_saved_tensors(replace(full, method=lora), True, "global")}
    dropped = {t.label for t in layer_saved_tensors(full, True, "global")} - labels
    assert {"Q clip input (fp32, for the scale's gradient)", "relative states (for the table's gradient)",
            "router input (fp32)", "tokens gathered for their experts", "MLP norm normalised value (fp32, before the "
            "weight)"} <= dropped  # fmt: skip
    assert "Q input norm output (Q, gate, sink, r_proj input)" in labels  # the adapters read it


def test_memory_lora_and_plan_take_it_and_tp_cp_are_refused(tmp_path):
    # six layers of the class's widths (the sixth global) with 16 experts
    path, best = takes_memory_lora_and_plan(tmp_path, "inkling2_text", 2048,
                                            {"num_hidden_layers": 6, "n_routed_experts": 16})  # fmt: skip
    assert (best.layout.tp, best.layout.cp) == (1, 1)
    assert_refused_in_one_line(path, 2048, {"tp": "TP=2 would split .*'s branch convolutions",
                                            "cp": "CP=2 would split .*'s branch convolutions"})  # fmt: skip


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

workload_of = partial(harness_workload, "inkling2_text")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [
    ("inkling2-small", 128, 1, False, False, torch.bfloat16),
    ("inkling2-small", 256, 2, False, True, torch.bfloat16),
    ("inkling2-small", 256, 2, True, False, torch.bfloat16),
    ("inkling2-small", 256, 2, True, True, torch.bfloat16),
    ("inkling2-small", 256, 2, False, False, torch.float32),
    ("inkling2-small", 256, 2, True, False, torch.float32),
    ("inkling2-wide", 256, 2, False, True, torch.bfloat16),
    ("inkling2-wide", 256, 2, True, False, torch.bfloat16),
]
"""inkling2-small's local layer attends over a window of 64 and its global layer's bias reaches 96 distances, both
shorter than the sequences; layer 1 is the global one. inkling2-wide opens a block at each layer."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    hf_saved.release_models()  # a checkpointed run leaves the embedding's output requiring gradients
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, "eager", lora, dtype == torch.float32)
    layer = None if checkpointing else sum(t.bytes for t in layer_saved_tensors(w, True, "global"))
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing, layer)


PEAKS = [
    ("inkling2-small", False, False),
    ("inkling2-small", True, False),
    ("inkling2-wide", False, False),
    ("inkling2-wide", False, True),
    ("inkling2-wide", True, False),
    ("inkling2-wide", True, True),
]
"""inkling2-wide binds in its top layer's backward, at its widest block residual's fp32 norm (-2.28 %, LoRA
-2.69 %), and checkpointed in the rebuilt top layer's forward, at the experts' fp32 combine (+0.01 %, LoRA -1.64 %);
inkling2-small at the loss's backward (+0.44 %), checkpointed at the rebuilt layer's combine (+0.04 %)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    assert_eager_step_peak("inkling2_text", name, checkpointing, lora)
