"""Looped transformers, whose layers' weights run more than once a forward pass (``specs.LayerReuseSpec``: Dory's
recurrent section, the Hierarchical Reasoning Model's stacks), and nGPT's learned scales (Loshchilov et al. 2024,
nGPT §2.6; Dory's). The spec's ``num_layers`` counts the runs, so each layer tensor is listed L times and a token
uses it L times; ``held_once`` keeps those uses for the FLOPs and counts the weights of the L_w held layers alone, as
``Site.active`` does for Zamba's shared blocks."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, tensor
from lmcalc.specs import ModelSpec


def held_once(spec: ModelSpec, tensors: list[WeightTensor]) -> list[WeightTensor]:
    """``tensors`` with each layer tensor (one a run, ``L``) held by the L_w layers whose weights the runs share, and
    still used at each of the L runs."""
    reuse = spec.layer_reuse
    if reuse is None:
        return tensors
    return [
        replace(t, count=reuse.held, count_symbol="L_w", active=t.active) if t.count_symbol == "L" else t
        for t in tensors
    ]


def start_state(spec: ModelSpec) -> list[WeightTensor]:
    """HRM's z_L_init (HrmTextModel): the low-level stack's first input, h wide, a parameter that never trains."""
    reuse = spec.layer_reuse
    if reuse is None or not reuse.start_state:
        return []
    return [tensor("start_state", Site("start_state", 1, "1"), (Dim(spec.hidden_size, "h"),), False)]


def ngpt_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """nGPT's scales (DoryAttention, DoryMLP, DoryLMHead): s_qk on the queries and s on the output gate (H·d each) in
    each layer's attention, s_u and s_v on the MLP's gate and up projections (f each), and a logit scale a token (V).
    Its residual rates, α_A and α_M (h each), are ``residual_scales``."""
    if not spec.ngpt_scales:
        return []
    layers, q, f = spec.num_layers, Dim(spec.num_heads * spec.head_size, "H·d"), Dim(spec.ffn_size, "f")
    attention, mlp = Site("attention", layers, "L"), Site("mlp", layers, "L")
    return [
        tensor("attn.s_qk", attention, (q,), False),
        tensor("attn.s_gate", attention, (q,), False),
        tensor("mlp.s_u", mlp, (f,), False),
        tensor("mlp.s_v", mlp, (f,), False),
        tensor("lm_head.logit_scale", Site("head", 1, "1"), (Dim(spec.vocab_size, "V"),), False),
    ]


def runs_note(spec: ModelSpec) -> str:
    """What L and L_w are in a looped model's rows; "" for any other."""
    reuse = spec.layer_reuse
    if reuse is None:
        return ""
    grads = f", {len(reuse.no_grad_runs)} of them without gradients" if reuse.no_grad_runs else ""
    return (f"a looped model: the weights of L_w = {reuse.held} held layers run L = {spec.num_layers} times a forward "
            f"pass{grads}; parameters count the held layers, FLOPs every run")  # fmt: skip
