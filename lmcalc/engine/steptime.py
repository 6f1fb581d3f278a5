"""Time of one training step for a layout, from the kernels up.

A step is ``m`` micro-batches through every pipeline stage, then the gradient reduction and the optimizer. Each
stage is timed with its own work (``engine.kernels.stage_work``), and the pipeline waits for the slowest.

One micro-batch on one GPU:

* **GPU compute**: every GEMM (forward, input gradient, weight gradient, and the forward again under full
  recomputation), fused attention and the memory-bound kernels, each by the roofline of ``engine.rates``.
* **Tensor-parallel collectives**: two activation-sized all-reduces per layer forward (after attention and after
  the MLP; with sequence parallelism an all-gather before and a reduce-scatter after each block, the same bytes)
  and two backward (Korthikanti et al. 2022 §3), two more forward under full recomputation. With sequence
  parallelism the gathered input of each block is not kept, so the backward pass gathers it again for the
  weight gradients: one more all-reduce's worth a layer (Megatron-LM's and nanotron's column-parallel
  backward). What the framework hides: with ``tp_overlap`` backward the backward collectives run behind the
  backward GEMMs (Megatron-LM's asynchronous TP); with full, the forward ones behind the forward GEMMs too.
* **Expert all-to-alls**: dispatch and combine, forward and backward, k copies of each token; with node-limited
  routing (DeepSeek-V3: at most ``node_limit`` nodes per token) a token crosses the network once per node it
  visits, not once per expert. Hidden behind another micro-batch's compute when the profile overlaps them
  (DualPipe).
* **Context parallelism**: K and V pass around the ring, CP − 1 hops forward and twice as many backward,
  overlapped with the attention they feed.
* **The host**: the CPU issues every operation (``SpeedRule.host_seconds_per_op`` each); it runs ahead of the
  GPU, so a micro-batch takes max(GPU time, host time). Small models at high TP are host-bound.

Once per step:

* **Pipeline bubble**: (p − 1)/v micro-batch times (1F1B, Narayanan et al. 2021 §2.2; v chunks interleaved), and
  the activations sent between stages, each way per micro-batch, unless the profile overlaps them.
* **Data parallelism**: the gradients' all-reduce (reduce-scatter under ZeRO-2/3) in the framework's gradient
  dtype, behind the last micro-batch's backward pass when the profile buckets it; ZeRO-1/2's all-gather of the
  updated parameters behind the next forward pass when it prefetches; ZeRO-3 gathers every layer's parameters
  forward and backward and scatters its gradients, behind that micro-batch's compute when it prefetches.
* **The optimizer step and gradient clipping**: memory traffic over this GPU's share of the states: read the
  gradients (twice: the norm for clipping, then the step), read and write the master weights and the optimizer
  states, write the weights; a foreach (multi-tensor) step makes ``FOREACH_PASSES`` passes where a fused one
  makes one.

``efficiency`` replaces the kernel model's compute with the old rule, hardware FLOPs at a fraction of the dense
peak (``--efficiency``, or a measured training step): the rest of the model is unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from lmcalc.engine import flops as fl
from lmcalc.engine import rates
from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.comm import collective_time, group_time, intra_link
from lmcalc.engine.kernels import StageWork, kernel_workload, stage_work
from lmcalc.engine.layout import Layout
from lmcalc.engine.pipeline import PipelineSplit, StageLayers, distinct_stage_layers, split_stage_layers
from lmcalc.engine.sharding import _params_held, stage_part, states_workload, zero_shards
from lmcalc.engine.states import optimizer_bytes_per_param
from lmcalc.engine.workload import Workload
from lmcalc.specs import AttentionKernel, Cluster, HardwareSpec, SpeedRule

FOREACH_PASSES = 3
"""A multi-tensor (foreach) AdamW step runs its update as separate element-wise kernels over the state lists
(lerp, multiply, add-multiply, square root, divide, add: torch/optim/adamw.py ``_multi_tensor_adamw``), about
three reads and writes of the states where a fused kernel makes one; an estimate, not a measurement."""


@dataclass(frozen=True)
class StepTime:
    slowest_stage: int  # the pipeline stage whose step is longest, which sets the pace
    stage_flops: float  # that stage's hardware FLOPs per step, over all its GPUs
    compute: float  # GPU kernel time over the step's micro-batches: gemm + attention + memory
    gemm: float
    attention: float
    memory: float
    host: float  # host time not hidden behind the GPU's
    tp: float
    ep: float
    cp: float
    pp_p2p: float
    bubble: float
    dp: float
    zero: float
    optimizer: float
    model_flops: float  # per step, whole cluster
    hardware_flops: float
    tokens: float
    gpus: int
    peak: float
    efficiency: float | None  # the fraction of peak the compute is assumed to reach; None: timed kernel by kernel
    matmul_rate: float  # the achievable matmul FLOP/s the GEMMs were timed against
    matmul_source: str
    gemm_fraction: float  # the share of it a step's GEMMs sustain (Calibration)

    @property
    def total(self) -> float:
        return self.seconds(
            self.compute,
            self.host,
            self.tp,
            self.ep,
            self.cp,
            self.pp_p2p,
            self.bubble,
            self.dp,
            self.zero,
            self.optimizer,
        )

    @staticmethod
    def seconds(
        compute: float,
        host: float,
        tp: float,
        ep: float,
        cp: float,
        pp_p2p: float,
        bubble: float,
        dp: float,
        zero: float,
        optimizer: float,
    ) -> float:
        """The step's seconds from its parts (``total``; the planner compares stages by it before it builds a
        ``StepTime``)."""
        return compute + host + tp + ep + cp + pp_p2p + bubble + dp + zero + optimizer

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


class ChipRates(NamedTuple):
    """What every step time reports of the chip: its dense peak, the matmul rate its GEMMs are timed against and
    where that comes from, and the share of that rate a step's GEMMs sustain."""

    peak: float
    matmul: float
    matmul_source: str
    gemm_fraction: float


@functools.lru_cache(maxsize=64)
def _chip_rates(hardware: HardwareSpec, dtype: str, calibration: rates.Calibration) -> ChipRates:
    matmul = rates.matmul_rate(hardware, dtype)
    return ChipRates(
        hardware.peak_flops(dtype), matmul.flops_per_s, matmul.source, calibration.gemm_fraction_for(hardware)
    )


@functools.lru_cache(maxsize=1024)
def _whole_step_flops(w: Workload) -> tuple[float, float]:
    """Model FLOPs per token of a step of the whole model, and the FLOPs recomputation adds."""
    flops = fl.step_flops(w.model, w.seq_len, w.recompute, "full")
    return flops.model, flops.recomputed


class KernelTimes(NamedTuple):
    """One micro-batch's GPU time on one GPU of a stage, by kind of kernel."""

    gemm_forward: float
    gemm_input_grad: float
    gemm_weight_grad: float
    gemm_recompute: float
    attention_forward: float  # recomputation included
    attention_backward: float
    memory: float

    @property
    def attention(self) -> float:
        return self.attention_forward + self.attention_backward

    @property
    def backward(self) -> float:
        """The backward pass's GEMMs and attention (what a bucketed gradient reduction can hide behind)."""
        return self.gemm_input_grad + self.gemm_weight_grad + self.attention_backward

    @property
    def forward(self) -> float:
        return self.gemm_forward + self.attention_forward

    @property
    def gemm(self) -> float:
        return self.gemm_forward + self.gemm_input_grad + self.gemm_weight_grad + self.gemm_recompute

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.memory

    def scaled(self, factor: float) -> KernelTimes:
        """Every kernel ``factor`` times as long (``--efficiency``: the same shares, another total)."""
        return KernelTimes(*(factor * seconds for seconds in self))


@functools.lru_cache(maxsize=1 << 14)
def kernel_times(
    work: StageWork, hardware: HardwareSpec, dtype: str, kernel: AttentionKernel, e: float, cal: rates.Calibration
) -> KernelTimes:
    """Time each kernel of ``work`` by its roofline (``engine.rates``)."""
    matmul = rates.matmul_rate(hardware, dtype)
    rate = matmul.flops_per_s
    operand = 1.0 if dtype == "fp8" else e  # fp8 GEMMs read one-byte operands

    def gemm(m: float, n: float, k: float, extra: float = 0.0) -> float:
        return rates.gemm_seconds(hardware, rate, m, n, k, operand, extra, cal)

    forward = input_grad = weight_grad = 0.0
    for g in work.gemms + work.head:
        forward += g.count * gemm(g.m, g.n, g.k)
        input_grad += g.count * gemm(g.m, g.k, g.n)
        weight_grad += g.count * gemm(g.n, g.k, g.m, work.wgrad_accumulator_bytes * g.n * g.k)
    batched = sum(g.count * gemm(g.m, g.n, g.k) for g in work.batched)
    forward += batched
    input_grad += 2 * batched  # the gradients of both operands
    head = sum(g.count * gemm(g.m, g.n, g.k) for g in work.head)
    recompute = work.recomputed_gemms * (forward - head)
    attention_forward = attention_backward = 0.0
    if work.attention_forward:
        # attention runs in the activation dtype even when the GEMMs run in fp8 (Transformer Engine's default)
        attention_dtype = "bf16" if dtype == "fp8" else dtype
        attn = rates.attention_rate(
            hardware,
            kernel,
            attention_dtype,
            rates.matmul_rate(hardware, attention_dtype),
            cal,
        )
        attention_forward = (work.attention_forward + work.attention_recomputed) / attn.forward
        attention_backward = work.attention_backward / attn.backward
        attention_forward += work.layers * cal.kernel_overhead_s
        attention_backward += work.layers * cal.kernel_overhead_s
    moved = work.memory_forward + work.memory_backward + work.accumulation_bytes + work.fp8_cast_bytes
    memory = rates.memory_seconds(hardware, moved, work.memory_kernels, cal)
    return KernelTimes(forward, input_grad, weight_grad, recompute, attention_forward, attention_backward, memory)


def step_time(
    w: Workload,
    layout: Layout,
    cluster: Cluster,
    efficiency: float | None = None,
    calibration: rates.Calibration = rates.CALIBRATION,
) -> StepTime:
    """Seconds per step, with the parts it is made of, as the slowest pipeline stage lives it: every distinct
    stage (``distinct_stages``) is timed with its own work, layers and parameters, and the pipeline waits for
    the longest."""
    m = layout.grad_accum
    chip = _chip_rates(cluster.hardware, w.precision.compute_dtype, calibration)
    tokens = layout.dp * m * w.micro_batch * w.seq_len
    model_per_token, recomputed_per_token = _whole_step_flops(w)
    model_flops = model_per_token * tokens
    timed = w if efficiency is not None else kernel_workload(w)  # what the stages' times depend on
    slowest = slowest_stage(timed, layout, cluster, efficiency, calibration)
    mb = slowest.micro_batch
    return StepTime(
        slowest.stage,
        stage_step_flops(w, slowest.built).hardware * tokens,
        m * mb.compute,
        m * mb.kernels.gemm,
        m * mb.kernels.attention,
        m * mb.kernels.memory,
        m * mb.host,
        m * mb.tp,
        m * mb.ep,
        m * mb.cp,
        slowest.pp_p2p,
        slowest.bubble,
        slowest.dp,
        slowest.zero,
        slowest.optimizer,
        model_flops,
        model_flops + recomputed_per_token * tokens,
        tokens,
        layout.gpus,
        chip.peak,
        efficiency,
        chip.matmul,
        chip.matmul_source,
        chip.gemm_fraction,
    )


class SlowestStage(NamedTuple):
    """The pipeline stage whose step is longest: what it builds, one micro-batch's time on it, and what its step
    adds once (pipeline sends, bubble, exposed data-parallel and ZeRO traffic, the optimizer)."""

    stage: int
    built: StageLayers
    micro_batch: MicroBatchTime
    pp_p2p: float
    bubble: float
    dp: float
    zero: float
    optimizer: float


@functools.lru_cache(maxsize=16)  # the planner tries a layout's recomputation modes one after the other
def slowest_stage(
    w: Workload, layout: Layout, cluster: Cluster, efficiency: float | None, calibration: rates.Calibration
) -> SlowestStage:
    """Time every distinct stage of the layout and keep the slowest (the first of equally slow ones). Timed kernel
    by kernel, the stages' times depend on the workload's kernels alone, so ``step_time`` asks with its
    ``kernel_workload``, which runs without and with selective recomputation share; under ``efficiency`` the
    compute follows the workload's own hardware FLOPs."""
    t, p, c, d, m = layout.tp, layout.pp, layout.cp, layout.dp, layout.grad_accum
    ep, zero, replicas, speed = layout.ep, layout.zero, layout.data_replicas, w.framework.speed
    sp = layout.sequence_parallel and t > 1
    stages = distinct_stage_layers(w.model, layout)
    if efficiency is None:
        micro_batches = stage_micro_batches(w, t, c, ep, sp, p, layout.split, cluster, calibration)
    else:  # the one-number rule: hardware FLOPs at a fraction of the peak, shared out as the kernels share it (what
        # overlaps with what keeps its meaning)
        tokens = d * m * w.micro_batch * w.seq_len
        peak = cluster.hardware.peak_flops(w.precision.compute_dtype)
        micro_batches = tuple(
            micro_batch_time(kernel_workload(w), t, c, ep, sp, built, cluster, calibration,
                             stage_step_flops(w, built).hardware * tokens / (layout.gpus / p * peak * efficiency) / m)
            for _, built in stages
        )  # fmt: skip
    traffics = stage_state_traffic(states_workload(w), t, c, ep, d, zero, p, layout.split, cluster, calibration)
    pp_p2p = _pipeline_sends(w, layout, cluster)
    bubble_share = (p - 1) / layout.split.chunks  # of a micro-batch's time, with v chunks a stage

    slowest: tuple[int, StageLayers, MicroBatchTime, float, float, float, float] | None = None
    slowest_total = 0.0
    for (stage, built), mb, traffic in zip(stages, micro_batches, traffics, strict=True):
        bubble = bubble_share * mb.total if p > 1 else 0.0
        dp_time, zero_time = _exposed_traffic(traffic, mb, m, zero, replicas, speed)
        total = StepTime.seconds(
            m * mb.compute, m * mb.host, m * mb.tp, m * mb.ep, m * mb.cp, pp_p2p, bubble, dp_time, zero_time,
            traffic.optimizer,
        )  # fmt: skip
        if slowest is None or total > slowest_total:  # the first of equally slow stages
            slowest, slowest_total = (stage, built, mb, bubble, dp_time, zero_time, traffic.optimizer), total
    assert slowest is not None  # every layout has a first stage
    stage, built, mb, bubble, dp_time, zero_time, optimizer = slowest
    return SlowestStage(stage, built, mb, pp_p2p, bubble, dp_time, zero_time, optimizer)


class MicroBatchTime(NamedTuple):
    """One micro-batch through one GPU of a pipeline stage: its kernels, the collectives it waits for, and the host
    that issues them. It depends on the workload, TP, CP, EP, SP and the stage's layers, not on DP, ZeRO or the
    micro-batches per step, so the layouts the planner tries share it."""

    kernels: KernelTimes  # as timed, or scaled to a given compute time (``--efficiency``)
    compute: float  # the kernels' GPU time
    tp: float  # tensor-parallel collectives not hidden behind GEMMs
    ep: float  # expert all-to-alls not hidden behind compute
    cp: float  # context-parallel ring passes not hidden behind attention
    busy: float  # compute and the exposed collectives
    total: float  # the longer of busy and the host's time to issue the micro-batch
    host: float  # host time not hidden behind the GPU's: total − busy


@functools.lru_cache(maxsize=1 << 17)
def stage_micro_batches(
    w: Workload,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    pp: int,
    split: PipelineSplit,
    cluster: Cluster,
    calibration: rates.Calibration,
) -> tuple[MicroBatchTime, ...]:
    """``micro_batch_time`` of each of the distinct stages of ``split`` (``split_stage_layers``), in their order:
    a layout's step time looks them up at once."""
    return tuple(
        micro_batch_time(w, tp, cp, ep, sequence_parallel, built, cluster, calibration)
        for _, built in split_stage_layers(w.model, pp, split)
    )


@functools.lru_cache(maxsize=1 << 17)
def micro_batch_time(
    w: Workload,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    built: StageLayers,
    cluster: Cluster,
    calibration: rates.Calibration,
    compute: float | None = None,
) -> MicroBatchTime:
    """One micro-batch on one GPU of a stage that builds ``built``: its kernels timed by their rooflines (or, given
    ``compute``, scaled to take that long), and the tensor-parallel, expert and context-parallel communication
    each can hide behind."""
    speed, sp = w.framework.speed, sequence_parallel
    layer = layer_times(w, tp, cp, ep, sp, cluster, calibration)
    times, operations = stage_kernel_times(built, layer)
    if compute is not None:
        times = times.scaled(compute / times.total)
    else:
        compute = times.total
    # tensor parallelism: forward collectives, and backward ones that may hide behind weight gradients
    tp_forward = built.layers * (4 if w.recompute == "full" else 2) * layer.tp_one
    tp_backward = built.layers * (3 if sp else 2) * layer.tp_one
    backward_gemms = times.gemm_input_grad + times.gemm_weight_grad
    if speed.tp_overlap == "full":
        tp_mb = max(0.0, tp_forward - times.gemm_forward) + max(0.0, tp_backward - backward_gemms)
    elif speed.tp_overlap == "backward":
        tp_mb = tp_forward + max(0.0, tp_backward - backward_gemms)
    else:
        tp_mb = tp_forward + tp_backward
    a2a = built.moe * (4 + (2 if w.recompute == "full" else 0)) * layer.ep_one
    ep_mb = max(0.0, a2a - compute) if speed.moe_overlap else a2a
    cp_mb = max(0.0, built.layers * layer.cp_per_layer - times.attention)
    busy = compute + tp_mb + ep_mb + cp_mb
    per_micro_batch = max(busy, operations * speed.host_seconds_per_op)
    return MicroBatchTime(times, compute, tp_mb, ep_mb, cp_mb, busy, per_micro_batch, per_micro_batch - busy)


class LayerTimes(NamedTuple):
    """One micro-batch on one GPU, a unit of work at a time: the kernel times and host operations of one dense
    layer, of one MoE layer and of what lies outside the layers (the embedding on the first stage, the head on the
    last, both on a single stage), and the collectives of a layer. Every stage of a layout is made of these."""

    dense: tuple[KernelTimes, float]
    moe: tuple[KernelTimes, float] | None  # None for a dense model
    embedding: tuple[KernelTimes, float]
    head: tuple[KernelTimes, float]
    embedding_and_head: tuple[KernelTimes, float]
    tp_one: float  # one tensor-parallel all-reduce of a layer's activations
    ep_one: float  # one expert all-to-all of a layer's routed tokens
    cp_per_layer: float  # a layer's context-parallel ring passes of K and V


@functools.lru_cache(maxsize=1 << 14)
def layer_times(
    w: Workload,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    cluster: Cluster,
    calibration: rates.Calibration,
) -> LayerTimes:
    """Each unit's kernels (``unit_kernel_times``) and a layer's collectives, with TP, CP and EP splitting them."""
    hardware, sp = cluster.hardware, sequence_parallel

    def unit(dense: int, moe: int, embedding: bool, head: bool, unit_ep: int = 1) -> tuple[KernelTimes, float]:
        # EP splits only the experts: the other units' kernels are the same whatever it is
        return unit_kernel_times(
            w, tp, cp, unit_ep, sp, StageLayers(dense, moe, embedding, head), hardware, calibration
        )

    return LayerTimes(
        unit(1, 0, False, False),
        unit(0, 1, False, False, ep) if w.model.moe else None,
        unit(0, 0, True, False),
        unit(0, 0, False, True),
        unit(0, 0, True, True),
        *_layer_collectives(w, tp, cp, ep, sp, cluster),
    )


def stage_kernel_times(built: StageLayers, layer: LayerTimes) -> tuple[KernelTimes, float]:
    """``kernel_times`` of a stage's work, and the operations the host issues for it. Both are sums over the
    kernels, so a stage's are its dense layers', its MoE layers' and its embedding's and head's (``layer``), each
    kind timed once and counted as often as the stage builds it."""
    units: list[tuple[int, tuple[KernelTimes, float]]] = []
    if built.dense:
        units.append((built.dense, layer.dense))
    if built.moe and layer.moe:
        units.append((built.moe, layer.moe))
    if built.embedding and built.head:
        units.append((1, layer.embedding_and_head))
    elif built.embedding:
        units.append((1, layer.embedding))
    elif built.head:
        units.append((1, layer.head))
    gemm_forward = gemm_input_grad = gemm_weight_grad = gemm_recompute = 0.0
    attention_forward = attention_backward = memory = operations = 0.0
    for count, (times, unit_operations) in units:
        gemm_forward += count * times.gemm_forward
        gemm_input_grad += count * times.gemm_input_grad
        gemm_weight_grad += count * times.gemm_weight_grad
        gemm_recompute += count * times.gemm_recompute
        attention_forward += count * times.attention_forward
        attention_backward += count * times.attention_backward
        memory += count * times.memory
        operations += count * unit_operations
    times = KernelTimes(
        gemm_forward, gemm_input_grad, gemm_weight_grad, gemm_recompute, attention_forward, attention_backward, memory
    )
    return times, operations


@functools.lru_cache(maxsize=1 << 15)
def unit_kernel_times(
    w: Workload,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    unit: StageLayers,
    hardware: HardwareSpec,
    calibration: rates.Calibration,
) -> tuple[KernelTimes, float]:
    """``kernel_times`` of one unit of a stage's work (one dense or MoE layer, or the embedding and the head), and
    the operations the host issues for it."""
    work = stage_work(w, tp, cp, ep, sequence_parallel, unit)
    kernel = w.framework.speed.attention_kernel if w.attention == "flash" else "eager"
    e = w.precision.activation_bytes
    return kernel_times(work, hardware, w.precision.compute_dtype, kernel, e, calibration), work.operations


@functools.lru_cache(maxsize=1 << 14)
def _layer_collectives(
    w: Workload, tp: int, cp: int, ep: int, sequence_parallel: bool, cluster: Cluster
) -> tuple[float, float, float]:
    """Per micro-batch: one tensor-parallel all-reduce of a layer's activations, one expert all-to-all of its
    routed tokens, and a layer's context-parallel ring passes of K and V."""
    model, e = w.model, w.precision.activation_bytes
    tp_one = 0.0
    if tp > 1:
        activation = w.micro_batch * w.seq_len / cp * model.hidden_size * e
        tp_one = group_time("all-reduce", activation, tp, 1, cluster)
    ep_one = 0.0
    if model.moe and ep > 1:
        hidden_tokens = w.micro_batch * w.seq_len / cp / (tp if sequence_parallel else 1)
        routed = hidden_tokens * model.hidden_size * e * model.moe.experts_per_token
        ep_one = _all_to_all(routed, ep, tp * cp, cluster, model.moe.node_limit, model.moe.experts_per_token)
    cp_per_layer = 0.0
    if cp > 1:
        kv_chunk = 2 * w.seq_len / cp * w.micro_batch * model.kv_heads * model.qk_head_dim * e / tp
        cp_per_layer = 3 * (cp - 1) * group_time("p2p", kv_chunk, cp, tp, cluster)
    return tp_one, ep_one, cp_per_layer


def _pipeline_sends(w: Workload, layout: Layout, cluster: Cluster) -> float:
    """Per step: the activations each stage sends and receives, each way per micro-batch and chunk, unless the
    framework overlaps them with compute."""
    t, p, c = layout.tp, layout.pp, layout.cp
    if p == 1 or w.framework.speed.pp_overlap:
        return 0.0
    sp = layout.sequence_parallel and t > 1
    activation = w.micro_batch * w.seq_len / c * w.model.hidden_size * w.precision.activation_bytes / (t if sp else 1)
    return layout.grad_accum * layout.split.chunks * 2 * group_time("p2p", activation, 2, t * c * layout.dp, cluster)


class StateTraffic(NamedTuple):
    """Per step, for one GPU of a stage: the data-parallel collectives of its share of the parameters and
    gradients, and its optimizer step. They depend on the stage's parameters and the layout's DP, ZeRO and EP, not
    on the micro-batch."""

    zero3: float  # ZeRO-3, per micro-batch: two all-gathers of the parameters (forward, backward) and a
    # reduce-scatter of the gradients
    reduce: float  # ZeRO-0/1/2, per step: the gradients' all-reduce (reduce-scatter from ZeRO-2)
    gather: float  # ZeRO-1/2, per step: the all-gather of the updated parameters
    optimizer: float


@functools.lru_cache(maxsize=1 << 16)
def stage_state_traffic(
    w: Workload, tp: int, cp: int, ep: int, dp: int, zero: ZeroStage, pp: int, split: PipelineSplit, cluster: Cluster,
    calibration: rates.Calibration,
) -> tuple[StateTraffic, ...]:  # fmt: skip
    """``state_traffic`` of each of the distinct stages of ``split`` (``split_stage_layers``), in their order."""
    return tuple(
        state_traffic(w, tp, cp, ep, dp, zero, built, cluster, calibration)
        for _, built in split_stage_layers(w.model, pp, split)
    )


@functools.lru_cache(maxsize=1 << 16)
def state_traffic(
    w: Workload, tp: int, cp: int, ep: int, dp: int, zero: ZeroStage, built: StageLayers, cluster: Cluster,
    calibration: rates.Calibration,
) -> StateTraffic:  # fmt: skip
    """The data-parallel traffic and the optimizer step of one GPU of a stage that builds ``built``. Neither the
    micro-batch nor recomputation changes them: the step time asks with ``states_workload``."""
    precision, speed = w.precision, w.framework.speed
    grad_bytes = w.framework.states.grad_bytes or precision.grad_bytes
    held = _params_held(w.model, tp, ep, built)
    params = held.total
    replicas = dp * cp
    zero3 = reduce = gather = 0.0
    if replicas > 1:
        stride = tp * cp
        if zero_shards("params", zero):
            flat = speed.zero3_network == "one_nic"
            gathered = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster, flat)
            scatter = group_time("reduce-scatter", params * grad_bytes, replicas, stride, cluster, flat)
            zero3 = 2 * gathered + scatter
        else:
            op = "reduce-scatter" if zero_shards("grads", zero) else "all-reduce"
            reduce = group_time(op, params * grad_bytes, replicas, stride, cluster)
            if zero_shards("optimizer", zero):
                gather = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster)
    optimizer = _optimizer_seconds(w, zero, replicas, ep, held.dense, held.experts, cluster.hardware, grad_bytes,
                                   calibration)  # fmt: skip
    return StateTraffic(zero3, reduce, gather, optimizer)


def _exposed_traffic(
    traffic: StateTraffic, mb: MicroBatchTime, grad_accum: int, zero: ZeroStage, replicas: int, speed: SpeedRule
) -> tuple[float, float]:
    """The data-parallel and ZeRO communication a stage's step leaves exposed: (DP, ZeRO) seconds. What hides
    depends on the framework: a bucketed reduction behind the last backward pass, a prefetched gather behind the
    next forward pass, ZeRO-3's traffic behind each micro-batch's compute."""
    if replicas == 1:
        return 0.0, 0.0
    if zero_shards("params", zero):
        comm = traffic.zero3
        return 0.0, grad_accum * (max(0.0, comm - mb.compute) if speed.param_gather_overlap else comm)
    hidden = speed.dp_overlap == "always" or speed.dp_overlap == "without_zero" and zero == 0
    dp_time = max(0.0, traffic.reduce - mb.kernels.backward) if hidden else traffic.reduce
    zero_time = 0.0
    if zero_shards("optimizer", zero):
        gather = traffic.gather
        zero_time = max(0.0, gather - mb.kernels.forward) if speed.param_gather_overlap else gather
    return dp_time, zero_time


def _all_to_all(size: float, ep: int, stride: int, cluster: Cluster, node_limit: int | None, k: int) -> float:
    """One all-to-all of ``size`` bytes per GPU (k copies of each token) over the EP group. With node-limited
    routing a token goes to at most ``node_limit`` nodes, and crosses the network once per node it visits (then
    NVLink forwards it to the experts there, DeepSeek-V3 §3.2.2): the network carries min(k, limit)/k of the
    bytes a plain all-to-all would send off the node."""
    per_node = max(1, cluster.gpus_per_node // stride)
    if node_limit and ep > per_node:
        nodes = -(-ep // per_node)
        visited = min(k, node_limit, nodes)
        size_remote = size * visited / k
        remote = group_time("all-to-all", size_remote, ep, stride, cluster)
        near = collective_time("all-to-all", size, min(ep, per_node), intra_link(cluster.hardware))
        return max(remote, near)
    return group_time("all-to-all", size, ep, stride, cluster)


def _optimizer_seconds(
    w: Workload,
    zero: ZeroStage,
    replicas: int,
    ep: int,
    dense: float,
    experts: float,
    hardware: HardwareSpec,
    grad_bytes: float,
    calibration: rates.Calibration,
) -> float:
    """The optimizer step and gradient clipping over this GPU's share of the states, as memory traffic."""
    precision = w.precision
    sharded = zero_shards("optimizer", zero)
    local = dense / replicas + experts / max(1, replicas // ep) if sharded else dense + experts
    states = optimizer_bytes_per_param(w.model, precision, w.optimizer)
    per_param = 2 * grad_bytes + 2 * (precision.master_bytes + states) + precision.param_bytes
    passes = FOREACH_PASSES if w.framework.optimizer_step.temporaries == "foreach" else 1
    return rates.memory_seconds(hardware, local * per_param * passes, 4 * passes, calibration)
