"""Doge's CDMoE (``specs.RetrievalExpertsSpec``; transformers 5.24's DogeCDMoE): the tensors its single-neuron experts
and their product-key router add to the layer's SwiGLU, which is its shared expert. ``engine.model.params`` lists them
and ``engine.model.flops`` counts them as it counts every matmul weight, by the copies a token uses: the router's
2·√E·h, and of the E experts' rows of ``down_embed`` and ``up_embed`` (h each) the k a token retrieves."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.specs import ModelSpec

EMBEDDINGS = ("down_embed", "up_embed")
"""The experts' two nn.Embedding tables, E × h, in DogeCDMoE's order: a token's k rows of each are gathered."""


def retrieval_expert_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Each layer's router_gate (2·√E × h, no bias: two halves of √E key scores) and its E experts' rows of
    down_embed and up_embed (h each), of which a token uses k: single-neuron experts, h → 1 → h."""
    r = spec.retrieval_experts
    if r is None:
        return []
    L, h = spec.num_layers, Dim(spec.hidden_size, "h")
    experts = Site("mlp", L * r.experts, "L·E", active=L * r.top_k)
    return [
        *linear("mlp.router", Site("mlp", L, "L"), Dim(2 * r.keys, "2·√E"), h, False),
        *(tensor(f"mlp.{name}", experts, (h,), True) for name in EMBEDDINGS),
    ]
