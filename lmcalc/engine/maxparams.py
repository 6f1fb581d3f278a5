"""The largest model whose training state fits a set of GPUs, for each ZeRO sharding strategy.

With B bytes of model state per parameter on each GPU and C bytes of memory, the largest model is
N = C / B (the lecture's napkin: 80 GB / 16 bytes = 5B per GPU, 8 × 80 GB / 16 = 40B fully sharded).
ZeRO changes B: with data-parallel degree n, ZeRO-1 keeps 2 + 2 + 12/n bytes per parameter, ZeRO-2
2 + 14/n, ZeRO-3 16/n (Rajbhandari et al. 2020 §5.1, mixed-precision Adam).

Activations do not shrink with ZeRO and depend on the model's shape, not only on N. To include them,
lmcalc scales a template architecture (by default the Llama 3 8B preset: its head size, KV heads,
FFN ratio, vocabulary and hidden-size-to-layers ratio) to N parameters and counts that shape's
activations. The shape used is reported, so the assumption is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.gpu_memory import gpu_memory
from lmcalc.engine.layout import Layout
from lmcalc.engine.params import count_params
from lmcalc.engine.states import bytes_per_param, optimizer_bytes_per_param
from lmcalc.engine.workload import Workload
from lmcalc.specs import Cluster, ModelSpec

STRATEGIES: tuple[tuple[ZeroStage, str], ...] = (
    (0, "Data parallel (replicated)"),
    (1, "ZeRO-1"),
    (2, "ZeRO-2"),
    (3, "ZeRO-3 / FSDP"),
)


def scaled_model(template: ModelSpec, n_params: float) -> ModelSpec:
    """``template`` resized to about ``n_params`` parameters, keeping its proportions: head size, query
    heads per KV head, FFN-to-hidden and hidden-to-layers ratios. It grows by whole KV groups."""
    head = template.head_size
    aspect = template.hidden_size / template.num_layers
    ffn_ratio = template.ffn_size / template.hidden_size
    group_size = template.num_heads // template.kv_heads

    def shape(kv_groups: int) -> ModelSpec:
        heads, kv = kv_groups * group_size, kv_groups
        h = heads * head
        return template.model_copy(
            update={
                "name": f"{template.name}-scaled",
                "display_name": "",
                "hidden_size": h,
                "num_heads": heads,
                "num_kv_heads": kv,
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

    lo, hi = 1, 1
    while count_params(shape(hi)).total < n_params and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_params(shape(mid)).total < n_params:
            lo = mid
        else:
            hi = mid
    return min((shape(lo), shape(hi)), key=lambda m: abs(count_params(m).total - n_params))


@dataclass(frozen=True)
class MaxParamsRow:
    zero_stage: int
    label: str
    bytes_per_param: float
    states_only: float
    with_overhead: float
    with_activations: float
    activation_shape: ModelSpec | None
    activation_bytes: float


def max_params(template: Workload, cluster: Cluster) -> list[MaxParamsRow]:
    """One row per sharding strategy over the cluster's GPUs: N that fits with states only, + overhead, +
    activations of ``template``'s model scaled to N (at its sequence, micro-batch, attention, recomputation)."""
    capacity_bytes, dp, overhead_bytes = cluster.hardware.memory_bytes, cluster.count, template.overhead_bytes
    precision = template.precision
    opt_bpp = optimizer_bytes_per_param(template.model, precision, template.optimizer)
    rows = []
    for stage, label in STRATEGIES:
        bpp = bytes_per_param(precision, opt_bpp, stage, dp)
        states_only = capacity_bytes / bpp
        with_overhead = max(0.0, capacity_bytes - overhead_bytes) / bpp

        def activations(n: float) -> tuple[float, ModelSpec]:
            model = scaled_model(template.model, n)
            return gpu_memory(replace(template, model=model), Layout(), 0).activations, model

        lo, hi = 0.0, with_overhead
        for _ in range(60):  # bisection: states + activations grow with N
            mid = (lo + hi) / 2
            if mid * bpp + activations(mid)[0] + overhead_bytes <= capacity_bytes:
                lo = mid
            else:
                hi = mid
        act_bytes, shape = activations(lo) if lo > 0 else (0.0, None)
        rows.append(MaxParamsRow(stage, label, bpp, states_only, with_overhead, lo, shape, act_bytes))
    return rows
