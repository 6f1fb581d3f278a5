"""How well the planner predicts published runs: tokens/s per GPU (and MFU) given the published layout, and the
rank of that layout among everything the planner would choose from (docs/plan-accuracy.md,
``scripts/plan_accuracy.py``). The runs are in benchmarks/published_runs.yaml, whose header describes each field.

A harness for the docs and the tests, not a command: it lives beside the scripts, outside the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcalc.engine.model.flops import step_flops
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.search.plan import Pins, plan
from lmcalc.engine.time.steptime import StepTime, step_time
from lmcalc.engine.workload import MIN_OFFLOADED_ELEMENTS, Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import DEFAULT_ATTENTION
from lmcalc.estimates.training import (
    bf16_gradient_buffer,
    build_layout,
    fp8_primary_weights,
    pipeline_split,
    recipe_on,
    split_settings,
    te_cross_entropy,
)
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.preset_files import TABLE_FILE_LIMIT
from lmcalc.presets import (
    read_yaml,
    resolve_framework,
    resolve_hardware,
    resolve_model,
    resolve_optimizer,
    resolve_precision,
)
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.specs import Cluster, ModelSpec

MFU_TOLERANCE = 0.20  # relative
TOP_RANK = 10
PRECISION, OPTIMIZER = "bf16-mixed", "adamw"  # what a published run trained with, unless it says otherwise
OVERHEAD_BYTES = 0.0  # the runs are judged on model states and activations alone, without lmcalc's allowance
FAMILIES = ("korthikanti", "megatron-2021", "llama3", "mpt", "playbook")
BLACKWELL_FAMILIES = ("nemo-25.02-b200", "nemo-25.04-gb200")  # benchmarks/blackwell_runs.yaml


@dataclass(frozen=True)
class PublishedRun:
    id: str
    family: str  # one of FAMILIES or BLACKWELL_FAMILIES: the paper or table the run comes from, for results per family
    source: str
    cluster: Cluster
    layout: Layout
    workload: Workload  # the model, sequence, micro-batch, attention, recomputation and framework as published
    tokens_per_s_per_gpu: float  # the published speed: what the step-time model is judged on
    published_mfu: float | None  # the MFU the source prints, in its own convention (mfu_convention)
    mfu_convention: str
    derived: str  # how tokens_per_s_per_gpu follows from the source's printed figures
    assumed: str
    toolset: Pins  # what the authors' software offered: the search space their choice was made in
    toolset_note: str
    fit_note: str = ""  # where the published layout does not fit under lmcalc: why, and what lmcalc cannot express

    @property
    def model(self) -> ModelSpec:
        return self.workload.model

    @property
    def global_batch(self) -> int:
        """Sequences per step: DP · micro-batch · micro-batches per step."""
        return self.layout.dp * self.workload.micro_batch * self.layout.grad_accum

    @property
    def mfu(self) -> float:
        """The published speed as MFU in lmcalc's convention, the step-time model's own (``StepTime.mfu``): model
        FLOPs per token, attention counted in full and recomputation left out (``engine.model.flops.step_flops``), times
        tokens/s per GPU, over the dense peak of the recipe's compute dtype. It differs from ``published_mfu``
        where the source counts another way (PaLM's 6N, eq. (3)'s recomputed forward, MosaicML's NumParams)."""
        per_token = step_flops(self.model, self.workload.seq_len, "none", "full").model
        peak = self.cluster.hardware.peak_flops(self.workload.precision.compute_dtype)
        return per_token * self.tokens_per_s_per_gpu / peak


def gpt_model(name: str, hidden: int, layers: int, heads: int) -> ModelSpec:
    """A Megatron GPT of Korthikanti et al. 2022 Table 3 and Narayanan et al. 2021 Table 1: vocabulary 51,200, 4h
    GELU MLP, sequence 2048. Its GELU is GPT-2's gelu_new, as the gpt3-175b preset's: what a profile that runs the
    model's own code (deepspeed, standing for a Hugging Face GPT) counts; Megatron's profile fuses it whatever."""
    return ModelSpec(
        name=name,
        vocab_size=51200,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        ffn_size=4 * hidden,
        ffn_kind="gelu_mlp",
        activation="gelu_new",
        norm_kind="layernorm",
        attention_bias="all",
        mlp_bias=True,
        tied_embeddings=True,
        position_embedding="learned",
        max_seq_len=2048,
        dropout=True,
    )


def run_model(run_id: str, model: dict[str, Any], shapes: dict[str, dict[str, Any]]) -> ModelSpec:
    """A run's model: a preset by name, a Megatron GPT by its width, depth and heads, or an entry of the file's
    ``shapes`` (ModelSpec fields), with the fields given beside ``shape`` overriding the shape's."""
    if "preset" in model:
        return resolve_model(model["preset"]).spec
    if "gpt" in model:
        return gpt_model(run_id, **model["gpt"])
    fields = dict(model)
    name = fields.pop("shape")
    if isinstance(name, dict):  # the shape written in place
        return ModelSpec(**{**name, **fields})
    if name not in shapes:
        raise LmcalcError(f"run {run_id}: no shape {name!r} among {', '.join(shapes)}")
    return ModelSpec(**{**shapes[name], **fields})


def _framework(row: dict[str, Any], precision: PrecisionRecipe) -> FrameworkProfile:
    """The run's framework profile, with the attention kernel the run used where it differs from the profile's
    (``attention_kernel``: FlashAttention-2 on runs made before FlashAttention-3 existed) and any other speed rule
    the source states (``speed``: DeepSeek-V3's DualPipe overlaps its all-to-alls), the norm kernel its software ran
    (``norm``: torchtitan's eager RMSNorm of December 2024, op by op), Megatron's gradient buffer in bf16 where the
    recipe reduces gradients in bf16 (``grad_reduce_in_bf16``), fp8 primary weights where the recipe gathers them in
    fp8 (``fp8_param_gather``), and Transformer Engine's cross-entropy where the recipe fuses the loss there
    (``te_cross_entropy``)."""
    profile = resolve_framework(row["framework"]).spec
    speed = dict(row.get("speed", {}))
    if "attention_kernel" in row:
        speed["attention_kernel"] = row["attention_kernel"]
    profile = _with_rule(_with_rule(profile, "speed", speed), "norm", row.get("norm", {}))
    if row.get("grad_reduce_in_bf16"):  # Megatron's gradient buffer in bf16, as the run's recipe sets it
        profile = bf16_gradient_buffer(profile)
    if row.get("fp8_param_gather"):  # Megatron's fp8 primary weights, as the run's recipe sets them
        profile = fp8_primary_weights(profile, precision)
    if row.get("te_cross_entropy"):  # Megatron-Core's loss fused in Transformer Engine, as the run's recipe sets it
        profile = te_cross_entropy(profile)
    return profile


def _with_rule(profile: FrameworkProfile, name: str, changes: dict[str, Any]) -> FrameworkProfile:
    """The profile with some fields of one of its rules changed (validated as that rule)."""
    if not changes:
        return profile
    rule = getattr(profile, name)
    return profile.model_copy(update={name: type(rule).model_validate({**rule.model_dump(), **changes})})


def load_runs(path: Path, families: tuple[str, ...] | None = FAMILIES) -> list[PublishedRun]:
    """The runs of a file in the published_runs.yaml layout; ``families`` (None: any) are the ones it may hold."""
    data = read_yaml(path, TABLE_FILE_LIMIT)
    shapes = data.get("shapes", {})
    runs = []
    for row in data["runs"]:
        if families is not None and row["family"] not in families:
            raise LmcalcError(f"run {row['id']}: family {row['family']!r} is not one of {', '.join(families)}")
        spec = run_model(row["id"], row["model"], shapes)
        hardware = resolve_hardware(row["hardware"]).spec
        precision = recipe_on(resolve_precision(row.get("precision", PRECISION)).spec, hardware)
        per_node = row.get("gpus_per_node", hardware.gpus_per_node)
        cluster = Cluster(hardware=hardware, count=row["gpus"], gpus_per_node=min(per_node, row["gpus"]))
        settings = dict(row["layout"])
        micro_batch = settings.pop("micro_batch")
        workload = Workload(
            spec,
            precision,
            resolve_optimizer(row.get("optimizer", OPTIMIZER)).spec,  # AdamW, unless the run says otherwise
            row["seq"],
            micro_batch,
            attention=row.get("attention", DEFAULT_ATTENTION),
            recompute=row["recompute"],
            recompute_modules=tuple(row.get("recompute_modules", ("core_attn",))),  # Megatron-Core's, under selective
            overhead_bytes=OVERHEAD_BYTES,
            framework=_framework(row, precision),
            cpu_offloading_num_layers=row.get("cpu_offloading_num_layers", 0),  # Megatron-Core's, as the recipe sets
            offload_modules=tuple(row.get("offload_modules", ())),  # Megatron-Core's fine-grained offloading
            min_offloaded_tensor_size=row.get("min_offloaded_tensor_size", MIN_OFFLOADED_ELEMENTS),
            capacity_factor=row.get("capacity_factor"),  # MoE token dropping, where the recipe sets a capacity
            pad_to_capacity=row.get("pad_to_capacity", True),
            moe_a2a_overlap=row.get("moe_a2a_overlap", False),  # Megatron-Core's overlap_moe_expert_parallel_comm
            moe_dispatcher=row.get("moe_dispatcher", "alltoall"),  # the flex dispatcher's backend, where the recipe
            nvlink_domain=cluster.scale_up,  # sets one
        )
        layout = build_layout(cluster, settings)
        check_layout(workload, layout, cluster, tp_within_node=False)  # it can exist: heads, layers, split, GPUs
        toolset = row.get("toolset", {})
        pins = dict(toolset.get("pins", {}))
        split = split_settings(pins)
        pins = {key: value for key, value in pins.items() if key not in split}
        runs.append(
            PublishedRun(
                row["id"],
                row["family"],
                row["source"],
                cluster,
                layout,
                workload,
                float(row["tokens_per_s_per_gpu"]),
                row.get("mfu"),
                row.get("mfu_convention", ""),
                row.get("derived", ""),
                row.get("assumed", ""),
                Pins(**pins, split=pipeline_split(split)),
                toolset.get("why", ""),
                row.get("fit_note", ""),
            )
        )
    return runs


@dataclass(frozen=True)
class Accuracy:
    run: PublishedRun
    predicted_mfu: float
    predicted_tokens_per_s_per_gpu: float
    rank: int | None  # of the published split among distinct splits that fit, fastest first
    splits: int
    toolset_rank: int | None  # the same, searching only what the authors' software offered
    toolset_splits: int
    rank_as_published: int  # where the published configuration's own speed ranks, fitting or not
    behind_fastest: float  # the published configuration's predicted tokens/s over the fastest split's, minus 1

    @property
    def error(self) -> float:
        """Predicted tokens/s per GPU over the published, minus 1 (the same as the MFUs' ratio in lmcalc's
        convention, ``PublishedRun.mfu``)."""
        return self.predicted_tokens_per_s_per_gpu / self.run.tokens_per_s_per_gpu - 1

    @property
    def ok(self) -> bool:
        return abs(self.error) <= MFU_TOLERANCE and self.rank is not None and self.rank <= TOP_RANK


Split = tuple[int, int, int, int]


def _split(layout: Layout) -> Split:
    return (layout.tp, layout.pp, layout.cp, layout.dp)


def fastest_per_split(run: PublishedRun, pins: Pins, efficiency: float | None = None) -> dict[Split, float]:
    """Tokens/s of each split's fastest variant (ZeRO stage, micro-batch, recomputation, schedule) that fits,
    fastest split first."""
    found = plan(run.workload, run.cluster, run.global_batch, pins, efficiency)
    fastest: dict[Split, float] = {}
    for candidate in found.fitting:  # already fastest first
        fastest.setdefault(_split(candidate.layout), candidate.tokens_per_s)
    return fastest


def _rank(split: Split, fastest: dict[Split, float]) -> int | None:
    order = list(fastest)
    return order.index(split) + 1 if split in order else None


def published_step_time(run: PublishedRun, efficiency: float | None = None) -> StepTime:
    """The step-time model's figures for the run's own layout (its tokens/s per GPU are what the published ones are
    compared with)."""
    return step_time(run.workload, run.layout, run.cluster, efficiency)


def assess(run: PublishedRun, efficiency: float | None = None) -> Accuracy:
    time = published_step_time(run, efficiency)
    published = _split(run.layout)
    everything = fastest_per_split(run, Pins(), efficiency)
    # a run whose authors had every option lmcalc searches needs no second search
    toolset = everything if run.toolset == Pins() else fastest_per_split(run, run.toolset, efficiency)
    faster = sum(1 for split, speed in everything.items() if split != published and speed > time.tokens_per_s)
    return Accuracy(
        run,
        time.mfu,
        time.tokens_per_s / run.layout.gpus,
        _rank(published, everything),
        len(everything),
        _rank(published, toolset),
        len(toolset),
        faster + 1,
        time.tokens_per_s / max(everything.values(), default=float("nan")) - 1,
    )
