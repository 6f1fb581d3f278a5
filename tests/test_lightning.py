"""MiniMax-01's lightning attention (MiniMax 2025, arXiv:2501.08313 §2.2), against hand derivations written here and
against transformers: the parameter count is exact (tests/test_hf_types.py), the FLOPs equal FlopCounterMode's on
transformers' blockwise PyTorch path with what that path leaves out stated (here at lengths that fill, span and
split blocks), the state a sequence keeps at inference is transformers' cache, and the saved bytes and step peak
under ``--framework transformers`` are the harness's (minimax-small in tests/test_framework_transformers.py and
tests/test_step_phases.py)."""

from __future__ import annotations

import warnings

import pytest

from lmcalc.engine.inference.serving import state_bytes
from lmcalc.engine.model.mixer_flops import ssm_flops
from lmcalc.engine.model.params import count_params
from lmcalc.specs import ModelSpec

# a small MiniMax: h 64, 4 heads of 16, layers 1 and 3 lightning (every second, from layer 1), blocks of 16
SMALL = {
    "name": "small-minimax", "vocab_size": 512, "hidden_size": 64, "num_layers": 4, "num_heads": 4,
    "num_kv_heads": 2, "ffn_size": 96, "norm_kind": "rmsnorm", "ffn_kind": "swiglu", "tied_embeddings": False,
    "position_embedding": "rope", "max_seq_len": 128,
    "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_size": 96},
    "lightning": {"heads": 4, "head_dim": 16, "block": 16, "attention_layer_ids": [0, 2]},
}  # fmt: skip


def spec(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate({**SMALL, **fields})


def test_a_lightning_layer_holds_its_norm_and_three_projections():
    # per lightning layer: the norm over H·d (64), q‖k‖v (3·64 × 64), the gate (64 × 64), the output (64 × 64); the
    # attention layers' q, k, v, o: 64·64 + 2·(32·64) + 64·64
    lightning = 64 + 3 * 64 * 64 + 64 * 64 + 64 * 64
    attention = 64 * 64 + 2 * 32 * 64 + 64 * 64
    without = spec(lightning=None)
    assert count_params(spec()).total - count_params(without).total == 2 * (lightning - attention)
    assert count_params(spec()).by_group["ssm"] == 2 * lightning


def test_the_blockwise_products_by_hand():
    # s = 20: a block of 16 and one of 4. Within blocks Q·Kᵀ and its product with V, 2·H·n²·d each; across blocks
    # the state's read and update, 2·H·d² each a token
    assert ssm_flops(spec(), 20) == pytest.approx(4 * (4 * 16 * (16**2 + 4**2) / 20 + 4 * 16**2))
    assert ssm_flops(spec(), 32) == pytest.approx(4 * (4 * 16 * 16 + 4 * 16**2))  # two whole blocks


@pytest.mark.torch
def test_what_the_pytorch_path_leaves_out_by_hand():
    # the first block's product with the zero state has one gradient (2·b·H·n₁·d² fewer), the last block's update
    # none (4·b·H·n_last·d² fewer), in each of the 2 lightning layers; s = 20, b = 2: n₁ = 16, n_last = 4
    pytest.importorskip("torch")
    from lmcalc.validate_hf import torch_path_flops

    assert torch_path_flops(spec(), 20, 2) == -2 * (2 * 2 * 4 * 16 * 16**2 + 4 * 2 * 4 * 4 * 16**2)
    assert torch_path_flops(spec(), 16, 1) == -2 * (2 * 4 * 16 * 16**2 + 4 * 4 * 16 * 16**2)  # one block: both


def test_the_state_is_h_heads_of_d_by_d():
    assert state_bytes(spec(), 2) == 2 * 4 * 16 * 16 * 2


@pytest.mark.torch
@pytest.mark.parametrize(("seq", "batch"), [(7, 2), (16, 1), (20, 1), (40, 2)])
def test_flops_equal_flopcountermode_within_and_across_blocks(seq: int, batch: int):
    pytest.importorskip("transformers")
    from hf_tiny import tiny_config

    from lmcalc.validate_hf import transformers_check

    result = transformers_check(tiny_config("minimax"), seq, batch)
    assert result.value("params.error") == 0
    assert abs(result.value("flops.error")) < 1e-9


@pytest.mark.torch
def test_the_state_a_sequence_keeps_is_transformers_cache():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_tiny import tiny_config

    from lmcalc.hf_config import model_from_hf_config

    config = tiny_config("minimax")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.zeros(2, 20, dtype=torch.long), use_cache=True).past_key_values
    linear = [cache.get_linear_cache(i) for i in (1, 3)]
    model_spec = ModelSpec.model_validate(model_from_hf_config(config, "minimax", "minimax"))
    assert sum(t.numel() * t.element_size() for t in linear) == 2 * state_bytes(model_spec, 2)
