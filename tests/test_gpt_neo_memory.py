"""GPT-Neo's attention as transformers 5.24 runs it (modeling_gpt_neo.py GPTNeoSelfAttention._attn), derived by hand
at the small shape tests/test_framework_transformers.py measures on the CPU (gpt-neo-small: h 128, 4 heads of 32,
f 512, a global layer then a local one of window 64, dropout 0.1 on the embedding and each sub-layer's output):

* Q and K are upcast to fp32 before their product, the softmax runs in fp32 and is cast back before the product
  with V (the model spec's ``eager_fp32_scores``, as GPT-J's);
* the local layers mask their window from a boolean buffer of their own (``GPTNeoSelfAttention.bias``), so the model
  makes one eager mask, the causal one, for every layer (``window_buffer``): under gradient checkpointing the
  layers' closures hold one [b, 1, s, s] mask, not one for each kind of layer.

The one difference from what transformers keeps is the LayerNorm statistics: the CPU's kernel keeps them in bf16,
lmcalc in fp32 (the profile's not_modelled)."""

from __future__ import annotations

from dataclasses import replace

from saved_compare import hf_spec, transformers_workload

from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.engine.workload import dropout_mask_bytes
from lmcalc.presets import resolve_precision

GPT_NEO_SMALL = {
    "model_type": "gpt_neo", "vocab_size": 2048, "hidden_size": 128, "num_heads": 4, "num_layers": 2,
    "attention_types": [[["global", "local"], 1]], "window_size": 64, "max_position_embeddings": 1024,
    "embed_dropout": 0.1, "resid_dropout": 0.1, "tie_word_embeddings": False,
}  # fmt: skip
"""scripts/hf_saved.py's gpt-neo-small."""
STATS_EXTRA = 2 * (4 - 2)  # a LayerNorm's two statistics a row: fp32 in lmcalc, bf16 on the CPU
CPU_MASK = dropout_mask_bytes("cpu", resolve_precision("bf16-pure").spec)  # PyTorch's CPU dropout: a bf16 mask


def test_gpt_neo_layer_by_hand():
    spec = hf_spec(GPT_NEO_SMALL, "gpt_neo")
    assert spec.eager_fp32_scores and spec.window_buffer
    w = replace(transformers_workload(spec, 256, 2), mask_bytes=CPU_MASK)
    # s 256, b 2: 512 rows, h 128 = H·d, f 512; bf16 2 bytes, fp32 4
    #   eight s·b·h bf16 tensors of 131,072: ln_1's input, the q/k/v input, V, out_proj's input, the residual
    #   dropout's mask after attention, ln_2's input, c_fc's input, the MLP's dropout mask:        1,048,576
    #   the two LayerNorms' statistics (bf16 on the CPU): 2 × 2,048                                    4,096
    #   Q and K in fp32: 2 × 512·128·4                                                              524,288
    #   the softmax in fp32, b·H·s²·4 = 2,097,152, and its bf16 cast, 1,048,576                   3,145,728
    #   gelu_new op by op (x, tanh, 0.5·x, 1 + tanh) and c_proj's input, 5 × 512·512·2            2,621,440
    #   = 7,344,128; measured 7,344,128 a layer, the global one and the local one alike
    for kind in ("global", "local"):
        assert sum(t.bytes for t in layer_saved_tensors(w, False, kind)) == 7_344_128 + 2 * STATS_EXTRA * 512


def test_gpt_neo_checkpoint_holds_one_mask():
    spec = hf_spec(GPT_NEO_SMALL, "gpt_neo")
    w = replace(transformers_workload(spec, 256, 2, checkpointing=True), mask_bytes=CPU_MASK)
    masks = [t for t in model_saved_tensors(w) if t.label.startswith("eager attention mask")]
    # one additive [b, 1, s, s] mask in bf16: 2 · 256² · 2 = 262,144 bytes; measured 262,144 in the closures
    assert [t.bytes for t in masks] == [262_144]
    # a model whose local layers take a mask of their own (window_buffer false) binds two
    two = replace(w, model=spec.model_copy(update={"window_buffer": False}))
    assert len([t for t in model_saved_tensors(two) if t.label.startswith("eager attention mask")]) == 2
