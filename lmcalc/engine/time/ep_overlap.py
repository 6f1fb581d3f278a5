"""Megatron-Core's expert all-to-all overlap (``--overlap-moe-expert-parallel-comm``, lmcalc's ``moe_a2a_overlap``):
the combined 1F1B schedule, as NVIDIA/Megatron-LM runs it (megatron/core/pipeline_parallel/combined_1f1b.py,
megatron/core/models/common/model_chunk_schedule_plan.py; docs/formulas.md §8.18).

The schedule runs one micro-batch's forward pass beside another's backward pass, layer by layer: the forward of
layer j of micro-batch i + 1 with the backward of a layer of micro-batch i. The all-to-alls run on a stream of their
own, and each MoE layer's pair runs in three phases, each waiting for both streams:

====================  ======================================  ==============================================
phase                 compute stream                          all-to-all stream
====================  ======================================  ==============================================
1                     the forward's attention, norm, router,  the backward's combine
                      shared experts and permutation
2                     the backward's routed experts (input    the forward's dispatch, then the backward's
                      and weight gradients), then the         dispatch
                      forward's routed experts
3                     the backward's attention side           the forward's combine
====================  ======================================  ==============================================

so a pair of MoE layers leaves max(0, a − F_o) + max(0, 2a − E_f − E_b) + max(0, a − B_o) of its all-to-alls
exposed, where a is one all-to-all of the layer's routed tokens, F_o and B_o the layer's forward and backward work
outside the routed experts, E_f and E_b the routed experts' (``paired_exposure``; ``microbatch.moe_phases`` times
the four). The passes no other pass runs beside, the first forward and the last backward of each stage's step, leave
theirs exposed whole (``unpaired_micro_batches``). What the overlap costs the computation (the SMs and the memory
bandwidth the communication kernels take) is not modelled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import StageWork, routed_names
from lmcalc.specs import ModelSpec

MOE_LAYER = StageLayers(0, 1, False, False)


class MoePhases(NamedTuple):
    """One MoE layer's GPU time for one micro-batch, as the overlap's phases split it: outside the routed experts
    (attention, norms, router, shared experts, permutation) forward and backward, and the routed experts'."""

    outer_forward: float
    outer_backward: float
    experts_forward: float
    experts_backward: float  # input and weight gradients

    @classmethod
    def of(cls, forward: float, total: float, experts_forward: float, experts_backward: float) -> MoePhases:
        """From the layer's forward and whole time and its routed experts' forward and backward."""
        return cls(forward - experts_forward, total - forward - experts_backward, experts_forward, experts_backward)


def routed_work(model: ModelSpec, work: StageWork) -> StageWork:
    """Of one MoE layer's work (``stage_work``), its routed experts' GEMMs alone: what ``moe_phases`` times apart."""
    routed = routed_names(model)
    return replace(
        work,
        gemms=tuple(g for g in work.gemms if g.name in routed),
        head=(),
        batched=(),
        attention_forward=0.0,
        attention_backward=0.0,
        attention_recomputed=0.0,
        scan_forward=0.0,
        scan_backward=0.0,
        scan_recomputed=0.0,
        scan_layers=0.0,
        memory_forward=0.0,
        memory_backward=0.0,
        memory_kernels=0.0,
        accumulation_bytes=0.0,
        fp8_cast_bytes=0.0,
    )


def forward_share(work: StageWork) -> float:
    """The share of a unit's memory-bound kernel time its forward pass takes, by the bytes each moves."""
    moved = work.memory_forward + work.memory_backward + work.accumulation_bytes + work.fp8_cast_bytes
    return work.memory_forward / moved if moved else 0.0


def paired_exposure(phases: MoePhases, a2a: float) -> float:
    """Seconds of one MoE layer's all-to-alls (``a2a``: one of them) the paired forward and backward leave exposed:
    in each of the three phases, the longer of the two streams, less the computation."""
    p = phases
    return (
        max(0.0, a2a - p.outer_forward)
        + max(0.0, 2 * a2a - p.experts_forward - p.experts_backward)
        + max(0.0, a2a - p.outer_backward)
    )


def unpaired_micro_batches(layout: Layout, stage: int) -> float:
    """How many micro-batches' worth of a stage's forward and backward passes run unpaired in a step, their
    all-to-alls exposed whole. Without pipeline stages, the first micro-batch's forward and the last one's backward:
    one micro-batch's worth (combined_1f1b_schedule_for_no_pipelining). With interleaved stages, the warm-up's
    forward chunks and as many backward chunks in the cool-down, over v chunks a micro-batch: warm-up chunks
    (p − rank − 1)·2 + (v − 1)·p + 1, the 1 the overlap adds, at most m·v (schedules.py,
    get_pp_rank_microbatches; microbatch_group_size_per_vp_stage = p, its default)."""
    p, v, m = layout.pp, layout.split.chunks, layout.grad_accum
    if p == 1:
        return 1.0
    warmup = min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1)
    return warmup / v
