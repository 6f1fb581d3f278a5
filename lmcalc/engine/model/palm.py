"""The napkin rule 6·N·D (Kaplan et al. 2020 §2.1) and the PaLM convention of training FLOPs (Chowdhery et al. 2022,
Appendix B), as nanoGPT's ``estimate_mfu`` counts them: 6·N for the weights, N every parameter, and 12·L·H·Q·T for
attention, non-causal. ``engine.model.flops`` holds the detailed count they are set beside."""

from __future__ import annotations

from lmcalc.engine.model.flops import FLOPS_PER_PARAM_PER_TOKEN
from lmcalc.engine.model.params import active_params, count_params
from lmcalc.result import Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group, sci


def napkin_params(spec: ModelSpec) -> int:
    """The N of 6·N·D: all parameters for a dense model, the active ones for MoE."""
    return active_params(spec) if spec.moe else count_params(spec).total


def napkin_section(spec: ModelSpec, tokens: float) -> Section:
    n = napkin_params(spec)
    n_name = "N_active" if spec.moe else "N"
    return Section(
        "napkin",
        "Napkin rule (6·N·D)",
        (
            Term(
                "forward",
                "Forward",
                2 * n * tokens,
                "FLOPs",
                f"2·{n_name}·D",
                f"2 × {group(n)} × {sci(tokens)}",
                "Kaplan et al. 2020 §2.1: 2 FLOPs per parameter per token",
            ),
            Term(
                "backward",
                "Backward",
                4 * n * tokens,
                "FLOPs",
                f"4·{n_name}·D",
                f"4 × {group(n)} × {sci(tokens)}",
                "backward = 2 × forward (gradients w.r.t. inputs and weights)",
            ),
            Term(
                "total",
                "Total training FLOPs",
                FLOPS_PER_PARAM_PER_TOKEN * n * tokens,
                "FLOPs",
                f"6·{n_name}·D",
                f"6 × {group(n)} × {sci(tokens)}",
                "Kaplan et al. 2020; Hoffmann et al. 2022 (C ≈ 6ND)",
                note="each held weight once, though a looped model runs it more often: the detailed count below "
                "counts every run"
                if spec.layer_reuse
                else "",
            ),
        ),
    )


def palm_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Chowdhery et al. 2022 (PaLM) Appendix B, as nanoGPT's ``estimate_mfu`` computes it: 6N + 12·L·H·Q·T."""
    return 6 * napkin_params(spec) + 12 * spec.num_layers * spec.num_heads * _palm_q(spec) * seq_len


def _palm_q(spec: ModelSpec) -> float:
    """PaLM's Q, a head's width: the attention layers' mean where the global ones have their own (Gemma 4)."""
    g = spec.global_attention
    if g is None:
        return spec.qk_head_dim
    local = spec.local_layers
    return (local * spec.head_size + (spec.attention_layers - local) * g.head_dim) / spec.attention_layers


def palm_section(spec: ModelSpec, tokens: float, seq_len: int) -> Section:
    n = napkin_params(spec)
    per_token = palm_flops_per_token(spec, seq_len)
    L, H, Q = spec.num_layers, spec.num_heads, f"{_palm_q(spec):g}"
    return Section(
        "palm",
        "PaLM / nanoGPT convention (6N + 12·L·H·Q·T)",
        (
            Term(
                "per_token",
                "Training per token",
                per_token,
                "FLOPs",
                "6·N + 12·L·H·Q·T",
                f"6 × {group(n)} + 12 × {L} × {H} × {Q} × {seq_len}",
                "Chowdhery et al. 2022 Appendix B; karpathy/nanoGPT estimate_mfu",
                note="N counts every parameter, embeddings included; attention counted non-causal",
            ),
            Term(
                "total",
                "Total training FLOPs",
                per_token * tokens,
                "FLOPs",
                "per token · D",
                f"{sci(per_token, 4)} × {sci(tokens)}",
            ),
        ),
    )
