"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, OLMo Hybrid, Lara Mini: Yang, Kautz & Hatamizadeh 2025), against
transformers. The parameter count is exact (tests/test_hf_types.py), the FLOPs equal FlopCounterMode's on
transformers' PyTorch path with its implementation's extra work stated (tests/test_validate_hf.py; here at lengths
that pad, fill and span chunks), and the state a sequence keeps at inference is the cache transformers allocates. The
saved activations are an estimate of flash-linear-attention's kernels (no fla here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import cached_state_bytes, tiny_config  # noqa: E402

from lmcalc.engine.inference.serving import state_bytes  # noqa: E402
from lmcalc.engine.model.mixer_flops import ssm_flops  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402
from lmcalc.validate_hf import transformers_check  # noqa: E402

pytestmark = pytest.mark.torch


def spec_of(kind: str) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))


@pytest.mark.parametrize("kind", ["qwen3_next", "olmo_hybrid", "lara_mini", "kimi_linear", "bailing_hybrid"])
@pytest.mark.parametrize(("seq", "batch"), [(20, 1), (64, 2), (150, 1)])
def test_flops_equal_flopcountermode_within_and_across_chunks(kind: str, seq: int, batch: int):
    # s = 20 pads one chunk of 64, s = 64 fills it, s = 150 spans three (the last one padded); OLMo Hybrid projects
    # q, k, v, the gate, β and α by six modules and concatenates q‖k‖v for the convolution; Kimi Delta Attention's
    # chunk_kimi_delta_attention computes K·βKᵀ and QKᵀ element-wise (which the counter does not see) and the solved
    # system's two products as matmuls, which with d_k = d_v count what lmcalc's forward counts
    result = transformers_check(tiny_config(kind), seq, batch)
    assert result.value("params.error") == 0
    assert abs(result.value("flops.error")) < 1e-9


def test_the_chunked_rules_forward_flops_by_hand():
    # one layer's mixer beyond its projections at s = 20 (one chunk of C = 64, padded): the convolution over
    # c_d = 2·2·16 + 4·16 = 128 channels, 2·128·4 a token; per value head (4) and padded token (64/20 of each token)
    # 4·64·16 + 2·64·16 (the intra-chunk products) + 6·16·16 (the state's reads and update)
    spec = spec_of("qwen3_next")
    assert ssm_flops(spec, 20) == pytest.approx(2 * 128 * 4 + 64 / 20 * 4 * (4 * 64 * 16 + 2 * 64 * 16 + 6 * 16 * 16))


@pytest.mark.parametrize("kind", ["qwen3_next", "olmo_hybrid", "lara_mini"])
def test_the_state_a_sequence_keeps_is_transformers_cache(kind: str):
    # after a prefill, transformers' cache holds per linear layer the convolution's last K inputs of q‖k‖v in the
    # model's dtype and the recurrent state, H_v × d_k × d_v, in fp32
    spec = spec_of(kind)
    linear = [i for i in range(spec.num_layers) if not spec.is_attention_layer(i)]
    assert linear == ([0, 2] if kind == "lara_mini" else [0, 1, 2])  # Lara Mini's layer 1 attends in a window
    assert cached_state_bytes(kind, linear, batch=2) == 2 * state_bytes(spec, 2)
