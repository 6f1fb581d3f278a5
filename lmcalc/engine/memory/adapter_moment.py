"""A layer's forward at its MLP's adapters under PEFT's LoRA: at the up projection's without autocast, at the down
projection's under autocast (docs/formulas.md §5.10.2 and §5.10.3).

PEFT's ``Linear.forward`` (peft/tuners/lora/layer.py) runs the frozen base layer, then adds
``lora_B(lora_A(x)) · scaling``: the base output, B's output and its scaled copy are alive at once, each as wide as
the layer's output, the last two in the adapters' dtype (fp32 where PEFT keeps the adapters in fp32 over a 16-bit
model and casts their input to it; the sum is then fp32 too, cast back after). A gated MLP's up projection is the
widest such module and the last before the MLP's product: under full recomputation the rebuilt top layer peaks
there, every tensor it keeps before the up projection's output made, beside the forward's locals and the gradients
its backward has made before the rebuild.

Under autocast (the Trainer's ``bf16=True``) PEFT's cast of x to the fp32 adapters is made all the same, but A's
matmul is on autocast's lower-precision list and casts it back to 16 bits: A keeps that copy, and the fp32 one is a
local of ``Linear.forward``, alive until it returns. The down projection's input is the MLP's widest, so the layer
peaks there, with every tensor it keeps made.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.finetune.method import TWO_MATRIX, adapted_modules, linear_modules
from lmcalc.engine.memory.adapters import adapter_bytes
from lmcalc.engine.memory.indexer_moment import adapted_output_gradient
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

MADE_AFTER_UP = ("up output", "down projection input (product)")
"""The labels of a gated MLP's kept tensors made from the up projection's output on (``activations``): the product's
factor, and the down projection's input where its adapter reads it uncopied; the down adapter's own follow."""


class AdapterMoment(NamedTuple):
    """A layer at one of its MLP's adapters (``adapted_up_moment``, ``autocast_down_moment``), in bytes, as the other
    moments of a layer's forward are counted (``phases.Transients``)."""

    forward: float  # beyond the kept tensors: the base output, B's and its scaled copy; the forward's locals
    kept_before: float  # the share of the layer's saved tensors made by then
    output_gradient: float  # the gradients alive while the layer is rebuilt (not recomputed: the layer's input)


def adapted_up_moment(w: Workload, layer: tuple[SavedTensor, ...], tp: int) -> AdapterMoment | None:
    """Where a dense layer with a gated MLP (``layer``, its saved tensors) rebuilt under full recomputation peaks in
    its forward under LoRA on the up projection, without autocast: at the adapter's scaled output, beside the frozen
    base's output (s·b·f in the activation dtype) and B's output (s·b·f each in the adapters' dtype), every tensor
    the layer keeps but those made from the up projection's output on (``MADE_AFTER_UP`` and the down adapter's);
    the forward's locals alive then, the attention's residual sum and, where no module keeps it (fp32 adapters read
    copies), the MLP norm's output (s·b·h each); and the gradients the backward made before the rebuild: the layer
    output's and an adapted down projection's (``adapted_output_gradient``). Read from the storages live at the
    step's peak with scripts/hf_step_peak.py on the CPU (qwen2-small and llama-wide, checkpointed, fp32 adapters;
    with bf16 adapters the same moment, 0.04 % off on llama-wide, stays below the down projection's backward). The
    s·b·f tensors split over ``tp``; the rest whole on each rank, as ``phases`` counts a layer's. None for any other
    model or step: MoE layers, parallel blocks, fused gate and up projections, two-matrix MLPs, QLoRA, autocast."""
    spec = w.model
    if w.recompute != "full" or w.method.kind != "lora" or w.precision.master_bytes or spec.moe or spec.parallel_block:
        return None
    up_adapted = any(m.group == "mlp" and m.leaf == "up" for m in adapted_modules(spec, w.method))
    if spec.ffn_kind == "gelu_mlp" or not up_adapted:
        return None
    act, t, h, f = w.precision.activation_bytes, w.tokens, spec.hidden_size, spec.ffn_size
    after = sum(x.bytes for x in layer if x.label in MADE_AFTER_UP or x.label.startswith("mlp.down adapter"))
    norm_output_kept = any(x.label == "MLP input (norm output)" for x in layer)
    locals_ = t * h * act * (1 if norm_output_kept else 2)
    forward = t * f * (act + 2 * adapter_bytes(w)) / tp + locals_
    gradients = t * h * act + adapted_output_gradient(w, False)
    return AdapterMoment(forward, 1 - after / sum(x.bytes for x in layer), gradients)


def autocast_down_moment(w: Workload, layer: tuple[SavedTensor, ...], tp: int) -> AdapterMoment | None:
    """Where a dense layer (``layer``, its saved tensors) peaks in its forward under LoRA with fp32 adapters over a
    16-bit model and autocast (a mixed recipe): inside PEFT's ``Linear.forward`` of the MLP's down projection (a
    two-matrix MLP's second), every tensor the layer keeps made (A keeps autocast's 16-bit copy of its input and, as B
    is called, autocast's cast of B's weight, the last), beside the forward's locals: the down projection's input (a
    gated MLP's product, a two-matrix MLP's activation output; s·b·f in the activation dtype, where no module keeps
    it: its adapter reads its own copy), PEFT's cast of it to the adapters' dtype (s·b·f·4, a local until
    ``Linear.forward`` returns), the frozen base's output, the attention's residual sum (a parallel block's attention
    output) and, where no module keeps it, the MLP norm's output (s·b·h each). Not recomputed, the forward runs on to
    B's output and its scaled copy (s·b·h each, autocast's dtype) and the model's forward holds the embedding output
    (``inputs_embeds``) and the top layer's input (``output_gradient``); under full recomputation (non-reentrant,
    stopping once the last saved tensor is made) the rebuild stops at B's weight cast, and the gradients the
    backward made before it live: the layer output's and the scaled B output's (s·b·h each, autocast's dtype). The
    up projection's moment is lower wherever f > h: beyond the same kept tensors it holds s·b·(f·a + 4·h + 2·h·a),
    the down projection's s·b·(f·a + 4·f + 5·h·a) (a the activation bytes). Read from the storages live at the
    step's peak with scripts/hf_step_peak.py on the CPU (llama-wide, gpt-neox-wide and gpt2-wide, fp32 adapters,
    autocast, with and without checkpointing). The s·b·f tensors split over ``tp``, the rest whole on each rank.
    None for any other model or step: MoE layers, fused gate and up projections, QLoRA, LoRA dropout (its output is
    the copy A reads), adapters in the model's dtype, or without autocast (``adapted_up_moment``)."""
    spec = w.model
    act, t, h, f = w.precision.activation_bytes, w.tokens, spec.hidden_size, spec.ffn_size
    pefts_cast = w.method.fp32_adapters and w.precision.master_bytes and act < 4  # PEFT's x.to(fp32), not kept
    if w.method.kind != "lora" or not pefts_cast or w.method.lora_dropout or spec.moe:
        return None
    leaves = {m.leaf for m in linear_modules(spec) if m.group == "mlp"}
    down = TWO_MATRIX["down"] if spec.ffn_kind == "gelu_mlp" else "down"  # a two-matrix MLP's is proj
    down_adapted = any(m.group == "mlp" and m.leaf == down for m in adapted_modules(spec, w.method))
    if "gate_up" in leaves or not down_adapted:
        return None
    kept = {x.label for x in layer}
    down_input = 0.0 if any(label.startswith("down projection input") for label in kept) else t * f * act
    norm_output = 0.0 if "MLP input (norm output)" in kept else t * h * act
    forward = (down_input + t * f * 4) / tp + t * h * act + t * h * act + norm_output  # base output, residual sum
    if w.recompute == "full":  # the layer output's gradient and the scaled B output's, in autocast's dtype
        return AdapterMoment(forward, 1.0, 2 * t * h * act)
    frame = t * h * act  # the model's forward holds the embedding output (inputs_embeds) throughout
    return AdapterMoment(forward + 2 * t * h * act + frame, 1.0, t * h * act)  # B's output and its scaled copy
