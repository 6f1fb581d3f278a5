"""What selective recomputation runs again in the backward pass (derivation: docs/formulas.md §5.5; the memory side
is ``engine.memory.op_checkpoint`` and ``engine.memory.activations``): Megatron-Core's, the attention core and the
modules ``recompute_modules`` names; torchtitan's per-operator checkpointing, every second matmul.

torchtitan's policy (torchtitan/distributed/activation_checkpoint.py, SelectiveAC, b5bcd76c) counts the matmuls of
each block in the order its forward runs them and keeps the output of every odd one, recomputing the even ones in
the backward pass; the router's matmul is always recomputed and not counted, and the experts' grouped GEMMs are not on
its list at all.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.model.params import WeightTensor, weight_tensors
from lmcalc.framework_specs import RecomputeRule
from lmcalc.specs import ModelSpec

NOT_COUNTED = ("router", "experts", "latent_moe")
"""Recomputed without counting: the forced router, the experts' grouped GEMMs, and a latent MoE's projections around
them (no torchtitan model has one: lmcalc keeps none of their outputs, as it keeps none of the experts')."""
LAYER_GROUPS = ("attention", "mlp", "router", "latent_moe", "experts", "shared_experts")
MODULE_MATMULS = {  # the weight matmuls each Megatron-Core module runs again, by group or by name
    "mlp": ("mlp",),
    "moe": ("router", "latent_moe", "experts", "shared_experts"),
    "shared_experts": ("shared_experts",),
    "mla_up_proj": ("attn.q_b.weight", "attn.kv_b.weight", "attn.kv.weight"),  # MLA's; DeepSeek-V4's q_b and kv
}


class Redone(NamedTuple):
    """What selective recomputation runs again: the attention core, and a share of the layers' weight matmuls."""

    attention_core: bool = True
    matmuls: float = 0.0


ATTENTION_CORE = Redone()


class Matmul(NamedTuple):
    """One matmul of a block, in the order the forward runs them: its name, output width per token and FLOPs."""

    name: str
    width: float
    symbol: str
    flops: float  # forward FLOPs per token: 2 · inputs · outputs


def block_matmuls(spec: ModelSpec, moe_layer: bool, fused_qkv: bool) -> tuple[Matmul, ...]:
    """The matmuls a dense or MoE block runs, in order, as the policy counts them: Q, K and V as one where the
    framework fuses them; not the router's nor the routed experts'."""
    matmuls: list[Matmul] = []
    groups = ("attention", "router", "experts", "shared_experts") if moe_layer else ("attention", "mlp")
    for t in weight_tensors(spec):
        if not t.matmul or t.group not in groups or t.group in NOT_COUNTED:
            continue
        out, inp = t.shape[0], t.shape[-1]
        copies = t.count / _layers_of(spec, t)
        leaf = t.name.rsplit(".", 2)[-2]
        if fused_qkv and leaf in ("k", "v") and matmuls and matmuls[-1].name in ("q", "qkv"):
            last = matmuls.pop()
            symbol = f"({last.symbol.strip('()')}+{t.symbols[0]})"
            matmuls.append(Matmul("qkv", last.width + out * copies, symbol, last.flops + 2 * inp * out * copies))
            continue
        matmuls.append(Matmul(leaf, out * copies, t.symbols[0], 2 * inp * out * copies))
    return tuple(matmuls)


def _layers_of(spec: ModelSpec, t: WeightTensor) -> float:
    """Over how many layers ``t``'s copies are averaged: the MoE ones, the others (a dense FFN's), or every layer (a
    hybrid's mixers, the norms of single blocks)."""
    if t.group in ("router", "latent_moe", "experts", "shared_experts"):
        return spec.moe_layers
    return spec.num_layers - spec.moe_layers if t.count_symbol == "L_dense" else spec.num_layers


def selective_redone(spec: ModelSpec, rule: RecomputeRule, modules: tuple[str, ...]) -> Redone:
    """What selective recomputation redoes under the framework's rule: torchtitan's every second matmul, or the
    Megatron-Core modules named (the attention core with ``core_attn``; the modules' weight matmuls)."""
    if rule.selective == "matmuls":
        return Redone(False, recomputed_matmul_share(spec, rule.fused_qkv))
    names = {name for module in modules for name in MODULE_MATMULS.get(module, ())}
    tensors = [t for t in weight_tensors(spec) if t.matmul and t.group in LAYER_GROUPS]
    total = sum(2 * t.active_total for t in tensors)
    redone = sum(2 * t.active_total for t in tensors if t.group in names or t.name in names)
    return Redone("core_attn" in modules, redone / total if total else 0.0)


def recomputed_matmul_share(spec: ModelSpec, fused_qkv: bool) -> float:
    """Of the layers' weight-matmul FLOPs, the share the backward pass runs again under the per-operator policy:
    every second matmul of each block, and in an MoE block the router's and the routed experts' (the policy keeps no
    grouped GEMM's output)."""
    tensors = [t for t in weight_tensors(spec) if t.matmul and t.group in LAYER_GROUPS]
    total = sum(2 * t.active_total for t in tensors)
    if not total:
        return 0.0
    redone = sum(2 * t.active_total for t in tensors if t.group in NOT_COUNTED)
    for moe_layer, layers in ((False, spec.num_layers - spec.moe_layers), (True, spec.moe_layers)):
        if layers:
            matmuls = block_matmuls(spec, moe_layer, fused_qkv)
            redone += layers * sum(m.flops for i, m in enumerate(matmuls, start=1) if i % 2 == 0)
    return redone / total
