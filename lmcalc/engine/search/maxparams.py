"""The largest model whose training state fits a set of GPUs, for each ZeRO sharding strategy.

With B bytes of model state per parameter on each GPU and C bytes of memory, the largest model is
N = C / B (the lecture's napkin: 80 GB / 16 bytes = 5B per GPU, 8 × 80 GB / 16 = 40B fully sharded).
ZeRO changes B: with data-parallel degree n, ZeRO-1 keeps 2 + 2 + 12/n bytes per parameter, ZeRO-2
2 + 14/n, ZeRO-3 16/n (Rajbhandari et al. 2020 §5.1, mixed-precision Adam).

Activations do not shrink with ZeRO and depend on the model's shape, not only on N. To include them,
lmcalc scales a template architecture (by default the Llama 3 8B preset: its head size, KV heads,
FFN ratio, vocabulary and hidden-size-to-layers ratio) by whole KV groups and asks the memory engine
(``gpu_memory``, the figure ``lmcalc memory`` prints, with the framework profile's buffers, transients and
fragmentation) whether each shape fits. Those shapes are coarse (Llama 3 8B's proportions go from 14.95B to 19.59B
in one KV group), so the depth is then solved to the layer: at the width of the widest shape that fits, layers are
added while the whole still fits. A layer adds (nearly) the same bytes each time, its states, activations and buffers,
so the memory is M(L) = M(L_g) + (L − L_g)·m and the answer is L_g + ⌊(C − M(L_g)) / m⌋ layers; the engine's own total
is what decides, so the answer is a shape that fits, never one rounded up. The shape used is reported, so the
assumption is visible.

With the optimizer and the weights offloaded (``optimizer+params``), the GPU keeps no state per parameter: no
states-only limit exists on the GPU (the host's memory holds them, which lmcalc does not know), and only ZeRO-3 runs
it (``check_offload``): only that row is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.memory.gpu_memory import GpuMemory, gpu_memory
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import framework_runs
from lmcalc.engine.workload import Workload
from lmcalc.specs import Cluster, ModelSpec

STRATEGIES: tuple[tuple[ZeroStage, str], ...] = (
    (0, "Data parallel (replicated)"),
    (1, "ZeRO-1"),
    (2, "ZeRO-2"),
    (3, "ZeRO-3 / FSDP"),
)


def scaled_shape(template: ModelSpec, kv_groups: int) -> ModelSpec:
    """``template`` with ``kv_groups`` KV groups, keeping its proportions: head size, query heads per KV head,
    FFN-to-hidden and hidden-to-layers ratios."""
    head = template.head_size
    aspect = template.hidden_size / template.num_layers
    ffn_ratio = template.ffn_size / template.hidden_size
    heads = kv_groups * (template.num_heads // template.kv_heads)
    h = heads * head
    return template.model_copy(
        update={
            "name": f"{template.name}-scaled",
            "display_name": "",
            "hidden_size": h,
            "num_heads": heads,
            "num_kv_heads": kv_groups,
            "head_dim": head,
            "num_layers": max(1, round(h / aspect)),
            "ffn_size": max(1, round(ffn_ratio * h)),
            "published_params": None,
            "family_aliases": [],
            "aliases": [],
            "moe": None,
            "mla": None,
        }
    )


def _largest_whole(fits: Callable[[int], bool], lowest: int = 1) -> int:
    """The largest whole number n ≥ ``lowest`` for which ``fits`` holds (``lowest`` − 1: not even that), by doubling
    then bisection; ``fits`` must hold up to some n and not beyond."""
    if not fits(lowest):
        return lowest - 1
    lo, hi = lowest, 2 * lowest
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def with_layers(shape: ModelSpec, layers: int) -> ModelSpec:
    """``shape`` with ``layers`` layers of the same width."""
    return shape.model_copy(update={"num_layers": layers})


def scaled_model(template: ModelSpec, n_params: float) -> ModelSpec:
    """``template`` resized to about ``n_params`` parameters (``scaled_shape``): it grows by whole KV groups."""
    below = _largest_whole(lambda groups: count_params(scaled_shape(template, groups)).total < n_params)
    shapes = [scaled_shape(template, groups) for groups in (max(1, below), below + 1)]
    return min(shapes, key=lambda m: abs(count_params(m).total - n_params))


@dataclass(frozen=True)
class Solved:
    """The largest shape whose whole memory fits: the widest of the template's proportions that fits (``rung``,
    ``rung_layers`` deep, with ``rung_memory``), then as many layers as fit at its width (``shape``, ``memory``).
    ``layer_bytes``, m, is what one layer adds at that width, and ``beyond`` the memory with one layer more: the
    answer's L satisfies M(L) ≤ C < M(L + 1)."""

    shape: ModelSpec
    memory: GpuMemory
    rung_layers: int
    rung_params: float
    rung_memory: float
    layer_bytes: float
    beyond: float

    @property
    def params(self) -> float:
        return float(count_params(self.shape).total)

    @property
    def added_layers(self) -> int:
        return self.shape.num_layers - self.rung_layers


@dataclass(frozen=True)
class MaxParamsRow:
    zero_stage: ZeroStage
    label: str
    bytes_per_param: float  # model-state bytes per parameter on one GPU, as the framework keeps them
    fixed_bytes: float  # what does not grow with the model: the CUDA context, workspaces, the flat allowance
    states_only: float  # C / bytes per parameter: infinite where the GPU keeps no state (everything offloaded)
    with_overhead: float
    with_activations: float  # the parameters of the largest shape whose whole memory fits (``memory``'s figure)
    activation_shape: ModelSpec | None
    activation_bytes: float
    memory: GpuMemory | None  # that shape's memory, as ``memory`` gives it
    framework: str = ""  # the framework profile it was costed under
    solved: Solved | None = None  # how the shape was found: its rung, and the layers added at the rung's width

    def __repr__(self) -> str:
        return (
            f"MaxParamsRow(zero_stage={self.zero_stage}, states_only={self.states_only:.4g}, "
            f"with_overhead={self.with_overhead:.4g}, with_activations={self.with_activations:.4g}, "
            f"shape={shape_text(self.activation_shape)!r}, framework={self.framework!r})"
        )


def shape_text(shape: ModelSpec | None) -> str:
    """A scaled shape in a line: width, depth, heads, KV heads and FFN size."""
    if shape is None:
        return "nothing fits"
    return (
        f"h={shape.hidden_size}, L={shape.num_layers}, H={shape.num_heads}, H_kv={shape.kv_heads}, f={shape.ffn_size}"
    )


def max_params(
    template: Workload, cluster: Cluster, runs: Callable[[ZeroStage], Workload] | None = None
) -> list[MaxParamsRow]:
    """One row per sharding strategy over the cluster's GPUs (DP over all of them): the napkin N that fits with
    the model states only, and with the fixed bytes; and the largest shape of ``template``'s proportions whose
    memory, counted by ``gpu_memory`` as ``lmcalc memory`` counts it (activations, buffers, transients,
    fragmentation), fits, its depth solved to the layer (``Solved``). The shape is never rounded up: its exact
    parameter count is the answer. ``runs``: each stage's workload, where the stage chooses the framework
    (``MaxParamsRow.framework``); a stage the framework does not run, or the offload does not (parameter offload is
    ZeRO-3's), is left out."""
    rows = []
    for stage, label in STRATEGIES:
        stage_template = runs(stage) if runs else template
        if not framework_runs(stage_template, stage, 1) or (stage_template.offload.params and stage != 3):
            continue
        rows.append(largest(stage_template, cluster, stage, label))
    return rows


def largest(template: Workload, cluster: Cluster, stage: ZeroStage, label: str = "") -> MaxParamsRow:
    """The row of one ZeRO stage (``max_params``)."""
    capacity = cluster.hardware.capacity_bytes
    layout = Layout(dp=cluster.count, zero=stage)
    reference = gpu_memory(template, layout, 0)
    bpp = reference.states / count_params(template.model).total
    fixed = reference.context + reference.overhead + template.framework.buffers.workspace_bytes
    solved = solve_shape(template, layout, capacity)
    per_param = (lambda room: room / bpp) if bpp > 0 else (lambda room: math.inf)  # no state on the GPU: no limit
    return MaxParamsRow(
        stage,
        label,
        bpp,
        fixed,
        per_param(capacity),
        per_param(max(0.0, capacity - fixed)),
        solved.params if solved else 0.0,
        solved.shape if solved else None,
        solved.memory.activations if solved else 0.0,
        solved.memory if solved else None,
        template.framework.name,
        solved,
    )


def solve_shape(template: Workload, layout: Layout, capacity: float) -> Solved | None:
    """The largest shape whose memory fits ``capacity`` (None: not even one KV group in the template's proportions):
    the widest shape of the template's proportions that fits, g KV groups and L_g layers, then at its width the most
    layers L ≥ L_g with M(L) ≤ C."""

    def memory_of(shape: ModelSpec) -> GpuMemory:
        return gpu_memory(replace(template, model=shape), layout, 0)

    groups = _largest_whole(lambda g: memory_of(scaled_shape(template.model, g)).total <= capacity)
    if not groups:
        return None
    rung = scaled_shape(template.model, groups)
    layers = _largest_whole(lambda n: memory_of(with_layers(rung, n)).total <= capacity, rung.num_layers)
    rung_memory = memory_of(rung).total
    shape = with_layers(rung, layers)
    beyond = memory_of(with_layers(rung, layers + 1)).total
    one_more = memory_of(with_layers(rung, rung.num_layers + 1)).total
    return Solved(
        shape,
        memory_of(shape),
        rung.num_layers,
        float(count_params(rung).total),
        rung_memory,
        one_more - rung_memory,
        beyond,
    )
