"""Issue #32 items 5 and 13: max-params solves the depth to the layer between the KV-group shapes, says in its
headline under which profile, what binds and what would lift it, and answers (not ZeroDivisionError) when every
state is offloaded.

The lecture's question, 8 H100s with AdamW counted as the papers count it (``--framework idealised``), worked by
hand below: the widest shape of Llama 3.1 8B's proportions that fits is 10 KV groups (h = 5,120, 40 layers,
14.95 B); before this issue that was the answer, and the 18-byte megatron profile gave the same 14.95 B. At that
width each layer adds m ≈ 1.54 GB, so 9 more layers fit in an H100's 85.03 GB: 49 layers, 18.01 B.
"""

from __future__ import annotations

import math

import pytest

import lmcalc
from lmcalc.engine.search.maxparams import with_layers

V, H, KV_HEADS, D, F = 128_256, 5_120, 10, 128, 17_920  # llama-3.1-8b's proportions at 10 KV groups
S = 4_096  # tokens a sequence, micro-batch 1
C = 85_028_896_768  # an H100's bytes as CUDA gives them (deviceQuery's 81090 MBytes), not the label's 80 × 10⁹
GPUS = 8

# One layer's parameters: q and o (h·h each), k and v (h·H_kv·d each), gate, up and down (h·f each), two RMSNorms.
LAYER_PARAMS = 2 * H * H + 2 * H * KV_HEADS * D + 3 * H * F + 2 * H
assert LAYER_PARAMS == 340_797_440


def params(layers: int) -> int:
    """The untied embedding and head (2·V·h), the layers, the final norm."""
    return 2 * V * H + layers * LAYER_PARAMS + H


# One layer's activations under the idealised profile, bytes a token (bf16 unless said): the attention norm's input
# (2h) and fp32 1/rms (4), the QKV input (2h), Q after RoPE (2h), K after RoPE and V (2·2·H_kv·d), FlashAttention's
# output, which the output projection reads (2h), and its fp32 log-sum-exp a head (4·40), the MLP norm's input and
# 1/rms (2h + 4), the MLP input (2h), gate, up, SiLU(gate) and their product (4·2f).
LAYER_ACTIVATIONS = S * (12 * H + 4 + 4 * KV_HEADS * D + 4 * 40 + 4 + 8 * F)
assert LAYER_ACTIVATIONS == 860_520_448
# Outside the layers: fp32 logits (4·s·V), the final norm's input, 1/rms and output (2h + 4 + 2h), and the int64
# token ids and targets (2·8).
OUTSIDE = S * (4 * V + 4 * H + 4 + 16)
ALLOWANCE = 2 * 2**30  # the idealised profile's flat allowance


def memory(layers: int) -> float:
    """M(L), the idealised profile's total on one GPU under ZeRO-3 over 8: 16 B a parameter sharded 8 ways (2 B), the
    activations, two gathered layers of 2-byte weights (the layer in use and the one prefetched, each the average
    layer: 2·N / L bytes), and the allowance."""
    n = params(layers)
    return 2 * n + layers * LAYER_ACTIVATIONS + OUTSIDE + 2 * (2 * n / layers) + ALLOWANCE


def test_the_depth_is_solved_to_the_layer_as_derived_by_hand():
    found = lmcalc.max_params(gpus="8xH100", framework="idealised")
    row = found.rows[3]
    assert row.zero_stage == 3
    # the widest shape of the template's proportions: 10 KV groups, 40 layers (11 groups, 44 layers, does not fit)
    assert memory(40) <= C
    assert row.solved is not None and row.solved.rung_layers == 40 and row.solved.rung_params == params(40)
    assert row.solved.rung_memory == pytest.approx(memory(40), rel=1e-12)  # 70.14 GB
    # m, one layer more at that width: its states (2 B a parameter) and activations, the gathered layers a little
    # smaller (their average layer holds less of the embedding): within 0.3 % of the first two alone
    m = memory(41) - memory(40)
    assert m == pytest.approx(2 * LAYER_PARAMS + LAYER_ACTIVATIONS, rel=3e-3)
    assert row.solved.layer_bytes == pytest.approx(m, rel=1e-12)
    # L = L_g + ⌊(C − M(L_g)) / m⌋ = 40 + ⌊(85.03 − 70.14) / 1.539⌋ = 40 + 9
    layers = 40 + math.floor((C - memory(40)) / m)
    assert layers == 49 and memory(49) <= C < memory(50)
    assert row.activation_shape is not None
    assert (row.activation_shape.hidden_size, row.activation_shape.num_layers) == (H, 49)
    assert row.with_activations == params(49) == 18_012_421_120
    assert row.memory is not None and row.memory.total == pytest.approx(memory(49), rel=1e-12)  # 83.99 GB
    assert row.solved.beyond == pytest.approx(memory(50), rel=1e-12)  # 85.53 GB
    assert "L_g = 40" in found.report.term("zero3.with_activations").substituted
    assert "⌊(85.03 − 70.14) / 1.539⌋ = 9 more" in found.report.term("zero3.with_activations").substituted


def test_every_answer_is_the_deepest_that_fits_at_its_width():
    """What max-params says fits, memory says fits, to the byte; one layer more at the same width does not."""
    for framework in ("megatron", "deepspeed", "transformers"):
        found = lmcalc.max_params(gpus="8xH100", framework=framework)
        for row in found.rows:
            assert row.activation_shape is not None and row.memory is not None
            settings = {"gpus": "8xH100", "seq": 4096, "dp": 8, "zero": row.zero_stage, "framework": framework}
            fed_back = lmcalc.memory(model=row.activation_shape, **settings)
            assert fed_back.fits and fed_back.total == row.memory.total
            deeper = with_layers(row.activation_shape, row.activation_shape.num_layers + 1)
            assert not lmcalc.memory(model=deeper, **settings).fits


def test_the_profiles_no_longer_land_on_one_rung():
    # 16 B a parameter (idealised) and Megatron's 18 gave the same 14.95 B; now each its own depth
    idealised = lmcalc.max_params(gpus="8xH100", framework="idealised").rows[3]
    megatron = lmcalc.max_params(gpus="8xH100", framework="megatron").rows[3]
    assert idealised.with_activations == params(49) == 18_012_421_120
    assert megatron.with_activations < idealised.with_activations
    assert megatron.states_only == pytest.approx(8 * C / 18)  # 37.79 B


def test_the_headline_names_the_profile_the_napkin_what_binds_and_the_lever():
    found = lmcalc.max_params(gpus="8xH100", framework="idealised")
    first, states, lever, others = found.report.headline
    assert first.startswith("On 8xh100-sxm (idealised profile): up to 18.01 B params with ZeRO-3 / FSDP")
    assert "at 4,096 tokens × micro-batch 1, recomputation none" in first
    # the lecture's napkin, 8 × 80 GB / 16 B = 40 B, at the H100's 85.03 GB: 42.51 B; at 18.01 B the activations
    # (49 layers' and the head's: 49 · 0.8605 + 2.185 = 44.4 GB) outweigh the states (2 B a parameter: 36.0 GB)
    assert f"{(49 * LAYER_ACTIVATIONS + OUTSIDE) / 1e9:.1f}" == "44.4" and f"{2 * params(49) / 1e9:.1f}" == "36.0"
    assert states.startswith("states alone: 42.51 B params (8 × 85.03 GB / 16 B a parameter)")
    assert "the states take 36.0 GB, the activations 44.4 GB of 85.03 GB: activations bind" in states
    # the lever's figure is the answer with that flag given
    full = lmcalc.max_params(gpus="8xH100", framework="idealised", recompute="full").rows[3]
    assert lever == f"the lever: --recompute full lifts it to {full.with_activations / 1e9:.4g} B params"
    assert others.startswith("Data parallel (replicated): ")


def test_where_the_states_bind_the_lever_is_more_gpus():
    found = lmcalc.max_params(gpus="8xH100", framework="idealised", recompute="full")
    assert found.report.headline[1].endswith("model states bind")
    doubled = lmcalc.max_params(gpus="16xH100", framework="idealised", recompute="full").rows[3]
    assert found.report.headline[2] == (
        f"the lever: --gpus 2x8xh100-sxm with ZeRO-3 lifts it to {doubled.with_activations / 1e9:.4g} B params"
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"offload": "optimizer+params"},
        {"offload": "optimizer+params", "framework": "deepspeed"},
        {"method": "qlora"},
        {"method": "qlora", "offload": "optimizer+params"},
        {"method": "lora", "offload": "optimizer"},
    ],
)
def test_offload_and_adapters_get_an_answer(settings, lmcalc_run):
    """Item 13: every state offloaded left the GPU 0 bytes a parameter, and N = C / 0 raised ZeroDivisionError."""
    found = lmcalc.max_params(gpus="8xH100", **settings)
    for row in found.rows:
        assert row.with_activations > 0 and row.activation_shape is not None
        given = {**settings, "framework": row.framework, "zero": row.zero_stage, "dp": 8, "seq": 4096}
        assert lmcalc.memory(model=row.activation_shape, gpus="8xH100", **given).fits
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
    assert lmcalc_run(["max-params", "--gpus", "8xH100", *flags, "--brief"]).code == 0


def test_with_every_state_offloaded_only_zero3_answers_and_states_set_no_limit():
    found = lmcalc.max_params(gpus="8xH100", offload="optimizer+params")
    assert [row.zero_stage for row in found.rows] == [3]  # parameter offload is ZeRO-3's
    row = found.rows[0]
    assert row.bytes_per_param == 0 and math.isinf(row.states_only) and math.isinf(row.with_overhead)
    assert found.to_dict()["results"]["zero3"]["states_only"]["value"] is None  # JSON has no infinity
    assert "no limit on the GPU" in found.report.headline[1] and "host memory a GPU" in found.report.headline[1]
