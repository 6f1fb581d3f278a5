"""xLSTM (issue #31): xLSTM-7B's mLSTM layers (Beck et al. 2025), as transformers 5.24 builds and runs them with its
own kernels. Parameters and the serving state by hand at the class defaults, the chunkwise kernel's FLOPs by hand,
and on the CPU against FlopCounterMode on transformers' fp32 step (whole chunks, a remainder run step by step, a
sequence shorter than a chunk) and against the state transformers' cache keeps. Its training memory:
tests/test_xlstm_memory.py."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import state_bytes
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.mixer_flops import mlstm_flops
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

DEFAULTS = {"model_type": "xlstm"}  # xLSTMConfig's defaults: xLSTM-7B's shape


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "xlstm", "test"))


def test_class_defaults_by_hand():
    h, NH, V, L = 4096, 8, 50304, 32
    qk, v = h // 2, h  # qk_dim_factor 0.5, v_dim_factor 1
    f = 10944  # 4096 × 2.667 = 10,924.03, rounded up to a multiple of 64
    mlstm = 2 * h * qk + 2 * h * v + 2 * (h * NH + NH) + v + v * h  # q, k; v, o gate; i, f gates; norm; out_proj
    layer = mlstm + 2 * h + 3 * h * f  # two RMSNorms, the SwiGLU
    total = L * layer + V * h + h + V * h  # embedding, out_norm, the head (never tied)
    assert count_params(spec_of(DEFAULTS)).total == total == 6_865_424_896  # transformers' meta-device count
    assert count_params(spec_of(DEFAULTS | {"tie_word_embeddings": True})).total == total  # xLSTM ties nothing


def test_the_blocks_are_num_blocks_where_both_are_written():
    # xLSTMConfig writes num_blocks beside num_hidden_layers, and xLSTMModel builds num_blocks blocks
    assert spec_of(DEFAULTS | {"num_hidden_layers": 16, "num_blocks": 32}).num_layers == 32
    assert spec_of(DEFAULTS | {"num_hidden_layers": 16}).num_layers == 16  # the class sets num_blocks from it


def test_the_chunkwise_kernel_by_hand():
    m = spec_of(DEFAULTS).mlstm
    assert m is not None
    d_k, d_v, L = 256, 512, 64  # a head's widths, the chunk
    # a chunked token: Kᵀ·V; QKᵀ and its product with V; Q·C and Q·n
    chunked = 2 * d_k * d_v + 2 * L * d_k + 2 * L * d_v + 2 * d_k * d_v + 2 * d_k
    step = 2 * d_k * d_v + 2 * d_k * d_v + 2 * d_k  # k·vᵀ; q·C, q·n
    assert mlstm_flops(m, 4096) == 8 * chunked
    assert mlstm_flops(m, 100) == pytest.approx(8 * (64 * chunked + 36 * step) / 100, rel=1e-12)
    padded = m.model_copy(update={"padded": True})  # mode train_with_padding: two whole chunks
    assert mlstm_flops(padded, 100) == pytest.approx(8 * 128 * chunked / 100, rel=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("seq", [32, 40, 7])  # whole chunks of 16; two and 8 steps; steps alone
def test_flops_equal_flopcountermode_on_transformers_fp32_step(seq):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_tiny import tiny_config
    from torch.utils.flop_counter import FlopCounterMode

    config = tiny_config("xlstm")  # transformers' kernels cannot train in bf16: fp32, the same matmuls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).train()
    tokens = torch.randint(0, config["vocab_size"], (1, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens, use_cache=False).loss.backward()
    assert fl.step_flops(spec_of(config), seq, convention="full").model * seq == counter.get_total_flops()


def test_the_state_by_hand():
    # each layer's heads: C (256 × 512), n (256) and m, at the cache's bf16
    assert state_bytes(spec_of(DEFAULTS), 2) == 32 * 8 * (256 * 512 + 256 + 1) * 2 == 67_240_448


@pytest.mark.torch
def test_the_state_equals_transformers_cache():
    from hf_tiny import prefill_cache_bytes, tiny_config

    config, batch = tiny_config("xlstm"), 2
    assert prefill_cache_bytes(config, batch, 7) == batch * state_bytes(spec_of(config), 2)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_bias": True}, "use_bias is true: xLSTM's biased norms"),
        ({"embedding_dim": 2048}, "embedding_dim differs from hidden_size"),
    ],
)
def test_what_is_not_modelled_is_refused_in_one_line(change, message):
    with pytest.raises(LmcalcError, match=message):
        spec_of(DEFAULTS | change)


def test_every_estimate_takes_it(tmp_path):
    # training memory, fine-tuning and the planner since the mLSTM's saved tensors are counted (formulas §2.29;
    # against transformers: tests/test_xlstm_memory.py); the serving state as before
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert api.params(model=str(path)).total == 6_865_424_896
    for context in (4096, 65536):  # no K and V: the state alone, whatever the context
        assert api.inference(model=str(path), context=context).memory.kv_cache == 67_240_448
    assert api.memory(model=str(path), seq=4096, precision="fp32").gpu.activations > 0
    assert api.memory(model=str(path), seq=4096, precision="fp32", method="lora").gpu.activations > 0
