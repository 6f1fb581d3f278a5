"""What Dory's nGPT layers keep for backward beyond a gated, sandwich-normed attention layer with a SwiGLU
(Loshchilov et al. 2024, *nGPT*, arXiv:2410.01131 §2.6; transformers 5.24's DoryAttention, DoryMLP,
DoryDecoderLayer, DoryModel and DoryLMHead), and outside the layers.

Every norm is DoryL2Norm, ``x.float() · rsqrt(sum(x²) + ε)`` cast back, without a weight: it keeps the fp32 copy
of its input and 1/‖x‖ a row, as ``norms.norm_saved`` counts a weightless norm written in the model's code. Beyond
what ``engine.memory.activations`` lists for such a layer, a run keeps:

- the query after RoPE, which the product with s_qk² keeps for s_qk's gradient (the scaled query is the kernel's);
- gate_proj's output, which the product with s_gate² keeps for s_gate's gradient;
- attn_sub_norm between the gated product and o_proj (its fp32 copy and 1/‖x‖; o_proj keeps its output);
- the outputs of the MLP's gate and up projections, which the products with s_u and s_v keep for their gradients,
  and ffn_sub_norm between the SwiGLU's product and down_proj;
- at each interpolating residual ``h + |α| · (y − h)``, the difference y − h, for α's gradient;
- the scales' own small products (s_qk², s_gate², |α_A|, |α_M|, s_u·√h and s_v·√h), a run each.

A frozen scale (LoRA) needs none of what its gradient reads: those tensors name the scale in ``for_weights``.
Outside the layers, DoryModel.forward normalises the input section's output once to re-inject it, and the hidden
state again at the start of each loop (``norm(h) + input_hidden_states``), each a norm of its own besides the final
one; DoryLMHead multiplies the fp32 logits by the logit scale, which keeps them for the scale's gradient beside the
V scales it multiplies by."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.finetune.method import weight_trained
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.params import Dim
from lmcalc.engine.workload import Workload

GATED_PRODUCT = "output projection input (the gated product)"  # what attn_sub_norm reads in Dory's attention
SWIGLU_PRODUCT = "down projection input (product)"  # what ffn_sub_norm reads in Dory's MLP
SCALES = ("ngpt_scale",)  # nGPT's learned scales, frozen under LoRA
SUB_NORM_BACKWARD_GRADIENTS = 4
"""f-wide fp32 tensors the backward of Dory's MLP sub-norm (DoryL2Norm: x.float(), pow, sum, rsqrt, multiply, cast
back) holds at once beyond the fp32 input it kept, at its power's backward: the gradient through the multiply by
1/‖x‖, the power's x¹ and 2·x¹, and their product with the incoming gradient; read from the storages live at the
step's peak with scripts/hf_step_peak.py on the CPU (dory-wide, checkpointed: a run's backward binds there)."""
FREED_ABOVE_SUB_NORM = ("down projection input (the sub-norm's output)", "post-MLP norm", "mlp residual: y − h")
"""What a run's backward has freed by its MLP sub-norm's: down_proj's saved input, the post-MLP norm's tensors and
the MLP residual's difference (autograd frees a node's saved tensors once it has run)."""


def ngpt_attention_saved(w: Workload, tensors: list[SavedTensor]) -> list[SavedTensor]:
    """A Dory run's attention after its input norm: ``tensors`` (a gated attention's) with the query kept before its
    s_qk scale, gate_proj's output kept for s_gate, and attn_sub_norm put between the gated product and o_proj."""
    if not w.model.ngpt_scales:
        return tensors
    act, sb, Hd = w.precision.activation_bytes, w.tokens, w.model.num_heads * w.model.v_head_dim
    rows, width = Dim(sb, "s·b"), Dim(Hd, "H·d")
    out: list[SavedTensor] = []
    for t in tensors:
        if t.label == GATED_PRODUCT:  # the sub-norm's input, not kept itself: its fp32 copy is
            out += norm_saved(w, "attention sub-norm", rows, width, "tp")
            out.append(SavedTensor("output projection input (the sub-norm's output)", "s·b·H·d", sb * Hd, act,
                                   for_weights=("o",)))  # fmt: skip
            continue
        out.append(t)
        if t.label.startswith("Q ") and not t.label.startswith("Q-"):
            out.append(SavedTensor("Q after RoPE, before s_qk² (for s_qk's gradient)", "s·b·H·d", sb * Hd, act,
                                   for_weights=SCALES))  # fmt: skip
    out.append(SavedTensor("gate_proj output, before s_gate² (for s_gate's gradient)", "s·b·H·d", sb * Hd, act,
                           for_weights=SCALES))  # fmt: skip
    return out


def ngpt_mlp_saved(w: Workload, tensors: list[SavedTensor]) -> list[SavedTensor]:
    """A Dory run's SwiGLU: ``tensors`` with the gate and up projections' outputs kept for s_u's and s_v's
    gradients, and ffn_sub_norm put between the product and down_proj."""
    if not w.model.ngpt_scales:
        return tensors
    act, sb, f = w.precision.activation_bytes, w.tokens, w.model.ffn_size
    out: list[SavedTensor] = []
    for t in tensors:
        if t.label != SWIGLU_PRODUCT:
            out.append(t)
            continue
        out += [SavedTensor(f"{name} projection output, before its scale (for {scale}'s gradient)", "s·b·f", sb * f,
                            act, for_weights=SCALES) for name, scale in (("gate", "s_u"), ("up", "s_v"))]  # fmt: skip
        out += norm_saved(w, "MLP sub-norm", Dim(sb, "s·b"), Dim(f, "f"), "tp")
        out.append(replace(t, label="down projection input (the sub-norm's output)"))
    return out


def interpolation_saved(w: Workload, half: str) -> list[SavedTensor]:
    """nGPT's residual of a half, ``h + |α| · (y − h)``: the product keeps the difference for α's gradient (none where
    α is frozen) and |α| for the difference's; with the scales' other small products, a run's parameter-sized
    tensors: s_qk²'s and s_gate²'s inputs and outputs (H·d each), |α|'s input and output (h each), s_u·√h and s_v·√h
    (f each), half of them only for the scales' own gradients."""
    if not w.model.ngpt_scales:
        return []
    spec, act, sb, h = w.model, w.precision.activation_bytes, w.tokens, w.model.hidden_size
    tensors = [SavedTensor(f"{half} residual: y − h (for α's gradient)", "s·b·h", sb * h, act, split="seq",
                           block=half, for_weights=SCALES)]  # fmt: skip
    Hd, f = spec.num_heads * spec.v_head_dim, spec.ffn_size
    if half == "attention":  # s_qk² and s_gate², kept by the products with Q and the gate, and their inputs
        tensors += [SavedTensor("s_qk² and s_gate² (the products keep them)", "2·H·d", 2 * Hd, act, split="none"),
                    SavedTensor("s_qk and s_gate scaled (the squares keep them)", "2·H·d", 2 * Hd, act,
                                split="none", for_weights=SCALES)]  # fmt: skip
    else:  # s_u·√h and s_v·√h, kept by the products with the projections' outputs
        tensors.append(SavedTensor("s_u·√h and s_v·√h (the products keep them)", "2·f", 2 * f, act, split="none",
                                   block=half))  # fmt: skip
    return tensors + [
        SavedTensor(f"{half} residual: |α| (the product keeps it)", "h", h, act, split="none", block=half),
        SavedTensor(f"{half} residual: α scaled (abs keeps it)", "h", h, act, split="none", block=half,
                    for_weights=SCALES),
    ]  # fmt: skip


def loop_norms_saved(w: Workload) -> list[SavedTensor]:
    """The norms DoryModel.forward runs besides the final one: the input section's output normalised once to
    re-inject, then the hidden state at the start of each of the n loops (``norm(h) + input_hidden_states``): 1 + n
    weightless norms over s·b rows of h. The first two read the same tensor: where the activations are fp32 already,
    ``x.float()`` is x and their inputs are one storage, kept once."""
    spec = w.model
    if not spec.ngpt_scales or spec.layer_reuse is None:
        return []
    loops = max(spec.layer_reuse.weights.count(layer) for layer in set(spec.layer_reuse.weights))
    rows, width = Dim(w.tokens, "s·b"), Dim(spec.hidden_size, "h")
    norms = norm_saved(w, f"loop norms (1 + {loops} loops)", rows, width)
    shared = w.precision.activation_bytes == 4  # the input section's output, re-injected and normalised again
    counts = [loops if shared and t.label.endswith(" input (fp32 copy)") else 1 + loops for t in norms]
    return [replace(t, symbol=f"{n}·{t.symbol}", elements=n * t.elements) for t, n in zip(norms, counts, strict=True)]


def logit_scale_saved(w: Workload) -> list[SavedTensor]:
    """DoryLMHead's ``logits.float() · (logit_scale · 1/σ)``: the product keeps the V scales for the logits' gradient
    and, where the scale trains, the fp32 logits for its own."""
    spec = w.model
    if not spec.ngpt_scales:
        return []
    scales = [SavedTensor("logit scale · 1/σ (fp32, the product keeps it)", "V", spec.vocab_size, 4, split="none")]
    if not weight_trained(spec, w.method, SCALES[0]):
        return scales
    sbV = w.tokens * spec.vocab_size
    return [*scales, SavedTensor("logits (fp32; the logit scale's product keeps them for its gradient)", "s·b·V", sbV,
                                 4, split="none", for_weights=SCALES)]  # fmt: skip


def second_rotary_tables(w: Workload, tables: list[SavedTensor]) -> list[SavedTensor]:
    """DoryModel's rotary tables: a cos and sin pair for each kind of layer it has (DoryRotaryEmbedding, a θ a
    kind), so a second pair where it has both sliding and full layers."""
    spec = w.model
    if not spec.ngpt_scales or not 0 < spec.local_layers < spec.attention_layers:
        return []
    return [replace(t, label=f"{t.label} (the other kind of layer's θ)") for t in tables]


def sub_norm_backward(w: Workload, layer: tuple[SavedTensor, ...]) -> float:
    """A Dory run's busiest moment in its backward beyond what it saved (``layer``, its saved tensors) and its output's
    gradient: the MLP sub-norm's fp32 gradients (``SUB_NORM_BACKWARD_GRADIENTS`` of s·b·f), less what the backward
    above it has freed (``FREED_ABOVE_SUB_NORM``); 0 for any other model."""
    if not w.model.ngpt_scales:
        return 0.0
    freed = sum(t.bytes for t in layer if t.label.startswith(FREED_ABOVE_SUB_NORM))
    return SUB_NORM_BACKWARD_GRADIENTS * 4 * w.tokens * w.model.ffn_size - freed
