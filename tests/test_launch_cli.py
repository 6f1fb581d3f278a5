"""``--from`` at the command line: a launch config's settings are the flags typed (the same answer as typing them),
a flag typed beside it wins and is said, and what the file cannot give is asked for in one line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "launch"


def results(run) -> dict:
    assert run.code == 0, run.err
    return run.json["results"]


def test_from_a_torchtitan_config_is_its_settings_typed(lmcalc_run):
    # torchtitan/llama3-70b.toml: llama3 70B, TP 8 (with sequence parallelism), FSDP (ZeRO-3), local batch 8 of 8192,
    # full activation checkpointing; torchtitan's profile
    typed = ["--model", "llama-3.1-70b", "--tp", "8", "--sequence-parallel", "--zero", "3", "--seq", "8192",
             "--micro-batch", "8", "--recompute", "full", "--framework", "torchtitan"]  # fmt: skip
    read = lmcalc_run(["memory", "--from", str(DATA / "torchtitan/llama3-70b.toml"), "--gpus", "64xH100", "--json"])
    assert results(read) == results(lmcalc_run(["memory", *typed, "--gpus", "64xH100", "--json"]))
    notes = " ".join(read.json["notes"])
    assert "tensor_parallel_degree → --tp 8" in notes and "activation_checkpoint.mode → --recompute full" in notes


def test_from_a_fine_tuning_config(lmcalc_run):
    # axolotl/llama3-8b-qlora.yml on a 24 GB card: QLoRA r32 on every linear layer, 2 × 4096 tokens, paged AdamW
    typed = ["--model", "llama-3-8b", "--method", "qlora", "--lora-rank", "32", "--lora-dropout", "0.05",
             "--lora-targets", "all-linear", "--seq", "4096", "--micro-batch", "2", "--grad-accum", "4",
             "--optimizer", "paged-adamw", "--recompute", "full", "--framework", "transformers"]  # fmt: skip
    read = lmcalc_run(["memory", "--from", str(DATA / "axolotl/llama3-8b-qlora.yml"), "--gpus", "1xrtx-4090",
                       "--json"])  # fmt: skip
    assert results(read) == results(lmcalc_run(["memory", *typed, "--gpus", "1xrtx-4090", "--json"]))
    assert any("sample_packing" in note for note in read.json["notes"])  # asked, not modelled: said


def test_a_flag_beside_from_wins_and_is_said(lmcalc_run):
    read = lmcalc_run(["memory", "--from", str(DATA / "torchtitan/llama3-70b.toml"), "--gpus", "64xH100", "--tp", "4",
                       "--json"])  # fmt: skip
    assert read.code == 0, read.err
    assert read.json["inputs"]["layout"]["value"].startswith("DP=16, TP=4")
    assert any("--tp 4 (the file's parallelism.tensor_parallel_degree: 8)" in note for note in read.json["notes"])


def test_a_global_batch_becomes_the_accumulation_on_the_gpus_given(lmcalc_run):
    # mixtral-8x7b-distributed.sh: 256 sequences a step, micro-batch 1, TP 1 · PP 4 · CP 1 on 32 GPUs: DP 8, so
    # 256 / (1 · 8) = 32 micro-batches a step
    read = lmcalc_run(["memory", "--from", str(DATA / "megatron/mixtral-8x7b-distributed.sh"), "--gpus", "32xH100",
                       "--json"])  # fmt: skip
    assert read.code == 0, read.err
    assert read.json["inputs"]["grad_accum"]["value"] == 32
    assert read.json["inputs"]["model"]["value"].startswith("mixtral-8x7b-distributed")


def test_a_tp_typed_beside_a_megatron_script_pads_its_vocabulary_for_that_tp(lmcalc_run, tmp_path):
    # GPT-3 175B at TP 4 (the script's is 8): GPT-2's 50,257 tokens padded to a multiple of 128 · 4, 50,688 rows
    # against the script's 51,200; the first stage holds the vocabulary-parallel embedding, a quarter of its rows
    import yaml

    from lmcalc.launch import read

    script = str(DATA / "megatron/gpt3-175b-distributed.sh")
    as_read = tmp_path / "gpt3-as-read.yaml"  # the model the script gives at its own TP, 51,200 rows
    as_read.write_text(yaml.safe_dump(read(script).keywords()["model"].model_dump(mode="json", exclude_none=True)))
    runs = [lmcalc_run(["memory", "--from", script, "--gpus", "128xH100", "--tp", "4", *model, "--json"])
            for model in ([], ["--model", str(as_read)])]  # fmt: skip
    held = [results(run)["state"]["params_per_gpu"]["value"] for run in runs]
    assert held[1] - held[0] == (51200 - 50688) * 12288 / 4
    assert any("padded to 50,688 (a multiple of 128 × TP 4" in note for note in runs[0].json["notes"])


def test_a_layout_that_does_not_fit_the_scripts_gpus_says_where_they_came_from(lmcalc_run):
    # the GPT-3 script launches on one node of 8 (GPUS_PER_NODE=8, NUM_NODES=1) with TP 8 · PP 16
    run = lmcalc_run(["memory", "--from", str(DATA / "megatron/gpt3-175b-distributed.sh")])
    assert run.code == 2 and "does not divide the 8 GPUs" in run.err
    assert "(8xH100: the GPUs" in run.err and "launches on; give --gpus)" in run.err


def test_train_time_and_plan_take_the_run_from_the_file(lmcalc_run):
    # mixtral: --train-iters 500000 of 256 × 4096 tokens = 524,288,000,000 tokens
    read = lmcalc_run(["train-time", "--from", str(DATA / "megatron/mixtral-8x7b-distributed.sh"), "--gpus",
                       "32xH100", "--mfu", "0.4", "--json"])  # fmt: skip
    assert read.code == 0, read.err
    assert read.json["inputs"]["tokens"]["value"] == 500_000 * 256 * 4096
    plan = lmcalc_run(["plan", "--from", str(DATA / "torchtitan/llama3-8b.toml"), "--gpus", "8xH100", "--json"])
    assert plan.code == 0, plan.err
    assert plan.json["details"]["rank1"]["zero"] == 3  # the file's FSDP, a pin


def test_without_a_model_it_is_asked_for(lmcalc_run):
    run = lmcalc_run(["memory", "--from", str(DATA / "deepspeed/axolotl-zero2.json"), "--gpus", "8xH100"])
    assert run.code == 2 and "does not name the model" in run.err and "give --model" in run.err
    run = lmcalc_run(["memory", "--gpus", "8xH100"])
    assert run.code == 2 and "give --model (or --from a launch config that names the model)" in run.err


def test_from_standard_input(lmcalc_run, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}'))
    run = lmcalc_run(["memory", "--from", "-", "--model", "llama-3.1-8b", "--gpus", "8xH100", "--json"])
    assert run.code == 0, run.err
    assert "ZeRO-3" in run.json["inputs"]["layout"]["value"]


@pytest.mark.parametrize("source", ["no/such/file.json", "x" * 5000, "deepspeed:" + str(DATA / "missing.json")])
def test_a_source_that_cannot_be_read_is_one_line(lmcalc_run, source):
    run = lmcalc_run(["memory", "--from", source, "--gpus", "8xH100"])
    assert run.code == 2 and run.err.count("\n") == 1 and "Traceback" not in run.err
