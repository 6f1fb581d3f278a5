"""FLOP counts checked against the papers' closed forms, derived by hand below."""

import pytest

from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.palm import napkin_params, napkin_section, palm_flops_per_token
from lmcalc.presets import resolve_model


def gpt3():
    return resolve_model("gpt3-175b").spec


def test_gpt3_napkin_matches_table_d1():
    # GPT-3 paper Table D.1: 175B on 300B tokens = 3.14e23 FLOPs (6·N·D, N = 174.6B).
    total = napkin_section(gpt3(), 300e9).term("total").value
    assert total == pytest.approx(3.14e23, rel=0.005)


def test_forward_backward_split_is_one_to_two():
    # Lecture: forward 2·N·D, backward 4·N·D.
    section = napkin_section(gpt3(), 1e9)
    assert section.term("backward").value == 2 * section.term("forward").value


def test_detailed_full_attention_is_korthikanti_eq7():
    # Korthikanti et al. 2022 eq. (7): model FLOPs per iteration = 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)),
    # i.e. per token 72·L·h² + 12·L·s·h + 6·h·V for a GPT block (4h MLP, full attention).
    m = gpt3()
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, 2048
    expected = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    fwd = fl.forward_flops_per_token(m, s, "full")
    assert 3 * fwd.total == pytest.approx(expected, rel=1e-12)


def test_full_recompute_is_narayanan_eq3():
    # Narayanan et al. 2021 eq. (3) assumes full recomputation: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)),
    # per token 96·l·h² + 16·l·s·h + 6·h·V: the layers' forward is done twice, the logits once.
    m = gpt3()
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, 2048
    fwd = fl.forward_flops_per_token(m, s, "full")
    hardware = 3 * fwd.total + fl.recompute_flops_per_token(fwd, "full")
    assert hardware == pytest.approx(96 * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)


def test_selective_recompute_adds_one_attention_core_forward():
    # Selective recomputation redoes QKᵀ and AV forward once: 2·2·L·s·h per token (full convention).
    m = gpt3()
    fwd = fl.forward_flops_per_token(m, 2048, "full")
    assert fl.recompute_flops_per_token(fwd, "selective") == 4 * m.num_layers * 2048 * m.hidden_size


def test_causal_attention_counts_half_plus_diagonal():
    # Query i attends to keys 1..i: Σ i = s(s+1)/2 per sequence, (s+1)/2 per token.
    m = gpt3()
    s = 2048
    full = fl.forward_flops_per_token(m, s, "full")
    causal = fl.forward_flops_per_token(m, s, "causal")
    assert causal.attention_scores == pytest.approx(full.attention_scores * (s + 1) / (2 * s), rel=1e-12)
    assert causal.projections == full.projections and causal.logits == full.logits


def test_palm_convention_is_6n_plus_12lhqt():
    # PaLM Appendix B / nanoGPT estimate_mfu: 6N + 12·L·H·Q·T per token.
    m = resolve_model("gpt2-124m").spec
    n = 124_439_808  # HF gpt2 parameter count
    assert palm_flops_per_token(m, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_moe_counts_active_parameters_only():
    # Mixtral 8x7B: 2 of 8 experts per token. Active count 12,879,925,248 is the reference's derived
    # figure (published_models.yaml: embed + head + 32·(attention + 2 experts + router + norms) + norm).
    m = resolve_model("mixtral-8x7b").spec
    assert napkin_params(m) == 12_879_925_248
    # The router (8 × 4096 per layer) is a matmul; the unvisited 6 experts are not.
    h, f, L = 4096, 14336, 32
    fwd = fl.forward_flops_per_token(m, 4096, "full")
    assert fwd.mlp == 2 * L * (2 * 3 * h * f + 8 * h)


def test_llama_gqa_projection_flops():
    # Llama 3 8B: q and o are h×h, k and v are h×(8·128): 2·L·(2h² + 2·h·1024) per token.
    m = resolve_model("llama-3.1-8b").spec
    h, L = 4096, 32
    assert fl.forward_flops_per_token(m, 8192).projections == 2 * L * (2 * h * h + 2 * h * 1024)


def test_detailed_minus_napkin_is_attention_minus_non_matmul_weights():
    # For a dense model the detailed count adds attention and drops what is no matmul:
    # detailed − napkin per token = attention − 6·V·h (embedding lookup) − 6·(2·L·h + h) (norm weights).
    m = resolve_model("llama-3.1-8b").spec
    s = 8192
    fwd = fl.forward_flops_per_token(m, s, "causal")
    napkin = 6 * napkin_params(m)
    difference = 3 * fwd.total - napkin
    attention = 3 * (fwd.attention_scores + fwd.attention_values)
    norms = 2 * m.num_layers * m.hidden_size + m.hidden_size
    assert difference == pytest.approx(attention - 6 * m.vocab_size * m.hidden_size - 6 * norms, rel=1e-12)
