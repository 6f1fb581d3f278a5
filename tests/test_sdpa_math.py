"""PyTorch's math path for SDPA (engine.memory.sdpa_math), derived by hand at the small shapes that
tests/test_framework_transformers.py measures on the CPU: Falcon-7B's one K/V head, which its own SDPA call passes
without enable_gqa, and GPTBigCode's attention dropout, which the CPU's flash kernel does not take.

Each layer's bytes are written out tensor by tensor from torch 2.13's _scaled_dot_product_attention_math and the
model's code; the figures the harness measured (saved-tensor hooks, scripts/hf_saved.py) are quoted beside them. The
one difference is the LayerNorm statistics: PyTorch's CPU kernel keeps them in bf16, lmcalc in fp32 (the
profile's not_modelled), 2·s·b·2 bytes a norm."""

from __future__ import annotations

from dataclasses import replace

from saved_compare import hf_spec, transformers_workload

from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.sdpa_math import sdpa_math_path
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.presets import framework_profile, resolve_precision

FALCON_7B_SMALL = {
    "model_type": "falcon", "vocab_size": 2048, "num_hidden_layers": 2, "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "hidden_size": 128, "num_attention_heads": 4, "ffn_hidden_size": 512,
    "new_decoder_architecture": False, "multi_query": True, "attention_dropout": 0.0,
}  # fmt: skip
"""scripts/hf_saved.py's falcon-7b-small: h 128, 4 heads of 32, one K/V head, f 512, one LayerNorm, a parallel
block."""
GPT_BIGCODE_SMALL = {
    "model_type": "gpt_bigcode", "vocab_size": 2048, "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 1024,
}  # fmt: skip
"""scripts/hf_saved.py's gpt-bigcode-small: h 128, 4 heads, multi_query and 0.1 dropout everywhere (the defaults)."""
STATS_EXTRA = 2 * (4 - 2)  # a LayerNorm's two statistics a row: fp32 in lmcalc, bf16 on the CPU


def layer_bytes(w: Workload) -> float:
    return sum(t.bytes for t in layer_saved_tensors(w, False))


def cpu(w: Workload) -> Workload:
    """The step as the harness runs it on the CPU: SDPA with dropout on the math path, dropout masks in bf16."""
    profile = w.framework
    attention = profile.attention.model_copy(update={"dropout_math": True})
    bf16 = resolve_precision("bf16-pure").spec
    return replace(w, framework=profile.model_copy(update={"attention": attention}),
                   mask_bytes=dropout_mask_bytes("cpu", bf16))  # fmt: skip


def test_falcon_7b_one_kv_head_runs_the_math_path():
    spec = hf_spec(FALCON_7B_SMALL, "falcon")
    assert spec.sdpa_broadcast_kv and spec.kv_heads == 1
    w = transformers_workload(spec, 256, 2, attention="flash")
    assert sdpa_math_path(w)
    # s 256, b 2: s·b = 512 rows, h 128, H·d 128, f 512; bf16 = 2 bytes, the math path's fp32 = 4
    #   the LayerNorm's input 512·128·2 = 131,072, its statistics 2·512·2 = 2,048 (bf16 on the CPU)
    #   its output, read by query_key_value and dense_h_to_4h:      131,072
    #   Q scaled, fp32, b·H·s·d = 2·4·256·32·4:                    262,144
    #   Kᵀ and V, fp32, broadcast to 4 heads (a copy: b = 2):  2 × 262,144 = 524,288
    #   softmax, fp32, b·H·s² = 2·4·256²·4:                      2,097,152
    #   dense's input (the output, bf16):                          131,072
    #   the GELU's input and dense_4h_to_h's, 512·512·2 each:  2 × 524,288 = 1,048,576
    #   = 4,327,424; measured 4,327,440 (and 2 int64 indices of the K/V slicing: 16)
    assert layer_bytes(w) == 4_327_424 + STATS_EXTRA * 512
    # s 128, b 1: one K/V head of one sequence broadcasts as a view, K and V stay one head wide (128·32·4 = 16,384)
    # 32,768 + 512 + 32,768 + 65,536 + 2 × 16,384 + 262,144 + 32,768 + 2 × 131,072 = 721,408; measured 721,424
    assert layer_bytes(transformers_workload(spec, 128, 1, attention="flash")) == 721_408 + STATS_EXTRA * 128


def test_falcon_math_path_is_the_models_own_call():
    # the 40B/180B layout broadcasts K and V to every head itself: the fused kernel takes them (falcon-small)
    new = hf_spec(FALCON_7B_SMALL | {"new_decoder_architecture": True, "num_kv_heads": 2}, "falcon")
    assert not new.sdpa_broadcast_kv and not sdpa_math_path(transformers_workload(new, 256, 2, attention="flash"))
    # eager attention is the model's own either way, and a profile without the rule counts the fused kernel
    spec = hf_spec(FALCON_7B_SMALL, "falcon")
    assert not sdpa_math_path(transformers_workload(spec, 256, 2, attention="eager"))
    flash = transformers_workload(spec, 256, 2, attention="flash")
    assert not sdpa_math_path(replace(flash, framework=framework_profile("idealised")))


def test_gpt_bigcode_dropout_runs_the_math_path_on_the_cpu():
    spec = hf_spec(GPT_BIGCODE_SMALL, "gpt_bigcode")
    gpu = transformers_workload(spec, 256, 2, attention="flash")
    assert spec.drops("attention") and not spec.sdpa_broadcast_kv  # transformers passes enable_gqa for its one head
    assert not sdpa_math_path(gpu)  # CUDA's flash kernel takes dropout and enable_gqa: the preset's rule
    w = cpu(gpu)
    assert sdpa_math_path(w)
    # s 256, b 2 (512 rows), h 128, H·d 128, f 512; bf16 2 bytes, fp32 4; the CPU's dropout masks in bf16
    #   seven s·b·h bf16 tensors of 131,072: ln_1's input, c_attn's input, c_proj's input, the residual dropout's
    #   mask after attention, ln_2's input, c_fc's input, the MLP's dropout mask:                    917,504
    #   the two LayerNorms' statistics (bf16 on the CPU): 2 × 2,048                                    4,096
    #   Q, K and V in fp32 at 4 heads (enable_gqa's repeat_interleave copies K and V): 3 × 262,144   786,432
    #   softmax, the dropout's mask (fp32: the CPU's mask takes its input's dtype) and its output,
    #   each b·H·s²·4 = 2,097,152:                                                                  6,291,456
    #   the GELU's input and c_proj's, 512·512·2 each:                                              1,048,576
    #   = 9,048,064; measured 9,048,064
    assert layer_bytes(w) == 9_048_064 + 2 * STATS_EXTRA * 512  # two LayerNorms
