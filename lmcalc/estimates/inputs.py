"""What every estimate starts from: the user's values resolved once, the same way for the Python API and the
command line (which passes its flags through unchanged), and the documented defaults with their origins.

A setting the user got wrong is named with ``errors.setting`` (its keyword), so the message says ``seq``
to a Python caller and ``--seq`` at the command line.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from lmcalc import presets as pr
from lmcalc.engine.choices import Attention, Recompute
from lmcalc.engine.finetune.method import METHODS, NF4_BITS_PER_WEIGHT, Method, parse_targets
from lmcalc.engine.finetune.offload import OFFLOAD_DEVICES, OFFLOAD_TARGETS, Offload
from lmcalc.engine.model.palm import napkin_params
from lmcalc.engine.model.params import count_params, weight_tensors
from lmcalc.engine.model.published import as_published, matches_published, precision_text
from lmcalc.engine.parallel.sharding import trained_precision
from lmcalc.engine.run.cost import DEFAULT_MFU
from lmcalc.engine.run.optimal import TOKENS_PER_PARAM
from lmcalc.engine.workload import IDEALISED, OVERHEAD_ALLOWANCE_BYTES, Workload
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates.setting_groups import defaults
from lmcalc.estimates.settings import Bytes, Count, TrainingSettings
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.recipe_specs import OptimizerSpec, OptimizerState, PrecisionRecipe
from lmcalc.result import Input, Result
from lmcalc.specs import NO_TOP_K, Cluster, HardwareSpec, ModelSpec
from lmcalc.units import GiB, group, parse_bytes, parse_count

DEFAULT_SEQ_CAP = 8192
MAX_SEQ_LEN = 2**40
"""The longest sequence lmcalc takes: 100,000 times the longest context trained today (Llama 4 Scout's 10M), and
short enough that its memory terms (s·b·h bytes per layer, s² for attention scores) stay within a float."""
DEFAULT_ATTENTION: Attention = "flash"
DEFAULT_RECOMPUTE: Recompute = "none"
DEFAULT_OVERHEAD = f"{OVERHEAD_ALLOWANCE_BYTES / GiB:g}GiB"
"""The serving estimate's flat allowance (``inference``); a training estimate's comes from its framework profile."""
ASSUMPTION = "assumption:"
"""How the origin of a value lmcalc assumed begins (``Given.assumed``)."""

ModelLike = str | ModelSpec
ClusterLike = str | Cluster
PrecisionLike = str | PrecisionRecipe
OptimizerLike = str | OptimizerSpec
FrameworkLike = str | FrameworkProfile
C = TypeVar("C", bound=str)


TRAINING_DEFAULTS = cast(TrainingSettings, defaults(TrainingSettings))
"""Each workload setting's default, as ``memory``, ``fit`` and the others read it (``settings.TrainingSettings``)."""


@dataclass(frozen=True)
class Given:
    """A value and where it came from, for the inputs table."""

    value: float
    origin: str

    @property
    def assumed(self) -> bool:
        """Whether lmcalc assumed the value (a default) rather than the user or a preset giving it."""
        return self.origin.startswith(ASSUMPTION)


# ------------------------------------------------------------------------------------------------- specs


def resolve_model(value: ModelLike, counting: Literal["", "params", "flops", "serving"] = "") -> pr.Resolved:
    """A model preset name, family name, YAML file or HF config.json; or a spec, taken as it is. A model whose
    top-k is null (DeepSeek-V2's class default) is refused unless only ``counting`` its parameters; one that lmcalc
    counts but does not yet estimate the training memory of (``ModelSpec.counted_only``: Gemma 3n's and 4's layers,
    Llama 3.2 Vision's, RWKV-4's, DeepSeek-V4's), unless counting its parameters, its FLOPs (and the time they take
    at an MFU) or its serving memory."""
    resolved = pr.Resolved(value, "given") if isinstance(value, ModelSpec) else pr.resolve_model(value)
    moe = resolved.spec.moe
    if counting != "params" and moe and moe.experts_per_token is None:
        raise LmcalcError(f"{resolved.spec.name}: {NO_TOP_K}")
    if not counting and resolved.spec.counted_only:  # Gemma 3n's and 4's layers, Llama 3.2 Vision's, RWKV-4's, …
        raise LmcalcError(f"{resolved.spec.name}: {resolved.spec.counted_only}")
    return resolved


def cluster_of(value: ClusterLike) -> Cluster:
    """``8xH100``, ``1024xH100``, ``128x8xH100``; or a ``Cluster``."""
    return value if isinstance(value, Cluster) else pr.parse_cluster(value)


def hardware_of(value: str | HardwareSpec) -> HardwareSpec:
    return value if isinstance(value, HardwareSpec) else pr.resolve_hardware(value).spec


def precision_of(value: PrecisionLike) -> PrecisionRecipe:
    return value if isinstance(value, PrecisionRecipe) else pr.resolve_precision(value).spec


def optimizer_of(value: OptimizerLike) -> OptimizerSpec:
    return value if isinstance(value, OptimizerSpec) else pr.resolve_optimizer(value).spec


def framework_of(value: FrameworkLike) -> FrameworkProfile:
    return value if isinstance(value, FrameworkProfile) else pr.resolve_framework(value).spec


# ------------------------------------------------------------------------------------------------- values


def accept(given: Mapping[str, Any], accepted: type, function: str) -> None:
    """Refuse a keyword among ``given`` that the TypedDict ``accepted`` has no setting for, as Python refuses an
    unexpected keyword argument: a function taking ``**settings`` accepts any keyword at run time, and would
    otherwise drop a misspelt one without a word."""
    unknown = sorted(set(given) - set(accepted.__annotations__))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")


def method_of(given: Mapping[str, Any]) -> Method:
    """The fine-tuning method the settings describe (``TRAINING_DEFAULTS`` for those left out)."""
    settings = {**TRAINING_DEFAULTS, **given}
    return Method(
        choice(settings["method"], METHODS, "method"),
        settings["lora_rank"],
        parse_targets(settings["lora_targets"]),
        settings["lora_dropout"],
        settings["freeze_layers"],
        settings["kbit_upcast"],
        settings["dora"],
        settings["fp32_adapters"],
    )


def offload_of(given: Mapping[str, Any]) -> Offload:
    """What the settings offload, where to and at which rates (``TRAINING_DEFAULTS`` for those left out)."""
    settings = {**TRAINING_DEFAULTS, **given}
    return Offload(
        choice(settings["offload"], OFFLOAD_TARGETS, "offload"),
        choice(settings["offload_device"], OFFLOAD_DEVICES, "offload_device"),
        settings["host_link_gbps"],
        settings["cpu_optimizer_params_per_s"],
    )


def choice(value: str, options: tuple[C, ...], name: str) -> C:
    """``value`` (any case, spaces around) if it is one of ``options``."""
    key = str(value).strip().lower()
    for option in options:
        if key == option:
            return option
    close = difflib.get_close_matches(key, [str(option) for option in options], n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise LmcalcError(f"{setting(name)} must be one of {', '.join(map(str, options))}; got {value!r}{hint}")


def positive_int(value: int, name: str) -> int:
    if value <= 0:
        raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
    return value


def non_negative_int(value: int, name: str) -> int:
    """A count that may be zero (warm-up calls), never negative."""
    if value < 0:
        raise LmcalcError(f"{setting(name)} must be 0 or more, got {value}")
    return value


def finite(value: float | None, name: str, allow_zero: bool = False) -> float | None:
    """A number that is finite and positive (or zero, if allowed); nan and inf are refused."""
    if value is not None and not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        wanted = "zero or a positive number" if allow_zero else "a positive number"
        raise LmcalcError(f"{setting(name)} must be {wanted}, got {value}")
    return value


def count(value: Count, name: str, binary: bool = False) -> float:
    """A positive count written ``15T``, ``4M`` (binary: 4,194,304), ``1e12`` or as a number."""
    return parse_count(value, setting(name), binary=binary)


def whole_count(value: Count, name: str) -> int:
    """A count that must be a whole number (``1M`` sizes, ``--sweep micro-batch=1,2``)."""
    parsed = count(value, name)
    if not parsed.is_integer():
        raise LmcalcError(f"{setting(name)} needs whole numbers, got {value!r}")
    return int(parsed)


def nbytes(value: Bytes, name: str) -> float:
    """Bytes written ``80GB``, ``2GiB``, ``512MiB`` or as a number."""
    return parse_bytes(value, setting(name))


def seq_given(value: Count | None, model: ModelSpec | None = None, name: str = "seq") -> Given:
    """Tokens per sequence from ``value`` (binary K: 8K = 8192), else the model's default."""
    if value is None:
        assert model is not None, "a sequence length without a value needs the model's default"
        return default_seq_len(model)
    seq = count(value, name, binary=True)
    if not seq.is_integer():
        raise LmcalcError(f"{setting(name)} must be a whole number of tokens, got {value!r}")
    if seq > MAX_SEQ_LEN:
        raise LmcalcError(f"{setting(name)} {value} is beyond lmcalc's range: at most 2^40 (about 10^12) tokens")
    return Given(int(seq), flag(name))


def tokens_given(value: Count | None, model: ModelSpec) -> Given:
    """Training tokens from ``value``, else the preset's published count, else 20 per parameter."""
    return Given(count(value, "tokens"), flag("tokens")) if value else default_tokens(model)


# ------------------------------------------------------------------------------------------------- defaults


def default_tokens(model: ModelSpec) -> Given:
    """The preset's published training tokens, else the compute-optimal ~20 tokens per parameter."""
    if model.training_tokens:
        return Given(model.training_tokens, f"preset: {model.training_tokens_source or 'published'}")
    n = napkin_params(model)
    return Given(
        TOKENS_PER_PARAM * n,
        f"default: compute-optimal 20 tokens/parameter (Hoffmann et al. 2022) × {group(n)}",
    )


def default_seq_len(model: ModelSpec) -> Given:
    seq = min(model.max_seq_len, DEFAULT_SEQ_CAP)
    return Given(seq, f"default: min(model context {model.max_seq_len}, {DEFAULT_SEQ_CAP})")


def default_mfu() -> Given:
    return Given(DEFAULT_MFU, f"{ASSUMPTION} default MFU (published large runs reach 0.38–0.56; see docs)")


def mfu_given(value: float | None) -> Given:
    return Given(value, flag("mfu")) if value is not None else default_mfu()


# ------------------------------------------------------------------------------------------------- results


def checked(result: Result) -> Result:
    """Refuse to print a figure that overflowed or vanished: name it instead of printing inf or NaN."""
    for section in result.sections:
        for term in section.terms:
            if not math.isfinite(term.value):
                raise LmcalcError(
                    f"{term.label} is out of range ({term.value}) for these inputs; "
                    f"check the sizes, {setting('tokens')}, {setting('days')} and {setting('mfu')}"
                )
    return result


def recipe_text(precision: PrecisionRecipe) -> str:
    return (
        f"{precision.param_bytes:g} B weights + {precision.grad_bytes:g} B grads + {precision.master_bytes:g} B "
        f"master + {precision.optimizer_state_bytes:g} B per optimizer state; matmuls at the "
        f"{precision.compute_dtype} peak"
    )


def stored_text(w: Workload) -> str:
    """What the precision recipe stores under the workload's method: the recipe for full training; for a fine-tune,
    the frozen weights' bytes and the trained weights' recipe apart (QLoRA's base is 4-bit, PEFT's adapters over a
    16-bit model are fp32: ``engine.parallel.sharding.trained_precision``)."""
    method = w.method
    if method.kind == "full":
        return recipe_text(w.precision)
    if method.kind == "qlora":
        others = 4.0 if method.kbit_upcast else w.precision.param_bytes
        nf4 = NF4_BITS_PER_WEIGHT / 8
        frozen = f"{nf4:.4g} B a quantised weight (NF4 and its block scales), {others:g} B the others"
    else:
        frozen = f"{w.precision.param_bytes:g} B a weight"
    trained = "adapters" if method.adapters else "the layers trained"
    return f"frozen base: {frozen}, nothing more; {trained}: {recipe_text(trained_precision(w))}"


def framework_text(framework: FrameworkProfile) -> str:
    return framework.label


def how_counted(framework: FrameworkProfile) -> str:
    """``as megatron allocates it``; the idealised profile is no framework: ``as the papers count it``."""
    return "as the papers count it" if framework.name == IDEALISED else f"as {framework.name} allocates it"


def optimizer_text(optimizer: OptimizerSpec) -> str:
    def state(s: OptimizerState) -> str:
        return s.name + (" (factored)" if s.factored else "") + ("" if s.params == "all" else f" ({s.params})")

    steps = optimizer.newton_schulz_steps
    orthogonalised = f"; {steps} Newton-Schulz iterations a matrix a step" if steps else ""
    return "states: " + (", ".join(state(s) for s in optimizer.states) or "none") + orthogonalised


def context_note(model: ModelSpec, seq_len: int) -> tuple[str, ...]:
    """Refuse a sequence the model cannot embed; flag one longer than its context."""
    if seq_len <= model.max_seq_len:
        return ()
    if model.position_embedding == "learned":
        raise LmcalcError(
            f"{model.name} has learned positions for {model.max_seq_len} tokens; "
            f"a sequence of {seq_len} does not fit them (use {setting('seq')} {model.max_seq_len} or less)"
        )
    return (f"sequence length {seq_len} exceeds {model.name}'s context of {model.max_seq_len} tokens",)


def method_inputs(w: Workload) -> tuple[Input, ...]:
    """The fine-tuning method and offload, for an inputs table: shown when they are not full training on the GPU;
    and an MoE model's expert capacity where one is set, and its dispatcher where it is not NCCL's all-to-all."""
    inputs = []
    if w.capacity_factor is not None:
        padded = "padded to it" if w.pad_to_capacity else "not padded"
        value = f"capacity factor {w.capacity_factor:g}, {padded}: the experts compute ρ = {w.routed_share:g} of "
        value += "k·s·b rows"
        origin = f"{flag('capacity_factor')}" + ("" if w.pad_to_capacity else f" {flag('pad_to_capacity')}")
        inputs.append(Input("capacity_factor", "Expert capacity", value, origin=origin))
    if w.model.moe and w.moe_dispatcher != "alltoall":
        value = f"{w.moe_dispatcher}: a token's copy to each GPU its experts reach, one to each node across nodes"
        inputs.append(Input("moe_dispatcher", "MoE dispatcher", value, origin=flag("moe_dispatcher")))
    if w.method.kind != "full":
        origin = f"{flag('method')} {w.method.kind}"
        if w.method.adapters:
            origin += f" {flag('lora_rank')} {flag('lora_targets')} {flag('lora_dropout')}"
        inputs.append(Input("method", "Fine-tuning method", w.method.label, origin=origin))
    if w.offload.optimizer:
        origin = (
            f"{flag('offload')}; host link {w.offload.host_link_gbps:g} GB/s, CPU optimizer "
            f"{w.offload.cpu_optimizer_params_per_s:.3g} params/s ({ASSUMPTION} unless given)"
        )
        inputs.append(Input("offload", "Offload", w.offload.label, origin=origin))
    return tuple(inputs)


def model_input(model: ModelSpec, note: str) -> Input:
    return Input("model", "Model", model.name, origin=note or model.label)


def model_notes(model: ModelSpec, note: str) -> tuple[str, ...]:
    notes = [note] if note else []
    if model.published_params:
        total = count_params(model).total
        digits = model.published_params_sig_figs
        verdict = "matches" if matches_published(model, total) else "DIFFERS FROM"
        scope = (
            f" ({group(as_published(model, total))} without the embeddings)"
            if total != as_published(model, total)
            else ""
        )
        notes.append(
            f"parameter count {group(total)}{scope} {verdict} the published {group(model.published_params)}"
            f"{f' ({precision_text(model)})' if digits else ''}"
            + (f": {model.published_params_source}" if model.published_params_source else "")
        )
    return tuple(notes)


def qlora_experts_note(w: Workload) -> tuple[str, ...]:
    """Why QLoRA leaves an MoE's routed experts unquantised, and what they weigh (``method.quantised``)."""
    if w.method.kind != "qlora" or w.model.moe is None:
        return ()
    experts = sum(t.total for t in weight_tensors(w.model) if t.group == "experts")
    width = 4 if w.method.kbit_upcast else w.precision.param_bytes
    cast = "cast to fp32 by peft.prepare_model_for_kbit_training" if w.method.kbit_upcast else "in the compute dtype"
    return (
        f"QLoRA on an MoE: transformers 5 stores the {experts:,} routed-expert weights as 3-D tensors, which "
        f"bitsandbytes' 4-bit loading leaves unquantised (bitsandbytes issue #1849), {cast}: "
        f"{experts * width / 1e9:,.1f} GB of frozen weights, where a loader that quantises fused experts "
        f"(Unsloth's) holds them in NF4, {experts * NF4_BITS_PER_WEIGHT / 8 / 1e9:,.1f} GB",
    )
