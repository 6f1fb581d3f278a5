"""What DeepSeek-V4 caches beyond the window every layer keeps (DeepSeek-AI 2026, DeepSeek-V4 §2.3; transformers'
DeepseekV4CSACache and DeepseekV4HCACache): each compressed layer's entries, one a closed window of m tokens (d wide,
and in a CSA layer the indexer's key of d_I beside it), and what its compressors hold of the window not yet closed
(each token's values and gates, 2·d and 2·d_I wide in a CSA layer, d in an HCA layer) and, in a CSA layer, the last
closed window's first series (m × d and m × d_I, values and gates), which the next entry overlaps.

``engine.inference.serving`` adds it to the window's cache; one key-value head serves every query head, so every TP
rank keeps all of it."""

from __future__ import annotations

from dataclasses import dataclass

from lmcalc.specs import ModelSpec


@dataclass(frozen=True)
class CompressedCache:
    """The compressed layers' cache of one sequence, at ``kv_bytes`` an element."""

    csa_layers: int
    hca_layers: int
    csa_rate: int  # m
    hca_rate: int  # m'
    head_dim: int  # d
    indexer_dim: int  # d_I
    kv_bytes: float

    def entries(self, context: int) -> float:
        """The entries of the closed windows: L_CSA·⌊s/m⌋·(d + d_I) + L_HCA·⌊s/m'⌋·d elements."""
        csa = self.csa_layers * (context // self.csa_rate) * (self.head_dim + self.indexer_dim)
        hca = self.hca_layers * (context // self.hca_rate) * self.head_dim
        return (csa + hca) * self.kv_bytes

    def unclosed(self, context: int) -> float:
        """The compressors' state: the tokens of the window not yet closed, s mod m of them, their values and gates
        (a CSA layer's 2·(2·d + 2·d_I) elements a token, an HCA layer's 2·d), and once a CSA window has closed, its
        first series' values and gates, 2·m·(d + d_I)."""
        d, c, m = self.head_dim, self.indexer_dim, self.csa_rate
        csa = (context % m) * 2 * (2 * d + 2 * c) + (2 * m * (d + c) if context >= m else 0)
        hca = (context % self.hca_rate) * 2 * d
        return (self.csa_layers * csa + self.hca_layers * hca) * self.kv_bytes

    def per_sequence(self, context: int) -> float:
        return self.entries(context) + self.unclosed(context)

    def most(self, context: int) -> float:
        """An upper bound that never falls as the context grows, for the longest context that fits: the entries, and
        the compressors' state at its fullest (each window one token short of closing, a CSA window closed before)."""
        d, c, m, m2 = self.head_dim, self.indexer_dim, self.csa_rate, self.hca_rate
        csa = (m - 1) * 2 * (2 * d + 2 * c) + 2 * m * (d + c)
        hca = (m2 - 1) * 2 * d
        return self.entries(context) + (self.csa_layers * csa + self.hca_layers * hca) * self.kv_bytes


def compressed_cache(spec: ModelSpec, kv_bytes: float) -> CompressedCache | None:
    """DeepSeek-V4's compressed layers' cache; None for a model without them."""
    c = spec.compressed_attention
    if c is None:
        return None
    return CompressedCache(
        csa_layers=len(c.csa_layer_ids),
        hca_layers=len(c.hca_layer_ids),
        csa_rate=c.csa_rate,
        hca_rate=c.hca_rate,
        head_dim=spec.head_size,
        indexer_dim=c.indexer.head_dim,
        kv_bytes=kv_bytes,
    )
