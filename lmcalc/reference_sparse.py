"""DeepSeek sparse attention's lightning indexer for the reference model (DeepSeek-AI 2025, DeepSeek-V3.2 §2.1): each
query's top k_I keys by I(t, s) = Σ_j w(t, j) · ReLU(q(t, j) · k(s)), as an additive mask on the attention.

It runs without gradients, as transformers' DeepseekV32Indexer does (its own training loss is not modelled), and
scores every key before the causal mask, as transformers does: what ``engine.model.flops`` counts in the full
convention. RoPE on the indexer's queries and key changes no count and is left out. torch is imported here and
nowhere in the accounting path."""

from __future__ import annotations

import torch
from torch import nn

from lmcalc.specs import ModelSpec


class Indexer(nn.Module):
    """Queries from the query latent, one key with a LayerNorm, a weight per head (``mla.indexer``)."""

    def __init__(self, spec: ModelSpec, **kw):
        super().__init__()
        ix, m = spec.indexer, spec.mla
        assert ix is not None and m is not None and m.q_lora_rank is not None
        self.heads, self.head_dim, self.top_k = ix.heads, ix.head_dim, ix.top_k
        self.wq_b = nn.Linear(m.q_lora_rank, ix.heads * ix.head_dim, bias=False, **kw)
        self.wk = nn.Linear(spec.hidden_size, ix.head_dim, bias=False, **kw)
        self.k_norm = nn.LayerNorm(ix.head_dim, **kw)
        self.weights_proj = nn.Linear(spec.hidden_size, ix.heads, bias=False, **kw)

    @torch.no_grad()
    def selection(self, x: torch.Tensor, latent: torch.Tensor, causal_bias: torch.Tensor) -> torch.Tensor:
        """An additive mask of shape (b, 1, s, s): 0 at each query's top k_I keys among those it may see, −inf
        elsewhere."""
        b, s, _ = x.shape
        q = self.wq_b(latent).view(b, s, self.heads, self.head_dim)
        k = self.k_norm(self.wk(x))
        scores = torch.relu(torch.einsum("bthd,bsd->bths", q, k))  # every query head against every key
        index = torch.einsum("bth,bths->bts", self.weights_proj(x), scores) + causal_bias[:s, :s]
        chosen = index.topk(min(self.top_k, s), dim=-1).indices
        outside = torch.ones_like(index, dtype=torch.bool).scatter(-1, chosen, False)
        return causal_bias[:s, :s].masked_fill(outside, float("-inf")).unsqueeze(1)
