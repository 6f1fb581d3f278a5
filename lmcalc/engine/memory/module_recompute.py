"""Megatron-Core's selective recomputation by module (``--recompute-granularity selective --recompute-modules``;
derivation: docs/formulas.md §5.5), as the megatron profile's Transformer Engine layers keep their tensors.

Read from Megatron-LM d98e8a64 (megatron/core/transformer/transformer_layer.py, moe/moe_layer.py, moe/experts.py,
multi_latent_attention.py; the Transformer Engine layer specs in megatron/core/models/gpt/gpt_layer_specs.py):

* ``core_attn``: the attention core, dropped and rebuilt (Korthikanti et al. 2022 §4.2.2; the default);
* ``mlp``: a dense layer's MLP under ``tensor_parallel.checkpoint``, its norm inside it (Transformer Engine fuses the
  norm into the first linear): the layer keeps the checkpoint's input, the residual stream, and nothing else of that
  half;
* ``moe``: an MoE layer's experts, router and shared experts under one checkpoint, after its separate norm: the norm's
  own tensors and its output, the checkpoint's input, stay;
* ``shared_experts``: the shared experts' MLP (and their gate) under a checkpoint whose input, the norm's output, the
  router keeps anyway;
* ``moe_act``, ``layernorm``, ``mla_up_proj``: output-discarding checkpoints (``CheckpointWithoutOutput``): the routed
  experts' activation output (the second linear's input; for a clamped SwiGLU the clamps' inputs too), a norm's
  output where the norm is a module of its own (an MoE layer's, and multi-head latent attention's input norm;
  elsewhere Transformer Engine fuses it into the next linear and the module is an ``IdentityOp``), and multi-head
  latent attention's up-projected Q, K and V (DeepSeek-V4's pre-norm Q, Q, K = V and the key norm's input, under the
  fused kernels: engine.memory.compressed_fused).

What a module drops comes back in its own backward: the largest such set of a layer is held there (``rebuilt``).
"""

from __future__ import annotations

from lmcalc.engine.memory.compressed_fused import UP_PROJECTED
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

ROUTER_INPUT = "router / shared-expert input (norm output)"
MLA_UP = ("Q (nope ‖ rope)", "K (nope ‖ shared rope)", "V")


def module_dropped(w: Workload, tensors: tuple[SavedTensor, ...], moe_layer: bool) -> set[SavedTensor]:
    """The layer's saved tensors that the named modules drop."""
    modules, mla = w.recompute_modules, bool(w.model.mla)
    dropped: set[SavedTensor] = set()
    for t in tensors:
        mlp_half = t.block == "mlp"
        if (
            ("core_attn" in modules and t.attention_core)
            or ("mlp" in modules and mlp_half and not moe_layer)
            or ("moe" in modules and mlp_half and moe_layer and not _kept_beside_moe(t))
            or ("shared_experts" in modules and moe_layer and _shared_expert(t))
            or ("moe_act" in modules and moe_layer and t.symbol.startswith("k·s·b") and _activation_kept(t))
            or ("layernorm" in modules and _separate_norm_output(t, moe_layer, mla))
            or ("mla_up_proj" in modules and (mla and t.label in MLA_UP or t.label in UP_PROJECTED))
        ):
            dropped.add(t)
    return dropped


def _activation_kept(t: SavedTensor) -> bool:
    """What the routed experts' activation checkpoint drops: its output, the second linear's input, whatever the
    activation (a SwiGLU's product, a squared ReLU's square, GELU's output; experts.py discards it for any
    activation_func), and for a clamped SwiGLU the clamps' inputs. The checkpoint keeps the first linear's output
    once, as its own input: what a gated activation or GELU keeps as its input, a squared ReLU's ReLU output of the
    same size, and a plain ReLU's one tensor, its output, which ReLU keeps too."""
    second_input = any(leaf.endswith((".down", ".proj")) for leaf in t.for_weights)
    return second_input and "kept by ReLU too" not in t.label or "the clamps' inputs" in t.label


def _kept_beside_moe(t: SavedTensor) -> bool:
    """An MoE layer's norm and its output stay outside the MoE layer's checkpoint."""
    return t.label.startswith("MLP norm") or t.label == ROUTER_INPUT


def _shared_expert(t: SavedTensor) -> bool:
    return t.symbol.startswith("E_shared·s·b") or t.label.startswith("shared-expert")


def _separate_norm_output(t: SavedTensor, moe_layer: bool, mla: bool) -> bool:
    """A norm's output where the norm is a module of its own: an MoE layer's MLP norm, multi-head latent attention's
    input norm."""
    return (moe_layer and t.label == ROUTER_INPUT) or (mla and t.label == "QKV projection input (norm output)")


def module_kept(w: Workload, tensors: tuple[SavedTensor, ...], moe_layer: bool) -> tuple[SavedTensor, ...]:
    """The layer's saved tensors less what the named modules drop, with a dense MLP's checkpoint input where ``mlp``
    drops that half (the residual stream, s·b·h)."""
    dropped = module_dropped(w, tensors, moe_layer)
    kept = tuple(t for t in tensors if t not in dropped)
    if "mlp" in w.recompute_modules and not moe_layer and any(t.block == "mlp" for t in tensors):
        h, act = w.model.hidden_size, w.precision.activation_bytes
        kept += (SavedTensor("MLP checkpoint input (the residual stream)", "s·b·h", w.tokens * h, act, split="seq",
                             block="mlp"),)  # fmt: skip
    return kept


def module_rebuilt(w: Workload, tensors: tuple[SavedTensor, ...], moe_layer: bool) -> tuple[SavedTensor, ...]:
    """What comes back in the layer's backward beyond what it kept: the larger of its two halves' dropped tensors
    (the attention core aside, which the step's phases count with the attention's backward), less a dense MLP's
    checkpoint input, which its norm saves again as the same storage."""
    dropped = module_dropped(w, tensors, moe_layer)
    halves = []
    for block in ("attention", "mlp"):
        back = [t for t in tensors if t in dropped and t.block == block and not t.attention_core]
        if block == "mlp" and "mlp" in w.recompute_modules and not moe_layer:
            back = [t for t in back if t.label != "MLP norm input"]
        halves.append(tuple(back))
    return max(halves, key=lambda half: sum(t.bytes for t in half))
