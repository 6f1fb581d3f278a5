"""Looped transformers, whose layers' weights run more than once a forward pass (``specs.LayerReuseSpec``: Dory's
recurrent section, the Hierarchical Reasoning Model's stacks, Inkling 2's looped section), and nGPT's learned scales
(Loshchilov et al. 2024, nGPT §2.6; Dory's). The spec's ``num_layers`` counts the runs, so each layer tensor is
listed L times and a token uses it L times; ``held_once`` keeps those uses for the FLOPs and counts the weights of the
L_w held layers alone (of each kind: global or local, MoE or dense), as ``Site.active`` does for Zamba's shared
blocks; Inkling 2's loop messages are held once a looped layer and run in each pass after the first
(``message_tensors``, ``message_flops``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.specs import ModelSpec

LAYER_KINDS: dict[str, Callable[[ModelSpec, int], bool]] = {
    "L": lambda spec, i: True,
    "L_global": lambda spec, i: spec.is_attention_layer(i) and not spec.is_local_layer(i),
    "L_local": lambda spec, i: spec.is_attention_layer(i) and spec.is_local_layer(i),
    "L_moe": lambda spec, i: spec.is_moe_layer(i),
    "L_dense": lambda spec, i: spec.has_ffn(i) and not spec.is_moe_layer(i),
}
"""The count symbols of layer tensors a looped model holds once a held layer, and which runs each counts."""


def held_once(spec: ModelSpec, tensors: list[WeightTensor]) -> list[WeightTensor]:
    """``tensors`` with each layer tensor (one a run of its kind: ``L``, or the global, local, MoE or dense layers')
    held by the held layers of that kind whose weights the runs share (L_w), and still used at each run."""
    reuse = spec.layer_reuse
    if reuse is None:
        return tensors
    firsts = sorted({layer: run for run, layer in reversed(list(enumerate(reuse.weights)))}.values())
    runs = {kind: sum(is_kind(spec, i) for i in range(spec.num_layers)) for kind, is_kind in LAYER_KINDS.items()}
    held = {kind: sum(is_kind(spec, i) for i in firsts) for kind, is_kind in LAYER_KINDS.items()}
    found = []
    for t in tensors:
        kind, _, rest = t.count_symbol.partition("·")
        if kind not in LAYER_KINDS or not runs[kind]:
            found.append(t)
            continue
        symbol = ("L_w" if kind == "L" else f"{kind}_w") + (f"·{rest}" if rest else "")
        found.append(replace(t, count=t.count // runs[kind] * held[kind], count_symbol=symbol, active=t.active))
    return found


def message_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Inkling 2's loop messages (Inkling2LoopMessageAttentionResidual, Inkling2LoopMessageGate): four learned queries
    of h a looped layer, and its four gates (Q's, K's, V's and the MLP's input), each 2·h → r and r → h twice; held
    once a looped layer (L_loop), run at each run after a held layer's first."""
    reuse = spec.layer_reuse
    if reuse is None or not reuse.messages:
        return []
    h, r = Dim(spec.hidden_size, "h"), Dim(reuse.messages.gate_rank, "r")
    looped, later = reuse.messages.layers, len(reuse.repeats)
    held = reuse.messages.query_layers or looped  # queries for the section as configured, past the last layer too
    queries = Site("loop_messages", held, "L_loop" if held == looped else "L_q", active=later)
    gates = Site("loop_messages", 4 * looped, "4·L_loop", active=4 * later)
    return [
        tensor("loop.message_queries", queries, (Dim(4, "4"), h), False),
        *linear("loop.gate_down", gates, r, Dim(2 * spec.hidden_size, "2·h"), False),
        *linear("loop.forget_gate", gates, h, r, False),
        *linear("loop.message_gate", gates, h, r, False),
    ]


def message_flops(spec: ModelSpec, block_layers: int) -> float:
    """Forward FLOPs per token of the loop messages' attention: at each run after a held layer's first, four queries
    against the m states of the previous pass (its blocks but the first, which every pass shares, and its output:
    the looped layers over ``block_layers``, the layers of a block), QKᵀ and AV, 2·2·m·h a query."""
    reuse = spec.layer_reuse
    if reuse is None or not reuse.messages:
        return 0.0
    states = reuse.messages.layers // block_layers
    return len(reuse.repeats) * 4 * 4 * states * spec.hidden_size


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
