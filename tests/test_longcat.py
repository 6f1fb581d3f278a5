"""LongCat-Flash (issue #31): zero-computation experts, a shortcut MoE beside the first of two sub-layers a layer, and
experts run one at a time in transformers' code. Checked by hand here; its count against transformers in
tests/test_hf_types.py, its FLOPs against transformers' own step in tests/test_validate_hf.py, its saved tensors and
step peak in tests/test_framework_transformers.py and tests/test_step_phases.py (longcat-flash-small)."""

from __future__ import annotations

import json

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.gpu_memory import stage_activations
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, check_split
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hf_layers import transformers_unused
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

V, h, LAYERS, H, f, f_e, E, Z, k = 131072, 6144, 28, 64, 12288, 2048, 512, 256, 12
r_q, r_kv, d_nope, d_rope, d_v = 1536, 512, 128, 64, 128
"""meituan-longcat/LongCat-Flash-Chat's shapes (LongcatFlashConfig's defaults)."""


def longcat() -> ModelSpec:
    return resolve_model("longcat-flash").spec


def workload(spec: ModelSpec, recompute: str = "none", seq_len: int = 256) -> Workload:
    return Workload(spec, resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, seq_len, 2,
                    "flash", recompute, framework=framework_profile("transformers"))  # fmt: skip


def test_total_and_active_by_hand():
    # 28 layers of two MLA sub-layers with a dense MLP each, and one MoE: 512 experts of 2048, 256 that compute nothing
    mla = h * r_q + r_q + r_q * H * (d_nope + d_rope) + h * (r_kv + d_rope) + r_kv + r_kv * H * (d_nope + d_v)
    mla += H * d_v * h  # o_proj
    sub_layer = mla + 3 * h * f + 2 * h  # attention, the dense MLP, two norms
    router = (E + Z) * h  # the router scores the zero-computation experts too
    total = 2 * V * h + 2 * LAYERS * sub_layer + LAYERS * (router + E * 3 * h * f_e) + h
    real = k * E // (E + Z)  # 8 of each token's 12 picks, on average, fall on real experts
    active = total - LAYERS * (E - real) * 3 * h * f_e
    counts = count_params(longcat())
    assert (counts.total, counts.active) == (total, active) == (560_664_958_976, 27_954_796_544)
    assert round(total / 1e9, -1) == 560 and abs(active / 27e9 - 1) < 0.04  # the report: 560B, 27B on average


def test_transformers_builds_the_zero_experts_a_gate_and_up_too():
    # LongcatFlashExperts' gate_up_proj is (E + Z) × 2f_e × h, its down_proj E × h × f_e: Z·2·f_e·h a layer unused
    assert transformers_unused(longcat()) == LAYERS * Z * 2 * f_e * h == 180_388_626_432


@pytest.mark.torch
def test_the_preset_is_what_transformers_reads_from_its_class_defaults():
    transformers = pytest.importorskip("transformers")
    from lmcalc.hf_config import model_from_hf_config

    read = ModelSpec.model_validate(model_from_hf_config(transformers.LongcatFlashConfig().to_dict(), "lc", "c"))
    preset = longcat()
    assert (read.num_layers, read.sublayers, read.moe, read.mla) == (preset.num_layers, 2, preset.moe, preset.mla)
    assert count_params(read) == count_params(preset)


def test_a_token_computes_k_e_over_e_plus_z_experts():
    # the MLP side of a token's forward: 56 dense MLPs, 28 routers over E + Z, and 8 real experts in each MoE layer
    mlp = 2 * (2 * LAYERS * 3 * h * f + LAYERS * (E + Z) * h + LAYERS * 8 * 3 * h * f_e)
    assert forward_flops_per_token(longcat(), 4096).mlp == mlp
    without = longcat().model_copy(update={"moe": longcat().moe.model_copy(update={"zero_experts": 0})})
    assert forward_flops_per_token(without, 4096).mlp - mlp == 2 * LAYERS * (4 * 3 * h * f_e - Z * h)


def test_the_expert_loop_keeps_each_weighted_output_and_each_passed_token():
    # transformers' loop: index_add keeps every weighted output, 8 real rows and 4 passed tokens a token; without it
    # the profile's grouped_mm keeps neither (a passed token is kept for the weight's product either way)
    spec, sb, act = longcat(), 256 * 2, 2
    looped = sum(t.bytes for t in layer_saved_tensors(workload(spec), True))
    plain = spec.moe.model_copy(update={"expert_loop": False})
    unlooped = sum(t.bytes for t in layer_saved_tensors(workload(spec.model_copy(update={"moe": plain})), True))
    assert looped - unlooped == (8 + 4) * sb * h * act
    passed = [t for t in layer_saved_tensors(workload(spec), True) if "zero-computation expert passes" in t.label]
    assert [t.bytes for t in passed] == [4 * sb * h * act]
    dense = [t for t in layer_saved_tensors(workload(spec), False) if "zero-computation" in t.label]
    assert dense == []


def test_checkpointing_keeps_and_rebuilds_whole_layers():
    # transformers checkpoints a LongcatFlashDecoderLayer: one input kept for two of lmcalc's layers, both rebuilt
    spec = longcat()
    w = workload(spec, "full")
    acts = stage_activations(w, Layout(), 0)
    one = stage_activations(workload(spec.model_copy(update={"sublayers": 1}), "full"), Layout(), 0)
    layer_input = 256 * 2 * h * 2
    assert one.total - acts.total == pytest.approx(LAYERS * layer_input)  # 56 inputs kept, now 28
    pair = sum(sum(t.bytes for t in layer_saved_tensors(w, moe)) for moe in (False, True))
    assert acts.rebuilt == pytest.approx(pair)


@pytest.mark.parametrize(("pp", "fits"), [(2, True), (4, True), (7, True), (8, False), (16, False)])
def test_a_pipeline_stage_holds_whole_layers(pp: int, fits: bool):
    spec = longcat()
    if fits:
        check_split(spec, pp, pp, PipelineSplit())
        return
    with pytest.raises(LmcalcError, match=f"PP={pp} splits a layer of longcat-flash: each of its 28 layers is 2"):
        check_split(spec, pp, pp, PipelineSplit())


def test_mla_kv_cache_by_hand():
    # 56 MLA sub-layers, each caching the 512-wide latent and the 64-wide RoPE key for every token
    memory = inference_memory(Serving(longcat(), context=8192, batch=2), 1e15)
    assert memory.kv_cache == 2 * 8192 * 2 * LAYERS * (r_kv + d_rope) * 2


def test_more_picks_than_experts_is_refused():
    with pytest.raises(ValueError, match=r"experts_per_token \(9\) exceeds num_experts \(4\) and zero_experts \(4\)"):
        longcat().moe.model_validate({**longcat().moe.model_dump(), "num_experts": 4, "zero_experts": 4,
                                      "experts_per_token": 9})  # fmt: skip


@pytest.mark.torch
def test_a_config_json_says_what_transformers_builds_beyond(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "longcat" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(transformers.LongcatFlashConfig().to_dict()))
    counted = api.params(model=str(path))
    assert counted.total == 560_664_958_976
    assert any("transformers 5.24 builds 180,388,626,432 more parameters" in n for n in counted.report.notes)
