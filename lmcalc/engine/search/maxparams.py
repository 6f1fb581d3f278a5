"""The largest model whose training state fits a set of GPUs, for each ZeRO sharding strategy.

With B bytes of model state per parameter on each GPU and C bytes of memory, the largest model is
N = C / B (the lecture's napkin: 80 GB / 16 bytes = 5B per GPU, 8 × 80 GB / 16 = 40B fully sharded).
ZeRO changes B: with data-parallel degree n, ZeRO-1 keeps 2 + 2 + 12/n bytes per parameter, ZeRO-2
2 + 14/n, ZeRO-3 16/n (Rajbhandari et al. 2020 §5.1, mixed-precision Adam).

Activations do not shrink with ZeRO and depend on the model's shape, not only on N. To include them,
lmcalc scales a template architecture (by default the Llama 3 8B preset: its head size, KV heads,
FFN ratio, vocabulary and hidden-size-to-layers ratio) by whole KV groups and asks the memory engine
(``gpu_memory``, the figure ``lmcalc memory`` prints, with the framework profile's buffers, transients and
fragmentation) whether each shape fits: the largest that does is the answer, never a shape rounded up past
it. The shape used is reported, so the assumption is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.memory.gpu_memory import GpuMemory, gpu_memory
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout, framework_runs
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


def _largest_groups(fits: Callable[[int], bool]) -> int:
    """The most KV groups for which ``fits`` holds (0: not even one), by doubling then bisection."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def scaled_model(template: ModelSpec, n_params: float) -> ModelSpec:
    """``template`` resized to about ``n_params`` parameters (``scaled_shape``): it grows by whole KV groups."""
    below = _largest_groups(lambda groups: count_params(scaled_shape(template, groups)).total < n_params)
    shapes = [scaled_shape(template, groups) for groups in (max(1, below), below + 1)]
    return min(shapes, key=lambda m: abs(count_params(m).total - n_params))


@dataclass(frozen=True)
class MaxParamsRow:
    zero_stage: int
    label: str
    bytes_per_param: float  # model-state bytes per parameter on one GPU, as the framework keeps them
    fixed_bytes: float  # what does not grow with the model: the CUDA context, workspaces, the flat allowance
    states_only: float
    with_overhead: float
    with_activations: float  # the parameters of the largest shape whose whole memory fits (``memory``'s figure)
    activation_shape: ModelSpec | None
    activation_bytes: float
    memory: GpuMemory | None  # that shape's memory, as ``memory`` gives it
    framework: str = ""  # the framework profile it was costed under


def max_params(
    template: Workload, cluster: Cluster, runs: Callable[[ZeroStage], Workload] | None = None
) -> list[MaxParamsRow]:
    """One row per sharding strategy over the cluster's GPUs (DP over all of them): the napkin N that fits with
    the model states only, and with the fixed bytes; and the largest shape of ``template``'s proportions whose
    memory, counted by ``gpu_memory`` as ``lmcalc memory`` counts it (activations, buffers, transients,
    fragmentation), fits. The shape is never rounded up: its exact parameter count is the answer. ``runs``: each
    stage's workload, where the stage chooses the framework (``MaxParamsRow.framework``); a stage the framework
    does not run is left out."""
    rows = []
    for stage, label in STRATEGIES:
        stage_template = runs(stage) if runs else template
        if not framework_runs(stage_template, stage, 1):
            continue  # a stage its framework does not run
        rows.append(_largest(stage_template, cluster, stage, label))
    return rows


def _largest(template: Workload, cluster: Cluster, stage: ZeroStage, label: str) -> MaxParamsRow:
    """The row of one ZeRO stage (``max_params``)."""
    capacity = cluster.hardware.memory_bytes
    layout = Layout(dp=cluster.count, zero=stage)
    reference = gpu_memory(template, layout, 0)
    bpp = reference.states / count_params(template.model).total
    fixed = reference.context + reference.overhead + template.framework.buffers.workspace_bytes

    def memory_of(groups: int, layout: Layout = layout) -> GpuMemory:
        return gpu_memory(replace(template, model=scaled_shape(template.model, groups)), layout, 0)

    def fits(groups: int, memory_of: Callable[[int], GpuMemory] = memory_of) -> bool:
        return memory_of(groups).total <= capacity

    groups = _largest_groups(fits)
    shape = scaled_shape(template.model, groups) if groups else None
    memory = memory_of(groups) if groups else None
    return MaxParamsRow(
        stage,
        label,
        bpp,
        fixed,
        capacity / bpp,
        max(0.0, capacity - fixed) / bpp,
        float(count_params(shape).total) if shape else 0.0,
        shape,
        memory.activations if memory else 0.0,
        memory,
        template.framework.name,
    )
