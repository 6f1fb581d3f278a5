"""The routing tensors an MoE layer keeps for backward, and how an expert capacity changes them.

Dropless, each token's k assignments keep ``MoeRule.routing_bytes`` each: the top-k indices, the sort order, each
row's token index and its routing weight (lmcalc's reference MoE layer, ``reference_model.MoE``). Under an expert
capacity the experts compute k·ρ rows a token (``Workload.routed_share``), and the row index and the weight follow
those rows, the padding included (``MoE._to_capacity``). What the combine keeps of the experts' outputs depends on
where the routing weights multiply them.
"""

from __future__ import annotations

from lmcalc.engine.memory.branch_convs import branch_router_saved
from lmcalc.engine.memory.cca import mlp_router_saved
from lmcalc.engine.memory.ffn import UP
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

ROUTED_ROW_BYTES = 12
"""Of the routing's bytes per assignment, those a capacity carries per expert row, padding included: the row's token
index (int64) and its routing weight (fp32), the gather's index and the weight product's factor
(``reference_model.MoE._to_capacity``); the top-k indices and the sort order stay one per assignment."""


def router_input_saved(w: Workload, sb: float) -> list[SavedTensor]:
    """What the router's matmul keeps of its input (the MLP norm's output), with the experts' and the shared experts'
    first projections that read it too: the norm output in the activation dtype; beside it an fp32 copy where the
    model's code multiplies one (``MoeRule.router`` model and the model spec's moe.router_fp32); or, under an fp32
    autocast (``MoeRule.router`` fp32: torchtitan's ``TokenChoiceTopKRouter``), fp32 copies of the input and of the
    weight (E·h, the same whatever the tokens, and on every GPU of a TP or CP group), the norm output itself kept only
    where shared experts read it (the routed experts read the tokens gathered for them)."""
    moe, rule, act, h = w.model.moe, w.framework.moe.router, w.precision.activation_bytes, w.model.hidden_size
    assert moe is not None
    norm_output = SavedTensor("router / shared-expert input (norm output)", "s·b·h", sb * h, act, split="seq",
                              for_weights=("router", *UP))  # fmt: skip
    fp32_copy = SavedTensor("router input (fp32 copy)", "s·b·h", sb * h, 4, split="seq", for_weights=("router",))
    if act == 4 or rule == "activation" or rule == "model" and not moe.router_fp32:  # in fp32 .float() is x
        return [norm_output]
    if rule == "model":
        return [norm_output, fp32_copy]
    weight = SavedTensor("router weight (autocast's fp32 copy)", "E·h", moe.num_experts * h, 4, split="whole",
                         for_weights=("router",))  # fmt: skip
    return [norm_output, fp32_copy, weight] if moe.shared_experts else [fp32_copy, weight]


def router_saved(w: Workload, sb: float, k: int, rows: float, kr: str) -> list[SavedTensor]:
    """What the router keeps beyond its input: per score (over E + Z with zero-computation experts) its fp32
    probability, or what the profile's fused router keeps (``MoeRule.score_bytes``), and the routing's indices and
    weights (``routing_saved``); ZAYA's MLP router its own (``cca.mlp_router_saved``)."""
    moe = w.model.moe
    assert moe is not None
    if moe.router_rank:
        return mlp_router_saved(w)
    if (inkling := branch_router_saved(w, k)) is not None:  # Inkling's fp32 router, scoring the shared experts
        return inkling
    symbol, rule = ("s·b·(E+Z)" if moe.zero_experts else "s·b·E"), w.framework.moe
    scores = SavedTensor(rule.score_label, symbol, sb * moe.router_outputs, rule.score_bytes, split="seq")
    return [scores, *routing_saved(w, sb, k, rows, kr)]


def routing_saved(w: Workload, sb: float, k: int, rows: float, kr: str) -> list[SavedTensor]:
    """The routing's index tensors and weights: ``MoeRule.routing_bytes`` per assignment (s·b·k of them), of which
    ``ROUTED_ROW_BYTES`` follow the experts' rows instead where a capacity changes them (k·ρ·s·b)."""
    routing, per_token = w.framework.moe.routing_bytes, w.framework.moe.routing_token_bytes
    divisors = [SavedTensor("each token's sum of its k weights (fp32)", "s·b", sb, per_token, split="seq")]
    divisors = divisors if per_token else []
    if w.routed_share == 1:
        return [SavedTensor("routing indices and weights", "s·b·k", sb * k, routing, split="seq"), *divisors]
    per_row = min(routing, ROUTED_ROW_BYTES)
    return [
        SavedTensor("routing indices (top-k, sort order)", "s·b·k", sb * k, routing - per_row, split="seq"),
        SavedTensor("each expert row's token index and weight", f"{kr}·s·b", rows, per_row, split="seq"),
        *divisors,
    ]


def expert_loop(w: Workload) -> bool:
    """Whether the model's own code runs the experts one at a time (``MoESpec.expert_loop``), under a profile that
    runs the model's code (``MoeRule.router`` model)."""
    moe = w.model.moe
    return bool(moe and moe.expert_loop and w.framework.moe.router == "model")


def weighted_outputs(w: Workload) -> bool:
    """Whether an index_add keeps each expert's weighted output: the profile's rule, or the model's own loop."""
    return w.framework.moe.weighted_outputs or expert_loop(w)


def expert_outputs_saved(w: Workload, rows: float, kr: str) -> list[SavedTensor]:
    """The experts' outputs as the combine keeps them: for the product with the routing weights, and again weighted
    where an index_add keeps its source (``weighted_outputs``); none where the weights multiply inside the experts'
    fused activation (``MoeRule.probs_in_activation``: Megatron-Core's grouped MLP). A pick of a zero-computation
    expert does the same with the token itself: k − k·E/(E + Z) rows a token, each kept for the weight's product
    (and again weighted where the combine keeps weighted outputs)."""
    rule, act, moe = w.framework.moe, w.precision.activation_bytes, w.model.moe
    h, io = w.model.hidden_size, w.expert_width  # the experts' outputs are l wide in a latent MoE
    if rule.probs_in_activation:
        return []
    if rule.outputs_fp32:  # torchtitan's combine: (out.float() · weight).to(act), then a scatter_add keeping its index
        label = "expert outputs, fp32 copy (for the routing-weight product)"
        return [SavedTensor(label, f"{kr}·s·b·{io.symbol}", rows * io.size, 4, split="seq")]
    outputs = [
        SavedTensor(
            "expert outputs (for the routing-weight product)", f"{kr}·s·b·{io.symbol}", rows * io.size, act, split="seq"
        )  # fmt: skip
    ]
    if weighted_outputs(w):
        label = "weighted expert outputs (index_add keeps its source)"
        outputs.append(SavedTensor(label, f"{kr}·s·b·{io.symbol}", rows * io.size, act, split="seq"))
    if moe and moe.zero_experts:
        passed, symbol = (moe.k - moe.computed_k) * w.tokens * h, "(k−k·E/(E+Z))·s·b·h"
        outputs.append(SavedTensor("tokens a zero-computation expert passes (for the weight's product)", symbol,
                                   passed, act, split="seq"))  # fmt: skip
        if weighted_outputs(w):
            label = "their weighted copies (index_add keeps its source)"
            outputs.append(SavedTensor(label, symbol, passed, act, split="seq"))
    return outputs


def routed_symbol(w: Workload) -> str:
    """The routed experts' rows per token in a formula: k, or k·ρ under a capacity that changes them; k·E/(E+Z) where
    zero-computation experts take some of the k (``MoESpec.computed_k``); E where every token reaches every expert
    (``Workload.routed_copies``)."""
    moe = w.model.moe
    if moe and moe.dense_dispatch and w.framework.moe.router == "model":
        return "E"
    k = "k·E/(E+Z)" if moe and moe.zero_experts else "k"
    return k if w.routed_share == 1 else f"{k}·ρ"
