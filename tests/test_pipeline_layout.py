"""Megatron-Core's pipeline layout (``--pipeline-model-parallel-layout``) as a split of lmcalc's: every part's layers
spelt out. The grammar and the parts each stage builds are checked against Megatron-Core's own
``PipelineParallelLayerLayout`` (megatron-core 0.16.1, a dev dependency); the stage counts below are worked by hand.

DeepSeek-V3 (61 layers, the first 3 dense) as Megatron-Bridge lays it out on 16 stages, two chunks each:
``Et*3|(tt|)*29,m|L`` names 32 parts: the embedding and 3 layers, 29 parts of 2, the MTP layer, the loss. Part g is
chunk g // 16 of stage g % 16: stage 0 builds parts 0 and 16 (3 + 2), stages 1-13 two parts of 2, stages 14 and 15
part 14 or 15 (2) and the MTP or loss part (no decoder layer). Trained (``mtp_layers`` 1, Megatron-Core's
--mtp-num-layers), the MTP module is one more MoE layer in stage 14's second chunk, as Megatron-Core builds it."""

from __future__ import annotations

import pytest

import lmcalc
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_chunk_mixes, stage_layer_counts, stage_layers
from lmcalc.engine.parallel.pipeline_layout import layout_parts
from lmcalc.errors import LmcalcError
from lmcalc.launch import read
from lmcalc.presets import resolve_model

DSV3 = "Et*3|(tt|)*29,m|L"
DSV3_26_02 = "Et*4|(t*4|)*14tmL"  # Megatron-Bridge 26.02's DeepSeek-V3 row (benchmarks/heldout_runs.yaml): 16 parts
LAYOUTS = [DSV3, DSV3_26_02, "E|t*4|(tt|)*2,tL", "Ettt|tttL", "(Et|t|)*1,tt|ttL"]


def test_deepseek_v3_on_16_stages_of_two_chunks():
    model = resolve_model("deepseek-v3").spec
    layout = Layout(pp=16, grad_accum=32, split=PipelineSplit("interleaved", 2, pipeline_layout=DSV3))
    assert stage_layer_counts(model, layout) == [3 + 2, *[2 + 2] * 13, 2 + 0, 2 + 0]
    assert stage_chunk_mixes(model, layout)[0] == ((3, 0), (0, 2))  # the 3 dense layers, then 2 MoE (layers 32-33)
    one_chunk = Layout(pp=16, split=PipelineSplit(pipeline_layout=DSV3_26_02))
    assert stage_layer_counts(model, one_chunk) == [4, *[4] * 14, 1]
    trained = Layout(pp=16, grad_accum=32, split=PipelineSplit("interleaved", 2, pipeline_layout=DSV3, mtp_layers=1))
    assert stage_layer_counts(model, trained) == [3 + 2, *[2 + 2] * 13, 2 + 1, 2 + 0]
    assert stage_chunk_mixes(model, trained)[14] == ((0, 2), (0, 1))  # the MTP module's MoE layer, in part 30
    built = [stage_layers(model, trained, stage) for stage in (14, 15)]
    assert [(b.mtp, b.mtp_heads, b.head) for b in built] == [(1, 0, False), (0, 1, True)]  # its logits: the head's
    one_chunk_trained = Layout(pp=16, split=PipelineSplit(pipeline_layout=DSV3_26_02, mtp_layers=1))
    assert stage_layer_counts(model, one_chunk_trained) == [4, *[4] * 14, 1 + 1]


@pytest.mark.torch
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_parts_are_megatron_cores(layout):
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    letters = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.mtp: "m", LayerType.loss: "L"}
    theirs = PipelineParallelLayerLayout.parse_str_to_list(layout)
    assert layout_parts(layout) == tuple("".join(letters[unit] for unit in part) for part in theirs)


@pytest.mark.torch
@pytest.mark.parametrize(("layout", "pp"), [(DSV3, 16), (DSV3, 8), (DSV3_26_02, 16), (DSV3_26_02, 4)])
def test_each_chunk_builds_the_layers_megatron_core_gives_it(layout, pp):
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    theirs = PipelineParallelLayerLayout(layout, pp)
    v = theirs.virtual_pipeline_model_parallel_size
    split = PipelineSplit("interleaved" if v > 1 else "1f1b", v, pipeline_layout=layout, mtp_layers=1)
    ours = stage_chunk_mixes(resolve_model("deepseek-v3").spec, Layout(pp=pp, grad_accum=4 * pp, split=split))
    for stage in range(pp):  # with the MTP module trained: its layer is built where Megatron-Core builds it
        built = [theirs.layout[stage][c].count(LayerType.decoder) + theirs.layout[stage][c].count(LayerType.mtp)
                 for c in range(v)]  # fmt: skip
        assert [sum(mix) for mix in ours[stage]] == built


def test_the_layout_makes_its_virtual_stages_and_the_plan_keeps_it():
    settings = {"model": "deepseek-v3", "gpus": "1024xH100", "pp": 16, "ep": 64, "recompute": "full"}
    estimate = lmcalc.memory(pipeline_layout=DSV3, mtp_layers=1, grad_accum=64, **settings)
    assert (estimate.layout.split.schedule, estimate.layout.split.virtual_stages) == ("interleaved", 2)
    found = lmcalc.plan(pipeline_layout=DSV3, mtp_layers=1, global_batch=4096 * 4096, seq=4096, **settings)
    assert found.layouts and all(c.layout.split == estimate.layout.split for c in found.layouts)


@pytest.mark.parametrize(
    ("layout", "pp", "said"),
    [
        ("Et*3|tx|L", 3, "'x' is not a layer"),
        (DSV3, 3, "names 32 parts, which PP=3 does not divide"),
        ("Et*30|t*30L", 2, "places 60 decoder layers (t); deepseek-v3 has 61"),
        ("t*31|Et*30L", 2, "the embedding (E) must open the first part"),
        ("t*99999999", 2, "spells out more than 100,000 units"),
        ("Et*30|t*31mL", 2, "places 1 multi-token-prediction layer (m) and"),
        ("Et*30m|t*31mL", 2, "the multi-token-prediction layers (m) come after every decoder layer"),
    ],
)
def test_a_layout_that_cannot_be_is_one_line(layout, pp, said):
    with pytest.raises(LmcalcError, match=said.replace("(", r"\(").replace(")", r"\)")):
        lmcalc.memory(model="deepseek-v3", gpus="96xH100", pp=pp, ep=8, pipeline_layout=layout)


@pytest.mark.parametrize(
    ("layout", "mtp", "said"),
    [
        ("Et*30|t*31L", 1, "places 0 multi-token-prediction layers (m) and"),
        ("Et*30|t*31m|mL", 2, "puts the multi-token-prediction layers (m) in one part"),
        (None, -1, "must be 0 or a positive integer, got -1"),
    ],
)
def test_mtp_layers_the_layout_cannot_hold_are_one_line(layout, mtp, said):
    with pytest.raises(LmcalcError, match=said.replace("(", r"\(").replace(")", r"\)")):
        lmcalc.memory(model="deepseek-v3", gpus="96xH100", pp=3 if layout and "m|mL" in layout else 2, ep=8,
                      pipeline_layout=layout, mtp_layers=mtp)  # fmt: skip


def test_a_layout_and_another_split_are_refused_together():
    with pytest.raises(LmcalcError, match="both set the split of the layers"):
        lmcalc.memory(model="deepseek-v3", gpus="64xH100", pp=2, ep=8, pipeline_layout="Et*30|t*31L",
                      first_stage_layers=30)  # fmt: skip


def test_megatron_reads_the_layout_and_its_virtual_stages(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --pipeline-model-parallel-size 16 --expert-model-parallel-size 64 "
                      f"--pipeline-model-parallel-layout '{DSV3}' --mtp-num-layers 1 "
                      "--micro-batch-size 1\n")  # fmt: skip
    settings = read(str(script)).keywords()
    assert (settings["pipeline_layout"], settings["mtp_layers"]) == (DSV3, 1)
    assert (settings["schedule"], settings["virtual_stages"]) == ("interleaved", 2)


def test_a_layout_emitted_for_torchtitan_names_its_parts(lmcalc_run, tmp_path):
    # torchtitan has no layout string: the parts' modules are named (module_fqns_per_model_part), 15 and 17 layers
    run = lmcalc_run(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--pp", "2", "--pipeline-layout",
                      "Et*15|t*17L", "--framework", "torchtitan", "--zero", "3", "--emit", "torchtitan"])  # fmt: skip
    assert run.code == 0, run.err
    (tmp_path / "t.toml").write_text(run.out)
    settings = read(f"torchtitan:{tmp_path / 't.toml'}").keywords()
    settings.pop("global_batch")  # a plan's setting, not memory's
    layout = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", **settings).layout
    assert stage_layer_counts(resolve_model("llama-3.1-8b").spec, layout) == [15, 17]
