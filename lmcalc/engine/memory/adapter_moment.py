"""A layer's forward at its MLP's adapters under PEFT's LoRA with fp32 adapters over a 16-bit model: at the first
matrix's (a gated MLP's up projection, a two-matrix MLP's fc) or at the second's (the down projection, proj),
whichever holds more (docs/formulas.md §5.10.2 and §5.10.3).

PEFT's ``Linear.forward`` (peft/tuners/lora/layer.py) runs the frozen base layer, casts the input to the adapters'
dtype (``_cast_input_dtype``), then adds ``lora_B(lora_A(x)) · scaling``: the base output, B's output and its scaled
copy are alive at once, each as wide as the layer's output, the last two in the dtype the adapters compute in (fp32
without autocast, the sum then fp32 too and cast back after). The first matrix's output is f wide; the second's input
is, and its adapter reads a copy of it, so the input (kept by no module) lives beside everything the layer keeps.
Under full recomputation the rebuilt top layer peaks at one of the two, every tensor it keeps by then made, beside
the forward's locals and the gradients its backward made before the rebuild; not recomputed, the top layer peaks at
the second matrix's scaled B output in its forward.

Under autocast (the Trainer's ``bf16=True``) PEFT's cast of x to the fp32 adapters is made all the same, but A's
matmul is on autocast's lower-precision list and casts it back to 16 bits: A keeps that copy, and the fp32 one is a
local of ``Linear.forward``, alive until it returns. The matmuls cast A's and B's fp32 weights too, and autocast
keeps each cast in its cache (aten/src/ATen/autocast_mode.cpp ``cached_cast``: an fp32 leaf that requires grad, on
every device) until the outermost autocast context exits (torch/amp/autocast_mode.py ``__exit__``), which
Accelerate's wrapper of the model's forward does when the forward returns, before the backward; a checkpointed
layer's rebuild enters its own (torch/utils/checkpoint.py ``recompute_fn``).
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.finetune.method import TWO_MATRIX, LinearModule, adapted_modules, in_layer, linear_modules
from lmcalc.engine.memory.adapters import adapter_bytes
from lmcalc.engine.memory.blocks import module_share
from lmcalc.engine.memory.indexer_moment import adapted_output_gradient
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload

MADE_AFTER_UP = ("up output", "down projection input (product)")
"""The labels of a gated MLP's kept tensors made from the up projection's output on (``activations``): the product's
factor, and the down projection's input where its adapter reads it uncopied; the down adapter's own follow."""


class AdapterMoment(NamedTuple):
    """A layer at one of its MLP's adapters (``mlp_adapter_moment``), in bytes, as the other moments of a layer's
    forward are counted (``phases.Transients``)."""

    forward: float  # beyond the kept tensors: the base output, B's and its scaled copy; the forward's locals
    kept_before: float  # the share of the layer's saved tensors made by then
    output_gradient: float  # the gradients alive while the layer is rebuilt (not recomputed: the layer's input)


def mlp_adapter_moment(w: Workload, layer: tuple[SavedTensor, ...], tp: int, layers: int) -> AdapterMoment | None:
    """The larger of a dense layer's moments at its MLP's first matrix's adapter (``adapted_up_moment``) and at its
    second's (``down_adapter_moment``), ``layer`` its saved tensors, ``layers`` the stage's; None where neither is
    counted."""
    moments = [m for m in (adapted_up_moment(w, layer, tp), down_adapter_moment(w, layer, tp, layers)) if m]
    if not moments:
        return None
    total = sum(x.bytes for x in layer) / tp
    return max(moments, key=lambda m: m.forward + m.output_gradient - (1 - m.kept_before) * total)


def _pefts_fp32_cast(w: Workload) -> bool:
    """Whether PEFT casts each adapter's input to fp32 adapters over 16-bit activations, with LoRA and no dropout
    (whose output is then the copy A reads) on a dense MLP whose second matrix is adapted and not fused with another
    (``gate_up``)."""
    spec = w.model
    fp32_cast = w.method.kind == "lora" and w.method.fp32_adapters and w.precision.activation_bytes < 4
    if not fp32_cast or w.method.lora_dropout or spec.moe:
        return False
    leaves = {m.leaf for m in linear_modules(spec) if m.group == "mlp"}
    return "gate_up" not in leaves and any(m.group == "mlp" and m.leaf == _leaf(w, "down") for m in _adapted(w))


def _adapted(w: Workload) -> tuple[LinearModule, ...]:
    """The linear modules that carry adapters."""
    return adapted_modules(w.model, w.method)


def _leaf(w: Workload, gated: str) -> str:
    """A gated MLP's ``up`` or ``down`` as the model names it: a two-matrix MLP's fc and proj."""
    return TWO_MATRIX[gated] if w.model.ffn_kind == "gelu_mlp" else gated


def _block_locals(w: Workload, layer: tuple[SavedTensor, ...]) -> float:
    """The block's locals while its MLP runs, s·b·h each, where no module keeps them: the attention's residual sum (a
    parallel block's attention output; a LayerNorm keeps it as its input) and the MLP norm's output (fp32 adapters
    read copies of it). GPT-2's block holds its attention output beside the sum too (``attn_output + residual``):
    not counted."""
    act, t, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    kept = {x.label for x in layer}
    return t * h * act * (("MLP norm input" not in kept) + ("MLP input (norm output)" not in kept))


def embedding_leaf(w: Workload) -> float:
    """Under full recomputation with a frozen embedding, transformers' ``enable_input_require_grads`` (which
    ``gradient_checkpointing_enable`` calls for a model of token ids) makes the embedding's output a leaf that
    requires grad; autograd's AccumulateGrad node for it holds it to the end of the backward. Where the first layer
    reads another tensor made from it (GPT-2's sum with the learned positions' embeddings), it is s·b·h beside the
    checkpointed inputs (gpt2-wide: 524,288 B, read from the storages live at the step's peak); 0 elsewhere."""
    if w.recompute != "full" or w.method.kind == "full" or w.model.position_embedding != "learned":
        return 0.0
    return w.tokens * w.model.hidden_size * w.precision.activation_bytes


def adapted_up_moment(w: Workload, layer: tuple[SavedTensor, ...], tp: int) -> AdapterMoment | None:
    """Where a dense layer (``layer``, its saved tensors) rebuilt under full recomputation stands in its forward under
    LoRA on its MLP's first matrix (a gated MLP's up projection, a two-matrix MLP's fc), fp32 adapters and no
    autocast: at the adapter's scaled output, beside the frozen base's output (s·b·f in the activation dtype) and B's
    output (s·b·f each in fp32), every tensor the layer keeps but those made from that output on (a gated MLP's
    ``MADE_AFTER_UP``, a two-matrix MLP's activation's, and the second matrix's adapter's); the block's locals
    (``_block_locals``); and the gradients the backward made before the rebuild: the layer output's and the adapted
    second matrix's (``adapted_output_gradient``). Read from the storages live at the step's peak with
    scripts/hf_step_peak.py on the CPU (qwen2-small, llama-wide and gpt-neox-wide, checkpointed, fp32 adapters; with
    bf16 adapters the same moment, 0.04 % off on llama-wide, stays below the down projection's backward). The s·b·f
    tensors split over ``tp``; the rest whole on each rank, as ``phases`` counts a layer's. None for any other model
    or step: MoE layers, fused gate and up projections, QLoRA, autocast (``down_adapter_moment``)."""
    spec = w.model
    if w.recompute != "full" or w.method.kind != "lora" or w.precision.master_bytes or spec.moe:
        return None
    up = _leaf(w, "up")
    if not any(m.group == "mlp" and m.leaf == up for m in _adapted(w)):
        return None
    act, t, f = w.precision.activation_bytes, w.tokens, spec.ffn_size
    down = f"mlp.{_leaf(w, 'down')} adapter"
    after = sum(x.bytes for x in layer if x.label.startswith(down) or _made_after_up(w, x))
    forward = t * f * (act + 2 * adapter_bytes(w)) / tp + _block_locals(w, layer)
    gradients = t * spec.hidden_size * act + adapted_output_gradient(w, False) + embedding_leaf(w)
    return AdapterMoment(forward, _share_made(w, layer, after), gradients)


def _share_made(w: Workload, layer: tuple[SavedTensor, ...], after: float) -> float:
    """The share of the rebuilt layer made before ``after`` bytes of ``layer``'s: where the attention norm keeps the
    layer's input, the checkpointed one (counted apart, not rebuilt: ``gpu_memory``), it is left out of both."""
    total = sum(x.bytes for x in layer)
    shared = sum(x.bytes for x in layer if x.label == "attention norm input") if norm_keeps(w) == "input" else 0.0
    return 1 - after / (total - shared)


def _made_after_up(w: Workload, x: SavedTensor) -> bool:
    """Whether the MLP makes ``x`` from its first matrix's output on: a gated MLP's ``MADE_AFTER_UP``; a two-matrix
    MLP's activation's tensors (what its MLP keeps but its norm's and its adapters')."""
    if w.model.ffn_kind != "gelu_mlp":
        return x.label in MADE_AFTER_UP
    return x.block == "mlp" and not x.label.startswith(("MLP norm", "MLP input")) and " adapter: " not in x.label


def down_adapter_moment(w: Workload, layer: tuple[SavedTensor, ...], tp: int, layers: int) -> AdapterMoment | None:
    """Where a dense layer (``layer``, its saved tensors) stands in its forward under LoRA with fp32 adapters over a
    16-bit model, with autocast (a mixed recipe) or without: inside PEFT's ``Linear.forward`` of the MLP's second
    matrix (a gated MLP's down projection, a two-matrix MLP's proj), every tensor the layer keeps made, beside the
    forward's locals: the matrix's input (a gated MLP's product, a two-matrix MLP's activation output; s·b·f in the
    activation dtype, where no module keeps it: its adapter reads its own copy), under autocast PEFT's cast of it to
    fp32 (s·b·f·4, a local until ``Linear.forward`` returns: A keeps autocast's 16-bit copy), the frozen base's
    output and the block's locals (``_block_locals``). Not recomputed, the forward runs on to B's output and its
    scaled copy (s·b·h each, in the adapters' dtype without autocast, autocast's under it), and the model's forward
    holds the embedding output (``inputs_embeds``; GPT-2's position embeddings too, s·h, one row of positions for
    the batch) and the top layer's input (where its norm does not keep it); under full recomputation
    (non-reentrant, stopping once the last saved tensor is made) the rebuild stops at B's matmul (A·x, or under
    autocast the cast of B's weight, the last tensor it saves), and the gradients the backward made before it live:
    the layer output's and the scaled B output's (``adapted_output_gradient``). Under autocast, the cached casts of
    the adapters' weights (``autocast_weight_casts``): each of the stage's ``layers``' not recomputed, the rebuilt
    layer's under full recomputation. Read from the storages live at the step's peak with scripts/hf_step_peak.py
    on the CPU (llama-wide, gpt-neox-wide and gpt2-wide, fp32 adapters, with and without autocast and
    checkpointing). The s·b·f tensors split over ``tp``, the rest whole on each rank. None for any other model or
    step (``_pefts_fp32_cast``)."""
    if not _pefts_fp32_cast(w):
        return None
    spec = w.model
    act, t, h, f = w.precision.activation_bytes, w.tokens, spec.hidden_size, spec.ffn_size
    autocast = bool(w.precision.master_bytes)
    kept = {x.label for x in layer}
    down_input = 0.0 if any(label.startswith("down projection input") for label in kept) else t * f * act
    pefts_cast = t * f * 4 if autocast else 0.0  # without autocast, the copy A keeps
    forward = (down_input + pefts_cast) / tp + t * h * act + _block_locals(w, layer)  # the base output
    if w.recompute == "full":
        casts = autocast_weight_casts(w)
        return AdapterMoment(forward + casts, 1.0, t * h * act + adapted_output_gradient(w, False) + embedding_leaf(w))
    b_outputs = 2 * t * h * adapter_bytes(w)
    frame = t * h * act + (w.seq_len * h * act if spec.position_embedding == "learned" else 0.0)
    top_input = 0.0 if norm_keeps(w) == "input" else t * h * act  # a LayerNorm keeps its input, the layer's
    return AdapterMoment(forward + b_outputs + frame + layers * autocast_weight_casts(w), 1.0, top_input)


def autocast_weight_casts(w: Workload) -> float:
    """Autocast's cached 16-bit casts of one dense layer's adapter weights, r·(in + out) each in the activation
    dtype, where PEFT keeps the adapters in fp32 under a mixed recipe (counted whole on each tensor-parallel
    rank); 0 elsewhere."""
    if not (w.method.kind == "lora" and w.method.fp32_adapters and w.precision.master_bytes):
        return 0.0
    modules = [m for m in _adapted(w) if in_layer(m, False) and m.group in ("attention", "mlp")]
    widths = sum(module_share(w.model, m, "average") * m.rank_scale * (m.inputs + m.outputs) for m in modules)
    return w.method.lora_rank * widths * w.precision.activation_bytes
