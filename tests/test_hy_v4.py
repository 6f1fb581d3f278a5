"""HY V4 (issue #31): DeepSeek-V3.2's MLA and indexer with an output gate, sinks and iHC hyper-connections. Its
parameters by hand at transformers 5.24's class defaults, the indexer layers HYV4Config writes, and what lmcalc
takes and refuses. FLOPs against FlopCounterMode on the tiny config run in tests/test_validate_hf.py."""

from __future__ import annotations

import json

import pytest

from lmcalc import api
from lmcalc.engine.model.compressed_attention import stream_mixing_flops
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

DEFAULTS = {"model_type": "hy_v4"}  # HYV4Config's defaults, as its save_pretrained writes them


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "hy", "test"))


def test_class_defaults_by_hand():
    h, L, H, r_q, r_kv, d_nope, d_rope, d_v, V = 2816, 34, 32, 1536, 512, 192, 64, 256, 120832
    f, E, f_e, k, H_I, d_I, n = 6912, 256, 768, 8, 16, 128, 4
    attention = (
        h * r_q + r_q + r_q * H * (d_nope + d_rope)  # the query's down-projection, norm, up-projection
        + h * (r_kv + d_rope) + r_kv + r_kv * H * (d_nope + d_v)  # the KV latent, its norm, its up-projection
        + H * d_v * h  # the output
        + h * H * d_v + H  # the gate's own projection, a sink a head
    )  # fmt: skip
    indexer = r_q * H_I * d_I + h * d_I + 2 * d_I + h * H_I  # wq_b, wk, k_norm (a LayerNorm), weights_proj
    indexers = 10  # a full indexer in layer 0 and in 1, 5, …, 33; the others share the previous one's
    hyper = 2 * (2 * n * n * h + 2 * n + 2)  # attn_hc and ffn_hc: n·h → 2·n, a bias, two scales
    moe = E * h + E * 3 * h * f_e + 3 * h * f_e  # router, experts, one shared expert
    total = L * (attention + hyper + 2 * h) + indexers * indexer + (L - 1) * moe + 3 * h * f  # layer 0 dense
    total += 2 * V * h + h + n * n * h + n + 1  # embedding, head, final norm, hc_head
    counted = count_params(spec_of(DEFAULTS))
    assert counted.total == total == 58_278_193_133  # transformers' meta-device count (test_hf_types, the coverage)
    assert counted.active == total - (L - 1) * (E - k) * 3 * h * f_e


@pytest.mark.torch
def test_the_indexer_layers_are_the_classs():
    transformers = pytest.importorskip("transformers")
    for layers in (1, 2, 6, 34):
        config = transformers.HYV4Config(num_hidden_layers=layers)
        spec = spec_of({"model_type": "hy_v4", "num_hidden_layers": layers})
        assert spec.indexer_layers == config.indexer_types.count("full")


def test_ihc_mixes_no_streams():
    # iHC collapses the n streams into a sub-layer's input and spreads its output back: no n × n mixing, so no FLOPs
    # beyond its projections (DeepSeek-V4's mHC mixes, 2·n²·h a sub-layer)
    spec = spec_of(DEFAULTS)
    assert spec.hyper_connections is not None and not spec.hyper_connections.mixing
    assert stream_mixing_flops(spec) == 0
    assert stream_mixing_flops(spec.model_copy(update={"hyper_connections": {"streams": 4}})) == 34 * 4 * 16 * 2816


def test_every_estimate_takes_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert api.params(model=str(path)).total == count_params(spec_of(DEFAULTS)).total
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    # MLA's latent and shared RoPE key, and the indexer's key in the 10 layers that run one, bf16
    per_token = 34 * (512 + 64) * 2 + 10 * 128 * 2
    assert api.inference(model=str(path), context=4096, gpus="2xH100").memory.kv_cache == 4096 * per_token
    # training memory, LoRA and the planner take its iHC streams (tests/test_compressed_memory.py)
    assert api.memory(model=str(path), gpus="8xH200").gpu.activations > 0
    assert api.memory(model=str(path), method="lora", gpus="1xH200").gpu.activations > 0
    assert api.plan(model=str(path), gpus="64xH100", tokens=1e12).best is not None
