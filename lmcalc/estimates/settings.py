"""The settings a user gives, each declared once: its keyword, its type, its default and its help, side by side.

A group of settings is a ``TypedDict`` whose every field is ``Annotated[type, Setting(default, help)]``. The Python
API takes a group as ``**settings: Unpack[Group]`` (a misspelt keyword refused by ``inputs.accept``, a setting left
out taking its default: ``defaults``), and the command line makes its options from the same fields
(``lmcalc.cli.options.options_of``): the flag is the keyword with dashes, the help is the field's, and the type is
the field's own, or where the API also takes a spec (a ``ModelSpec``, a ``PrecisionRecipe``), the name the command
line gives instead.

The groups: what is trained (``FineTuneSettings``, ``MethodSettings`` with offload), the workload
(``WorkloadSettings``, ``TrainingSettings`` with its micro-batch and recomputation), the batch a search fills
(``BatchSettings``), the run (``RunSettings``), its cost and energy (``EnergySettings``), and serving
(``ServingSettings``). The parallel layout's groups, given or pinned and bounded for a search, are
``estimates.layout_settings``'. ``MemorySettings``, ``TrainTimeSettings``, ``PlanSettings`` and ``ReportSettings``
are what those functions take.
"""

from typing import Annotated, TypedDict

from lmcalc.engine.choices import (
    ATTENTION_KERNELS,
    MOE_DISPATCHERS,
    OFFLOAD_MODULES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
)
from lmcalc.engine.finetune.method import ALL_LINEAR, METHODS
from lmcalc.engine.finetune.offload import CPU_OPTIMIZER_PARAMS_PER_S, HOST_LINK_GBPS, OFFLOAD_DEVICES, OFFLOAD_TARGETS
from lmcalc.engine.model.numerics import SERVING_DTYPES
from lmcalc.engine.run.energy import DEFAULT_GRID_GCO2_PER_KWH, DEFAULT_POWER_FRACTION, DEFAULT_PUE
from lmcalc.engine.workload import MIN_OFFLOADED_ELEMENTS
from lmcalc.estimates.layout_settings import LayoutSettings, PinSettings, SearchSettings, SplitSettings
from lmcalc.estimates.setting_groups import Setting, alternatives
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe

Count = str | float | int
Bytes = str | float | int


METHOD_MEANINGS: dict[object, str] = {
    "full": "every weight trained",
    "lora": "low-rank adapters on a frozen base",
    "qlora": "adapters on a 4-bit NF4 base",
    "freeze": "train only the layers above --freeze-layers",
}
OFFLOAD_MEANINGS: dict[object, str] = {
    "optimizer": "ZeRO-Offload",
    "optimizer+params": "ZeRO-3 / FSDP CPU offload, needs --zero 3",
}
KERNEL_MEANINGS: dict[object, str] = {"flash": "fused, no s² scores", "eager": "scores materialised"}
DEFAULT_PRECISION = "bf16-mixed"
DEFAULT_OPTIMIZER = "adamw"
DEFAULT_FRAMEWORK = "megatron"
"""The framework profile of a training estimate unless one is named: lmcalc's layouts (TP with sequence
parallelism, PP with the interleaved schedule and Megatron's split flags, CP, EP, the distributed optimizer as
ZeRO-1) are Megatron-LM's, the framework that runs all of them, so a plan is costed as Megatron would allocate it."""
FINE_TUNING_FRAMEWORK = "transformers"
"""The framework profile of a LoRA or QLoRA estimate unless one is named: adapters are trained with Hugging Face
transformers and PEFT, which Megatron-LM does not run."""


# ------------------------------------------------------------------------------------------------ training


class FineTuneSettings(TypedDict, total=False):
    """What is trained: the fine-tuning method, as the user gives it (what its FLOPs depend on)."""

    method: Annotated[str, Setting("full", f"What is trained: {alternatives(METHODS, METHOD_MEANINGS)}.")]
    lora_rank: Annotated[int, Setting(16, "LoRA/QLoRA: the rank r of each adapter.")]
    lora_targets: Annotated[
        str | list[str],
        Setting(
            ALL_LINEAR,
            "LoRA/QLoRA: the linear layers that get adapters, PEFT-style: q,k,v,o,gate,up,down (or q_proj,... and "
            "GPT-2's c_attn,c_fc,c_proj), or all-linear (every linear layer but the head).",
        ),
    ]
    lora_dropout: Annotated[float, Setting(0.0, "LoRA/QLoRA: PEFT's lora_dropout.")]
    freeze_layers: Annotated[int, Setting(0, "Freeze method: the bottom layers kept frozen.")]
    dora: Annotated[
        bool,
        Setting(
            False,
            "LoRA/QLoRA as DoRA (PEFT's use_dora): a trained magnitude per output, and the weight norm every forward.",
        ),
    ]


class OffloadSettings(TypedDict, total=False):
    """What leaves the GPU, where to, and the two rates its time is counted at (``memory``, ``plan``,
    ``train_time``)."""

    offload: Annotated[
        str, Setting("none", f"Model states off the GPU: {alternatives(OFFLOAD_TARGETS, OFFLOAD_MEANINGS)}.")
    ]
    offload_device: Annotated[str, Setting("cpu", f"Where to: {alternatives(OFFLOAD_DEVICES)}.")]
    host_link_gbps: Annotated[
        float,
        Setting(
            HOST_LINK_GBPS,
            "Offload: GPU-host bandwidth, one direction, GB/s (default: an assumption, 80 % of PCIe 4.0 x16).",
        ),
    ]
    cpu_optimizer_params_per_s: Annotated[
        float,
        Setting(
            CPU_OPTIMIZER_PARAMS_PER_S,
            "Offload: parameters a node's CPUs update per second (default: an assumption, 1e9).",
        ),
    ]


class MethodSettings(FineTuneSettings, OffloadSettings, total=False):
    """The fine-tuning method and what is offloaded, as the user gives them (what memory depends on too)."""

    fp32_adapters: Annotated[
        bool,
        Setting(
            True,
            "LoRA/QLoRA: the adapters in fp32, as PEFT makes them over a 16-bit model (autocast_adapter_dtype, its "
            "default); without autocast (a pure 16-bit recipe) each adapter then keeps an fp32 copy of its input.",
            flags=("--fp32-adapters/--model-dtype-adapters",),
        ),
    ]
    kbit_upcast: Annotated[
        bool,
        Setting(
            True,
            "QLoRA: the unquantised weights (embeddings, norms, head, an MoE's routed experts) in fp32, as "
            "peft.prepare_model_for_kbit_training casts them; or in the compute dtype.",
            flags=("--kbit-upcast/--no-kbit-upcast",),
        ),
    ]


class WorkloadSettings(MethodSettings, total=False):
    """What is trained and how, besides the micro-batch and the recomputation (which a layout search varies)."""

    seq: Annotated[
        Count | None,
        Setting(None, "Sequence length in tokens: 4096, or 8K = 8192 (binary K). Default: min(model context, 8192)."),
    ]
    precision: Annotated[
        str | PrecisionRecipe,
        Setting(DEFAULT_PRECISION, "Precision recipe (lmcalc presets list precisions).", complete="complete_precision"),
    ]
    optimizer: Annotated[
        str | OptimizerSpec,
        Setting(DEFAULT_OPTIMIZER, "Optimizer (lmcalc presets list optimizers).", complete="complete_optimizer"),
    ]
    attention: Annotated[
        str, Setting("flash", f"Attention kernel: {alternatives(ATTENTION_KERNELS, KERNEL_MEANINGS)}.")
    ]
    framework: Annotated[
        str | FrameworkProfile | None,
        Setting(
            None,
            "Framework profile: what it keeps and allocates (lmcalc presets list frameworks; idealised: the "
            f"papers' count). Default: {DEFAULT_FRAMEWORK}; {FINE_TUNING_FRAMEWORK} with --method lora or qlora; "
            "deepspeed with --zero 2 or 3 and no TP, PP, CP or EP.",
        ),
    ]
    overhead: Annotated[
        Bytes | None,
        Setting(
            None,
            "A flat per-GPU allowance (e.g. 2GiB, 0) on top of what the framework profile counts (it replaces the "
            "idealised profile's 2 GiB).",
        ),
    ]
    recompute_num_layers: Annotated[
        int,
        Setting(
            1,
            "Full recomputation's N, as Megatron-LM's flag: uniform, units of N layers each keeping its input; block, "
            "the first N layers of each pipeline chunk recomputed, the others keeping everything.",
        ),
    ]
    recompute_method: Annotated[
        str,
        Setting(
            "uniform",
            f"Which layers full recomputation covers, as Megatron-LM's flag: {alternatives(RECOMPUTE_METHODS)}.",
        ),
    ]
    recompute_modules: Annotated[
        str,
        Setting(
            "core_attn",
            "Selective recomputation's modules, comma-separated, as Megatron-Core's --recompute-modules: "
            f"{alternatives(RECOMPUTE_MODULES)} (--framework megatron).",
        ),
    ]
    grad_reduce_in_bf16: Annotated[
        bool,
        Setting(
            False,
            "Megatron-LM's --grad-reduce-in-bf16 (Megatron-Bridge's grad_reduce_in_fp32 off): the gradient buffer in "
            "bf16, reduced in bf16, the distributed optimizer casting its shard to fp32 at the step.",
            flags=("--grad-reduce-in-bf16",),
        ),
    ]
    clock_fraction: Annotated[
        float,
        Setting(
            1.0,
            "The GPUs' tensor-core clock as a fraction of the one their matmul rates were measured at, for a power "
            "cap or a locked clock (nvidia-smi -q -d CLOCK under load, over the boost clock): matmul and attention "
            "run slower in proportion; memory bandwidth and links do not.",
            flags=("--clock-fraction",),
        ),
    ]
    fp8_param_gather: Annotated[
        bool,
        Setting(
            False,
            "Megatron-LM's --fp8-param-gather (Megatron-Bridge's fp8_param_gather, on in its fp8 recipes): the layers' "
            "weights kept quantised, with no bf16 copy beside them; the fp32 master copy stays.",
            flags=("--fp8-param-gather",),
        ),
    ]
    te_cross_entropy: Annotated[
        bool,
        Setting(
            False,
            "Megatron-Core's cross-entropy fused in Transformer Engine (--cross-entropy-loss-fusion with "
            "--cross-entropy-fusion-impl te, as Megatron-Bridge's performance recipes set it): the bf16 logits are "
            "kept and their gradient written into them, with no fp32 copy (Transformer Engine before 2.18).",
            flags=("--te-cross-entropy",),
        ),
    ]
    cpu_offloading_num_layers: Annotated[
        int,
        Setting(
            0,
            "Megatron-Core's CPU activation offloading (Transformer Engine's offload context): the activations of "
            "this many layers wait in host memory between their forward and backward; no PP, no recomputation.",
        ),
    ]
    offload_modules: Annotated[
        str,
        Setting(
            "",
            f"Megatron-Core's fine-grained activation offloading ({alternatives(OFFLOAD_MODULES)}): routed experts' "
            "tensors in host memory, but the last MoE layer's.",
        ),
    ]
    min_offloaded_tensor_size: Annotated[
        int,
        Setting(
            MIN_OFFLOADED_ELEMENTS,
            "The smallest tensor fine-grained offloading moves, in elements.",
        ),
    ]
    capacity_factor: Annotated[
        float | None,
        Setting(
            None,
            "MoE: each routed expert takes at most this many times its balanced share of the tokens and drops the "
            "rest (Megatron-Core's --moe-expert-capacity-factor; Switch Transformer's capacity factor). Default: "
            "dropless.",
        ),
    ]
    pad_to_capacity: Annotated[
        bool,
        Setting(
            True,
            "MoE with --capacity-factor: each expert's input padded to its capacity, so every expert computes the "
            "same rows (Megatron-Core's --moe-pad-expert-input-to-capacity, as Megatron-Bridge's token-drop recipes "
            "set it); or only the tokens it keeps.",
            flags=("--pad-to-capacity/--no-pad-to-capacity",),
        ),
    ]
    moe_a2a_overlap: Annotated[
        bool,
        Setting(
            False,
            "MoE: overlap the expert all-to-alls with another micro-batch's computation, one forward beside one "
            "backward, layer by layer (Megatron-Core's --overlap-moe-expert-parallel-comm, combined 1F1B): EP > 1, "
            "interleaved stages where PP > 1, no full recomputation.",
            flags=("--moe-a2a-overlap/--no-moe-a2a-overlap",),
        ),
    ]
    moe_dispatcher: Annotated[
        str,
        Setting(
            "alltoall",
            f"MoE: how tokens reach their experts' GPUs: {alternatives(MOE_DISPATCHERS)}. alltoall: NCCL's all-to-all "
            "of each token's k copies (Megatron-Core's alltoall dispatcher, torchtitan's standard one); deepep, "
            "hybridep: one copy per GPU its experts reach, one per node across nodes (Megatron-Core's flex "
            "dispatcher with --moe-flex-dispatcher-backend).",
        ),
    ]


class TrainingSettings(WorkloadSettings, total=False):
    """What is trained and how, as the user gives it; a setting left out takes its default (``TRAINING_DEFAULTS``)."""

    micro_batch: Annotated[int, Setting(1, "Sequences per GPU per micro-batch.")]
    recompute: Annotated[str, Setting("none", f"Activation recomputation: {alternatives(RECOMPUTE_MODES)}.")]


class MemorySettings(TrainingSettings, LayoutSettings, total=False):
    """A training workload and its parallel layout, as ``memory`` and ``fit`` take them."""


# ------------------------------------------------------------------------------------------------ the run


class BatchSettings(TypedDict, total=False):
    """The global batch a layout search fills."""

    global_batch: Annotated[Count, Setting("4M", "Tokens per step (binary: 4M = 4,194,304).")]


class RunSettings(TypedDict, total=False):
    """How long the run is: its tokens, or a fine-tune's dataset and epochs."""

    tokens: Annotated[
        Count | None,
        Setting(None, "Training tokens. Default: the preset's published count, else 20 per parameter."),
    ]
    dataset_tokens: Annotated[Count | None, Setting(None, "A fine-tune's dataset in tokens; the run is × --epochs.")]
    epochs: Annotated[float, Setting(1, "Passes over --dataset-tokens.")]


class EnergySettings(TypedDict, total=False):
    """Energy and emissions (``engine.run.energy``), and the cost."""

    price_per_gpu_hour: Annotated[float | None, Setting(None, "Price in $ per GPU-hour, for the cost.")]
    power_fraction: Annotated[
        float, Setting(DEFAULT_POWER_FRACTION, "Share of the GPU's TDP drawn on average. Default: 1 (the TDP).")
    ]
    pue: Annotated[
        float, Setting(DEFAULT_PUE, "The data centre's power usage effectiveness. Default: 1.1 (hyperscale).")
    ]
    grid_gco2_per_kwh: Annotated[
        float,
        Setting(
            DEFAULT_GRID_GCO2_PER_KWH, "The grid's carbon intensity, gCO2e/kWh. Default: 481 (world average, 2023)."
        ),
    ]


class TrainTimeSettings(RunSettings, FineTuneSettings, OffloadSettings, EnergySettings, total=False):
    """What ``train_time`` takes as settings: the run's tokens, the fine-tuning method (its FLOPs), what is offloaded
    (said, not timed: the MFU carries it), the cost and the energy."""


class PlanSettings(
    WorkloadSettings, PinSettings, SplitSettings, SearchSettings, BatchSettings, RunSettings, total=False
):
    """What ``plan`` takes besides the model and the GPUs."""

    top: Annotated[int | None, Setting(None, "How many of the fastest layouts to rank in the report; None: every one.")]


class ReportSettings(
    WorkloadSettings, PinSettings, SplitSettings, BatchSettings, RunSettings, EnergySettings, total=False
):
    """What ``report`` takes besides the model and the GPUs."""

    mfu: Annotated[
        float | None,
        Setting(
            None,
            "Model FLOPs utilisation for the training time. Default: the throughput the layout search predicts "
            "for its best layout (when none fits, 0.4, an assumption).",
        ),
    ]


# ------------------------------------------------------------------------------------------------ serving


class ServingSettings(TypedDict, total=False):
    """What serving memory depends on besides the model, the GPUs and the tensor-parallel split (``inference``;
    ``lmcalc memory --inference``)."""

    batch: Annotated[int, Setting(1, "With --inference: sequences served at once.")]
    context: Annotated[Count | None, Setting(None, "With --inference: tokens per sequence (8K = 8192).")]
    weights_dtype: Annotated[
        str, Setting("bf16", f"With --inference: {alternatives(SERVING_DTYPES)} (fp8 = fp8-e4m3).")
    ]
    kv_dtype: Annotated[str, Setting("bf16", f"With --inference: KV-cache dtype ({alternatives(SERVING_DTYPES)}).")]
    quant_group: Annotated[
        int | None,
        Setting(None, "With --inference: count one fp16 scale per group of this many int8/int4 weights."),
    ]
