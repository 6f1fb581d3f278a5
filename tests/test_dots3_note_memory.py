"""Training memory of dots.3 Note's attention (``engine.memory.dots_mla``): the terms derived by hand at
Dots3NoteTextConfig's defaults, then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s dots3-small and
dots3-wide, three layers: indexed and dense, sliding and MoE, indexed and MoE; built in bf16, which transformers
trains on the CPU, and one case in fp32): the bytes saved for backward within 5 % (the whole, a sliding layer, the
checkpointed forward and the rebuilt layer), eager and SDPA, the step's peak (``scripts/hf_step_peak.py``) within
3 %, with and without gradient checkpointing, fully trained and under PEFT's LoRA on every linear layer."""

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

from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.dots_mla import checkpoint_masks_kept, rope_key_norm_saved, rotary_tables
from lmcalc.engine.model.params import Dim

DEFAULTS = {"model_type": "dots3_note_text"}
"""Dots3NoteTextConfig's defaults: h 5,120; the indexed layers' MLA 128 heads, r_q 1,024, r_kv 512, keys 128 + 64
RoPE, values 128, an indexer of 64 heads of 128; the sliding layers' (swa_*) 64 heads, r_q 1,024, r_kv 1,024, keys
192 + 64 RoPE (head_dim 256 − 192), values 128; 256 experts of 1,536, top 8, one shared of 1,536."""

spec_of = partial(hf_spec, model_type="dots3_note_text")
workload = transformers_workload


def _bytes(tensors, *labels: str) -> int:
    return sum(t.bytes for t in tensors if t.label.startswith(labels))


def test_the_rope_key_norm_the_sliding_widths_and_the_tables_by_hand():
    # At the defaults, s = 4,096, b = 1, bf16 (2 B), eager attention.
    s = 4096
    w = workload(spec_of(DEFAULTS), s, 1)
    # k_rope_only_layernorm, an RMSNorm of d_rope = 64 written op by op: its fp32 copy of the input (4 B), 1/rms a
    # token (fp32), the normalised value before the weight (2 B)
    norm = s * 64 * 4 + s * 4 + s * 64 * 2
    assert norm == 1_589_248
    assert sum(t.bytes for t in rope_key_norm_saved(w, Dim(s, "s·b"))) == norm
    # a sliding layer at its own widths: Q and K at 64 heads of 192 + 64 = 256, V at 64 of 128; eager's scores over
    # 64 heads, the softmax in fp32 (4 B) and its cast (2 B): b·H_local·s²·6
    local = layer_saved_tensors(w, True, "local")
    assert _bytes(local, "Q (nope", "K (nope") == 2 * (s * 64 * 256 * 2) == 268_435_456
    assert _bytes(local, "V") == s * 64 * 128 * 2 == 67_108_864
    assert _bytes(local, "softmax output") == 64 * s * s * 6 == 6_442_450_944
    # its KV latent of 1,024 (the norm's fp32 copy, its normalised value, kv_b_proj's input) against the indexed
    # layers' 512
    assert _bytes(local, "KV latent norm input", "KV up-projection input") == s * 1024 * (4 + 2)
    assert _bytes(layer_saved_tensors(w, True, "global"), "KV latent norm input", "KV up-projection input") == (
        s * 512 * (4 + 2)
    )
    # the gate a head: σ(g_proj(x)), s·b·H, and the gated product, o_proj's input, s·b·H·d_v (the indexed layers)
    assert _bytes(layer_saved_tensors(w, True, "global"), "output gate", "output projection input (the gated") == (
        s * 128 * 2 + s * 128 * 128 * 2
    )
    # rotary tables, cos and sin of s·d_rope: the indexed layers' in fp32 (made from inputs_embeds.float()), the
    # sliding ones' in bf16
    assert sum(t.bytes for t in rotary_tables(w)) == 2 * s * 64 * 4 + 2 * s * 64 * 2 == 3_145_728
    # checkpointed with a fused kernel: the indexed layers' boolean causal mask, s², and the int64 position ids
    fused = workload(spec_of(DEFAULTS), s, 1, checkpointing=True, attention="flash")
    assert sum(t.bytes for t in checkpoint_masks_kept(fused)) == s * s + 8 * s == 16_809_984
    # in fp32 the norm's upcast is its input, a view of kv_a_proj_with_mqa's output: r_kv + d_rope a token, kept whole
    fp32 = workload(spec_of(DEFAULTS), s, 1, precision="fp32")
    assert sum(t.bytes for t in rope_key_norm_saved(fp32, Dim(s, "s·b"))) == s * (512 + 64) * 4 + s * 4 + s * 64 * 4


def test_under_lora_the_frozen_experts_and_the_indexer_keep_nothing_for_their_adapters():
    # PEFT adapts the shared expert's gate, up and down (nn.Linear) but not the 3-D routed experts: the tokens
    # gathered for them and their down projection's input go, though the shared expert's leaves are named alike;
    # the indexer runs under torch.no_grad, so its adapters keep no A·x
    s = 4096
    w = workload(spec_of(DEFAULTS), s, 1)
    lora = replace(w, method=Method("lora", 8, parse_targets("all-linear"), fp32_adapters=False))
    full, tuned = layer_saved_tensors(w, True, "global"), layer_saved_tensors(lora, True, "global")
    assert _bytes(full, "tokens gathered") == 8 * s * 5120 * 2
    assert _bytes(tuned, "tokens gathered") == 0
    assert not [t for t in tuned if t.label.startswith("indexer.")]
    assert _bytes(tuned, "shared_experts.gate adapter") == s * 8 * 2  # the shared expert's A·x stays


def test_memory_lora_and_plan_take_it_and_tp_cp_are_refused(tmp_path):
    # eight layers (three indexed, five sliding) of 16 experts, so that 8 H100s hold a plan
    small = {"num_hidden_layers": 8, "n_routed_experts": 16, "hidden_size": 2048, "num_attention_heads": 16,
             "num_key_value_heads": 16, "swa_num_attention_heads": 16, "swa_num_key_value_heads": 16}  # fmt: skip
    path, _ = takes_memory_lora_and_plan(tmp_path, "dots3_note_text", 4096, small)
    assert_refused_in_one_line(path, 4096, {"tp": "TP=2 would split", "cp": "CP=2 would split"})


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "dots3_note_text")  # scripts/hf_saved.py's cases, read as lmcalc reads them


def test_a_checkpointed_wide_step_s_moments_by_hand():
    # dots3-wide at s = 256, b = 2 (t = 512 tokens, bf16; h 512, the indexed layers 8 heads, keys 16 + 16, r_kv 32;
    # 4 experts of 256, top 2, one shared of 256), checkpointed, eager
    from lmcalc.engine.memory.indexer_moment import adapted_output_gradient, mla_indexer_locals, shared_expert_freed

    t, h = 512, 512
    full, lora = workload_of("dots3-wide", 256, 2, True, "eager", False), workload_of("dots3-wide", 256, 2, True,
                                                                                      "eager", True)  # fmt: skip
    # the MoE combine's backward: its three fp32 k·t·h gradients (the rebuilt expert outputs freed before their
    # gradient's cast back), the layer output's gradient, less the shared expert's four f_s-wide tensors and its
    # input, freed by its backward, which runs first and leaves its input's gradient (t·h·2) for the routed part
    freed = 4 * t * 256 * 2 + t * h * 2 - t * h * 2
    assert shared_expert_freed(full, layer_saved_tensors(full, True)) == freed == 1_048_576
    gpu = gpu_memory(full, Layout(), 0)
    assert gpu.transients.layer == 2 * t * h * 3 * 4 - freed + t * h * 2
    # the rebuilt indexed layer's forward at its indexer's scores: q_b's output (H·32), Q's RoPE output cast back
    # (H·16), kv_b's key half (H·16), kv_a's output (32 + 16) and K's RoPE output (16); under LoRA, the shared
    # expert's scaled adapter output's gradient beside the layer output's
    assert mla_indexer_locals(full, layer_saved_tensors(full, True), 1) == t * (8 * (32 + 16 + 16) + 48 + 16) * 2
    assert adapted_output_gradient(lora, True) == t * h * 2 == 524_288 and adapted_output_gradient(full, True) == 0


B16 = torch.bfloat16
SAVED = [("dots3-small", "eager", 256, 2, ck, False, B16) for ck in (False, True)]
SAVED += [("dots3-small", "eager", 128, 1, False, False, B16), ("dots3-small", "sdpa", 256, 2, True, False, B16),
          ("dots3-small", "eager", 256, 2, False, True, B16), ("dots3-small", "eager", 256, 2, False, False,
                                                                torch.float32)]  # fmt: skip
"""One sequence (eager attention's V a view of kv_b_proj's output) and two; SDPA checkpointed (the indexed layers'
boolean mask kept for the rebuild); PEFT's LoRA (the routed experts frozen, the indexer's adapters under no_grad);
fp32 (the RoPE key norm's input a view of the KV latent, the router's upcast the norm's output itself)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, attention, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, attention, seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, attention, lora, dtype == torch.float32)
    acts = stage_activations(w, Layout(), 0)
    # without checkpointing the sliding MoE layer 1 too (not under LoRA: the lowest keeps less, counted outside)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, True, "local"))
    assert_saved_match(m, acts, checkpointing, layer)


PEAKS = [("dots3-wide", True, True), ("dots3-wide", True, False)]
"""dots3-wide checkpointed: fully trained, the rebuilt top layer's MoE combine backward binds (26,507,288 B measured,
lmcalc +0.02 %), the shared expert's tensors and input freed by its backward, which runs first, its input's gradient
left (1,048,576 B net), the rebuilt expert outputs freed before their gradient's cast back (1,048,576 B); under
LoRA the rebuilt indexed layer's scores (26,036,232 B, lmcalc -1.2 %), beside MLA's forward locals and the gradient
of the shared expert's scaled adapter output. dots3-small (its indexer's scores bind: -1.1 %) by hf_step_peak.py
alone."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2, eager: dots3-wide peaks at a layer's backward (the MoE combine). Each model is built afresh: one
    # a checkpointed measurement ran is otherwise reused
    assert_eager_step_peak("dots3_note_text", name, checkpointing, lora)
