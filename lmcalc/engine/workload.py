"""The workload: what is trained and how, on one model replica, as one frozen, validated value.

Every memory, FLOP and time estimate of a training step starts from the same handful of facts: the
model, the sequence length and micro-batch, the precision recipe and the optimizer, the attention kernel
and the recomputation mode, the fine-tuning method (what is trained) and what is offloaded, the framework
that runs it (its profile: what it keeps and allocates beyond the textbook count), and two allowances (the
bytes of a dropout mask element, the per-GPU overhead). They travel together as a ``Workload``; engine
functions take ``(workload, layout[, stage])`` or ``(workload, layout, cluster)``. A workload is hashable, and
memoised engine functions are keyed by it (its hash is computed once, when it is made), so a field added here
is part of every cached figure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from lmcalc.engine.choices import (
    ATTENTION_KERNELS,
    MOE_DISPATCHERS,
    OFFLOAD_MODULES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
    Attention,
    MoeDispatcher,
    OffloadModule,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
)
from lmcalc.engine.finetune.method import FULL, Method, check_method
from lmcalc.engine.finetune.offload import NO_OFFLOAD, Offload
from lmcalc.engine.model.tensors import Dim
from lmcalc.errors import LmcalcError, setting
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe
from lmcalc.specs import ModelSpec
from lmcalc.units import GiB

OVERHEAD_ALLOWANCE_BYTES = 2 * GiB
"""A flat allowance for what is not weights, states or activations: the CUDA context, cuBLAS/NCCL workspaces
and the caching allocator's fragmentation; a round, deliberately conservative figure, not a measurement. The
idealised framework profile and the serving estimate (``engine.inference.serving``) use it; a real framework's profile
counts those parts one by one. Users change it with ``--overhead``."""

IDEALISED = "idealised"
"""The framework profile of the textbook count (``presets/frameworks/idealised.yaml``): what a caller gives a
workload to count it as the papers count it (``presets.framework_profile()``). The engine reads no preset: the
caller chooses the profile."""


MASK_BYTES = 1  # dropout masks are stored as bool / uint8 (Korthikanti et al. 2022 §4.1)
MIN_OFFLOADED_ELEMENTS = 1024 * 1024  # Megatron-Core's min_offloaded_tensor_size default (transformer_config.py)


def dropout_mask_bytes(device_type: str, precision: PrecisionRecipe) -> float:
    """Bytes of one dropout-mask element on a device: a bool on CUDA (``MASK_BYTES``); PyTorch's CPU dropout
    keeps its mask in the input's dtype, the recipe's activation bytes."""
    return MASK_BYTES if device_type == "cuda" else precision.activation_bytes


@dataclass(frozen=True)
class Workload:
    """What is trained and how, on one model replica: everything an estimate needs besides the parallel
    layout and the hardware."""

    model: ModelSpec
    precision: PrecisionRecipe  # bytes of weights, gradients, master copy, optimizer states, activations
    optimizer: OptimizerSpec
    seq_len: int  # tokens per sequence
    micro_batch: int = 1  # sequences per GPU per micro-batch
    attention: Attention = "flash"
    recompute: Recompute = "none"
    mask_bytes: float = MASK_BYTES  # bytes of one dropout-mask element (see dropout_mask_bytes)
    overhead_bytes: float | None = None  # per-GPU allowance beyond what the profile counts; None: the profile's
    framework: FrameworkProfile = field(kw_only=True)  # what the framework keeps and allocates (presets/)
    method: Method = FULL  # what is trained: every weight, adapters on a frozen base, or the top layers
    offload: Offload = NO_OFFLOAD  # which model states leave the GPU for the host or NVMe
    recompute_num_layers: int = field(default=1, kw_only=True)  # full recomputation's N (--recompute-num-layers)
    recompute_method: RecomputeMethod = field(default="uniform", kw_only=True)  # uniform units of N, or block
    recompute_modules: tuple[RecomputeModule, ...] = field(default=("core_attn",), kw_only=True)  # Megatron's selective
    cpu_offloading_num_layers: int = field(default=0, kw_only=True)  # layers whose activations wait in host memory
    # (without recomputation only, as Megatron-Core runs it: a recomputing variant, such as a lever, offloads none)
    offload_modules: tuple[OffloadModule, ...] = field(default=(), kw_only=True)  # fine-grained offloading's modules
    min_offloaded_tensor_size: int = field(default=MIN_OFFLOADED_ELEMENTS, kw_only=True)  # elements, as Megatron's
    capacity_factor: float | None = field(default=None, kw_only=True)  # routed experts' capacity; None: dropless
    pad_to_capacity: bool = field(default=True, kw_only=True)  # each expert's input padded to its capacity
    moe_a2a_overlap: bool = field(default=False, kw_only=True)  # Megatron-Core's EP all-to-all overlap (combined 1F1B)
    moe_dispatcher: MoeDispatcher = field(default="alltoall", kw_only=True)  # how tokens reach their experts' GPUs
    nvlink_domain: int = field(default=8, kw_only=True)  # the cluster's NVLink domain: HybridEP sizes its buffers by it
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch", "recompute_num_layers", "min_offloaded_tensor_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
        for name, options in (
            ("attention", ATTENTION_KERNELS),
            ("recompute", RECOMPUTE_MODES),
            ("recompute_method", RECOMPUTE_METHODS),
            ("moe_dispatcher", MOE_DISPATCHERS),
        ):
            if getattr(self, name) not in options:
                raise LmcalcError(f"{setting(name)} must be one of {', '.join(options)}; got {getattr(self, name)!r}")
        n = self.cpu_offloading_num_layers
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < self.model.num_layers:
            raise LmcalcError(
                f"{setting('cpu_offloading_num_layers')} must be a whole number from 0 to "
                f"{self.model.num_layers - 1} (fewer than the model's layers, as Megatron-Core requires), got {n}"
            )
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown or not self.recompute_modules or len(set(self.recompute_modules)) < len(self.recompute_modules):
            raise LmcalcError(
                f"{setting('recompute_modules')} must name one or more of {', '.join(RECOMPUTE_MODULES)}, each once; "
                f"got {', '.join(self.recompute_modules) or 'none'}"
            )
        _check_offload_modules(self.model, self.offload_modules)
        _check_capacity(self.model, self.capacity_factor, self.pad_to_capacity)
        if self.moe_dispatcher == "deepep" and self.capacity_factor is not None and self.pad_to_capacity:
            raise LmcalcError(  # megatron/core/transformer/transformer_config.py: the flex dispatcher's check
                f"{setting('moe_dispatcher')} deepep does not pad experts' input to a capacity (Megatron-Core refuses "
                f"moe_pad_expert_input_to_capacity with it); turn {setting('pad_to_capacity')} off or use alltoall"
            )
        if not isinstance(self.moe_a2a_overlap, bool):
            raise LmcalcError(f"{setting('moe_a2a_overlap')} must be true or false, got {self.moe_a2a_overlap!r}")
        if not self.mask_bytes > 0:
            raise LmcalcError(f"{setting('mask_bytes')} must be a positive number of bytes, got {self.mask_bytes}")
        if self.overhead_bytes is not None and not self.overhead_bytes >= 0:
            raise LmcalcError(
                f"{setting('overhead_bytes')} must be zero or a positive number of bytes, got {self.overhead_bytes}"
            )
        check_method(self.model, self.method)
        compared = tuple(getattr(self, f.name) for f in fields(self) if f.compare)
        object.__setattr__(self, "_hash", hash(compared))  # once: a spec's hash walks all its fields

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        """The workload by name: the model, recipe, optimizer and profile named, not their every field (the default
        repr ran to 14,000 characters, and a plan holds thousands of workloads)."""
        settings = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.repr
            and f.name not in ("model", "precision", "optimizer", "seq_len", "framework", "method", "offload")
            and getattr(self, f.name) != f.default
        )
        names = (
            f"model={self.model.name!r}, precision={self.precision.name!r}, optimizer={self.optimizer.name!r}, "
            f"framework={self.framework.name!r}, method={self.method.label!r}, offload={self.offload.label!r}"
        )
        return f"Workload({names}, seq_len={self.seq_len}{', ' + settings if settings else ''})"

    @property
    def offloaded_layers(self) -> int:
        """The layers whose activations CPU offloading moves to host memory: none under recomputation."""
        return self.cpu_offloading_num_layers if self.recompute == "none" else 0

    @property
    def routed_share(self) -> float:
        """ρ: the rows each routed expert computes over the rows balanced routing gives it, k·s·b/E. Dropless: 1.
        With a capacity factor C each expert keeps at most C times its balanced share and drops the rest
        (Switch Transformer, Fedus et al. 2021 §2.1; Megatron-Core's ``moe_expert_capacity_factor``); padded to its
        capacity (``moe_pad_expert_input_to_capacity``, GShard's fixed expert buffers) it computes C times it, the
        padding included: ρ = C padded, min(1, C) not (balanced routing drops nothing at C ≥ 1)."""
        c = self.capacity_factor
        if c is None:
            return 1.0
        return c if self.pad_to_capacity else min(1.0, c)

    @property
    def routed_copies(self) -> float:
        """The rows the routed experts compute per token: k·ρ (0 for a model without routed experts); k·E/(E + Z)·ρ
        with zero-computation experts, which compute nothing (``MoESpec.computed_k``); E where the model's own code,
        which the profile runs, sends every token to every expert (``MoESpec.dense_dispatch``)."""
        moe = self.model.moe
        if moe is None:
            return 0.0
        if moe.dense_dispatch and self.framework.moe.router == "model":
            return float(moe.num_experts)
        return moe.computed_k * self.routed_share

    @property
    def expert_width(self) -> Dim:
        """A token's width as the routed experts read and write it and the dispatcher moves it: h, or the latent width
        l where a latent MoE projects the tokens down before its experts and back after them (``MoESpec.latent_size``:
        Nemotron 3 Super; transformers' NemotronHMoE, and Megatron-Core's MoELayer, whose dispatcher takes
        moe_latent_size as its hidden size)."""
        moe = self.model.moe
        return Dim(moe.latent_size, "l") if moe and moe.latent_size else Dim(self.model.hidden_size, "h")

    @property
    def core_recomputed(self) -> bool:
        """Whether selective recomputation drops the attention core (Megatron-Core's ``core_attn``)."""
        return self.recompute == "selective" and "core_attn" in self.recompute_modules

    def __reduce__(self) -> tuple[Callable[..., Workload], tuple[object, ...]]:
        """Pickled as its fields, so that a copy made in another process (another hash seed) hashes anew."""
        return _workload_of, (tuple((f.name, getattr(self, f.name)) for f in fields(self) if f.init),)

    @property
    def allowance(self) -> float:
        """The flat per-GPU allowance: the user's ``overhead``, else the framework profile's."""
        return self.framework.allocator.allowance_bytes if self.overhead_bytes is None else self.overhead_bytes

    @property
    def grad_bytes(self) -> float:
        """Bytes of one gradient element as the step keeps it: the framework profile's, where it says (Megatron-LM
        and torchtitan accumulate gradients in fp32), else the precision recipe's."""
        return self.framework.states.grad_bytes or self.precision.grad_bytes

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch: b · s."""
        return self.seq_len * self.micro_batch


@functools.lru_cache(maxsize=1024)
def canonical(w: Workload) -> Workload:
    """The first workload equal to ``w`` this process asked for: a cache finds a key by identity before it compares
    one field by field, so the workloads the engine derives anew (``states_workload``, ``kernel_workload``) are
    given as the one first made (comparing them cost the DeepSeek-V3 search of benchmarks/plan_search.py ~0.5 s)."""
    return w


def _check_offload_modules(model: ModelSpec, modules: tuple[OffloadModule, ...]) -> None:
    """Fine-grained offloading's modules: the routed experts' ones lmcalc models, each once, of an MoE model, and not
    the fused grouped MLP beside a part of it (Megatron-Core refuses fused_group_mlp with expert_fc1)."""
    unknown = [m for m in modules if m not in OFFLOAD_MODULES]
    if unknown or len(set(modules)) < len(modules):
        raise LmcalcError(
            f"{setting('offload_modules')} must name {' or '.join(OFFLOAD_MODULES)}, each once (lmcalc models the "
            f"routed experts' offloading, not the attention's or the norms'); got {', '.join(map(str, modules))}"
        )
    if modules and model.moe is None:
        raise LmcalcError(f"{setting('offload_modules')} offloads the routed experts' inputs; {model.label} has none")
    if len(modules) > 1:
        raise LmcalcError(f"{setting('offload_modules')} fused_group_mlp covers expert_fc1: give one of them")


def _check_capacity(model: ModelSpec, capacity_factor: float | None, pad: bool) -> None:
    """A capacity factor is a positive number, for a model with routed experts; padding to it needs one."""
    if not isinstance(pad, bool):
        raise LmcalcError(f"{setting('pad_to_capacity')} must be true or false, got {pad!r}")
    if capacity_factor is None:
        return
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float):
        raise LmcalcError(f"{setting('capacity_factor')} must be a positive number, got {capacity_factor!r}")
    if not 0 < capacity_factor < float("inf"):
        raise LmcalcError(f"{setting('capacity_factor')} must be a positive number, got {capacity_factor}")
    if model.moe is None:
        raise LmcalcError(
            f"{setting('capacity_factor')} applies to routed experts; {model.name} has none (leave it out)"
        )


def _workload_of(fields_given: tuple[tuple[str, object], ...]) -> Workload:
    """A workload from its fields by name (unpickling: ``framework`` is keyword-only)."""
    return Workload(**dict(fields_given))  # type: ignore[arg-type]
