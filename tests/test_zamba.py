"""Zamba and Zamba 2 (issue #31): Mamba (Mamba-2) in every layer and transformer blocks whose weights run at several
depths. Their parameters by hand at transformers 5.24's class defaults (Zamba-7B's and Zamba2-2.7B's shapes), what
transformers builds when the head is untied (a block a use) or when hybrid_layer_ids lists more layers than run a
block, the serving cache against transformers' own, and every estimate taking it. FLOPs against FlopCounterMode on the
tiny configs (Zamba 2's: two blocks in turn, adapters on Q, K and V) run in tests/test_validate_hf.py."""

from __future__ import annotations

import json
import warnings

import pytest

from lmcalc import api
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.hf_layers import transformers_unused
from lmcalc.specs import ModelSpec

DEFAULTS = {"model_type": "zamba2"}  # Zamba2Config's defaults, as its save_pretrained writes them


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "zamba2", "test"))


def test_class_defaults_by_hand():
    h, L, G, H, V, r = 2560, 54, 9, 32, 32000, 128
    d, f, inner, heads, state, kernel = 2 * h // H, 4 * h, 2 * h, 8, 64, 4  # heads of 2·h/H, f = 4·h, I = 2·h
    conv = inner + 2 * state  # x, B and C of one group
    mamba = h * (2 * inner + 2 * state + heads) + conv * kernel + conv + 3 * heads + inner + inner * h
    block = 2 * h + 3 * (2 * h) * (H * d) + H * d * h + h + h * 2 * f + f * h  # norms, Q, K, V, O, the gated MLP
    per_use = h * r + r * 2 * f + h * h  # the MLP's adapter, and the linear into the Mamba-2 mixer
    total = L * (mamba + h) + block + G * per_use + h + V * h  # a norm a layer, the final norm, the tied embedding
    counted = count_params(spec_of(DEFAULTS))
    assert counted.total == counted.active == total == 2_481_848_336  # transformers' meta-device count


def test_zamba_class_defaults_by_hand():
    # Zamba's multi-head Mamba: each of its n_mamba_heads heads a Mamba of d_inner/heads channels, whose x_proj,
    # dt_proj, A and D hold and compute together what one Mamba of d_inner does
    h, L, G, H, V, f = 3712, 76, 13, 16, 32000, 14848
    d, inner, state, kernel, rank = 2 * h // H, 2 * h, 16, 4, 232  # dt_rank ⌈h/16⌉
    mamba = (
        h * 2 * inner + inner * kernel + inner  # in_proj, the convolution and its bias
        + (rank + 2 * state) * inner + inner * rank + inner  # x_proj, dt_proj and its bias, over the heads
        + inner * state + inner + inner * h  # A, D, out_proj
    )  # fmt: skip
    block = 2 * h + 3 * (2 * h) * (H * d) + H * d * h + h + 3 * h * f  # no adapters
    total = L * (mamba + h) + block + G * h * h + h + V * h
    assert count_params(spec_of({"model_type": "zamba"})).total == total == 7_232_490_496  # transformers' count


def test_a_block_computes_at_every_use():
    # its weights count once and compute G times: the MLP's 2·(h·2f + f·h) FLOPs a token, nine times
    spec = spec_of(DEFAULTS)
    h, f = 2560, 10240
    once = spec_of(DEFAULTS | {"layers_block_type": ["mamba"] * 53 + ["hybrid"]})
    assert spec.shared_block is not None and spec.shared_block.uses == 9
    mlp, mlp_once = fl.forward_flops_per_token(spec, 4096).mlp, fl.forward_flops_per_token(once, 4096).mlp
    per_use = 2 * (h * 2 * f + f * h) + 2 * (h * 128 + 128 * 2 * f) + 2 * h * h
    assert mlp - mlp_once == 8 * per_use


@pytest.mark.torch
@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("Zamba2Config", {"tie_word_embeddings": False}),  # a block a use, each holding nine adapters
        ("Zamba2Config", {"tie_word_embeddings": False, "num_mem_blocks": 2, "use_shared_attention_adapter": True}),
        ("Zamba2Config", {"num_mem_blocks": 2, "use_shared_attention_adapter": True}),
        ("ZambaConfig", {"tie_word_embeddings": False}),
        ("ZambaConfig", {"num_hidden_layers": 13, "attn_layer_period": 3, "attn_layer_offset": 1, "n_mamba_heads": 4}),
    ],
)
def test_what_transformers_builds(kind: str, fields: dict):
    # transformers ties the uses' blocks only where it ties the head; untied, each use's block also holds the adapters
    # of every use of its turn, of which it runs one
    transformers = pytest.importorskip("transformers")
    import torch

    config = getattr(transformers, kind)(**fields)
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    spec = spec_of(config.to_dict())
    assert spec.shared_block is not None and spec.shared_block.tied == config.tie_word_embeddings
    assert count_params(spec).total + transformers_unused(spec) == sum(p.numel() for p in built.parameters())


def test_hybrid_layer_ids_longer_than_the_uses_build_unrun_adapters():
    # a config.json whose hybrid_layer_ids lists nine layers where layers_block_type runs a block at four: each block
    # builds adapters for all nine (the coverage's variant with half the layers)
    layers = (["mamba"] * 5 + ["hybrid"]) * 4
    config = DEFAULTS | {"num_hidden_layers": 24, "layers_block_type": layers, "hybrid_layer_ids": list(range(9))}
    spec = spec_of(config)
    assert spec.shared_block is not None and spec.shared_block.uses == 4
    assert transformers_unused(spec) == (9 - 4) * (2560 * 128 + 128 * 2 * 10240)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["zamba", "zamba2"])
def test_the_serving_cache_is_what_transformers_keeps(kind: str):
    # each use caches its K and V (4 heads of 32), each Mamba or Mamba-2 layer its convolution's last 4 inputs and its
    # state
    transformers = pytest.importorskip("transformers")
    import torch
    from hf_tiny import tiny_config

    from lmcalc.engine.inference.serving import Serving, inference_memory

    config = tiny_config(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    spec = spec_of(config)
    for seq in (5, 20, 37):
        with torch.no_grad():
            cache = model(torch.randint(3, 120, (1, seq)), use_cache=True).past_key_values
        held = {}
        for layer in cache.layers:
            for value in vars(layer).values():
                for t in value.values() if isinstance(value, dict) else [value]:
                    if isinstance(t, torch.Tensor):
                        held[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        assert inference_memory(Serving(spec, context=seq, kv_dtype="fp32"), 1e12).kv_cache == sum(held.values())


def test_every_estimate_takes_it(tmp_path):
    # params, FLOPs and serving, and since the uses' activations are counted (tests/test_shared_block_memory.py)
    # training memory, fine-tuning and the planner, on one pipeline stage
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert api.params(model=str(path)).total == 2_481_848_336
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    assert api.inference(model=str(path), context=4096).memory.kv_cache > 0
    assert api.memory(model=str(path)).gpu.activations > 0
    assert api.memory(model=str(path), method="lora").gpu.activations > 0
    assert api.plan(model=str(path), gpus="8xH100").best.layout.pp == 1
    with pytest.raises(LmcalcError, match="one pipeline stage"):
        api.memory(model=str(path), gpus="8xH100", pp=2)
