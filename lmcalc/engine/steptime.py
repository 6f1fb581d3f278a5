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
from dataclasses import dataclass, fields

from lmcalc.engine import flops as fl
from lmcalc.engine import rates
from lmcalc.engine.comm import collective_time, group_time, intra_link
from lmcalc.engine.kernels import StageWork, stage_work
from lmcalc.engine.layout import Layout
from lmcalc.engine.pipeline import StageLayers, distinct_stages, stage_layers
from lmcalc.engine.sharding import stage_params, stage_part, zero_shards
from lmcalc.engine.states import optimizer_bytes_per_param
from lmcalc.engine.workload import Workload
from lmcalc.specs import AttentionKernel, Cluster, HardwareSpec

DEFAULT_COMPUTE_EFFICIENCY = 0.6
"""The fraction of the dense peak a step's compute reaches under ``--efficiency``-style timing, kept for the
estimates that take one number (``lmcalc time``); the planner times kernels instead."""

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
        return (
            self.compute
            + self.host
            + self.tp
            + self.ep
            + self.cp
            + self.pp_p2p
            + self.bubble
            + self.dp
            + self.zero
            + self.optimizer
        )

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


@dataclass(frozen=True)
class KernelTimes:
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
        return KernelTimes(*(factor * getattr(self, f.name) for f in fields(self)))


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
    hardware, precision, model, speed = cluster.hardware, w.precision, w.model, w.framework.speed
    t, p, c, d, m = layout.tp, layout.pp, layout.cp, layout.dp, layout.grad_accum
    gpus, dtype, e = layout.gpus, precision.compute_dtype, precision.activation_bytes
    peak = hardware.peak_flops(dtype)
    matmul = rates.matmul_rate(hardware, dtype)
    tokens = d * m * w.micro_batch * w.seq_len
    whole = _whole_step_flops(w)
    model_flops = whole.model * tokens
    hardware_flops = model_flops + whole.recomputed * tokens
    sp = layout.sequence_parallel and t > 1
    kernel = speed.attention_kernel
    grad_bytes = w.framework.states.grad_bytes or precision.grad_bytes
    replicas = layout.data_replicas
    virtual = layout.split.chunks

    tp_one = 0.0
    if t > 1:
        activation = w.micro_batch * w.seq_len / c * model.hidden_size * e
        tp_one = group_time("all-reduce", activation, t, 1, cluster)
    ep_one = 0.0
    if model.moe and layout.ep > 1:
        hidden_tokens = w.micro_batch * w.seq_len / c / (t if sp else 1)
        routed = hidden_tokens * model.hidden_size * e * model.moe.experts_per_token
        ep_one = _all_to_all(routed, layout.ep, t * c, cluster, model.moe.node_limit, model.moe.experts_per_token)
    cp_per_layer = 0.0
    if c > 1:
        kv_chunk = 2 * w.seq_len / c * w.micro_batch * model.kv_heads * model.qk_head_dim * e / t
        cp_per_layer = 3 * (c - 1) * group_time("p2p", kv_chunk, c, t, cluster)

    def stage_time(stage: int) -> StepTime:
        built = stage_layers(model, layout, stage)
        flops = stage_step_flops(w, built)
        work = stage_work(w, t, c, layout.ep, sp, built)
        times = kernel_times(work, hardware, dtype, kernel if w.attention == "flash" else "eager", e, calibration)
        if efficiency is not None:  # the one-number rule: hardware FLOPs at a fraction of the peak, shared out as
            # the kernels share it (what overlaps with what keeps its meaning)
            compute_mb = flops.hardware * tokens / (gpus / p * peak * efficiency) / m
            times = times.scaled(compute_mb / times.total)
        else:
            compute_mb = times.total
        # tensor parallelism: forward collectives, and backward ones that may hide behind weight gradients
        tp_forward = built.layers * (4 if w.recompute == "full" else 2) * tp_one
        tp_backward = built.layers * (3 if sp else 2) * tp_one
        backward_gemms = times.gemm_input_grad + times.gemm_weight_grad
        if speed.tp_overlap == "full":
            tp_mb = max(0.0, tp_forward - times.gemm_forward) + max(0.0, tp_backward - backward_gemms)
        elif speed.tp_overlap == "backward":
            tp_mb = tp_forward + max(0.0, tp_backward - backward_gemms)
        else:
            tp_mb = tp_forward + tp_backward
        a2a = built.moe * (4 + (2 if w.recompute == "full" else 0)) * ep_one
        ep_mb = max(0.0, a2a - compute_mb) if speed.moe_overlap else a2a
        cp_mb = max(0.0, built.layers * cp_per_layer - times.attention)
        busy = compute_mb + tp_mb + ep_mb + cp_mb
        host_mb = work.operations * speed.host_seconds_per_op
        per_micro_batch = max(busy, host_mb)
        bubble = (p - 1) / virtual * per_micro_batch if p > 1 else 0.0
        pp_p2p = 0.0
        if p > 1 and not speed.pp_overlap:
            activation = w.micro_batch * w.seq_len / c * model.hidden_size * e / (t if sp else 1)
            pp_p2p = m * virtual * 2 * group_time("p2p", activation, 2, t * c * d, cluster)
        held = stage_params(w, layout, stage)
        params = held.total
        dp_time = zero_time = 0.0
        if replicas > 1:
            stride = t * c
            backward = times.backward
            if zero_shards("params", layout.zero):
                flat = speed.zero3_network == "one_nic"
                gather = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster, flat)
                scatter = group_time("reduce-scatter", params * grad_bytes, replicas, stride, cluster, flat)
                comm = 2 * gather + scatter
                zero_time = m * (max(0.0, comm - compute_mb) if speed.param_gather_overlap else comm)
            else:
                op = "reduce-scatter" if zero_shards("grads", layout.zero) else "all-reduce"
                reduce = group_time(op, params * grad_bytes, replicas, stride, cluster)  # type: ignore[arg-type]
                hidden = speed.dp_overlap == "always" or speed.dp_overlap == "without_zero" and layout.zero == 0
                dp_time = max(0.0, reduce - backward) if hidden else reduce
                if zero_shards("optimizer", layout.zero):
                    gather = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster)
                    zero_time = max(0.0, gather - times.forward) if speed.param_gather_overlap else gather
        optimizer = _optimizer_seconds(w, layout, held.dense, held.experts, hardware, grad_bytes, calibration)
        return StepTime(
            stage,
            flops.hardware * tokens,
            m * compute_mb,
            m * times.gemm,
            m * times.attention,
            m * times.memory,
            m * (per_micro_batch - busy),
            m * tp_mb,
            m * ep_mb,
            m * cp_mb,
            pp_p2p,
            bubble,
            dp_time,
            zero_time,
            optimizer,
            model_flops,
            hardware_flops,
            tokens,
            gpus,
            peak,
            efficiency,
            matmul.flops_per_s,
            matmul.source,
            calibration.gemm_fraction_for(hardware),
        )

    return max((stage_time(stage) for stage in distinct_stages(model, layout)), key=lambda st: st.total)


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
    layout: Layout,
    dense: float,
    experts: float,
    hardware: HardwareSpec,
    grad_bytes: float,
    calibration: rates.Calibration,
) -> float:
    """The optimizer step and gradient clipping over this GPU's share of the states, as memory traffic."""
    precision = w.precision
    replicas = layout.data_replicas
    if zero_shards("optimizer", layout.zero):
        local = dense / replicas + experts / max(1, replicas // layout.ep)
    else:
        local = dense + experts
    states = optimizer_bytes_per_param(w.model, precision, w.optimizer)
    per_param = 2 * grad_bytes + 2 * (precision.master_bytes + states) + precision.param_bytes
    passes = FOREACH_PASSES if w.framework.optimizer_step.temporaries == "foreach" else 1
    return rates.memory_seconds(hardware, local * per_param * passes, 4 * passes, calibration)
