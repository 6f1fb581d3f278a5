"""The command line's options, declared once: the types every command shares, and the layout's options as groups
that ``memory``, ``fit``, ``plan`` and ``report`` take alike (``with_options``).

Each option is named like the Python API's keyword (``--first-stage-layers`` is ``first_stage_layers``), so a
command passes what it parsed straight to the API.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from lmcalc.cli.completion import complete_model, complete_optimizer, complete_precision
from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES, SCHEDULES, ZERO_STAGES
from lmcalc.engine.finetune.method import METHODS
from lmcalc.engine.finetune.offload import OFFLOAD_DEVICES, OFFLOAD_TARGETS
from lmcalc.engine.run.energy import DEFAULT_GRID_GCO2_PER_KWH, DEFAULT_POWER_FRACTION, DEFAULT_PUE
from lmcalc.errors import flag
from lmcalc.estimates.inputs import TRAINING_DEFAULTS


def alternatives(options: tuple[object, ...], meanings: Mapping[object, str] | None = None) -> str:
    """The values a help text offers, read from the tuple the code checks against: ``a | b``, each with its
    meaning where one is given (``flash (fused, no s² scores) | eager (...)``)."""
    meanings = meanings or {}
    return " | ".join(f"{o} ({meanings[o]})" if o in meanings else str(o) for o in options)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document with the same figures.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the derivation: formula, numbers, sources.")]
BriefOpt = Annotated[bool, typer.Option("--brief", help="Print only the answer: the headline's lines.")]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model preset name, family name, YAML file, HF config.json (or its directory), or Hugging Face Hub "
        "id (org/name: the local cache first, then the Hub; needs lmcalc[hub]).",
        autocompletion=complete_model,
    ),
]
PrecisionOpt = Annotated[
    str,
    typer.Option(
        "--precision", help="Precision recipe (lmcalc presets list precisions).", autocompletion=complete_precision
    ),
]
OptimizerOpt = Annotated[
    str,
    typer.Option("--optimizer", help="Optimizer (lmcalc presets list optimizers).", autocompletion=complete_optimizer),
]
SeqOpt = Annotated[
    str | None,
    typer.Option(
        "--seq", help="Sequence length in tokens: 4096, or 8K = 8192 (binary K). Default: min(model context, 8192)."
    ),
]
RecomputeOpt = Annotated[
    str, typer.Option("--recompute", help=f"Activation recomputation: {alternatives(RECOMPUTE_MODES)}.")
]
KERNELS = {"flash": "fused, no s² scores", "eager": "scores materialised"}
AttentionOpt = Annotated[
    str, typer.Option("--attention", help=f"Attention kernel: {alternatives(ATTENTION_KERNELS, KERNELS)}.")
]
OverheadOpt = Annotated[
    str | None,
    typer.Option(
        "--overhead",
        help="A flat per-GPU allowance (e.g. 2GiB, 0) on top of what the framework profile counts (it replaces the "
        "idealised profile's 2 GiB).",
    ),
]
TrainingFrameworkOpt = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="Framework profile: what it keeps and allocates (lmcalc presets list frameworks; idealised: the "
        "papers' count). Default: megatron; transformers with --method lora or qlora.",
    ),
]
MicroBatchOpt = Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU per micro-batch.")]


@dataclass(frozen=True)
class Option:
    """One command-line option: its keyword (the API's), its annotation (type and typer's option: the flag and its
    help), and its default."""

    name: str
    annotation: Any
    default: Any

    @classmethod
    def of(cls, name: str, kind: Any, default: Any, help: str) -> Option:
        """An option whose flag is its keyword with dashes."""
        return cls(name, Annotated[kind, typer.Option(flag(name), help=help)], default)

    def parameter(self) -> inspect.Parameter:
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default, annotation=self.annotation
        )


SPLIT_OPTIONS = (
    Option.of(
        "first_stage_layers",
        int | None,
        None,
        "Layers on the first pipeline stage, which also holds the embedding (Megatron-LM's "
        "--decoder-first-pipeline-num-layers); the other stages share the rest. Interleaved: every stage's "
        "layers must split evenly over its chunks. Default: an even split.",
    ),
    Option.of(
        "last_stage_layers",
        int | None,
        None,
        "Layers on the last pipeline stage, which also computes the logits (Megatron-LM's "
        "--decoder-last-pipeline-num-layers); the other stages share the rest. Interleaved: every stage's "
        "layers must split evenly over its chunks. Default: an even split.",
    ),
    Option.of(
        "account_for_embedding_in_pipeline_split",
        bool,
        False,
        "Count the input embedding as one layer when the layers are split over the pipeline stages "
        "(Megatron-LM's flag): the first stage builds one layer fewer. Works with the interleaved schedule.",
    ),
    Option.of(
        "account_for_loss_in_pipeline_split",
        bool,
        False,
        "Count the output layer and the loss as one layer when the layers are split over the pipeline "
        "stages (Megatron-LM's flag): the last stage builds one layer fewer. Works with the interleaved schedule.",
    ),
)
"""How the layers split over the pipeline stages (``estimates.inputs.SplitSettings``)."""

DEGREES = {
    "dp": "data-parallel degree",
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "cp": "context-parallel degree",
    "ep": "expert-parallel degree",
    "zero": "ZeRO stage",
}

LAYOUT_OPTIONS = (
    Option.of("grad_accum", int, 1, "Micro-batches per step (gradient accumulation)."),
    Option.of("dp", int | None, None, "Data-parallel degree (default: GPUs / (TP·PP·CP))."),
    Option.of("tp", int, 1, "Tensor-parallel degree (within a node)."),
    Option.of("pp", int, 1, "Pipeline-parallel stages."),
    Option.of("cp", int, 1, "Context-parallel degree (splits the sequence; needs --attention flash)."),
    Option.of("ep", int, 1, "Expert-parallel degree (MoE models; divides DP·CP)."),
    Option.of("zero", int, 0, f"ZeRO stage {ZERO_STAGES[0]}-{ZERO_STAGES[-1]} over DP·CP (3 = FSDP full sharding)."),
    Option.of(
        "sequence_parallel", bool, False, "Split norms, dropout and linear inputs over TP too (Korthikanti et al.)."
    ),
    Option.of("schedule", str, "1f1b", f"Pipeline schedule: {alternatives(SCHEDULES)}."),
    Option.of("virtual_stages", int, 1, "Model chunks per pipeline stage (interleaved schedule)."),
    *SPLIT_OPTIONS,
)
"""A parallel layout (``estimates.inputs.LayoutSettings``), as ``memory`` and ``fit`` take it (``plan`` and
``report`` search the layout: they take ``PIN_OPTIONS``)."""

METHODS_MEANINGS: dict[object, str] = {
    "full": "every weight trained",
    "lora": "low-rank adapters on a frozen base",
    "qlora": "adapters on a 4-bit NF4 base",
    "freeze": "train only the layers above --freeze-layers",
}
OFFLOAD_MEANINGS: dict[object, str] = {
    "optimizer": "ZeRO-Offload",
    "optimizer+params": "ZeRO-3 / FSDP CPU offload, needs --zero 3",
}
FINETUNE_OPTIONS = (
    Option.of(
        "method", str, TRAINING_DEFAULTS["method"], f"What is trained: {alternatives(METHODS, METHODS_MEANINGS)}."
    ),
    Option.of("lora_rank", int, TRAINING_DEFAULTS["lora_rank"], "LoRA/QLoRA: the rank r of each adapter."),
    Option.of(
        "lora_targets",
        str,
        TRAINING_DEFAULTS["lora_targets"],
        "LoRA/QLoRA: the linear layers that get adapters, PEFT-style: q,k,v,o,gate,up,down (or q_proj,... and "
        "GPT-2's c_attn,c_fc,c_proj), or all-linear (every linear layer but the head).",
    ),
    Option.of("lora_dropout", float, TRAINING_DEFAULTS["lora_dropout"], "LoRA/QLoRA: PEFT's lora_dropout."),
    Option.of(
        "freeze_layers", int, TRAINING_DEFAULTS["freeze_layers"], "Freeze method: the bottom layers kept frozen."
    ),
    Option.of(
        "dora",
        bool,
        TRAINING_DEFAULTS["dora"],
        "LoRA/QLoRA as DoRA (PEFT's use_dora): a trained magnitude per output, and the weight norm every forward.",
    ),
)
"""The fine-tuning method (``estimates.inputs.MethodSettings``)."""

METHOD_OPTIONS = (
    *FINETUNE_OPTIONS,
    Option(
        "kbit_upcast",
        Annotated[
            bool,
            typer.Option(
                "--kbit-upcast/--no-kbit-upcast",
                help="QLoRA: the unquantised weights (embeddings, norms, head) in fp32, as "
                "peft.prepare_model_for_kbit_training casts them; or in the compute dtype.",
            ),
        ],
        TRAINING_DEFAULTS["kbit_upcast"],
    ),
    Option.of(
        "offload",
        str,
        TRAINING_DEFAULTS["offload"],
        f"Model states off the GPU: {alternatives(OFFLOAD_TARGETS, OFFLOAD_MEANINGS)}.",
    ),
    Option.of(
        "offload_device", str, TRAINING_DEFAULTS["offload_device"], f"Where to: {alternatives(OFFLOAD_DEVICES)}."
    ),
    Option.of(
        "host_link_gbps",
        float,
        TRAINING_DEFAULTS["host_link_gbps"],
        "Offload: GPU-host bandwidth, one direction, GB/s (default: an assumption, 80 % of PCIe 4.0 x16).",
    ),
    Option.of(
        "cpu_optimizer_params_per_s",
        float,
        TRAINING_DEFAULTS["cpu_optimizer_params_per_s"],
        "Offload: parameters a node's CPUs update per second (default: an assumption, 1e9).",
    ),
)
"""The fine-tuning method and offload (``estimates.inputs.TrainingSettings``)."""

TRAINING_OPTIONS = (
    Option("seq", SeqOpt, TRAINING_DEFAULTS["seq"]),
    Option("micro_batch", MicroBatchOpt, TRAINING_DEFAULTS["micro_batch"]),
    Option("precision", PrecisionOpt, TRAINING_DEFAULTS["precision"]),
    Option("optimizer", OptimizerOpt, TRAINING_DEFAULTS["optimizer"]),
    Option("attention", AttentionOpt, TRAINING_DEFAULTS["attention"]),
    Option("recompute", RecomputeOpt, TRAINING_DEFAULTS["recompute"]),
    Option("framework", TrainingFrameworkOpt, TRAINING_DEFAULTS["framework"]),
    Option("overhead", OverheadOpt, TRAINING_DEFAULTS["overhead"]),
    *METHOD_OPTIONS,
)
"""What is trained and how (``estimates.training.TrainingSettings``), as ``memory`` and ``fit`` take it."""

PIN_OPTIONS = (
    *(Option.of(o.name, int | None, None, f"Pin the {DEGREES[o.name]}.") for o in LAYOUT_OPTIONS if o.name in DEGREES),
    Option.of("schedule", str | None, None, f"Pin the pipeline schedule: {alternatives(SCHEDULES)}."),
    Option.of(
        "virtual_stages",
        int | None,
        None,
        "Pin the model chunks per pipeline stage (2 or more: the interleaved schedule; 1: 1F1B).",
    ),
    Option(
        "sequence_parallel",
        Annotated[
            bool,
            typer.Option(
                "--sequence-parallel/--no-sequence-parallel",
                help="Sequence parallelism wherever TP > 1 (Korthikanti et al.), or nowhere.",
            ),
        ],
        True,
    ),
)
"""The layout's settings ``plan`` searches (the degrees, the ZeRO stage, the schedule and its virtual stages,
sequence parallelism), each of which the user may pin instead."""


def with_options(options: tuple[Option, ...], at: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command ``options`` in place of its parameter ``at``, which then receives them as one dict of
    keyword → value: a group of options declared once, shared by every command that takes it. (typer reads a
    command's options from its signature, so the wrapper's signature lists the group's options.)"""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)  # the annotations as objects, as typer reads them
        names = [o.name for o in options]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            group = {name: kwargs.pop(name) for name in names}
            command(**kwargs, **{at: group})

        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name == at:
                parameters += [o.parameter() for o in options]
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return wrapper

    return decorate


ENERGY_OPTIONS = (
    Option.of(
        "power_fraction",
        float,
        DEFAULT_POWER_FRACTION,
        "Share of the GPU's TDP drawn on average. Default: 1 (the TDP).",
    ),
    Option.of("pue", float, DEFAULT_PUE, "The data centre's power usage effectiveness. Default: 1.1 (hyperscale)."),
    Option.of(
        "grid_gco2_per_kwh",
        float,
        DEFAULT_GRID_GCO2_PER_KWH,
        "The grid's carbon intensity, gCO2e/kWh. Default: 481 (world average, 2023).",
    ),
)
"""Energy and emissions (``engine.run.energy``), as ``train-time`` and ``report`` take them."""

VALIDATE_AGAINST = ("pytorch", "transformers")
AGAINST_MEANINGS = {
    "pytorch": "lmcalc's reference model; default",
    "transformers": "the model transformers builds from the config.json: parameters and FLOPs",
}
AgainstOpt = Annotated[
    str, typer.Option("--against", help=f"What to check against: {alternatives(VALIDATE_AGAINST, AGAINST_MEANINGS)}.")
]
