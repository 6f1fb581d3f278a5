"""Megatron-Core's fine-grained activation offloading of the routed experts (``--offload-modules``;
megatron/core/pipeline_parallel/fine_grained_activation_offload.py and transformer/moe/experts.py at d98e8a64): the
tensors a named module keeps, each of at least ``--min-offloaded-tensor-size`` elements, wait in host memory, every
layer's group but the one the backward reaches first (``post_warmup_callback``'s offload margin keeps it).

By hand on Qwen3 30B-A3B (48 MoE layers, h 2048, 128 experts of 768 chosen 8 at a time; HF Qwen/Qwen3-30B-A3B) at
4,096 tokens on 8 H100 with EP 8, bf16: Megatron-Core's grouped MLP keeps its input, the k·s = 32,768 rows of h
(67,108,864 elements), the gate's and the up projection's outputs and their SwiGLU product, each k·s·f_e =
25,165,824 elements.
"""

from __future__ import annotations

import pytest

import lmcalc
from lmcalc.errors import LmcalcError

SETTINGS = {"model": "qwen3-30b-a3b", "gpus": "8xH100", "ep": 8, "seq": 4096, "framework": "megatron"}
FC1_INPUT, EACH = 8 * 4096 * 2048, 8 * 4096 * 768
MOE_LAYERS = 48


def _held(**settings) -> float:
    return lmcalc.memory(**SETTINGS, **settings).gpu.held.total


def test_the_fused_grouped_mlp_leaves_all_it_keeps_on_the_host_but_the_last_layers():
    kept = _held()
    assert FC1_INPUT == 67_108_864 and EACH == 25_165_824
    per_layer = 2 * (FC1_INPUT + 3 * EACH)  # bf16: the input, gate and up outputs, their product
    assert kept - _held(offload_modules="fused_group_mlp") == (MOE_LAYERS - 1) * per_layer
    # the first projection's input alone
    assert kept - _held(offload_modules="expert_fc1") == (MOE_LAYERS - 1) * 2 * FC1_INPUT


def test_only_tensors_of_the_minimum_size_leave():
    # 60 M elements: the 67 M-element input goes, the 25 M-element gate, up and product stay
    kept = _held()
    assert (
        kept - _held(offload_modules="fused_group_mlp", min_offloaded_tensor_size=60_000_000)
        == (MOE_LAYERS - 1) * 2 * FC1_INPUT
    )
    assert _held(offload_modules="fused_group_mlp", min_offloaded_tensor_size=70_000_000) == kept


def test_the_inputs_and_the_formula_say_so():
    estimate = lmcalc.memory(**SETTINGS, offload_modules="fused_group_mlp")
    (recompute,) = [i for i in estimate.report.inputs if i.key == "recompute"]
    assert "fused_group_mlp offloaded to the CPU, every MoE layer's but the last" in str(recompute.value)
    assert "--offload-modules" in recompute.origin
    assert "(L_moe − 1)" in estimate.report.term("activations.total").formula


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"offload_modules": "attn_norm"}, r"offload.modules"),
        ({"offload_modules": "fused_group_mlp,expert_fc1"}, r"fused_group_mlp covers expert_fc1"),
        ({"offload_modules": "fused_group_mlp", "pp": 2}, r"modelled on one pipeline stage, not PP=2"),
        ({"offload_modules": "fused_group_mlp", "framework": "torchtitan", "zero": 3}, r"fine-grained activation"),
        ({"offload_modules": "expert_fc1", "model": "llama-3.1-8b", "ep": 1}, r"routed experts' inputs; .* has none"),
    ],
)
def test_what_is_not_modelled_is_refused_in_a_line(settings, message):
    with pytest.raises(LmcalcError, match=message):
        lmcalc.memory(**{**SETTINGS, **settings})
