"""What a training estimate starts from: the workload the user's values describe, on the cluster they name, and
the parallel layout their settings give (``estimates.layout_settings.LayoutSettings``: the same keywords for the
Python API and, as flags, for the command line)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, cast

from lmcalc import presets as pr
from lmcalc.engine.choices import (
    ATTENTION_KERNELS,
    MOE_DISPATCHERS,
    OFFLOAD_MODULES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
    SCHEDULES,
    OffloadModule,
    RecomputeModule,
)
from lmcalc.engine.finetune.method import Method
from lmcalc.engine.memory.fp8_storage import SM100_GPUS, on_gpu
from lmcalc.engine.memory.terms import Capacity
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.engine.parallel.pipeline_layout import layout_parts
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, flag, keyword, setting
from lmcalc.estimates.inputs import (
    TRAINING_DEFAULTS,
    ClusterLike,
    Given,
    ModelLike,
    choice,
    cluster_of,
    framework_of,
    method_of,
    nbytes,
    offload_of,
    optimizer_of,
    precision_of,
    resolve_model,
    seq_given,
)
from lmcalc.estimates.layout_settings import LayoutSettings, SplitSettings
from lmcalc.estimates.settings import DEFAULT_FRAMEWORK, FINE_TUNING_FRAMEWORK, MethodSettings, TrainingSettings
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.result import Input
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec


def training_settings(given: Mapping[str, Any]) -> TrainingSettings:
    """The workload's settings among ``given``."""
    return cast(TrainingSettings, _among(given, TrainingSettings))


def layout_settings(given: Mapping[str, Any]) -> LayoutSettings:
    """The layout's settings among ``given``."""
    return cast(LayoutSettings, _among(given, LayoutSettings))


def _among(given: Mapping[str, Any], kind: type) -> dict[str, Any]:
    """The settings among ``given`` that the TypedDict ``kind`` holds."""
    return {key: value for key, value in given.items() if key in kind.__annotations__}


def pipeline_split(settings: LayoutSettings | SplitSettings) -> PipelineSplit:
    """The pipeline split the settings describe: each ``PipelineSplit`` field read under its keyword
    (``errors.keyword``: ``embedding_in_split`` is ``account_for_embedding_in_pipeline_split``)."""
    named: Mapping[str, Any] = settings
    given = {f.name: named[keyword(f.name)] for f in fields(PipelineSplit) if keyword(f.name) in named}
    if "schedule" in given:
        given["schedule"] = choice(given["schedule"], SCHEDULES, "schedule")
    layout, pp = given.get("pipeline_layout"), named.get("pp")
    if layout is not None and isinstance(pp, int) and pp > 1 and given.get("virtual_stages", 1) == 1:
        chunks, rest = divmod(len(layout_parts(layout)), pp)  # as Megatron-Core: the virtual stages the parts make
        if chunks > 1 and not rest:
            given |= {"schedule": "interleaved", "virtual_stages": chunks}
    return PipelineSplit(**given)


def split_settings(settings: LayoutSettings) -> SplitSettings:
    """The pipeline split's layer settings among a layout's."""
    return cast(SplitSettings, _among(settings, SplitSettings))


def build_layout(cluster: Cluster, settings: LayoutSettings) -> Layout:
    """The layout the settings describe on ``cluster`` (checked when it is made); DP, when not given, fills the
    GPUs the other degrees leave. Checked against a workload by ``engine.parallel.layout_checks.check_layout``."""
    named: Mapping[str, Any] = settings
    degrees = {
        f.name: named[f.name] for f in fields(Layout) if f.init and f.name not in ("dp", "split") and f.name in named
    }
    dp = settings.get("dp")
    layout = Layout(dp=1 if dp is None else dp, **degrees, split=pipeline_split(settings))  # the rest: Layout's own
    if dp is not None:
        return layout
    model_parallel = layout.tp * layout.pp * layout.cp
    if cluster.count % model_parallel:
        raise LmcalcError(f"TP·PP·CP = {model_parallel} does not divide the {cluster.count} GPUs of {cluster.label}")
    return replace(layout, dp=cluster.count // model_parallel)


def layout_origin(layout: Layout) -> str:
    """The settings a layout in an inputs table came from."""
    split = layout.split
    folded: tuple[str, ...] = ("etp",) if layout.folded else ()
    hybrid: tuple[str, ...] = ("hsdp",) if layout.hsdp > 1 else ()
    hybrid += ("hsdp_shard_optimizer",) if layout.hsdp_shard_optimizer else ()
    degrees = ("dp", "tp", "pp", "cp", "ep", *folded, "zero", *hybrid, "sequence_parallel", "schedule",
               "virtual_stages")  # fmt: skip
    return (
        " ".join(flag(name) for name in degrees)
        + (" --first/--last-stage-layers" if split.first_stage_layers or split.last_stage_layers else "")
        + (" --account-for-embedding/loss-in-pipeline-split" if split.units else "")
        + (" --pipeline-layout" if split.pipeline_layout is not None else "")
        + (" --mtp-layers" if split.mtp_layers else "")
    )


@dataclass(frozen=True)
class TrainingSetup:
    """A training workload on a cluster, resolved: what the memory, fit and plan estimates start from."""

    resolved: pr.Resolved  # the model, and a note when a family name chose it
    cluster: Cluster
    workload: Workload
    seq: Given  # the sequence length, and where it came from, for the inputs table
    assumed: str = ""  # why the framework profile was chosen, when none was named and the layout chose it
    framework_named: bool = False  # whether the user named the framework profile

    @property
    def model(self) -> ModelSpec:
        return self.workload.model

    @property
    def capacity(self) -> Capacity:
        return Capacity.of(self.cluster.hardware)

    @property
    def framework_input(self) -> Input:
        """The framework's row of an inputs table: its profile, and why it was assumed when the layout chose it."""
        framework = self.workload.framework
        origin = f"assumed: {self.assumed}; {flag('framework')} to choose" if self.assumed else framework.label
        return Input("framework", "Framework", framework.name, origin=origin)

    @property
    def assumed_line(self) -> tuple[str, ...]:
        """The headline's line saying which profile the layout chose, if it did: an answer's first lines say so."""
        name = self.workload.framework.name
        return (f"costed as {name} runs it ({self.assumed}; {flag('framework')} to choose)",) if self.assumed else ()


SOFTCAP_EAGER = (
    "attention eager: transformers runs soft-capped attention logits (Gemma 2) in its eager path, which keeps the "
    "b·H·s² scores (its SDPA path refuses soft-capping; flash-attn 2 soft-caps in its kernel: --framework idealised "
    "or megatron counts that)"
)


def training_setup(
    model: ModelLike, gpus: ClusterLike, settings: TrainingSettings, layout: Mapping[str, Any] | None = None
) -> TrainingSetup:
    """The workload the user's settings describe (``TRAINING_DEFAULTS`` for those left out), on the cluster they
    name. ``layout``: the layout settings given (``tp``, ``zero``, …), from which a framework profile is chosen when
    none is named (``default_framework``)."""
    given: TrainingSettings = {**TRAINING_DEFAULTS, **settings}
    resolved = resolve_model(model)
    cluster = at_clock(cluster_of(gpus), given["clock_fraction"])
    recipe, opt = recipe_on(precision_of(given["precision"]), cluster.hardware), optimizer_of(given["optimizer"])
    kernel = choice(given["attention"], ATTENTION_KERNELS, "attention")
    mode = choice(given["recompute"], RECOMPUTE_MODES, "recompute")
    recompute_method = choice(given["recompute_method"], RECOMPUTE_METHODS, "recompute_method")
    partial = given["recompute_num_layers"] != 1 or recompute_method != "uniform"
    if partial and "recompute" in settings and mode != "full":  # a search (plan) varies the mode: full uses them
        raise LmcalcError(
            f"{setting('recompute_num_layers')} and {setting('recompute_method')} say which layers full "
            f"recomputation covers; they need {setting('recompute')} full (got {mode})"
        )
    modules = recompute_modules_of(given["recompute_modules"])
    if modules != DEFAULT_MODULES and "recompute" in settings and mode != "selective":
        raise LmcalcError(f"{setting('recompute_modules')} says what selective recomputation covers; it needs "
                          f"{setting('recompute')} selective (got {mode})")  # fmt: skip
    overhead = given["overhead"]
    overhead_bytes = None if overhead is None else nbytes(overhead, "overhead")
    seq_in = seq_given(given["seq"], resolved.spec)
    method = method_of(given)
    offload = offload_of(given)
    name, assumed = (given["framework"], "") if given["framework"] else default_framework(method, layout or {})
    framework = framework_of(name)
    if modules != DEFAULT_MODULES:
        check_modules(modules, framework, resolved.spec)
    if given["cpu_offloading_num_layers"] and mode != "none" and "recompute" in settings:
        raise LmcalcError(  # megatron/core/transformer/transformer_config.py refuses the two together
            f"{setting('cpu_offloading_num_layers')} offloads activations that recomputation would not keep; "
            f"Megatron-Core refuses the two together: use {setting('recompute')} none (got {mode})"
        )
    if given["grad_reduce_in_bf16"]:
        framework = bf16_gradient_buffer(framework)
    if given["fp8_param_gather"]:
        framework = fp8_primary_weights(framework, recipe)
    if given["te_cross_entropy"]:
        framework = te_cross_entropy(framework)
    offload_modules = offload_modules_of(given["offload_modules"])
    if offload_modules and framework.name not in MEGATRON_LIKE:
        raise LmcalcError(f"{setting('offload_modules')} is Megatron-Core's fine-grained activation offloading "
                          f"({setting('framework')} megatron); {framework.label} has none modelled")  # fmt: skip
    if given["cpu_offloading_num_layers"] and framework.name not in MEGATRON_LIKE:
        raise LmcalcError(
            f"{setting('cpu_offloading_num_layers')} is Megatron-Core's CPU activation offloading "
            f"({setting('framework')} megatron); {framework.label} has none modelled"
        )
    if framework.name == "transformers" and resolved.spec.attention_softcap and kernel == "flash":
        kernel = "eager"  # Gemma 2's soft-capped logits: transformers' SDPA path refuses them (_supports_sdpa False)
        resolved = replace(resolved, note=" ".join(filter(None, (resolved.note, SOFTCAP_EAGER))))
    workload = Workload(
        resolved.spec,
        recipe,
        opt,
        int(seq_in.value),
        given["micro_batch"],
        kernel,
        mode,
        overhead_bytes=overhead_bytes,
        framework=framework,
        method=method,
        offload=offload,
        recompute_num_layers=given["recompute_num_layers"],
        recompute_method=recompute_method,
        recompute_modules=modules,
        cpu_offloading_num_layers=given["cpu_offloading_num_layers"],
        offload_modules=offload_modules,
        min_offloaded_tensor_size=given["min_offloaded_tensor_size"],
        capacity_factor=given["capacity_factor"],
        pad_to_capacity=given["pad_to_capacity"],
        moe_a2a_overlap=given["moe_a2a_overlap"],
        moe_dispatcher=choice(given["moe_dispatcher"], MOE_DISPATCHERS, "moe_dispatcher"),
        nvlink_domain=cluster.scale_up,
    )
    return TrainingSetup(resolved, cluster, workload, seq_in, assumed, bool(given["framework"]))


def at_clock(cluster: Cluster, fraction: float) -> Cluster:
    """The cluster's GPUs at ``fraction`` of the clock their rates were taken at (``HardwareSpec.clock_fraction``)."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise LmcalcError(f"{setting('clock_fraction')} must be above 0 and at most 1, got {fraction}")
    if fraction == 1:
        return cluster
    hardware = cluster.hardware
    slower = hardware.model_copy(
        update={"clock_fraction": fraction, "display_name": f"{hardware.label} at {fraction:.0%} of its clock"}
    )
    return replace(cluster, hardware=slower)


def recipe_on(recipe: PrecisionRecipe, hardware: HardwareSpec) -> PrecisionRecipe:
    """The precision recipe as ``hardware`` runs it: an fp8 recipe's transposes only where its GEMMs need them
    (``engine.memory.fp8_storage.on_gpu``); a recipe Transformer Engine runs only on compute capability 10.x
    (MXFP8) refused on any other GPU."""
    fp8 = recipe.fp8
    if fp8 is None:
        return recipe
    if fp8.sm100_only and hardware.name not in SM100_GPUS:
        raise LmcalcError(
            f"{setting('precision')} {recipe.name} runs only on GPUs of compute capability 10.x "
            f"({', '.join(SM100_GPUS)}), as Transformer Engine supports it; {hardware.label} is not one: use fp8-mixed"
        )
    return recipe.model_copy(update={"fp8": on_gpu(fp8, hardware.name)})


DEFAULT_MODULES: tuple[RecomputeModule, ...] = ("core_attn",)
MEGATRON_LIKE = ("megatron", "idealised")  # the profiles Megatron-Core's own levers apply to


def recompute_modules_of(value: str) -> tuple[RecomputeModule, ...]:
    """``core_attn,mlp`` as the modules it names, each one of ``RECOMPUTE_MODULES``, in the order given."""
    names = [part.strip() for part in str(value).split(",") if part.strip()]
    if not names:
        raise LmcalcError(f"{setting('recompute_modules')} must name one or more of {', '.join(RECOMPUTE_MODULES)}")
    modules = tuple(choice(name, RECOMPUTE_MODULES, "recompute_modules") for name in names)
    if len(set(modules)) < len(modules):
        raise LmcalcError(f"{setting('recompute_modules')} names a module twice: {value}")
    return modules


def offload_modules_of(value: str) -> tuple[OffloadModule, ...]:
    """``fused_group_mlp`` as the modules it names (none for an empty value), each one of ``OFFLOAD_MODULES``."""
    names = [part.strip() for part in str(value).replace(" ", ",").split(",") if part.strip()]
    return tuple(choice(name, OFFLOAD_MODULES, "offload_modules") for name in names)


def check_modules(modules: tuple[RecomputeModule, ...], framework: FrameworkProfile, model: ModelSpec) -> None:
    """Refuse what Megatron-Core refuses, and modules under a framework that has none."""
    if framework.recompute.selective != "attention_core" or framework.name not in MEGATRON_LIKE:
        raise LmcalcError(
            f"{setting('recompute_modules')} is Megatron-Core's selective recomputation ({setting('framework')} "
            "megatron); "
            f"{framework.label} recomputes {_what_selective_redoes(framework)}"
        )
    v4 = model.compressed_attention and framework.attention.compressed_kernels == "fused"  # DeepSeek-V4's own module
    if "mla_up_proj" in modules and not (model.mla or v4):  # transformer_config.py raises it too
        raise LmcalcError(
            f"{setting('recompute_modules')} mla_up_proj needs multi-head latent attention (or DeepSeek-V4's, under "
            f"the fused kernels); {model.label} has neither"
        )


def bf16_gradient_buffer(framework: FrameworkProfile) -> FrameworkProfile:
    """The megatron profile with Megatron-LM's ``--grad-reduce-in-bf16``: megatron/core/distributed/
    param_and_grad_buffer.py keeps the gradient buffer in the parameters' bf16 when grad_reduce_in_fp32 is off, and the
    distributed optimizer (megatron/core/optimizer/distrib_optimizer.py) copies its shard of it into fp32 main
    gradients at the step."""
    if framework.name != "megatron":
        raise LmcalcError(
            f"{setting('grad_reduce_in_bf16')} is Megatron-LM's gradient buffer ({setting('framework')} megatron); "
            f"{framework.label} keeps its gradients as its profile says"
        )
    return framework.model_copy(
        update={
            "display_name": f"{framework.label}, gradients reduced in bf16",
            "states": framework.states.model_copy(update={"grad_bytes": 2.0}),
            "optimizer_step": framework.optimizer_step.model_copy(update={"fp32_grad_copy": True}),
        }
    )


def te_cross_entropy(framework: FrameworkProfile) -> FrameworkProfile:
    """The megatron profile with Megatron-Core's cross-entropy fused in Transformer Engine
    (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``): transformer_engine/pytorch/cross_entropy.py
    (v2.8 to v2.17) saves the logits it is given, and its Triton kernels (triton/cross_entropy.py) read them once for
    the online softmax's maximum and sum, then read them again and write each logit's gradient into them in place;
    the backward multiplies that gradient by the loss's in place and returns it. So the bf16 logits are kept and
    nothing else a logit (2 B saved, none transient), and the loss moves 2 + 2 + 2 B a logit forward and 2 + 2
    backward. From 2.18 (01bbe3e) the gradient is written to a new fp32 tensor, as the profile's own count has it."""
    if framework.name != "megatron":
        raise LmcalcError(
            f"{setting('te_cross_entropy')} is Megatron-Core's fused cross-entropy ({setting('framework')} megatron); "
            f"{framework.label} keeps its loss as its profile says"
        )
    return framework.model_copy(
        update={
            "display_name": f"{framework.label}, Transformer Engine's cross-entropy",
            "loss": framework.loss.model_copy(
                update={
                    "saved_bytes": 2.0,
                    "transient_bytes": 0.0,
                    "moved_bytes": (6.0, 4.0),
                    "source": "transformer_engine/pytorch/cross_entropy.py and triton/cross_entropy.py (v2.8 to "
                    "v2.17), with Megatron-Core's --cross-entropy-fusion-impl te: the bf16 logits saved, their "
                    "gradient written into them in place in the forward and scaled in place in the backward",
                }
            ),
        }
    )


def fp8_primary_weights(framework: FrameworkProfile, recipe: PrecisionRecipe) -> FrameworkProfile:
    """The megatron profile with Megatron-LM's ``--fp8-param-gather``: the layers' weights are Transformer Engine's
    quantised tensors (transformer_engine/pytorch/module/base.py ``reset_parameters`` under ``fp8_model_init``), with
    no bf16 weight and no separate fp8 copy; the distributed optimizer keeps its fp32 master shard
    (megatron/core/optimizer/distrib_optimizer.py)."""
    if framework.fp8.saved != "transformer_engine" or recipe.fp8 is None:
        raise LmcalcError(
            f"{setting('fp8_param_gather')} keeps Transformer Engine's fp8 weights: it needs an fp8 recipe "
            f"({setting('precision')} fp8-mixed, fp8-current, fp8-blockwise or mxfp8) under {setting('framework')} "
            f"megatron (got {recipe.name} under {framework.label})"
        )
    return framework.model_copy(
        update={
            "display_name": f"{framework.label}, fp8 primary weights",
            "fp8": framework.fp8.model_copy(update={"primary_weights": True}),
        }
    )


def _what_selective_redoes(framework: FrameworkProfile) -> str:
    return "every second matmul" if framework.recompute.selective == "matmuls" else "the attention core"


def recompute_input(w: Workload) -> Input:
    """The recomputation mode as the answer's inputs show it, with the layers full recomputation covers where not
    every layer one by one (Megatron's ``--recompute-method`` and ``--recompute-num-layers``)."""
    value: str = w.recompute
    origin = flag("recompute")
    if w.recompute == "full" and (w.recompute_num_layers != 1 or w.recompute_method != "uniform"):
        n = w.recompute_num_layers
        value = (
            f"full, the first {n} layer{'s' if n > 1 else ''} of each chunk"
            if w.recompute_method == "block"
            else f"full, units of {n} layer{'s' if n > 1 else ''}"
        )
        origin += f" {flag('recompute_method')} {flag('recompute_num_layers')}"
    if w.recompute == "selective" and w.recompute_modules != DEFAULT_MODULES:
        value = f"selective: {', '.join(w.recompute_modules)}"
        origin += f" {flag('recompute_modules')}"
    if w.offload_modules:
        value += f"; {', '.join(w.offload_modules)} offloaded to the CPU, every MoE layer's but the last"
        origin += f" {flag('offload_modules')}"
    if w.offloaded_layers:
        n = w.offloaded_layers
        value = f"none; the first {n} layer{'s' if n > 1 else ''}' activations offloaded to the CPU"
        origin += f" {flag('cpu_offloading_num_layers')}"
    return Input("recompute", "Activation recomputation", value, origin=origin)


def default_framework(method: Method, layout: Mapping[str, Any]) -> tuple[str, str]:
    """The framework profile an estimate uses unless one is named, and why, when the layout chose it: transformers
    for adapters; DeepSpeed for ZeRO-2 or ZeRO-3 without tensor, pipeline, context or expert parallelism, as a
    transformers model is sharded (the Trainer with DeepSpeed); else Megatron-LM, whose layouts lmcalc's are
    (its ZeRO-2 and ZeRO-3 are Megatron-FSDP)."""
    if method.adapters:
        return FINE_TUNING_FRAMEWORK, ""
    zero = layout.get("zero") or 0
    # a degree left to the planner (a pin of None) may not stay 1: only one given as 1 is data parallelism alone
    if zero >= 2 and all(layout.get(key, 1) == 1 for key in ("tp", "pp", "cp", "ep")):
        return "deepspeed", f"ZeRO-{zero} without TP, PP, CP or EP: a transformers model under DeepSpeed"
    return DEFAULT_FRAMEWORK, ""


def method_settings(given: Mapping[str, Any]) -> MethodSettings:
    """The method's and offload's settings among ``given``."""
    return cast(MethodSettings, _among(given, MethodSettings))
