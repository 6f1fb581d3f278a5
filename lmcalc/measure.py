"""Measurements of the reference model with PyTorch itself: parameters, FLOPs, bytes saved for backward.

These are the independent figures ``lmcalc validate`` sets beside the engine's. torch is imported here.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from lmcalc.engine.choices import Attention, Recompute
from lmcalc.engine.memory.step_peak import StepPeak, plain_step_peak
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.reference_model import ReferenceModel, loss
from lmcalc.specs import ModelSpec


def build(
    spec: ModelSpec, attention: Attention, seq_len: int, device: str = "meta", dtype: torch.dtype = torch.float32
) -> ReferenceModel:
    model = ReferenceModel(spec, attention, max_seq=seq_len, device=device, dtype=dtype)
    return model.train()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def training_step_flops(model: ReferenceModel, seq_len: int, micro_batch: int) -> int:
    """FLOPs of one forward + backward step as ``FlopCounterMode`` counts them (no values needed on meta)."""
    device = next(model.parameters()).device
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        loss(model, tokens).backward()
    return counter.get_total_flops()


@dataclass(frozen=True)
class SavedTensors:
    """Bytes of the distinct storages autograd keeps for backward (parameters and buffers excluded)."""

    bytes: int
    count: int


def saved_for_backward(
    model: ReferenceModel,
    tokens: torch.Tensor,
    recompute: Recompute = "none",
    layer: int | None = None,
    units: tuple[tuple[int, int], ...] | None = None,
    end: int | None = None,
) -> SavedTensors:
    """Run the forward pass with ``saved_tensors_hooks`` and add up what autograd keeps, by storage.

    With ``layer`` only that transformer block runs (to ``end`` − 1 with ``end``), on the embedded tokens: what full
    recomputation rebuilds, a layer (or a unit of layers) at a time, during the backward pass. ``units``: the
    (first, end) ranges of layers checkpointed together (``ReferenceModel.forward``).
    """
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    storages: dict[int, int] = {}
    if layer is not None:
        # the layer's input is the checkpoint full recomputation already keeps (the rebuilt layer's first norm
        # saves that same storage), so it is not counted again; the embedding ran in the forward pass
        x = model.embed(tokens).detach().requires_grad_()
        state.add(x.untyped_storage().data_ptr())

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in state:
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        if layer is not None:
            s = tokens.shape[1]
            cos, sin = model.get_buffer("cos")[:s], model.get_buffer("sin")[:s]
            model.run_layers(x, cos, sin, layer, layer + 1 if end is None else end)
        else:
            loss(model, tokens, recompute, units)
    return SavedTensors(sum(storages.values()), len(storages))


def peak_saved_bytes(model: ReferenceModel, tokens: torch.Tensor, recompute: Recompute) -> int:
    """Bytes held for backward at its peak: everything saved by the forward pass, plus, under full
    recomputation, the largest unit rebuilt during backward (dense and MoE layers differ): a layer of the model's
    code, ``sublayers`` of the spec's layers (LongCat-Flash's two)."""
    held = saved_for_backward(model, tokens, recompute).bytes
    if recompute != "full":
        return held
    spec, unit = model.spec, model.spec.sublayers
    kinds = {tuple(spec.is_moe_layer(i) for i in range(start, start + unit)): start
             for start in range(0, spec.num_layers, unit)}  # fmt: skip
    return held + max(saved_for_backward(model, tokens, layer=i, end=i + unit).bytes for i in kinds.values())


CUDA_CHECK_SEQ = 1024  # row 4's sequence when --seq is longer: the check is about the timeline, not scale
CUDA_MODEL_FRACTION = 0.25  # a model whose bf16-pure AdamW states exceed this share of the GPU is cut


class MemoryCounters(Protocol):
    """What ``step_memory`` reads: bytes live now, the most since the last reset, and the reset."""

    def allocated(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class AllocatorStats:
    """Bytes the CUDA caching allocator has handed out: now, and at most since the last reset.

    ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` count tensors only: not the CUDA context,
    not cached-but-free blocks. Each read synchronises first, so queued kernels have run.
    """

    def __init__(self, device: str | torch.device = "cuda"):
        self.device = torch.device(device)

    def allocated(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)


class StorageTracker(TorchDispatchMode):
    """The CPU's stand-in for the CUDA allocator's counters: bytes of live storages, each counted from
    the operator that made it until PyTorch frees it (a weak reference's callback on the storage).

    ``resident`` tensors (weights, optimizer states) are counted from the start. The same idea as
    ``torch.distributed._tools.mem_tracker.MemTracker``, reduced to the counters ``step_memory`` reads.
    Enter the mode around the step; only tensors on ``device`` count.
    """

    def __init__(self, resident: list[torch.Tensor], device: str | torch.device = "cpu"):
        super().__init__()
        self.device = torch.device(device)
        self.live = self.high = 0
        self._refs: dict[int, weakref.ref] = {}
        for tensor in resident:
            self._track(tensor.untyped_storage())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = self.run(func, args, kwargs or {})
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device == self.device:
                self._track(tensor.untyped_storage())
        return out

    def run(self, func, args: tuple, kwargs: dict):
        """The operator itself; what it makes inside this handler is not dispatched here (a test harness runs bf16
        products in fp32 this way: tests/test_grads_lifetime.py)."""
        return func(*args, **kwargs)

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key in self._refs and self._refs[key]() is storage:
            return  # counted already: a view, or an in-place result
        size = storage.nbytes()
        self._refs[key] = weakref.ref(storage, functools.partial(self._free, size))
        self.live += size
        self.high = max(self.high, self.live)

    def _free(self, size: int, _storage: weakref.ref) -> None:
        self.live -= size

    def allocated(self) -> int:
        return self.live

    def peak(self) -> int:
        return self.high

    def reset_peak(self) -> None:
        self.high = self.live


@dataclass(frozen=True)
class StepMemory:
    """What the allocator reported around one AdamW step whose optimizer states already exist."""

    weights: int  # Σ bytes of the parameters
    optimizer_states: int  # Σ bytes of the optimizer's state tensors on the device
    buffers: int  # Σ bytes of the module's buffers (rotary tables, causal mask): not model state
    baseline: int  # allocated before the step: weights + states + buffers + workspaces
    after_forward: int  # allocated once the loss is computed: + tensors saved for backward
    peak_forward: int
    peak_backward: int
    after_backward: int  # + gradients
    peak_optimizer: int
    workspaces: int = 0  # allocated before the model existed: cuBLAS's workspaces on CUDA (cuda_workspaces)

    @property
    def outside_model(self) -> int:
        """Bytes in every figure that are not model state: the module's buffers and cuBLAS's workspaces."""
        return self.buffers + self.workspaces

    @property
    def activations(self) -> int:
        return self.after_forward - self.baseline

    @property
    def gradients(self) -> int:
        return self.after_backward - self.baseline

    @property
    def peak(self) -> int:
        return max(self.peak_forward, self.peak_backward, self.peak_optimizer)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor]:
    """The optimizer's per-element state tensors on ``device``, without scalar step counters."""
    return [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.device == device and value.dim() > 0
    ]


def cuda_workspaces(device: str | torch.device = "cuda") -> int:
    """Bytes the CUDA allocator holds before any model exists, once cuBLAS has made its workspaces.

    cuBLAS takes a workspace per handle from PyTorch's allocator (32 MiB each on Hopper), one for the
    main thread and one for autograd's backward thread, so ``memory_allocated`` counts them in every
    figure of a step. A tiny matmul, forward and backward, makes both; what is then allocated is not
    model state, and is taken off the measured figures with the module's buffers."""
    device = torch.device(device)
    x = torch.ones(64, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    (x @ x).sum().backward()
    del x
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def step_memory(
    model: ReferenceModel,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    recompute: Recompute,
    stats: MemoryCounters,
) -> StepMemory:
    """One training step with the allocator read between its phases: forward, backward, optimizer. Bytes
    allocated before the model was built (cuBLAS's workspaces, ``cuda_workspaces``) are in every figure; the
    caller who measured them sets ``StepMemory.workspaces`` (0 here), as ``measured_step`` does."""
    device = tokens.device
    baseline = stats.allocated()
    stats.reset_peak()
    value = loss(model, tokens, recompute)
    after_forward, peak_forward = stats.allocated(), stats.peak()
    stats.reset_peak()
    value.backward()
    after_backward, peak_backward = stats.allocated(), stats.peak()
    stats.reset_peak()
    optimizer.step()
    peak_optimizer = stats.peak()
    optimizer.zero_grad(set_to_none=True)
    return StepMemory(
        weights=tensor_bytes(model.parameters()),
        buffers=tensor_bytes(model.buffers()),
        optimizer_states=tensor_bytes(optimizer_state_tensors(optimizer, device)),
        baseline=baseline,
        after_forward=after_forward,
        peak_forward=peak_forward,
        peak_backward=peak_backward,
        after_backward=after_backward,
        peak_optimizer=peak_optimizer,
    )


def tracked_step(
    model: ReferenceModel, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, recompute: Recompute
) -> StepMemory:
    """``step_memory`` on a device without allocator statistics: every live storage counted by a
    ``StorageTracker`` that starts from the weights, the buffers and the optimizer's states."""
    states = optimizer_state_tensors(optimizer, tokens.device)
    with StorageTracker([*model.parameters(), *model.buffers(), *states], tokens.device) as tracker:
        return step_memory(model, optimizer, tokens, recompute, tracker)


def step_parts(predicted: StepPeak, measured: StepMemory) -> list[tuple[str, str, float, float, str]]:
    """(key, what, engine, measured, when it is read) for each part of a step's peak, the measured figures
    less what is not model state (``StepMemory.outside_model``): what a difference in the peak is made of."""
    outside = measured.outside_model
    states = predicted.weights + predicted.optimizer_states
    return [
        ("states", "weights + optimizer states", states, measured.baseline - outside, "before the step"),
        (
            "activations",
            "activations saved by the forward pass",
            predicted.activations,
            measured.activations,
            "after the forward − before the step",
        ),
        ("gradients", "gradients", predicted.gradients, measured.gradients, "after the backward − before"),
        (
            "backward",
            "peak of the backward pass",
            predicted.backward_peak,
            measured.peak_backward - outside,
            "peak over loss.backward()",
        ),
        (
            "optimizer",
            "peak of optimizer.step()",
            predicted.phases["optimizer_step"],
            measured.peak_optimizer - outside,
            "peak over optimizer.step()",
        ),
    ]


def model_that_fits(spec: ModelSpec, max_params: float) -> ModelSpec:
    """``spec`` if it has at most ``max_params`` parameters; else the same model with fewer layers, every
    tensor at its real shape (an MoE model keeps one dense layer if it had any, and at least one MoE
    layer); else, where even that is too large, its proportions scaled down (``scaled_model``)."""
    from lmcalc.engine.model.params import count_params
    from lmcalc.engine.search.maxparams import scaled_model

    if count_params(spec).total <= max_params:
        return spec
    fewest = 1 + (min(spec.moe.dense_layers, 1) if spec.moe else 0)
    for layers in range(spec.num_layers - 1, fewest - 1, -1):
        update: dict = {"num_layers": layers, "name": f"{spec.name}-{layers}-layers", "published_params": None}
        if spec.moe:
            update["moe"] = spec.moe.model_copy(update={"dense_layers": min(spec.moe.dense_layers, layers - 1)})
        cut = spec.model_copy(update=update)
        if spec.moe and not cut.moe_layers:
            continue
        if count_params(cut).total <= max_params:
            return cut
    return scaled_model(spec, max_params)


def measured_step(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int = 1,
    recompute: Recompute = "none",
    device: str = "cpu",
    attention: Attention = "flash",
) -> tuple[StepPeak, StepMemory, str]:
    """The engine's phase-by-phase peak of a plain AdamW step, one real step measured beside it, and
    what ran (model, dtype, shape).

    * ``cuda``: the model in bf16 with AdamW states in bf16 (the ``bf16-pure`` recipe: what plain
      PyTorch does with a bf16 model), read by the allocator's counters (``AllocatorStats``). A model
      whose states would take more than a quarter of the GPU is cut (``model_that_fits``).
    * ``cpu``: fp32, every live storage counted by ``StorageTracker``; dropout masks are floats there.

    Fused attention unless ``attention`` says eager, and ``torch.optim.AdamW(foreach=True)`` (its
    default on a GPU), on both. One step runs first, so that AdamW's states exist; the next is measured.
    """
    from lmcalc.engine.parallel.states import bytes_per_param, optimizer_bytes_per_param
    from lmcalc.errors import LmcalcError, setting
    from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision

    cuda = device == "cuda"
    precision = resolve_precision("bf16-pure" if cuda else "fp32").spec
    adamw = resolve_optimizer("adamw").spec
    if cuda:
        capacity = torch.cuda.get_device_properties(0).total_memory
        per_param = bytes_per_param(precision, optimizer_bytes_per_param(spec, precision, adamw), 0, 1)
        spec = model_that_fits(spec, CUDA_MODEL_FRACTION * capacity / per_param)
    seq = min(seq_len, spec.max_seq_len)
    mask_bytes = dropout_mask_bytes(device, precision)
    predicted = plain_step_peak(
        Workload(
            spec, precision, adamw, seq, micro_batch, attention, recompute, mask_bytes, framework=framework_profile()
        )
    )
    if cuda and predicted.peak > 0.9 * capacity:
        raise LmcalcError(
            f"row 4 would need about {predicted.peak / 1e9:.0f} GB of the GPU's {capacity / 1e9:.0f} GB at "
            f"s={seq}, b={micro_batch}; try a shorter {setting('seq')} or a smaller {setting('micro_batch')}"
        )
    workspaces = cuda_workspaces(device) if cuda else 0
    torch.manual_seed(0)
    model = build(spec, attention, seq, device, torch.bfloat16 if cuda else torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    tokens = torch.randint(0, spec.vocab_size, (micro_batch, seq), device=device)
    loss(model, tokens, recompute).backward()  # the first step makes AdamW's states
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if cuda:
        measured = replace(
            step_memory(model, optimizer, tokens, recompute, AllocatorStats(device)), workspaces=workspaces
        )
    else:
        measured = tracked_step(model, optimizer, tokens, recompute)
    detail = f"{spec.name}, {'bf16' if cuda else 'fp32'}, s={seq}, b={micro_batch}, recompute {recompute}"
    detail += ", eager attention" if attention == "eager" else ""
    return predicted, measured, detail
