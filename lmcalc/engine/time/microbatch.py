"""One micro-batch on one GPU of a pipeline stage: its kernels timed by their rooflines (``engine.time.rates``), the
collectives it waits for, and the host that issues it (docs/formulas.md §8).

* **GPU compute**: every GEMM (forward, input gradient, weight gradient, and the forward again under full
  recomputation), fused attention and the memory-bound kernels of ``engine.time.kernels.stage_work``.
* **Tensor-parallel collectives**: two activation-sized all-reduces per layer forward (after attention and after
  the MLP; with sequence parallelism an all-gather before and a reduce-scatter after each block, the same bytes)
  and two backward (Korthikanti et al. 2022 §3), two more forward under full recomputation. With sequence
  parallelism the gathered input of each block is not kept, so the backward pass gathers it again for the
  weight gradients: one more all-reduce's worth a layer (Megatron-LM's and nanotron's column-parallel
  backward). An MoE layer's MLP side is its shared experts' pair (as an MLP's) and, over the expert TP group
  (ETP GPUs), a gather of the routed tokens after the dispatch and a reduce-scatter before the combine: k copies
  of each token, an all-reduce's worth forward and backward, no gather again (the dispatcher keeps them;
  Megatron-Core's all-to-all dispatcher). What the framework hides: with ``tp_overlap`` backward the backward
  collectives run behind the backward GEMMs (Megatron-LM's asynchronous TP); with full, the forward ones behind
  the forward GEMMs too.
* **Expert all-to-alls**: dispatch and combine, forward and backward, over the EP group (its GPUs ETP apart:
  Megatron-Core lays the experts' grid out ETP first, then EP): k copies of each token under NCCL's all-to-all, or
  one per GPU its experts reach and one per node across nodes under DeepEP or HybridEP (``engine.time.dispatch``).
  Hidden behind another micro-batch's compute when the profile overlaps them (DualPipe).
* **Context parallelism**: K and V pass around the ring, CP − 1 hops forward and twice as many backward,
  overlapped with the attention they feed.
* **The host**: the CPU issues every operation (``SpeedRule.host_seconds_per_op`` each); it runs ahead of the
  GPU, so a micro-batch takes max(GPU time, host time). Small models at high TP are host-bound.

A micro-batch's time depends on the workload, TP, CP, EP, sequence parallelism and the stage's layers, not on DP,
ZeRO or the micro-batches per step, so the layouts the planner tries share it (``engine.time.steptime`` puts a step
together from it).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import Mix, StageLayers, Stages, block_recomputed, split_stage_layers
from lmcalc.engine.time import rates
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.dispatch import EpGroup, dispatch_time
from lmcalc.engine.time.ep_overlap import MOE_LAYER, MoePhases, forward_share, paired_exposure, routed_work
from lmcalc.engine.time.kernels import StageWork, stage_work
from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import AttentionKernel
from lmcalc.specs import Cluster, HardwareSpec


class KernelTimes(NamedTuple):
    """One micro-batch's GPU time on one GPU of a stage, by kind of kernel."""

    gemm_forward: float
    gemm_input_grad: float
    gemm_weight_grad: float
    gemm_recompute: float
    attention_forward: float  # recomputation included; a state-space mixer's scans too
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
    """Time each kernel of ``work`` by its roofline (``engine.time.rates``)."""
    matmul = rates.matmul_rate(hardware, dtype)
    rate = matmul.flops_per_s
    operand = rates.LOW_PRECISION_OPERAND_BYTES.get(dtype, e)  # fp8 GEMMs read one-byte operands, fp4 half a byte

    def gemm(m: float, n: float, k: float, extra: float = 0.0) -> float:  # the output in the activation dtype
        return rates.gemm_seconds(hardware, rate, (m, n, k), (operand, e), extra, cal)

    forward = input_grad = weight_grad = 0.0
    for g in work.gemms + work.head:
        forward += g.count * gemm(g.m, g.n, g.k)
        input_grad += g.input_grad * g.count * gemm(g.m, g.k, g.n)
        if g.weight_grad:
            weight_grad += g.weight_grad * g.count * gemm(g.n, g.k, g.m, work.wgrad_accumulator_bytes * g.n * g.k)
    batched = sum(g.count * gemm(g.m, g.n, g.k) for g in work.batched)
    forward += batched
    input_grad += 2 * batched  # the gradients of both operands
    head = sum(g.count * gemm(g.m, g.n, g.k) for g in work.head)
    recompute = work.recomputed_gemms * (forward - head)
    attention_forward = attention_backward = 0.0
    if work.attention_forward:
        # attention runs in the activation dtype even when the GEMMs run in fp8 (Transformer Engine's default)
        attention_dtype = "bf16" if dtype in rates.LOW_PRECISION_OPERAND_BYTES else dtype
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
    if work.scan_forward:  # a state-space or linear-attention mixer's scans, in the activation dtype
        scan_dtype = "bf16" if dtype in rates.LOW_PRECISION_OPERAND_BYTES else dtype
        scan = rates.SCAN_FRACTION * rates.matmul_rate(hardware, scan_dtype).flops_per_s
        launches = work.scan_layers * cal.kernel_overhead_s
        attention_forward += (work.scan_forward + work.scan_recomputed) / scan + launches
        attention_backward += work.scan_backward / scan + launches
    moved = work.memory_forward + work.memory_backward + work.accumulation_bytes + work.fp8_cast_bytes
    memory = rates.memory_seconds(hardware, moved, work.memory_kernels, cal)
    return KernelTimes(forward, input_grad, weight_grad, recompute, attention_forward, attention_backward, memory)


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
    ep_alone: float  # the expert all-to-alls its passes leave exposed where no other micro-batch's run beside them


@functools.lru_cache(maxsize=1 << 17)
def stage_micro_batches(w: Workload, grid: Grid, stages: Stages, machine: rates.Machine) -> tuple[MicroBatchTime, ...]:
    """``micro_batch_time`` of each of the distinct stages of the pipeline (``split_stage_layers``), in their
    order: a layout's step time looks them up at once."""
    return tuple(
        micro_batch_time(w, grid, built, machine, recomputed=block_layers(w, stages, stage))
        for stage, built in split_stage_layers(w.model, stages)
    )


def block_layers(w: Workload, stages: Stages, stage: int) -> Mix | None:
    """Under Megatron's block recomputation, the (dense, MoE) layers of ``stage`` that full recomputation covers;
    None where it covers every layer or none (``micro_batch_time``'s ``recomputed``)."""
    if w.recompute != "full" or w.recompute_method != "block":
        return None
    return block_recomputed(w.model, stages, stage, w.recompute_num_layers)


@functools.lru_cache(maxsize=1 << 17)
def micro_batch_time(
    w: Workload,
    grid: Grid,
    built: StageLayers,
    machine: rates.Machine,
    compute: float | None = None,
    recomputed: Mix | None = None,
) -> MicroBatchTime:
    """One micro-batch on one GPU of a stage that builds ``built``: its kernels timed by their rooflines (or, given
    ``compute``, scaled to take that long), and the tensor-parallel, expert and context-parallel communication
    each can hide behind. ``recomputed``: under full recomputation, the (dense, MoE) layers it covers where not all
    (Megatron's block method); the others run as without it."""
    speed, sp = w.framework.speed, grid.sequence_parallel
    layer = layer_times(w, grid, machine)
    times, operations = stage_kernel_times(built, layer)
    dense_redone, moe_redone = (built.dense, built.moe) if w.recompute == "full" else (0, 0)
    if recomputed is not None:
        dense_redone, moe_redone = recomputed
        stored = StageLayers(built.dense - dense_redone, built.moe - moe_redone, False, False)
        redone, redone_operations = stage_kernel_times(built._replace(dense=dense_redone, moe=moe_redone), layer)
        plain, plain_operations = stage_kernel_times(stored, layer_times(replace(w, recompute="none"), grid, machine))
        times = KernelTimes(*(a + b for a, b in zip(redone, plain, strict=True)))
        operations = redone_operations + plain_operations
    for count, unit in ((built.mtp, (1, 0)), (built.mtp_heads, (0, 1))):  # the MTP modules' projections, norms and
        if count:  # embedding lookups where they are built; their passes through the head and losses on the last stage
            extra, extra_operations = unit_kernel_times(
                w,
                grid._replace(ep=1, etp=1),
                StageLayers(0, 0, False, False, *unit),
                machine.hardware,
                machine.calibration,
            )
            times = KernelTimes(*(a + count * b for a, b in zip(times, extra, strict=True)))
            operations += count * extra_operations
    if compute is not None:
        times = times.scaled(compute / times.total)
    else:
        compute = times.total
    # tensor parallelism: forward collectives, and backward ones that may hide behind weight gradients; a dense
    # layer's two blocks, an MoE layer's attention, shared experts and routed experts (``LayerTimes``)
    dense_blocks, blocks = w.model.tp_blocks  # a dense layer's and an MoE layer's blocks gathered by TP
    dense_forward, moe_forward = dense_blocks * layer.tp_one, blocks * layer.tp_one + layer.etp_one
    tp_forward = (built.dense + dense_redone) * dense_forward + (built.moe + moe_redone) * moe_forward
    regather = 1.5 if sp else 1.0  # with SP, each block's input gathered again for its weight gradient
    tp_backward = built.dense * dense_blocks * regather * layer.tp_one + built.moe * (
        blocks * regather * layer.tp_one + layer.etp_one
    )
    # an MTP module's projection (column-parallel, its h-wide output gathered: multi_token_prediction.py), in
    # all-reduces of h: with SP its 2h input gathered and its output, 1.5, backward the scatter's gather, the input
    # gathered again and its gradient reduce-scattered, 2.5; without SP the output gathered, 0.5, its input's
    # gradient all-reduced, 2 (mHC's, DeepSeek-V4's, runs at TP = 1 alone: layout_checks.check_kept_whole)
    tp_forward += built.mtp * (1.5 if sp else 0.5) * layer.tp_one
    tp_backward += built.mtp * (2.5 if sp else 2.0) * layer.tp_one
    backward_gemms = times.gemm_input_grad + times.gemm_weight_grad
    if speed.tp_overlap == "full":
        tp_mb = max(0.0, tp_forward - times.gemm_forward) + max(0.0, tp_backward - backward_gemms)
    elif speed.tp_overlap == "backward":
        tp_mb = tp_forward + max(0.0, tp_backward - backward_gemms)
    else:
        tp_mb = tp_forward + tp_backward
    a2a = (4 * built.moe + 2 * moe_redone) * layer.ep_one
    if speed.moe_overlap:  # DualPipe: behind the whole of another micro-batch's compute
        ep_mb = max(0.0, a2a - compute)
    elif layer.moe_phases is not None:  # Megatron-Core's combined 1F1B, phase by phase (engine.time.ep_overlap)
        ep_mb = built.moe * paired_exposure(layer.moe_phases, layer.ep_one)
    else:
        ep_mb = a2a
    cp_mb = max(0.0, built.layers * layer.cp_per_layer - times.attention)
    busy = compute + tp_mb + ep_mb + cp_mb
    per_micro_batch = max(busy, operations * speed.host_seconds_per_op)
    return MicroBatchTime(times, compute, tp_mb, ep_mb, cp_mb, busy, per_micro_batch, per_micro_batch - busy, a2a)


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
    etp_one: float  # the expert TP group's gather and reduce-scatter of a layer's routed tokens, one pass
    ep_one: float  # one expert all-to-all of a layer's routed tokens
    cp_per_layer: float  # a layer's context-parallel ring passes of K and V
    moe_phases: MoePhases | None = None  # an MoE layer's work as the all-to-all overlap pairs it (moe_a2a_overlap)


@functools.lru_cache(maxsize=1 << 14)
def layer_times(w: Workload, grid: Grid, machine: rates.Machine) -> LayerTimes:
    """Each unit's kernels (``unit_kernel_times``) and a layer's collectives, with TP, CP and EP splitting them."""
    hardware, calibration = machine.hardware, machine.calibration
    without_experts = grid._replace(ep=1, etp=1)  # EP, ETP split only the experts: the other units are the same

    def unit(dense: int, moe: int, embedding: bool, head: bool, unit_grid: Grid) -> tuple[KernelTimes, float]:
        return unit_kernel_times(w, unit_grid, StageLayers(dense, moe, embedding, head), hardware, calibration)

    return LayerTimes(
        unit(1, 0, False, False, without_experts),
        unit(0, 1, False, False, grid) if w.model.moe else None,
        unit(0, 0, True, False, without_experts),
        unit(0, 0, False, True, without_experts),
        unit(0, 0, True, True, without_experts),
        *_layer_collectives(w, grid, machine.cluster),
        moe_phases(w, grid, hardware, calibration) if w.moe_a2a_overlap and w.model.moe else None,
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
    w: Workload, grid: Grid, unit: StageLayers, hardware: HardwareSpec, calibration: rates.Calibration
) -> tuple[KernelTimes, float]:
    """``kernel_times`` of one unit of a stage's work (one dense or MoE layer, or the embedding and the head), and
    the operations the host issues for it. Keyed by the chip, not the cluster: clusters of one chip share them."""
    work = stage_work(w, grid, unit)
    kernel = w.framework.speed.attention_kernel if w.attention == "flash" else "eager"
    e = w.precision.activation_bytes
    return kernel_times(work, hardware, w.precision.compute_dtype, kernel, e, calibration), work.operations


@functools.lru_cache(maxsize=1 << 12)
def moe_phases(w: Workload, grid: Grid, hardware: HardwareSpec, calibration: rates.Calibration) -> MoePhases:
    """One MoE layer's kernels as the all-to-all overlap's phases split them (``ep_overlap.MoePhases``): timed as
    ``unit_kernel_times`` times the layer, the memory-bound kernels shared between forward and backward by the bytes
    each moves, and the routed experts' GEMMs timed alone."""
    layer, _ = unit_kernel_times(w, grid, MOE_LAYER, hardware, calibration)
    work = stage_work(w, grid, MOE_LAYER)
    forward = layer.gemm_forward + layer.attention_forward + layer.memory * forward_share(work)
    kernel = w.framework.speed.attention_kernel if w.attention == "flash" else "eager"
    e, dtype = w.precision.activation_bytes, w.precision.compute_dtype
    experts = kernel_times(routed_work(w.model, work), hardware, dtype, kernel, e, calibration)
    return MoePhases.of(forward, layer.total, experts.gemm_forward, experts.gemm_input_grad + experts.gemm_weight_grad)


@functools.lru_cache(maxsize=1 << 14)
def _layer_collectives(w: Workload, grid: Grid, cluster: Cluster) -> tuple[float, float, float, float]:
    """Per micro-batch: one tensor-parallel all-reduce of a layer's activations, the expert TP group's gather and
    reduce-scatter of its routed tokens, one expert all-to-all of them, and a layer's context-parallel ring passes
    of K and V."""
    model, e = w.model, w.precision.activation_bytes
    tp, cp, ep, sequence_parallel, etp = grid
    tp_one = etp_one = 0.0
    if tp > 1:
        activation = w.micro_batch * w.seq_len / cp * model.hidden_size * e
        tp_one = group_time("all-reduce", activation, tp, 1, cluster)
    ep_one = 0.0
    if model.moe:
        hidden_tokens = w.micro_batch * w.seq_len / cp / (tp if sequence_parallel else 1)
        width = w.expert_width.size  # h, or a latent MoE's l: its dispatcher moves the projected tokens
        routed = hidden_tokens * width * e * w.routed_copies  # k·ρ rows a token (padding is sent too)
        if etp > 1:  # gathered: the k copies of the tokens of the group's ETP GPUs (TP's share theirs without SP)
            gathered = routed * (etp if sequence_parallel or tp == 1 else 1)
            etp_one = group_time("all-gather", gathered, etp, 1, cluster)
            etp_one += group_time("reduce-scatter", gathered, etp, 1, cluster)
        if ep > 1:
            moe = model.moe
            group = EpGroup(ep, etp, moe.num_experts, moe.num_experts + moe.zero_experts, moe.k, moe.node_limit)
            token_bytes = hidden_tokens * width * e
            ep_one = dispatch_time(w.moe_dispatcher, group, token_bytes, w.routed_copies, w.routed_share, cluster)
    cp_per_layer = 0.0
    if cp > 1:
        kv_chunk = 2 * w.seq_len / cp * w.micro_batch * model.mean_kv_heads * model.qk_head_dim * e / tp
        cp_per_layer = 3 * (cp - 1) * group_time("p2p", kv_chunk, cp, tp, cluster)
    return tp_one, etp_one, ep_one, cp_per_layer
