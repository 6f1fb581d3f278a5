"""Doge (issue #31): Llama's layer with a dynamic mask on its attention (a learned A a KV head and dt_proj from the
values score each key; a query keeps its top keep_window_size) and a learned scale on each residual. Its parameters
by hand at transformers 5.24's class defaults, the keys a query reads and the one gap of the FLOP check. FLOPs against
FlopCounterMode on the tiny config run in tests/test_validate_hf.py; its training memory in tests/test_doge_memory.py;
its CDMoE (is_moe) in tests/test_doge_moe.py."""

from __future__ import annotations

import json

from lmcalc import api
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec
from lmcalc.validate_hf import mask_gradient_flops

DEFAULTS = {"model_type": "doge"}  # DogeConfig's defaults, as its save_pretrained writes them


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "doge", "test"))


def test_class_defaults_by_hand():
    h, L, H, f, V = 1024, 32, 8, 2048, 32768
    d = h // H  # 128; as many KV heads as heads
    attention = 4 * h * H * d + H + H * d * H + 2 * d  # q, k, v, o; A; dt_proj from the values; per-head q, k norms
    layer = attention + 3 * h * f + 2 * h + 2 * h  # the SwiGLU, two norms, two residual scales
    total = V * h + L * layer + h + V * h  # untied head
    assert count_params(spec_of(DEFAULTS)).total == total == 403_055_872  # transformers' meta-device count


def test_a_query_reads_the_keys_its_mask_keeps():
    # causal: query i reads min(i, k) keys, k = keep_window_size 2,048; full: all s, as transformers scores them
    spec, s, k = spec_of(DEFAULTS), 8192, 2048
    assert fl.attended_keys(spec, s, "causal") == (k * (k + 1) / 2 + (s - k) * k) / s
    assert fl.attended_keys(spec, s, "full") == s
    assert fl.attended_keys(spec, 1024, "causal") == (1024 + 1) / 2  # within the window, every earlier key


def test_the_flop_checks_one_gap():
    # the count's stand-in for SDPA gives the additive mask no gradient: dt_proj (8·128 → 8) runs forward only there
    spec = spec_of(DEFAULTS)
    assert mask_gradient_flops(spec, 100) == -2 * 2 * 8 * 128 * 8 * 32 * 100


def test_every_estimate_takes_it(tmp_path):
    # training memory, fine-tuning and the planner since the dynamic mask's saved tensors are counted (formulas
    # §2.27; against transformers: tests/test_doge_memory.py); params, FLOPs and serving as before
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert api.params(model=str(path)).total == 403_055_872
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    # its K and V (8 heads of 128) in each of 32 layers, bf16
    assert api.inference(model=str(path), context=4096).memory.kv_cache == 4096 * 32 * 2 * 8 * 128 * 2
    assert api.memory(model=str(path), seq=4096).gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100", seq=4096, global_batch=4096 * 64, tokens=1e9).best is not None
