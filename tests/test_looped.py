"""Looped transformers (issue #31): Dory (nGPT layers, a recurrent section run n_recurrent_loops times) and the
Hierarchical Reasoning Model's text model (two stacks run in cycles, the early low-level runs without gradients).
Their parameters and FLOPs by hand at transformers 5.24's class defaults, the runs each class lays out, the KV cache
each run keeps, and what lmcalc refuses. The tiny configs' counts and FLOPs against transformers and FlopCounterMode
run in tests/test_hf_types.py and tests/test_validate_hf.py; their caches against transformers' here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import cache_layers
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, config["model_type"], "test"))


DORY = {"model_type": "dory"}  # DoryConfig's defaults (NVIDIA-Nemotron-Labs-Dory1.0-4B's shape)
HRM = {"model_type": "hrm_text"}  # HrmTextConfig's defaults (HRM-Text-1B's shape)


def test_dory_class_defaults_by_hand():
    h, f, V, H, H_kv, d = 2560, 7168, 131072, 16, 4, 256
    attention = 3 * h * H * d + 2 * h * H_kv * d  # q, gate and o; k and v (every norm weightless: nGPT's L2)
    scales = 2 * H * d + 2 * f + 2 * h  # s_qk, the gate's s; s_u, s_v; the residual rates α_A, α_M
    layer = attention + 3 * h * f + scales
    total = 36 * layer + V * h + V * h + V  # 36 held layers, the embedding, the untied head and its logit scale
    assert count_params(spec_of(DORY)).total == total == 3_975_229_440  # transformers' meta-device count


def test_dory_runs_its_recurrent_section_once_a_loop():
    reuse = spec_of(DORY).layer_reuse
    assert reuse is not None
    assert reuse.weights == (*range(8), *range(8, 28), *range(8, 28), *range(28, 36))  # 8 in, 20 twice, 8 out
    # a released config.json lists attention and MLP blocks, two a layer: 72 "layers", 16 in and 16 out
    released = {**DORY, "num_hidden_layers": 72, "n_input_layers": 16, "n_output_layers": 16,
                "layer_types": [t for i in range(36) for t in ("full_attention" if (i + 1) % 4 == 0
                                                                else "sliding_attention", "mlp")]}  # fmt: skip
    assert spec_of(released).layer_reuse == reuse


def test_dory_flops_count_every_run():
    spec, s = spec_of(DORY), 4096
    h, f, V, Hd, H_kv_d = 2560, 7168, 131072, 16 * 256, 4 * 256
    run = 2 * (3 * h * Hd + 2 * h * H_kv_d + 3 * h * f) + 2 * 2 * s * Hd  # matmuls, then QKᵀ and AV over s keys
    assert fl.step_flops(spec, s, convention="full").model == pytest.approx(3 * (56 * run + 2 * h * V), rel=1e-12)


def test_hrm_class_defaults_by_hand():
    h, f, V, N = 1536, 4096, 151808, 16  # 12 heads of 128: H·d = h; every head its own K and V
    layer = 5 * h * h + 3 * h * f  # q, k, v, the gate, o; the SwiGLU (RMSNorms weightless)
    total = 2 * N * layer + 2 * V * h + h  # the low and high stacks, the embedding and untied head, z_L_init
    assert count_params(spec_of(HRM)).total == total == 1_447_822_848  # transformers' meta-device count


def test_hrm_runs_its_stacks_in_cycles_and_the_early_ones_without_gradients():
    # two high-level cycles; each runs the low stack (layers 0-15) three times, then the high stack (16-31).
    # L_bp_cycles [2], padded to [1, 2]: cycle 0 trains the last low run, cycle 1 the last two
    reuse = spec_of(HRM).layer_reuse
    assert reuse is not None
    low, high = tuple(range(16)), tuple(range(16, 32))
    assert reuse.weights == (low * 3 + high) * 2
    assert reuse.no_grad_runs == (*range(0, 32), *range(64, 80))
    assert reuse.start_state


def test_hrm_flops_run_the_no_grad_runs_forward_alone():
    spec, s = spec_of(HRM), 2048
    h, f, V = 1536, 4096, 151808
    run = 2 * (5 * h * h + 3 * h * f) + 2 * 2 * s * h  # per token: the matmuls, QKᵀ and AV over s keys
    trained, forward_only = 128 - 48, 48
    expected = 3 * 2 * h * V + 3 * trained * run + forward_only * run
    assert fl.step_flops(spec, s, convention="full").model == pytest.approx(expected, rel=1e-12)


def test_each_run_keeps_its_own_cache_unless_only_the_last_loop_writes():
    assert cache_layers(spec_of(DORY), None) == 56  # per_loop: the 20 looped layers cache twice
    assert cache_layers(spec_of(DORY | {"recurrent_kv_cache_mode": "last_loop"}), None) == 36
    assert cache_layers(spec_of(HRM), None) == 128  # HrmTextModel: a cache slot for every run
    # at 1,024 tokens (Dory's window) every run keeps all: 56 runs × K and V of 4 heads of 256, bf16
    assert api.inference(model=_written(DORY), context=1024).memory.kv_cache == 1024 * 56 * 2 * 4 * 256 * 2


@pytest.mark.torch
@pytest.mark.parametrize("kind, extra", [("dory", {}), ("dory", {"recurrent_kv_cache_mode": "last_loop"}),
                                         ("hrm_text", {})])  # fmt: skip
def test_the_cache_equals_transformers(kind, extra):
    from hf_tiny import prefill_cache_bytes, tiny_config

    from lmcalc.engine.inference.serving import kv_elements_per_token_per_layer

    config, batch, tokens = tiny_config(kind) | extra, 2, 7
    spec = spec_of(config)
    held = prefill_cache_bytes(config, batch, tokens)
    assert held == cache_layers(spec, None) * kv_elements_per_token_per_layer(spec) * 2 * batch * tokens


def _written(config: dict) -> str:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_recurrent_loops": 0}, "n_recurrent_loops must be at least 1"),
        ({"n_input_layers": 30}, r"n_input_layers \+ n_recurrent_layers \+ n_output_layers"),
        ({"recurrent_kv_cache_mode": "every"}, "recurrent_kv_cache_mode must be per_loop or last_loop"),
    ],
)
def test_a_dory_config_its_class_refuses_is_one_line(change, message):
    with pytest.raises(LmcalcError, match=message):
        spec_of(DORY | change)


def test_a_loop_over_layers_of_other_kinds_is_refused():
    fields = model_from_hf_config(DORY, "dory", "test")
    with pytest.raises(ValueError, match="layer_reuse.weights names 3 runs, but num_layers is 56"):
        ModelSpec.model_validate(fields | {"layer_reuse": {"weights": [0, 1, 0]}})
    with pytest.raises(ValueError, match="never runs held layer 1"):
        ModelSpec.model_validate(fields | {"layer_reuse": {"weights": [0, 2] * 28}})
    with pytest.raises(ValueError, match="held layer 0 runs as two kinds of layer"):  # every fourth run global
        ModelSpec.model_validate(fields | {"layer_reuse": {"weights": [0] * 56}})
    mla = {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
    with pytest.raises(ValueError, match="layer_reuse is for layers that hold the same tensors"):
        ModelSpec.model_validate(fields | {"mla": mla})
