"""A torchtitan config's pipeline split, schedule and FSDP resharding, read as torchtitan resolves them
(pytorch/torchtitan 238fa995: torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part`` and
torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy``). Each expected split is worked by hand
from torchtitan's rule: the L layers plus the embedding and the output, weighed one layer each, dealt over the p·v
parts, the first ``(L + 2) mod (p·v)`` parts taking one more, the first part less the embedding's weight and the
last less the output's; rank r holds parts r, r + p, …."""

from __future__ import annotations

import pytest

import lmcalc
from lmcalc.engine.parallel.pipeline import stage_layer_counts
from lmcalc.launch import read
from lmcalc.presets import resolve_model

LLAMA_8B = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nseq_len = 8192\n'


def read_toml(tmp_path, parallelism: str):
    path = tmp_path / "train.toml"
    path.write_text(LLAMA_8B + "[parallelism]\n" + parallelism)
    return read(str(path))


def stages_of(launch) -> list[int]:
    settings = launch.keywords()
    layout = lmcalc.memory(gpus="8xH100", **settings).layout
    return stage_layer_counts(resolve_model("llama-3.1-8b").spec, layout)


def test_the_default_split_counts_the_embedding_and_the_output_as_a_layer_each(tmp_path):
    # 1F1B, 4 parts: 32 + 2 = 34 = 4 · 8 + 2, so parts of 9, 9, 8, 8 weighed layers: 8, 9, 8, 7 layers
    launch = read_toml(tmp_path, "pipeline_parallel_degree = 4\n")
    settings = launch.keywords()
    assert settings["schedule"] == "1f1b" and settings["account_for_embedding_in_pipeline_split"]
    assert settings["grad_accum"] == 8  # local_batch_size 8 over the default pipeline micro-batch of 1
    assert stages_of(launch) == [8, 9, 8, 7]
    # the weights at 0: 32 = 4 · 8, an even split
    launch = read_toml(tmp_path, "pipeline_parallel_degree = 4\npipeline_parallel_first_stage_less_layers = 0\n"
                                 "pipeline_parallel_last_stage_less_layers = 0\n")  # fmt: skip
    assert stages_of(launch) == [8, 8, 8, 8]


def test_interleaved_takes_two_parts_a_rank(tmp_path):
    # 8 parts: 34 = 8 · 4 + 2: weighed 5, 5, 4, 4, 4, 4, 4, 4; layers 4, 5, 4, 4, 4, 4, 4, 3; rank r: parts r, r + 4
    launch = read_toml(tmp_path, 'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n')
    assert launch.keywords()["virtual_stages"] == 2
    assert stages_of(launch) == [4 + 4, 5 + 4, 4 + 4, 4 + 3]


def test_named_parts_are_read_as_the_split_they_make(tmp_path):
    layers = [[f"layers.{i}" for i in range(start, end)] for start, end in ((0, 10), (10, 20), (20, 28), (28, 32))]
    parts = [["tok_embeddings", *layers[0]], layers[1], layers[2], [*layers[3], "norm", "output"]]
    launch = read_toml(tmp_path, f"pipeline_parallel_degree = 4\nmodule_fqns_per_model_part = {parts}\n")
    # 10, 10, 8, 4 is no split of lmcalc's (given the first and last stages, the middle ones split evenly: 9, 9):
    # said, and the answer is lmcalc's even split
    assert any(u.key == "parallelism.module_fqns_per_model_part" for u in launch.unexpressed)
    assert stages_of(launch) == [8, 8, 8, 8]
    parts[1], parts[2] = parts[1][:9], parts[1][9:] + parts[2]  # 10, 9, 9, 4: the first and last stages given
    launch = read_toml(tmp_path, f"pipeline_parallel_degree = 4\nmodule_fqns_per_model_part = {parts}\n")
    assert stages_of(launch) == [10, 9, 9, 4] and not launch.unexpressed


@pytest.mark.parametrize(
    ("parallelism", "zero"),
    [
        ("", 3),  # FSDP over every GPU, resharded after forward
        ('fsdp_reshard_after_forward = "never"\n', 2),
        ("pipeline_parallel_degree = 2\n", 2),  # "default" does not reshard under PP
        ('pipeline_parallel_degree = 2\nfsdp_reshard_after_forward = "always"\n', 3),
        ("data_parallel_shard_degree = 1\n", None),  # no FSDP: the profile's replicated default
    ],
)
def test_fsdp_resharding_is_zero_3_and_keeping_the_weights_is_zero_2(tmp_path, parallelism, zero):
    assert read_toml(tmp_path, parallelism).keywords().get("zero") == zero


def test_a_schedule_lmcalc_does_not_time_is_named(tmp_path):
    launch = read_toml(tmp_path, 'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBVZeroBubble"\n')
    assert [u.key for u in launch.unexpressed] == ["parallelism.pipeline_parallel_schedule"]
    assert "schedule" not in launch.keywords()


def test_an_embedding_weighed_as_two_layers_is_named(tmp_path):
    launch = read_toml(tmp_path, "pipeline_parallel_degree = 2\npipeline_parallel_first_stage_less_layers = 2\n")
    (said,) = launch.unexpressed
    assert said.key == "parallelism.pipeline_parallel_first_stage_less_layers"
    assert said.why == "the embedding weighed as 2 layers in the split (lmcalc: 0 or 1)"


def test_a_replicate_degree_is_read_as_hsdp_groups(tmp_path):
    # torchtitan's 2-D mesh: FSDP over data_parallel_shard_degree GPUs in each of data_parallel_replicate_degree groups
    launch = read_toml(tmp_path, "data_parallel_shard_degree = 8\ndata_parallel_replicate_degree = 2\n")
    settings = launch.keywords()
    assert (settings["zero"], settings["hsdp"]) == (3, 2)
    gpu = lmcalc.memory(gpus="16xH100", **settings).gpu
    assert gpu.master == 4 * 8_030_261_248 / 8  # fp32 master shards over a group of 8, not all 16
