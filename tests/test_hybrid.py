"""A hybrid (Jamba: Mamba layers with an attention layer every 8th, MoE every 2nd), against transformers and the
Jamba paper (Lieber et al. 2024, arXiv:2403.19887). The parameter count is exact; the FLOPs equal FlopCounterMode's
(tests/test_validate_hf.py runs the tiny Jamba, with the depthwise convolution's backward counted right); the KV
cache and the state-space layers' state are checked against the paper's Table 1 and transformers' own cache. The
saved activations of the state-space layers are an estimate of mamba_ssm's fused kernels (no CUDA here)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import tiny_config  # noqa: E402

from lmcalc.engine.inference.serving import Serving, inference_memory, ssm_state_elements  # noqa: E402
from lmcalc.engine.model.flops import forward_flops_per_token  # noqa: E402
from lmcalc.engine.model.mixer_flops import ssm_flops  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import resolve_model  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

GiB = 2**30


def jamba_v01() -> ModelSpec:
    """JambaConfig's defaults are ai21labs/Jamba-v0.1's config (transformers' docstring says so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.JambaConfig().to_dict()
    return ModelSpec.model_validate(model_from_hf_config(config, "jamba-v0.1", "jamba"))


def test_jamba_v01_counts_as_transformers_builds_it_and_as_the_paper_rounds_it():
    spec = jamba_v01()
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        built = transformers.JambaForCausalLM(transformers.JambaConfig())
    counts = count_params(spec)
    assert counts.total == sum(p.numel() for p in built.parameters()) == 51_570_323_328
    # the paper's Table 1: 52B available parameters, 12B active
    assert (round(counts.total, -9), round(counts.active, -9)) == (52_000_000_000, 12_000_000_000)
    assert (spec.attention_layers, spec.moe_layers) == (4, 16)


@pytest.mark.parametrize(
    "model, gib",
    [("jamba", 4), ("mixtral-8x7b", 32), ("llama-2-7b", 128)],
)
def test_kv_cache_at_256k_equals_the_papers_table(model: str, gib: int):
    """Jamba paper, Table 1: KV cache at a 256K context in 16-bit: Jamba 4GB, Mixtral 32GB, Llama-2 (7B) 128GB,
    in GiB. Jamba's 4 attention layers of 32 keep K and V; its 28 Mamba layers keep a fixed state instead."""
    spec = jamba_v01() if model == "jamba" else resolve_model(model).spec
    memory = inference_memory(Serving(spec, context=256 * 1024), 2_000 * GiB)
    assert memory.kv_cache - memory.state_per_sequence == gib * GiB


def test_state_is_what_transformers_keeps():
    """Per sequence, each Mamba layer of transformers' Jamba keeps its convolution's state (d_in × d_conv) and the
    SSM state (d_in × N), whatever the prompt's length."""
    config = tiny_config("jamba")
    spec = ModelSpec.model_validate(model_from_hf_config(config, "jamba", "jamba"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    kept = []
    for seq in (5, 40):
        with torch.no_grad():
            cache = model(torch.randint(3, 500, (1, seq)), use_cache=True).past_key_values
        mamba = [layer for layer in cache.layers if hasattr(layer, "conv_states")]  # not the attention's K/V
        kept.append(
            sum(
                t.numel()
                for layer in mamba
                for states in (layer.conv_states, layer.recurrent_states)
                for t in states.values()
            )  # fmt: skip
        )
    assert kept[0] == kept[1] == ssm_state_elements(spec)


def test_ssm_flops_by_hand():
    # Jamba-v0.1: d_in = 8,192, d_conv 4, N 16: 2·8192·4 + 2·8192·16 = 327,680 FLOPs per token and Mamba layer
    spec = jamba_v01()
    assert ssm_flops(spec, 4096) == 2 * 8192 * 4 + 2 * 8192 * 16
    fwd = forward_flops_per_token(spec, 4096, "full")
    assert fwd.ssm == 28 * ssm_flops(spec, 4096)
    assert fwd.attention_scores == 2 * 4 * 4096 * 32 * 128  # only the 4 attention layers score keys


def test_fine_tuning_a_hybrid_is_refused_in_one_line():
    from lmcalc.api import memory

    with pytest.raises(LmcalcError, match="hybrid with Mamba layers: lmcalc models its full training only"):
        memory(model=jamba_v01(), gpus="8xH100", method="lora")
