"""What DeepSeek-V3.2's attention (transformers 5.24's DeepseekV32Attention, and the types that share its MLA and
indexer: GLM-5's GlmMoeDsaAttention, A.X K2's AXK2Attention) holds as forward locals when its indexer scores the
keys, beyond what the layer keeps for backward and the indexer's own tensors (``phases.indexer_peak``).

The attention makes Q, K and V before it calls the indexer (under torch.no_grad), and its frame still holds: q_b's
output, of which the no-RoPE part of Q is a view (s·b·H·d_qk); kv_a's output, of which the KV latent is a slice
(s·b·(r_kv + d_rope)); the interleaved RoPE's outputs for Q and the shared key (s·b·(H + 1)·d_rope), which the
concatenations into Q and K copied; and kv_b's output, whose value half V's view keeps, its key half beside it
(s·b·H·d_nope) unless the layer already counts it kept (a fused kernel keeps V's storage whole). The indexer's own
frame holds its RoPE outputs too (s·b·(H_I + 1)·d_rope), copied into its concatenated queries and key. dots.3
Note's attention (Dots3NoteTextAttention) holds the same but the indexer's: it rotates Q and the RoPE key in fp32 and
keeps their bf16 casts, and its indexer rotates in fp32 too (its indexed layers' tables are fp32), so that its
RoPE outputs and their concatenation are fp32 with no cast after: (H_I + 1)·(d_rope + d_I)·4 bytes a token beside
the projections, which ``indexer_peak``'s (H_I + 1)·d_I·(2·2 + 4) (a bf16 concatenation and its fp32 copy) equals
where d_rope = d_I/2, as in every dots.3 case measured; not counted apart. A.X K2's
q_gate_proj makes Q and the output gate in one output (s·b·H·(d_qk + d_v)), and keeps the query latent, the input of
its norm, as a local (s·b·r_q); the gate, a strided slice, is reshaped into a copy (s·b·H·d_v) that the gate's
upcast reads after the attention. All in the activation dtype. Read from the storages live at the step's peak with
scripts/hf_step_peak.py on the CPU, each tagged by the module and op that made it (deepseek-v32-small, axk2-small
and, under LoRA, dots3-wide, checkpointed: the rebuilt top layer's forward at its indexer's scores). The same family's
checkpointed step holds, beside it, an adapted last module's output gradient under LoRA (``adapted_output_gradient``),
and at its MoE combine's backward no longer the shared experts' tensors (``shared_expert_freed``)."""

from __future__ import annotations

from lmcalc.engine.finetune.method import TWO_MATRIX, adapted_modules
from lmcalc.engine.memory.activations import kept_before_core, layer_saved_tensors
from lmcalc.engine.memory.adapters import adapter_bytes
from lmcalc.engine.memory.module_recompute import ROUTER_INPUT
from lmcalc.engine.memory.outside_layers import layer_checkpoint
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

KEY_IN_VALUE = "K's no-RoPE part, in V's storage"
"""The label under which a layer counts kv_b's key half kept, where V's storage is kept whole
(``activations._mla_saved``)."""


def mla_indexer_locals(w: Workload, layer: tuple[SavedTensor, ...], tp: int) -> float:
    """Bytes DeepSeek-V3.2's MLA holds as forward locals at its indexer's scores (the module's docstring), on one of
    ``tp`` ranks: the heads' share split, the latents and the indexer's whole. ``layer``: the layer's saved tensors,
    which say whether kv_b's key half is counted kept. 0 for a model without MLA and an indexer; dots.3 Note's
    (``MLASpec.rope_key_norm``) without its indexer's RoPE outputs, counted by ``indexer_peak``."""
    m, spec = w.model.mla, w.model
    if m is None or m.indexer is None:
        return 0.0
    H, d_rope = spec.num_heads, m.qk_rope_head_dim
    by_head = m.qk_head_dim + d_rope  # q_b's output and Q's RoPE output
    if not any(t.label == KEY_IN_VALUE for t in layer):
        by_head += m.qk_nope_head_dim  # kv_b's key half, beside V's view
    shared = m.kv_lora_rank + 2 * d_rope  # kv_a's output and K's RoPE output
    if not m.rope_key_norm:  # the indexer's RoPE outputs (dots.3 Note's: fp32, in indexer_peak)
        shared += (m.indexer.heads + 1) * d_rope
    if m.q_latent_concat:  # A.X K2: the latent a local, the gate in q_gate_proj's output and its reshaped copy
        shared += m.q_lora_rank or 0
        by_head += 2 * m.v_head_dim if spec.attention_output_gate else 0
    return w.tokens * (H * by_head / tp + shared) * w.precision.activation_bytes


def adapted_output_gradient(w: Workload, moe_layer: bool) -> float:
    """Under LoRA, a rebuilt layer's last module adapted (an MoE layer's shared experts' down projection, a dense
    layer's MLP's): PEFT adds ``lora_B(lora_A(x)) · scaling``, and the backward of that product by a number, which
    unpacks no saved tensor, runs before the layer is rebuilt; its output, the gradient of B's output (t·h in the
    activation dtype), lives through the rebuild. Read from the storages live at the step's peak (dots3-wide,
    checkpointed, PEFT's LoRA on every linear layer, bf16 adapters: a MulBackward0's output of 524,288 B beside the
    layer output's gradient). With fp32 adapters over a 16-bit model and no autocast the sum is fp32 (cast back
    after), so its gradient is made fp32, cast for the base output's branch (t·h in the activation dtype) and the
    product's is fp32 (t·h·4): both live (qwen2-small and llama-wide, checkpointed, fp32 adapters). 0 without full
    recomputation or where that module is frozen."""
    if w.recompute != "full" or not w.method.adapters:
        return 0.0
    group = "shared_experts" if moe_layer else "mlp"
    if not any(m.group == group and m.leaf in ("down", TWO_MATRIX["down"]) for m in adapted_modules(w.model, w.method)):
        return 0.0
    act, computed = w.precision.activation_bytes, adapter_bytes(w)
    return w.tokens * w.model.hidden_size * (act + (computed if computed > act else 0.0))


def shared_expert_freed(w: Workload, layer: tuple[SavedTensor, ...]) -> float:
    """What an MoE layer of DeepSeek-V3's code (``hidden = experts(x) + shared_experts(x)``) no longer holds when the
    routed experts' combine runs its backward: the shared experts' tensors and their input, the norm's output (the
    router reads an fp32 copy, the experts a gathered one), freed by the shared experts' backward, which autograd runs
    first (their sum's operand made last); less the gradient of that input it leaves (s·b·h in the activation dtype),
    which waits for the routed experts' part to be added to it. Read from the storages live at the step's peak
    (dots3-wide checkpointed: 1,572,864 B freed, 524,288 B of gradient made, at its rebuilt top layer's combine
    backward). Counted for the DeepSeek-V3.2 family alone (an MLA with an indexer), where it was measured; 0
    elsewhere and where a gate multiplies the shared experts' output."""
    spec = w.model
    if not (spec.moe and spec.moe.shared_experts and spec.mla and spec.mla.indexer) or spec.moe.shared_expert_gate:
        return 0.0
    input_gradient = w.tokens * spec.hidden_size * w.precision.activation_bytes
    return sum(t.bytes for t in layer if "E_shared" in t.symbol or t.label == ROUTER_INPUT) - input_gradient


def indexed_layer(w: Workload, moe_built: bool, last_stage: bool) -> tuple[tuple[SavedTensor, ...], float]:
    """The topmost layer that runs an indexer of its own (``IndexerSpec.above_last`` below the top; the top layer,
    an MoE one where the stage builds any (``moe_built``), where none is above it): what it saves, and the share of
    them made before its attention core. Under full recomputation the step's phases count the top layer's kind
    rebuilt, so the share is of that layer's bytes (GLM-5's: a dense layer below an MoE one, the same attention).
    A stage without the model's top layers (``last_stage`` false): its top layer's, as if it ran an indexer."""
    ix, moe = w.model.indexer, w.model.moe
    indexed = moe_built
    if ix is not None and ix.above_last and last_stage:
        indexed = moe_built and moe is not None and moe.is_moe_layer(w.model.num_layers - 1 - ix.above_last)
    kept, share = layer_saved_tensors(w, indexed), kept_before_core(w, indexed)
    if w.recompute == "full" and indexed != moe_built:
        share *= sum(t.bytes for t in kept) / sum(t.bytes for t in layer_saved_tensors(w, moe_built))
    return kept, share


def above_last_indexer(w: Workload, tp: int, cp: int) -> float:
    """What the layers above the topmost layer that runs an indexer of its own (GLM-5's and HY V4's indexer_types
    ending in "shared": they reuse its selection) hold in the step's other phases but not at that layer's indexer's
    scores, where the step's forward moment is. Not checkpointed, they have not run: every tensor they save (split
    over TP, CP; not over SP, which transformers does not run). Checkpointed, the layer is rebuilt after their
    backward has freed their checkpointed inputs. Measured with scripts/hf_step_peak.py on the CPU: glm-moe-dsa-small
    (its first layer indexes, its second reuses the selection) and hy-v4-small at 2, 3 and 5 layers, whose peak is
    the same 25,536,520 B at each depth (layer 1's rebuild). 0 where the top layer runs one; for the stage that holds
    the model's top layers (the others' are not modelled: no measurement)."""
    ix, spec = w.model.indexer, w.model
    if ix is None or not ix.above_last:
        return 0.0
    if w.recompute == "full":
        return ix.above_last * layer_checkpoint(w).bytes / cp
    top, moe = spec.num_layers, spec.moe
    above = (layer_saved_tensors(w, moe is not None and moe.is_moe_layer(i)) for i in range(top - ix.above_last, top))
    return sum(t.bytes / (t.cp_ways(cp) * (t.tp_ways(tp) if t.split == "tp" else 1)) for kept in above for t in kept)
