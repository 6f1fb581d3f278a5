"""A layout ``plan`` chose, written as a framework's own config (``plan --emit``): Megatron-LM arguments, a DeepSpeed
JSON, a torchtitan TOML (the training configs of torchtitan up to 0.2; 0.3 replaced them by Python config
registries), or a Hugging Face Trainer's arguments as YAML. What lmcalc assumed is written beside the settings: as
comments where the format has them, under a top-level ``lmcalc`` key in DeepSpeed's JSON (DeepSpeed reads the keys
it knows).

Reading what is written here with ``--from`` gives the same layout back (tests/test_emit.py).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, setting
from lmcalc.launch.config import EMIT_KINDS
from lmcalc.specs import Cluster

if TYPE_CHECKING:
    from lmcalc.estimates.plan import PlanEstimate

MEGATRON_PRECISION = {
    "bf16-mixed": [["--bf16"]],
    "bf16-pure": [["--bf16"]],
    "fp16-mixed": [["--fp16"]],
    "fp8-mixed": [["--bf16"], ["--fp8-format", "hybrid"]],
    "fp8-current": [["--bf16"], ["--fp8-format", "hybrid"], ["--fp8-recipe", "tensorwise"]],
    "fp8-blockwise": [["--bf16"], ["--fp8-format", "e4m3"], ["--fp8-recipe", "blockwise"]],
    "mxfp8": [["--bf16"], ["--fp8-format", "e4m3"], ["--fp8-recipe", "mxfp8"]],
    "fp32": [],
}
"""lmcalc's precision recipes as Megatron-LM's flags (Transformer Engine's fp8 recipes by ``--fp8-recipe``)."""
MEGATRON_FSDP = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO-2 and -3 under Megatron-LM: Megatron-FSDP's sharding strategies (``--use-megatron-fsdp``)."""
HF_OPTIM = {"adamw": "adamw_torch", "adam": "adamw_torch", "adam-8bit": "adamw_bnb_8bit",
            "paged-adamw": "paged_adamw_32bit", "paged-adamw-8bit": "paged_adamw_8bit", "adafactor": "adafactor",
            "sgd": "sgd", "adagrad": "adagrad", "rmsprop": "rmsprop", "lion": "lion_32bit"}  # fmt: skip
"""lmcalc's optimizers as the Trainer's ``optim`` names them."""


@dataclass(frozen=True)
class Chosen:
    """A layout as ``plan`` ranked it: its place, the workload it runs, the cluster, and its figures."""

    rank: int
    ranked: int
    model: str
    layout: Layout
    workload: Workload
    cluster: Cluster
    tokens_per_s: float
    mfu: float
    memory_bytes: float

    @property
    def global_batch(self) -> int:
        """Sequences a step: micro-batch · accumulation · data-parallel replicas."""
        return self.workload.micro_batch * self.layout.grad_accum * self.layout.dp


PROFILES = {"megatron": ("megatron",), "deepspeed": ("deepspeed",), "torchtitan": ("torchtitan",),
            "trainer": ("transformers", "liger", "deepspeed")}  # fmt: skip
"""The framework profiles that cost a layout as each kind's framework runs it."""


def emit_plan(found: PlanEstimate, kind: str, rank: int = 1) -> str:
    """The layout on row ``rank`` of the plan's table (the first of the layouts tied there) as a config of ``kind``."""
    from lmcalc.estimates.inputs import choice
    from lmcalc.estimates.plan import tie_rows

    rows = tie_rows(list(found.layouts), None)
    if not 1 <= rank <= len(rows):
        raise LmcalcError(f"{setting('rank')} {rank}: the plan ranks {len(rows)} layouts; give 1 to {len(rows)}")
    best = rows[rank - 1][0]
    chosen = Chosen(rank, len(rows), best.workload.model.name, best.layout, best.workload, best.machine.cluster,
                    best.tokens_per_s, best.mfu, best.memory_total)  # fmt: skip
    return emit(choice(kind, EMIT_KINDS, "emit"), chosen)


def emit(kind: str, chosen: Chosen) -> str:
    """``chosen`` as a config of ``kind`` (``EMIT_KINDS``)."""
    writers: dict[str, Callable[[Chosen], str]] = {
        "megatron": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan, "trainer": _trainer,
    }  # fmt: skip
    if kind not in writers:
        raise LmcalcError(f"cannot emit {kind!r}; lmcalc writes {', '.join(EMIT_KINDS)}")
    if kind != "megatron" and chosen.layout.split.mtp_layers:
        raise LmcalcError(f"--emit {kind}: a {kind} config trains no multi-token-prediction modules; drop "
                          "--mtp-layers or --emit megatron")  # fmt: skip
    return writers[kind](chosen)


def notes(kind: str, chosen: Chosen) -> list[str]:
    """What the figures rest on that the config does not say, and whether they were costed as ``kind``'s framework
    allocates (its profile)."""
    profile = chosen.workload.framework.name
    if profile in PROFILES[kind]:
        return assumptions(chosen)
    return [*assumptions(chosen), f"costed under the {profile} profile, not as {kind} allocates: plan --framework "
            f"{PROFILES[kind][0]} costs it so"]  # fmt: skip


def assumptions(chosen: Chosen) -> list[str]:
    """What the figures rest on that the config does not say: lmcalc's prediction, and its assumptions."""
    w, layout = chosen.workload, chosen.layout
    return [
        f"lmcalc plan: rank {chosen.rank} of {chosen.ranked} for {chosen.model} on {chosen.cluster.label} "
        f"({chosen.cluster.count} GPUs, DP {layout.dp})",
        f"predicted: {chosen.tokens_per_s:,.0f} tokens/s, MFU {100 * chosen.mfu:.1f} %, "
        f"{chosen.memory_bytes / 1e9:.2f} GB on the most loaded GPU "
        f"of {chosen.cluster.hardware.capacity_bytes / 1e9:.1f}",
        f"as costed: the {w.framework.name} profile{_modifiers(w)}, the {w.precision.name} recipe, "
        f"{w.optimizer.name}, {w.attention} attention, {w.seq_len} tokens a sequence",
    ]


def _modifiers(w: Workload) -> str:
    """The settings that changed the megatron profile, and an MoE model's dispatcher, as the notes name them."""
    said = [name for name, _ in _profile_settings(w)] + ([f"the {w.moe_dispatcher} dispatcher"] if w.model.moe else [])
    return f" ({', '.join(said)})" if said else ""


def _refuse(kind: str, chosen: Chosen, degrees: tuple[str, ...]) -> None:
    used = [f"{name.upper()} {getattr(chosen.layout, name)}" for name in degrees if getattr(chosen.layout, name) > 1]
    if used:
        raise LmcalcError(
            f"--emit {kind}: this layout uses {', '.join(used)}, which a {kind} config does not set; pin them to 1 "
            f"(--{' 1 --'.join(d for d in degrees)} 1) or --emit megatron"
        )


def _megatron(chosen: Chosen) -> str:
    layout, w = chosen.layout, chosen.workload
    args: list[list[str]] = [
        ["--tensor-model-parallel-size", str(layout.tp)],
        ["--pipeline-model-parallel-size", str(layout.pp)],
        ["--context-parallel-size", str(layout.cp)],
        ["--expert-model-parallel-size", str(layout.ep)],
    ]
    if layout.etp is not None:
        args.append(["--expert-tensor-parallel-size", str(layout.etp)])
    if layout.sequence_parallel:
        args.append(["--sequence-parallel"])
    if w.optimizer.name == "muon":  # with --use-distributed-optimizer, Megatron-LM's layer-wise one
        args.append(["--optimizer", "muon"])
    if layout.zero >= 1:
        args.append(["--use-distributed-optimizer"])
    if layout.hsdp > 1:  # the distributed optimizer's (or Megatron-FSDP's) instances, each sharding within its group
        args.append(["--num-distributed-optimizer-instances", str(layout.hsdp)])
    if layout.hsdp_shard_optimizer:  # HFSDP (Megatron-FSDP's optimizer sharded across the instances)
        args.append(["--outer-dp-sharding-strategy", "optim"])
    if layout.zero >= 2:
        args += [["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", MEGATRON_FSDP[layout.zero]]]
    split = layout.split
    if split.schedule == "interleaved":
        args.append(["--virtual-pipeline-model-parallel-size", str(split.virtual_stages)])
    if split.first_stage_layers is not None:
        args.append(["--decoder-first-pipeline-num-layers", str(split.first_stage_layers)])
    if split.last_stage_layers is not None:
        args.append(["--decoder-last-pipeline-num-layers", str(split.last_stage_layers)])
    if split.pipeline_layout is not None:
        args.append(["--pipeline-model-parallel-layout", split.pipeline_layout])
    if split.mtp_layers:
        args.append(["--mtp-num-layers", str(split.mtp_layers)])
    args += [["--account-for-embedding-in-pipeline-split"]] if split.embedding_in_split else []
    args += [["--account-for-loss-in-pipeline-split"]] if split.loss_in_split else []
    args += [
        ["--micro-batch-size", str(w.micro_batch)],
        ["--global-batch-size", str(chosen.global_batch)],
        ["--seq-length", str(w.seq_len)],
    ]
    if w.recompute == "selective":
        args += [["--recompute-granularity", "selective"], ["--recompute-modules", *w.recompute_modules]]
    elif w.recompute == "full":
        args += [["--recompute-granularity", "full"], ["--recompute-method", w.recompute_method],
                 ["--recompute-num-layers", str(w.recompute_num_layers)]]  # fmt: skip
    if w.offload_modules:  # Megatron-Core's fine-grained activation offloading
        args += [["--fine-grained-activation-offloading"], ["--offload-modules", *w.offload_modules],
                 ["--min-offloaded-tensor-size", str(w.min_offloaded_tensor_size)]]  # fmt: skip
    if w.precision.name not in MEGATRON_PRECISION:
        raise LmcalcError(f"--emit megatron: no Megatron-LM flags for the {w.precision.name} recipe")
    args += MEGATRON_PRECISION[w.precision.name] + _megatron_profile_flags(w) + _megatron_dispatcher(w)
    lines = [f"# {line}" for line in notes("megatron", chosen)]
    lines += ["# Megatron-LM (pretrain_gpt.py) arguments; add the model's shape flags, your data and optimizer's:",
              "# torchrun ... pretrain_gpt.py \"${LMCALC_ARGS[@]}\" ...", "LMCALC_ARGS=("]  # fmt: skip
    lines += [f"    {' '.join(map(shlex.quote, arg))}" for arg in args]  # a layout's | and * quoted for the shell
    return "\n".join([*lines, ")"]) + "\n"


def _megatron_profile_flags(w: Workload) -> list[list[str]]:
    """The flags behind the megatron profile's settings (``_profile_settings``)."""
    return [flag for _, flags in _profile_settings(w) for flag in flags]


def _profile_settings(w: Workload) -> list[tuple[str, list[list[str]]]]:
    """The settings that changed the megatron profile (``estimates.training``), each as the notes name it and as
    Megatron-LM's flags ask for it: the gradient buffer in bf16, the fp8 primary weights, and the loss fused in
    Transformer Engine, each as the profile it made reads it."""
    f, settings = w.framework, list[tuple[str, list[list[str]]]]()
    if f.name != "megatron":  # another profile's gradient and loss rules are not Megatron's flags
        return settings
    if f.states.grad_bytes == 2:  # bf16_gradient_buffer
        settings.append(("gradients reduced in bf16", [["--grad-reduce-in-bf16"]]))
    if f.fp8.primary_weights:  # fp8_primary_weights
        settings.append(("fp8 primary weights", [["--fp8-param-gather"]]))
    if f.loss.saved_bytes == 2 and f.loss.moved_bytes is not None:  # te_cross_entropy: the bf16 logits, in place
        flags = [["--cross-entropy-loss-fusion"], ["--cross-entropy-fusion-impl", "te"]]
        settings.append(("Transformer Engine's fused loss", flags))
    return settings


def _megatron_dispatcher(w: Workload) -> list[list[str]]:
    """An MoE model's token dispatcher as costed (Megatron-Core's default is allgather, which lmcalc does not time):
    alltoall, or the flex dispatcher with its backend."""
    if not w.model.moe:
        return []
    if w.moe_dispatcher == "alltoall":
        return [["--moe-token-dispatcher-type", "alltoall"]]
    return [["--moe-token-dispatcher-type", "flex"], ["--moe-flex-dispatcher-backend", w.moe_dispatcher]]


def _deepspeed(chosen: Chosen) -> str:
    config = deepspeed_config(chosen)
    config["lmcalc"] = {"note": notes("deepspeed", chosen), "checkpointing": _checkpointing(chosen.workload)}
    return json.dumps(config, indent=2) + "\n"


def deepspeed_config(chosen: Chosen) -> dict[str, object]:
    """The DeepSpeed config of ``chosen``: its batch, ZeRO stage and offload, and precision."""
    _refuse("deepspeed", chosen, ("tp", "pp", "cp", "ep"))
    layout, w = chosen.layout, chosen.workload
    zero: dict[str, object] = {"stage": layout.zero}
    if w.offload.target != "none":
        zero["offload_optimizer"] = {"device": w.offload.device}
        if w.offload.target == "optimizer+params":
            zero["offload_param"] = {"device": w.offload.device}
    config: dict[str, object] = {
        "train_micro_batch_size_per_gpu": w.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "train_batch_size": chosen.global_batch,
        "zero_optimization": zero,
    }
    if w.precision.name.startswith("bf16"):
        config["bf16"] = {"enabled": True}
    elif w.precision.name.startswith("fp16"):
        config["fp16"] = {"enabled": True}
    elif w.precision.name != "fp32":
        raise LmcalcError(f"--emit deepspeed: a DeepSpeed config has no {w.precision.name} recipe")
    return config


def _checkpointing(w: Workload) -> str:
    return {"none": "none", "full": "the model's gradient checkpointing (every layer)",
            "selective": "selective recomputation (core attention)"}[w.recompute]  # fmt: skip


def _torchtitan(chosen: Chosen) -> str:
    layout, w = chosen.layout, chosen.workload
    if layout.zero not in (0, 2, 3):
        raise LmcalcError(f"--emit torchtitan: torchtitan shards with FSDP (ZeRO-3, or ZeRO-2 without resharding "
                          f"after forward) or replicates (ZeRO-0), not ZeRO-{layout.zero}; pin --zero 3, 2 or "
                          "0")  # fmt: skip
    if layout.tp > 1 and not layout.sequence_parallel:
        raise LmcalcError("--emit torchtitan: torchtitan's TP shards the norms too (sequence parallelism); pin "
                          "--sequence-parallel")  # fmt: skip
    shard, replicate = (layout.dp // layout.hsdp, layout.hsdp) if layout.zero >= 2 else (1, layout.dp)
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": layout.tp,
        "pipeline_parallel_degree": layout.pp,
        "context_parallel_degree": layout.cp,
        "expert_parallel_degree": layout.ep,
    }
    if layout.zero == 2 or (layout.zero == 3 and layout.pp > 1):  # its default: resharded, but not under PP
        parallelism["fsdp_reshard_after_forward"] = "never" if layout.zero == 2 else "always"
    # torchtitan accumulates local_batch_size / (its microbatch) under PP, and global / (local · DP) otherwise
    local = w.micro_batch * layout.grad_accum if layout.pp > 1 else w.micro_batch
    if layout.pp > 1:
        from lmcalc.launch.torchtitan_pipeline import pipeline_keys

        parallelism["pipeline_parallel_microbatch_size"] = w.micro_batch
        parallelism |= pipeline_keys(w.model.num_layers, layout.pp, layout.split)
    training = {"local_batch_size": local, "global_batch_size": chosen.global_batch, "seq_len": w.seq_len}
    lines = [f"# {line}" for line in notes("torchtitan", chosen)]
    lines += ["# torchtitan's training config (TOML, torchtitan 0.2; 0.3 takes Python configs): merge these sections",
              "# into your config of the model's flavor", "", "[parallelism]"]  # fmt: skip
    lines += [f"{key} = {json.dumps(value)}" for key, value in parallelism.items()]  # TOML's ints, strings, arrays
    lines += ["", "[training]", *(f"{key} = {value}" for key, value in training.items())]
    lines += ["", "[activation_checkpoint]", f'mode = "{w.recompute}"']
    if w.recompute == "selective":  # op-level: the matmuls' outputs kept, the rest (attention's core) recomputed
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


def _trainer(chosen: Chosen) -> str:
    _refuse("trainer", chosen, ("tp", "pp", "cp", "ep"))
    layout, w = chosen.layout, chosen.workload
    if w.optimizer.name not in HF_OPTIM:
        raise LmcalcError(
            f"--emit trainer: transformers' Trainer names no optim for {w.optimizer.name} (its optim is one of "
            f"{', '.join(sorted(set(HF_OPTIM.values())))}); pass your own to Trainer(optimizers=...) or "
            "--emit megatron"
        )
    settings: dict[str, object] = {
        "per_device_train_batch_size": w.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "gradient_checkpointing": w.recompute == "full",
        "bf16": w.precision.name.startswith("bf16"),
        "fp16": w.precision.name.startswith("fp16"),
        "optim": HF_OPTIM[w.optimizer.name],
    }
    if w.recompute == "selective":
        raise LmcalcError("--emit trainer: the Trainer checkpoints whole layers; pin --recompute full or none")
    if layout.zero == 3 and w.framework.name != "deepspeed":
        settings["fsdp"] = "full_shard auto_wrap" + (" offload" if w.offload.target == "optimizer+params" else "")
    elif layout.zero >= 1:
        settings["deepspeed"] = deepspeed_config(chosen)
    lines = [f"# {line}" for line in notes("trainer", chosen)]
    lines.append(
        "# Hugging Face TrainingArguments (HfArgumentParser.parse_yaml_file; TRL and axolotl take the same keys)"
    )
    import yaml

    return "\n".join(lines) + "\n" + yaml.safe_dump(settings, sort_keys=False)
