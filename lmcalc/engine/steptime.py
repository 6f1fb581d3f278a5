"""Time of one training step for a layout: compute, exposed communication and the pipeline bubble.

Compute is the step's hardware FLOPs (model FLOPs in the full-attention convention, plus what
recomputation redoes) at a fraction of the dense peak. With pipeline parallelism, every stage waits for
the slowest, so each stage is timed with its own share of the work, its own layers' communication and its
own parameters' data-parallel traffic, and the longest sets the step: often the stage with the most
layers, or the last when the logits outweigh a layer (a large vocabulary). Communication follows
``engine.comm``; what overlaps with compute and what does not is an assumption, stated per term:

* TP: 2 collectives per layer forward (after attention and after the MLP) and 2 backward, each moving
  one activation tensor s·b·h (all-reduce, or all-gather + reduce-scatter with sequence parallelism, the
  same volume); full recomputation repeats the forward ones. Exposed (Korthikanti et al. 2022 §3).
* EP: an all-to-all to dispatch and one to combine the routed tokens, forward and backward. Exposed.
* CP: K and V pass around the CP group (Llama 3 gathers them); counted as exposed, since the
  exchange only partly hides behind the attention it feeds.
* PP: the 1F1B bubble (p − 1)/m of the ideal time, divided by v with the interleaved schedule
  (Narayanan et al. 2021 §2.2), and one activation sent between stages per micro-batch each way.
* DP: the gradient all-reduce (reduce-scatter under ZeRO-2/3) overlaps the last micro-batch's
  backward pass; under ZeRO-1/2 the all-gather of the updated parameters overlaps the next step's first
  forward pass, layer by layer (Megatron-LM's --overlap-param-gather, FSDP's SHARD_GRAD_OP prefetch);
  ZeRO-3 gathers each layer's parameters forward and backward, overlapped with that micro-batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lmcalc.engine import flops as fl
from lmcalc.engine.comm import Collective, collective_time, link_for
from lmcalc.engine.layout import Layout
from lmcalc.engine.pipeline import StageLayers, distinct_stages, stage_layers
from lmcalc.engine.sharding import stage_params, stage_part, zero_shards
from lmcalc.engine.workload import Workload
from lmcalc.specs import Cluster

DEFAULT_COMPUTE_EFFICIENCY = 0.6
"""Fraction of the dense peak a whole training step's compute reaches (matmuls at realistic shapes plus
the memory-bound kernels between them): an assumption calibrated on published runs (docs/plan-accuracy.md).
Large matmuls alone reach 0.80 of peak on H100 and 0.87 on A100 (stas00 maximum-achievable-matmul tables);
use ``lmcalc bench`` figures or ``--efficiency`` to override."""


@dataclass(frozen=True)
class StepTime:
    slowest_stage: int  # the pipeline stage whose step is longest, which sets the pace
    stage_flops: float  # that stage's hardware FLOPs per step, over all its GPUs
    compute: float
    tp: float
    ep: float
    cp: float
    pp_p2p: float
    bubble: float
    dp: float
    zero: float
    model_flops: float  # per step, whole cluster
    hardware_flops: float
    tokens: float
    gpus: int
    peak: float
    efficiency: float  # the fraction of peak the compute is assumed to reach

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.ep + self.cp + self.pp_p2p + self.bubble + self.dp + self.zero

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.total * self.gpus * self.peak)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.total * self.gpus * self.peak)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total


@functools.lru_cache(maxsize=1 << 14)
def stage_step_flops(w: Workload, built: StageLayers) -> fl.StepFlops:
    """FLOPs per token of a stage that builds ``built``: its share of the weights, its layers' attention (counted
    in full, as model FLOPs are), the logits on the last stage, and what recomputation redoes."""
    return fl.step_flops(w.model, w.seq_len, w.recompute, "full", stage_part(w.model, built))


@functools.lru_cache(maxsize=1024)
def _whole_step_flops(w: Workload) -> fl.StepFlops:
    return fl.step_flops(w.model, w.seq_len, w.recompute, "full")


def step_time(
    w: Workload, layout: Layout, cluster: Cluster, efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
) -> StepTime:
    """Seconds per step, with the parts it is made of, as the slowest pipeline stage lives it: every distinct
    stage (``distinct_stages``) is timed with its own work, layers and parameters, and the pipeline waits for
    the longest."""
    hardware, gpus_per_node, precision, model = cluster.hardware, cluster.gpus_per_node, w.precision, w.model
    t, p, c, d, m = layout.tp, layout.pp, layout.cp, layout.dp, layout.grad_accum
    gpus = layout.gpus
    peak = hardware.peak_flops(precision.compute_dtype)
    act = precision.activation_bytes
    tokens = d * m * w.micro_batch * w.seq_len
    whole = _whole_step_flops(w)
    model_flops = whole.model * tokens
    hardware_flops = model_flops + whole.recomputed * tokens
    activation = w.seq_len * w.micro_batch * model.hidden_size * act / c
    tp_link = link_for(hardware, t, gpus_per_node)
    collectives = 4 + (2 if w.recompute == "full" else 0)
    tp_per_layer = collectives * collective_time("all-reduce", activation, t, tp_link)
    ep_per_moe_layer = 0.0
    if model.moe and layout.ep > 1:
        routed = model.moe.experts_per_token * activation / (t if layout.sequence_parallel else 1)
        ep_per_moe_layer = 4 * collective_time(
            "all-to-all", routed, layout.ep, link_for(hardware, layout.ep * t * c, gpus_per_node)
        )
    cp_per_layer = 0.0
    if c > 1:
        kv_chunk = 2 * w.seq_len / c * w.micro_batch * model.kv_heads * model.qk_head_dim * act / t
        cp_link = link_for(hardware, c * t, gpus_per_node)
        cp_per_layer = 3 * (c - 1) * collective_time("p2p", kv_chunk, 2, cp_link)  # forward once, backward twice
    pp_p2p = 0.0
    if p > 1:
        pp_link = link_for(hardware, t * c * d * p, gpus_per_node)
        pp_p2p = m * 2 * collective_time("p2p", activation / (t if layout.sequence_parallel else 1), 2, pp_link)
    virtual = layout.split.chunks
    replicas = layout.data_replicas
    dp_link = link_for(hardware, t * c * d, gpus_per_node)

    def stage_time(stage: int) -> StepTime:
        """The step as ``stage`` lives it; the pipeline waits for the slowest."""
        built = stage_layers(model, layout, stage)
        flops = stage_step_flops(w, built)
        forward, work = flops.forward.total, flops.hardware
        compute = work * tokens / (gpus / p * peak * efficiency)
        per_micro_batch = compute / m
        tp_time = m * built.layers * tp_per_layer
        ep_time = m * built.moe * ep_per_moe_layer
        cp_time = m * built.layers * cp_per_layer
        bubble = (p - 1) / (virtual * m) * (compute + tp_time + ep_time + cp_time) if p > 1 else 0.0
        params = stage_params(w, layout, stage).total
        dp_time = zero_time = 0.0
        if replicas > 1:
            if zero_shards("params", layout.zero):  # every layer's parameters gathered, its gradients scattered
                gather = collective_time("all-gather", params * precision.param_bytes, replicas, dp_link)
                scatter = collective_time("reduce-scatter", params * precision.grad_bytes, replicas, dp_link)
                zero_time = m * max(0.0, 2 * gather + scatter - per_micro_batch)
            else:
                op: Collective = "reduce-scatter" if zero_shards("grads", layout.zero) else "all-reduce"
                reduce = collective_time(op, params * precision.grad_bytes, replicas, dp_link)
                dp_time = max(0.0, reduce - (work - forward) / work * per_micro_batch)  # its last backward
                if zero_shards("optimizer", layout.zero):  # the updated shards, gathered during the next forward
                    gather = collective_time("all-gather", params * precision.param_bytes, replicas, dp_link)
                    zero_time = max(0.0, gather - forward / work * per_micro_batch)
        return StepTime(
            stage,
            work * tokens,
            compute,
            tp_time,
            ep_time,
            cp_time,
            pp_p2p,
            bubble,
            dp_time,
            zero_time,
            model_flops,
            hardware_flops,
            tokens,
            gpus,
            peak,
            efficiency,
        )

    return max((stage_time(stage) for stage in distinct_stages(model, layout)), key=lambda st: st.total)
