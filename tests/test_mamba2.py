"""Mamba-2 hybrids (Bamba, Granite 4: Dao & Gu 2024, §7), against transformers. The parameter count is exact
(tests/test_hf_types.py), the FLOPs equal FlopCounterMode's on transformers' PyTorch scan with its convolution's padding
stated (here at lengths within one chunk and across several), and the state a sequence keeps at inference is the cache
transformers allocates. The saved activations are an estimate of mamba_ssm's fused kernel (no CUDA here)."""

from __future__ import annotations

import warnings

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


@pytest.mark.parametrize("kind", ["bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "mamba2"])
@pytest.mark.parametrize(("seq", "batch"), [(7, 1), (16, 2), (100, 2)])
def test_flops_equal_flopcountermode_within_and_across_chunks(kind: str, seq: int, batch: int):
    # chunks of 16: s = 7 pads one, s = 16 fills it, s = 100 spans seven
    result = transformers_check(tiny_config(kind), seq, batch)
    assert result.value("params.error") == 0
    assert abs(result.value("flops.error")) < 1e-9


def test_the_chunked_scans_forward_flops_by_hand():
    # one layer beyond its projections at s = 100 (chunks of Q = 16: c = 7, padded to 112): the convolution over
    # I + 2·G·N = 128 + 2·2·16 = 192 channels, 2·192·4 a token; per head (8 of P = 16) and padded token
    # 2·(16·16 + 16·16 + 2·16·16) (C·Bᵀ, its product with x, the chunk states and their read); the states carried
    # from chunk to chunk, 2·P·N·(c + 1)² per head and sequence
    spec = spec_of("bamba")
    core = 112 / 100 * 2 * 8 * (16 * 16 + 16 * 16 + 2 * 16 * 16) + 2 * 8 * 16 * 16 * 8**2 / 100
    assert ssm_flops(spec, 100) == pytest.approx(2 * 192 * 4 + core)


def test_the_state_a_sequence_keeps_is_transformers_cache():
    # after a prefill, transformers' cache holds per Mamba-2 layer the convolution's last K inputs of x‖B‖C in the
    # model's dtype and the H × P × N state in fp32
    spec = spec_of("bamba")
    ssm = [i for i in range(spec.num_layers) if not spec.is_attention_layer(i)]
    assert ssm == [0, 2, 3]
    assert cached_state_bytes("bamba", ssm, batch=2) == 2 * state_bytes(spec, 2)


def test_a_hybrid_without_attention_layers_serves_at_any_context(tmp_path, capsys):
    # Granite 4's class defaults: every layer is Mamba-2, so nothing grows with the context: the longest context is
    # the model's own, and a sequence costs its states alone, at the class's widths (I = 8,192, G = 1, N = 256,
    # H = 128, P = 64, K = 4) 4 layers × (8704·4·2 B of convolution state + 128·64·256·4 B of fp32 state)
    import json

    from lmcalc.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.GraniteMoeHybridConfig(num_hidden_layers=4).to_dict()
    spec = ModelSpec.model_validate(model_from_hf_config(config, "granite", "granite"))
    assert spec.attention_layers == 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path), "--gpus", "1xh100", "--inference", "--json"])
    assert exit_info.value.code == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results["per_gpu"]["max_context"]["value"] == spec.max_seq_len
    assert results["kv_cache"]["state"]["value"] == 4 * (8704 * 4 * 2 + 128 * 64 * 256 * 4)


def test_nemotron_hs_state_is_its_mamba_blocks_alone():
    # Nemotron-H's single blocks (Mamba-2, MoE, attention, MoE, Mamba-2, MLP): only the two Mamba-2 blocks keep a
    # state, whatever the MoE and MLP blocks, which neither attend nor keep one
    spec = spec_of("nemotron_h")
    mamba = [i for i in range(spec.num_layers) if spec.has_mixer(i) and not spec.is_attention_layer(i)]
    assert mamba == [0, 4] and spec.other_mixer_layers == 2 and spec.attention_layers == 1
    assert cached_state_bytes("nemotron_h", mamba, batch=2) == 2 * state_bytes(spec, 2)


def test_falcon_h1_runs_both_mixers_in_every_layer():
    # FalconH1DecoderLayer: attention and Mamba-2 side by side on one norm's output in each of the 4 layers, so every
    # layer keeps a KV cache and a Mamba-2 state, the FLOPs count both cores in every layer, and one layer's saved
    # tensors are both mixers'
    from lmcalc.engine.memory.activations import layer_saved_tensors
    from lmcalc.engine.model.flops import forward_flops_per_token
    from lmcalc.engine.workload import Workload
    from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision

    spec = spec_of("falcon_h1")
    assert spec.attention_layers == spec.other_mixer_layers == spec.num_layers == 4
    assert cached_state_bytes("falcon_h1", list(range(4)), batch=2) == 2 * state_bytes(spec, 2)
    flops = forward_flops_per_token(spec, 16)
    assert flops.ssm == 4 * ssm_flops(spec, 16)
    assert flops.attention_scores == 2 * 4 * (16 + 1) / 2 * spec.num_heads * spec.head_size
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 16, 1,
                 framework=framework_profile("transformers"))  # fmt: skip
    labels = {t.label for t in layer_saved_tensors(w, False)}
    assert {"log-sum-exp per row (fp32)", "z‖x‖B‖C‖Δ (input projection output)"} <= labels
