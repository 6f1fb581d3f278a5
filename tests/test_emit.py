"""``plan --emit``: what it writes is accepted by each framework's own parser (DeepSpeed's ``DeepSpeedConfig``,
Megatron-Core's config dataclasses, transformers' ``HfArgumentParser``; torchtitan's TOML schema at the commit of the
published configs in tests/data/launch), and read back with ``--from`` it gives the same layout and the same memory."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

pytestmark = pytest.mark.torch  # DeepSpeed, Megatron-Core and transformers import torch

DATA = Path(__file__).parent / "data" / "launch"

PLANS = {
    # (kind, the plan's flags): layouts each framework runs
    name: shlex.split(flags)
    for name, flags in {
        "megatron": "-m llama-3.1-70b --gpus 64xH100 --pp 2 --framework megatron",
        "megatron-moe": "-m mixtral-8x7b --gpus 32xH100 --ep 8 --framework megatron",
        "megatron-flex": "-m mixtral-8x7b --gpus 32xH100 --ep 8 --framework megatron --moe-dispatcher hybridep",
        "megatron-layout": "-m deepseek-v3 --gpus 1024xH100 --pp 16 --ep 64 --pipeline-layout 'Et*3|(tt|)*29,m|L' "
        "--mtp-layers 1 --framework megatron",
        "megatron-bridge": "-m llama-3.1-8b --gpus 16xH100 --zero 1 --framework megatron --precision fp8-current "
        "--grad-reduce-in-bf16 --fp8-param-gather --te-cross-entropy",
        "megatron-muon": "-m llama-3.1-8b --gpus 16xH100 --zero 1 --framework megatron --optimizer muon",
        "megatron-hsdp": "-m llama-3.1-70b --gpus 64xH100 --tp 8 --zero 1 --hsdp 2 --framework megatron",
        "megatron-offload": "-m qwen3-30b-a3b --gpus 16xH100 --ep 8 --pp 1 --framework megatron "
        "--offload-modules expert_fc1 --min-offloaded-tensor-size 20000000",  # fused_group_mlp: after 0.16.1
        "megatron-hfsdp": "-m llama-3.1-70b --gpus 64xH100 --tp 8 --zero 3 --hsdp 2 --hsdp-shard-optimizer "
        "--framework megatron",
        "torchtitan-hsdp": "-m llama-3.1-8b --gpus 32xH100 --tp 1 --pp 1 --zero 3 --hsdp 4 --framework torchtitan",
        "deepspeed": "-m llama-3.1-8b --gpus 16xH100 --tp 1 --pp 1 --cp 1 --zero 2 --offload optimizer "
        "--framework deepspeed",
        "torchtitan": "-m llama-3.1-70b --gpus 64xH100 --zero 3 --framework torchtitan",
        "torchtitan-zero2": "-m llama-3.1-8b --gpus 8xH100 --zero 2 --framework torchtitan",
        "torchtitan-pp": "-m llama-3.1-70b --gpus 64xH100 --pp 2 --zero 3 --framework torchtitan",
        "trainer": "-m qwen3-8b --gpus 8xH100 --tp 1 --pp 1 --cp 1 --zero 3 --recompute full --framework deepspeed",
    }.items()
}


def emitted(lmcalc_run, name: str, rank: int = 1) -> tuple[str, list[str]]:
    kind = name.split("-")[0]
    run = lmcalc_run(["plan", *PLANS[name], "--emit", kind, "--rank", str(rank)])
    assert run.code == 0, run.err
    return run.out, PLANS[name]


def planned(lmcalc_run, name: str, rank: int = 1) -> dict:
    """The plan's own figures for the layout at ``rank``: the terminal's JSON of the same search."""
    run = lmcalc_run(["plan", *PLANS[name], "--top", "all", "--json"])
    assert run.code == 0, run.err
    return {"memory": run.json["results"][f"rank{rank}"]["memory"]["value"], **run.json["details"][f"rank{rank}"]}


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("rank", [1, 2])
def test_reading_what_was_emitted_gives_the_same_layout_and_memory(lmcalc_run, tmp_path, name, rank):
    text, flags = emitted(lmcalc_run, name, rank)
    kind = name.split("-")[0]
    path = tmp_path / {"megatron": "args.sh", "deepspeed": "ds.json", "torchtitan": "t.toml", "trainer": "t.yaml"}[kind]
    path.write_text(text)
    model, gpus = flags[flags.index("-m") + 1], flags[flags.index("--gpus") + 1]
    source = f"{kind}:{path}"
    plan = planned(lmcalc_run, name, rank)
    extra = []
    if kind == "deepspeed":  # a DeepSpeed config does not say how the model checkpoints: given beside it
        extra = ["--recompute", plan["recompute"]]
    run = lmcalc_run(["memory", "--from", source, "-m", model, "--gpus", gpus, *extra, "--json"])
    assert run.code == 0, run.err
    layout = run.json["inputs"]["layout"]["value"]
    for degree in ("dp", "tp", "pp", "cp", "ep"):
        assert f"{degree.upper()}={plan[degree]}," in layout, (degree, layout)
    assert f"ZeRO-{plan['zero']}" in layout
    assert run.json["inputs"]["micro_batch"]["value"] == plan["micro_batch"]
    assert run.json["results"]["total"]["total"]["value"] == pytest.approx(plan["memory"], rel=1e-9)


def test_the_dispatcher_costed_is_the_one_written_and_read_back(lmcalc_run, tmp_path):
    # Megatron-Core's default dispatcher is allgather (transformer_config.py), which lmcalc does not time: an MoE
    # plan writes alltoall, or flex with the backend it was costed with
    assert "--moe-token-dispatcher-type alltoall" in emitted(lmcalc_run, "megatron-moe")[0]
    text, _ = emitted(lmcalc_run, "megatron-flex")
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend hybridep" in text
    assert "--moe-token-dispatcher-type" not in emitted(lmcalc_run, "megatron")[0]  # a dense model: none
    assert "as costed: the megatron profile (the hybridep dispatcher)" in text  # the notes say it too
    bridge = emitted(lmcalc_run, "megatron-bridge")[0]  # and the settings that changed the profile
    assert "(gradients reduced in bf16, fp8 primary weights, Transformer Engine's fused loss)" in bridge
    path = tmp_path / "args.sh"
    path.write_text(text)
    from lmcalc.launch import read

    assert read(f"megatron:{path}").keywords()["moe_dispatcher"] == "hybridep"


# ------------------------------------------------------------------------------------------- the parsers


MEGATRON_LM_ONLY = {"micro_batch_size", "global_batch_size", "seq_length", "use_megatron_fsdp",
                    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                    "grad_reduce_in_bf16"}  # fmt: skip
"""Megatron-LM's training script's own arguments (megatron/training/arguments.py), which set no Megatron-Core config
field of the same name."""


def megatron_arguments(text: str) -> dict[str, object]:
    words = shlex.split(text[text.index("LMCALC_ARGS=(") + len("LMCALC_ARGS=(") : text.rindex(")")], comments=True)
    found: dict[str, object] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            values = []
            for following in words[i + 1 :]:
                if following.startswith("--"):
                    break
                values.append(following)
            name = word[2:].replace("-", "_")
            listed = name in ("recompute_modules", "offload_modules")  # the flags that take a list
            found[name] = True if not values else values if listed else values[0]
    return found


SHAPES = {"megatron-layout": {"num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_moe_experts": 256,
                               "moe_router_topk": 8}}  # fmt: skip
"""The model's shape flags where the layout checks them against the model (DeepSeek-V3: 61 layers, 256 experts, top-8;
presets/models/deepseek-v3.yaml; its one MTP layer is the plan's --mtp-num-layers, which the layout must match); the
others: a Llama 3 8B's, with 8 experts top-2 under EP."""


@pytest.mark.parametrize(
    "name",
    [
        "megatron",
        "megatron-moe",
        "megatron-flex",
        "megatron-layout",
        "megatron-bridge",
        "megatron-muon",
        "megatron-hsdp",
        "megatron-hfsdp",
        "megatron-offload",
    ],
)
def test_megatron_core_accepts_the_arguments(lmcalc_run, name):
    """Megatron-LM copies each argument into the Megatron-Core config field of the same name
    (``core_transformer_config_from_args``): each one is such a field or the training script's own, and the configs
    take them (their ``__post_init__`` checks how they combine)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    text, _ = emitted(lmcalc_run, name)
    transformer = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    # a field whose flag is named otherwise says so in its metadata (fp8: --fp8-format)
    renamed = {flag[2:].replace("-", "_"): f.name for f in transformer.values()
               for flag in f.metadata.get("argparse_meta", {}).get("arg_names", [])}  # fmt: skip
    arguments = {renamed.get(k, k): v for k, v in megatron_arguments(text).items()}
    ddp = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    optimizer = {f.name for f in dataclasses.fields(OptimizerConfig)}  # --optimizer muon
    unknown = set(arguments) - set(transformer) - ddp - optimizer - MEGATRON_LM_ONLY
    assert not unknown, f"not Megatron-Core config fields: {sorted(unknown)}"

    def typed(name: str, value: object) -> object:
        kind = str(transformer[name].type)
        whole = ("int", "<class 'int'>", "Optional[int]", "int | None", "typing.Optional[int]")
        return int(value) if kind in whole else value

    given = {k: typed(k, v) for k, v in arguments.items() if k in transformer}
    moe = {"num_moe_experts": 8, "moe_router_topk": 2} if given.get("expert_model_parallel_size", 1) > 1 else {}
    if given["pipeline_model_parallel_size"] > 1:  # Megatron-LM sets it from --bf16 (args.params_dtype)
        import torch

        given["pipeline_dtype"] = torch.bfloat16
    shape = SHAPES.get(name, {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, **moe})
    config = TransformerConfig(**shape, **given)
    if "pipeline_model_parallel_layout" in given:  # the layout's parts over PP: the virtual stages written beside it
        assert config.virtual_pipeline_model_parallel_size == int(given["virtual_pipeline_model_parallel_size"])
    DistributedDataParallelConfig(**{k: v for k, v in arguments.items() if k in ddp})
    OptimizerConfig(**{k: v for k, v in arguments.items() if k in optimizer and k not in transformer})


def test_deepspeed_accepts_the_config(lmcalc_run, monkeypatch, tmp_path):
    text, _ = emitted(lmcalc_run, "deepspeed")
    config = json.loads(text)
    plan = planned(lmcalc_run, "deepspeed")
    import deepspeed.comm as dist  # after lmcalc has run: DeepSpeed prints to standard output as it loads
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(dist, "get_rank", lambda: 0)  # no process group on the CPU: DeepSpeed asks the mpu for DP
    (tmp_path / "ds.json").write_text(text)
    checked = DeepSpeedConfig(
        str(tmp_path / "ds.json"), mpu=SimpleNamespace(get_data_parallel_world_size=lambda: plan["dp"])
    )
    # its own batch check: train_batch_size = micro-batch · accumulation · DP
    assert (
        checked.train_batch_size == config["train_batch_size"] == plan["micro_batch"] * plan["grad_accum"] * plan["dp"]
    )
    assert checked.zero_optimization_stage == plan["zero"] == 2
    assert checked.zero_config.offload_optimizer.device == "cpu" and checked.bfloat16_config.enabled


def test_transformers_accepts_the_training_arguments(lmcalc_run, tmp_path):
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    text, _ = emitted(lmcalc_run, "trainer")
    settings = yaml.safe_load(text)
    # bf16 is refused on a machine without a GPU for want of the device, not of the config: train "on the CPU" here
    try:
        (arguments,) = HfArgumentParser(TrainingArguments).parse_dict({**settings, "use_cpu": True},
                                                                      allow_extra_keys=False)  # fmt: skip
    finally:  # TrainingArguments with a DeepSpeed config makes it the process's own: every later model ZeRO-3's
        unset_hf_deepspeed_config()
    plan = planned(lmcalc_run, "trainer")
    assert arguments.per_device_train_batch_size == plan["micro_batch"]
    assert arguments.gradient_accumulation_steps == plan["grad_accum"] and arguments.gradient_checkpointing
    assert arguments.deepspeed["zero_optimization"]["stage"] == 3


TORCHTITAN_SCHEMA = {
    # torchtitan/config/job_config.py at 238fa9953e4aec2a62582121564273d7cbb1e9f1, the commit of the TOMLs in
    # tests/data/launch/torchtitan (the last before torchtitan's TOMLs gave way to Python configs): the fields a
    # training TOML's sections set, and their types
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "tensor_parallel_degree": int, "pipeline_parallel_degree": int, "context_parallel_degree": int,
                    "expert_parallel_degree": int, "pipeline_parallel_microbatch_size": int,
                    "fsdp_reshard_after_forward": ("default", "always", "never"),
                    # torch.distributed.pipelining's schedule classes by name (get_schedule_class)
                    "pipeline_parallel_schedule": ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS",
                                                   "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"),
                    "pipeline_parallel_first_stage_less_layers": int, "pipeline_parallel_last_stage_less_layers": int,
                    "module_fqns_per_model_part": list},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int},
    "activation_checkpoint": {"mode": ("selective", "full", "memory_budget", "none"), "selective_ac_option": str},
}  # fmt: skip


@pytest.mark.parametrize("name", ["torchtitan", "torchtitan-zero2", "torchtitan-pp", "torchtitan-hsdp"])
def test_torchtitan_reads_the_toml_as_its_configs_do(lmcalc_run, name):
    text, _ = emitted(lmcalc_run, name)
    written = tomllib.loads(text)
    published = [tomllib.loads(p.read_text()) for p in sorted((DATA / "torchtitan").glob("*.toml"))]
    for section, keys in written.items():
        for key, value in keys.items():
            kind = TORCHTITAN_SCHEMA[section][key]
            assert value in kind if isinstance(kind, tuple) else isinstance(value, kind), (section, key, value)
            seen = [p[section][key] for p in published if key in p.get(section, {})]
            assert all(type(s) is type(value) for s in seen), (section, key)  # as torchtitan's own configs give it
    plan = planned(lmcalc_run, name)
    parallelism = written["parallelism"]  # FSDP within each of HSDP's replica groups (torchtitan's dp_replicate)
    assert parallelism["data_parallel_shard_degree"] * parallelism["data_parallel_replicate_degree"] == plan["dp"]
    assert parallelism["data_parallel_replicate_degree"] == plan.get("hsdp", 1) and plan["zero"] >= 2
    # the policy torchtitan/distributed/fsdp.py resolves: "default" reshards, but not under PP
    reshard = written["parallelism"].get("fsdp_reshard_after_forward", "default")
    assert (reshard == "never" or reshard == "default" and plan["pp"] > 1) == (plan["zero"] == 2)
    assert re.search(r"^\[activation_checkpoint\]$", text, re.M)


def test_what_a_framework_cannot_run_is_refused_in_a_line(lmcalc_run):
    run = lmcalc_run(["plan", "-m", "llama-3.1-70b", "--gpus", "64xH100", "--tp", "8", "--emit", "deepspeed"])
    assert run.code == 2 and "--emit deepspeed: this layout uses TP 8" in run.err
    run = lmcalc_run(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--emit", "torchtitan", "--zero", "1"])
    assert run.code == 2 and "not ZeRO-1" in run.err
    run = lmcalc_run(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--emit", "megatron", "--rank", "100000"])
    assert run.code == 2 and "--rank 100000" in run.err
    run = lmcalc_run(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--emit", "nemo"])
    assert run.code == 2 and "megatron" in run.err
    run = lmcalc_run(["plan", "-m", "llama-3.2-1b", "--gpus", "1xH100", "--optimizer", "muon", "--emit", "trainer"])
    assert run.code == 2 and "Trainer names no optim for muon" in run.err  # not AdamW in its place
