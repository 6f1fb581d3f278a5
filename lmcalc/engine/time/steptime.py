"""Time of one training step for a layout, from the kernels up.

A step is ``m`` micro-batches through every pipeline stage, then the gradient reduction and the optimizer. Each
stage is timed with its own work (``engine.time.kernels.stage_work``), and the pipeline waits for the slowest.

One micro-batch on one GPU (its kernels, the tensor-parallel, expert and context-parallel collectives it waits
for, the host that issues it) is ``engine.time.microbatch``'s.

Once per step:

* **Pipeline bubble**: (p − 1)/v micro-batch times (1F1B, Narayanan et al. 2021 §2.2; v chunks interleaved), and
  the activations sent between stages, each way per micro-batch, unless the profile overlaps them.
* **Data parallelism** and **the optimizer step** (``engine.time.state_traffic``): the gradients' all-reduce
  (reduce-scatter under ZeRO-2/3) behind the last micro-batch's backward pass when the profile buckets it; ZeRO-1/2's
  all-gather of the updated parameters behind the next forward pass when it prefetches; ZeRO-3 gathers every layer's
  parameters forward and backward and scatters its gradients, behind that micro-batch's compute when it prefetches;
  HSDP's reduction across its groups; the optimizer's memory traffic over this GPU's share of the states.

``efficiency`` replaces the kernel model's compute with the old rule, hardware FLOPs at a fraction of the dense
peak (``--efficiency``, or a measured training step): the rest of the model is unchanged.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, replace
from typing import NamedTuple, overload

from lmcalc.engine.finetune.flops import method_step_flops
from lmcalc.engine.model import flops as fl
from lmcalc.engine.parallel.layout import ActivationLayout, Layout
from lmcalc.engine.parallel.pipeline import Mix, StageLayers, split_stage_layers
from lmcalc.engine.parallel.sharding import (
    stage_part,
    states_workload,
)
from lmcalc.engine.time import rates
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.ep_overlap import unpaired_micro_batches
from lmcalc.engine.time.kernels import kernel_workload, workload_redone
from lmcalc.engine.time.microbatch import MicroBatchTime, block_layers, micro_batch_time, stage_micro_batches
from lmcalc.engine.time.state_traffic import exposed_traffic, stage_state_traffic
from lmcalc.engine.workload import Workload
from lmcalc.specs import Cluster


class _OverMicroBatches:
    """A ``StepTime`` figure: the slowest stage's micro-batch figure at ``path`` (``kernels.gemm``), times the
    micro-batches of the step."""

    def __init__(self, path: str, doc: str | None = None):
        self._figure = operator.attrgetter(path)
        self.__doc__ = doc or f"The micro-batch's {path.rsplit('.', 1)[-1]} time over the step's micro-batches."

    @overload
    def __get__(self, step: None, owner: type) -> _OverMicroBatches: ...

    @overload
    def __get__(self, step: StepTime, owner: type) -> float: ...

    def __get__(self, step: StepTime | None, owner: type) -> float | _OverMicroBatches:
        if step is None:
            return self
        return step.slowest.grad_accum * self._figure(step.slowest.micro_batch)


@dataclass(frozen=True, slots=True)  # slots: the planner makes one per layout that fits
class StepTime:
    """Seconds per step and the parts it is made of, as the slowest pipeline stage lives them: ``grad_accum``
    times that stage's micro-batch (its kernels, the host, the TP, EP and CP collectives it waits for), then
    what its step adds once (pipeline sends, bubble, exposed DP and ZeRO traffic, the optimizer)."""

    workload: Workload
    layout: Layout
    slowest: StageStep  # the pipeline stage whose step is longest, which sets the pace
    chip: ChipRates  # the dense peak, and the matmul rate the GEMMs were timed against
    efficiency: float | None  # the fraction of peak the compute is assumed to reach; None: timed kernel by kernel

    @property
    def tokens(self) -> int:
        """Tokens per step, whole cluster: DP · m · b · s."""
        return step_tokens(self.workload, self.layout)

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    @property
    def model_flops(self) -> float:
        """Per step, whole cluster."""
        return _whole_step_flops(self.workload)[0] * self.tokens

    @property
    def hardware_flops(self) -> float:
        """Model FLOPs and what recomputation redoes, per step, whole cluster."""
        redone = _whole_step_flops(self.workload)[1] * recomputed_share(self.workload, self.layout)
        return self.model_flops + redone * self.tokens

    @property
    def stage_flops(self) -> float:
        """The slowest stage's hardware FLOPs per step, over all its GPUs."""
        w, built = self.workload, self.slowest.built
        return stage_hardware_flops(w, built, block_layers(w, self.layout.stages, self.slowest_stage)) * self.tokens

    @property
    def slowest_stage(self) -> int:
        return self.slowest.stage

    # A micro-batch's figure on the slowest stage, times the micro-batches of the step
    compute = _OverMicroBatches("compute", "GPU kernel time over the step's micro-batches: gemm + attention + memory.")
    gemm = _OverMicroBatches("kernels.gemm")
    attention = _OverMicroBatches("kernels.attention")
    memory = _OverMicroBatches("kernels.memory")
    host = _OverMicroBatches("host", "Host time not hidden behind the GPU's.")
    tp = _OverMicroBatches("tp")

    @property
    def ep(self) -> float:
        """The expert all-to-alls exposed: each micro-batch's, and where Megatron-Core's overlap pairs the passes,
        what its unpaired ones expose beyond (``StageStep.ep_unpaired``)."""
        return self.slowest.grad_accum * self.slowest.micro_batch.ep + self.slowest.ep_unpaired

    cp = _OverMicroBatches("cp")

    @property
    def pp_p2p(self) -> float:
        return self.slowest.pp_p2p

    @property
    def bubble(self) -> float:
        return self.slowest.bubble

    @property
    def dp(self) -> float:
        return self.slowest.dp

    @property
    def zero(self) -> float:
        return self.slowest.zero

    @property
    def optimizer(self) -> float:
        return self.slowest.optimizer

    @property
    def peak(self) -> float:
        return self.chip.peak

    @property
    def matmul_rate(self) -> float:
        """The achievable matmul FLOP/s the GEMMs were timed against."""
        return self.chip.matmul

    @property
    def matmul_source(self) -> str:
        return self.chip.matmul_source

    @property
    def gemm_fraction(self) -> float:
        """The share of the matmul rate a step's GEMMs sustain (Calibration)."""
        return self.chip.gemm_fraction

    @property
    def total(self) -> float:
        return self.slowest.total

    @property
    def mfu(self) -> float:
        return _utilisation(self.model_flops, self.total, self.gpus, self.peak)

    @property
    def hfu(self) -> float:
        return _utilisation(self.hardware_flops, self.total, self.gpus, self.peak)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total


def step_tokens(w: Workload, layout: Layout) -> int:
    """Tokens per step, whole cluster: DP · m · b · s."""
    return layout.dp * layout.grad_accum * w.micro_batch * w.seq_len


def _utilisation(flops: float, seconds: float, gpus: int, peak: float) -> float:
    """FLOPs per step over what the GPUs could do at their peak in the step: MFU of model FLOPs, HFU of hardware's."""
    return flops / (seconds * gpus * peak)


def step_figures(
    w: Workload, layout: Layout, machine: rates.Machine, efficiency: float | None = None
) -> tuple[float, float, float]:
    """``step_time_on``'s tokens/s, MFU and seconds a step, without the parts: all the planner keeps of each layout
    that fits (the same arithmetic as ``StepTime``'s, so the figures are equal to the bit)."""
    timed, model_flops, peak = _step_constants(w, machine, efficiency)
    total = slowest_stage(timed, layout, machine, efficiency).total
    tokens = step_tokens(w, layout)
    return tokens / total, _utilisation(model_flops * tokens, total, layout.gpus, peak), total


@functools.lru_cache(maxsize=1024)
def _step_constants(w: Workload, machine: rates.Machine, efficiency: float | None) -> tuple[Workload, float, float]:
    """What ``step_figures`` reads that no layout changes, looked up at once: the workload its stages are timed with,
    the model FLOPs per token and the chip's dense peak."""
    timed = w if efficiency is not None else kernel_workload(w)
    return timed, _whole_step_flops(w)[0], _chip_rates(machine, w.precision.compute_dtype).peak


@functools.lru_cache(maxsize=1 << 14)
def stage_step_flops(w: Workload, built: StageLayers) -> fl.StepFlops:
    """FLOPs per token of a stage that builds ``built``: its share of the weights, its layers' attention (counted
    in full, as model FLOPs are), the logits on the last stage, and what recomputation redoes."""
    flops = fl.step_flops(w.model, w.seq_len, w.recompute, "full", stage_part(w.model, built), workload_redone(w))
    if w.method.kind == "full":
        return flops
    # a fine-tuning method's share of full training, whole-model, applied to the stage's part
    whole = fl.step_flops(w.model, w.seq_len, w.recompute, "full", redone=workload_redone(w))
    model, recomputed = _whole_step_flops(w)
    return fl.StepFlops(flops.forward, flops.recomputed * recomputed / whole.recomputed if whole.recomputed else 0.0,
                        model / whole.model)  # fmt: skip


class ChipRates(NamedTuple):
    """What every step time reports of the chip: its dense peak, the matmul rate its GEMMs are timed against and
    where that comes from, and the share of that rate a step's GEMMs sustain."""

    peak: float
    matmul: float
    matmul_source: str
    gemm_fraction: float


@functools.lru_cache(maxsize=64)
def _chip_rates(machine: rates.Machine, dtype: str) -> ChipRates:
    hardware, matmul = machine.hardware, rates.matmul_rate(machine.hardware, dtype)
    return ChipRates(
        hardware.peak_flops(dtype), matmul.flops_per_s, matmul.source, machine.calibration.gemm_fraction_for(hardware)
    )


def stage_hardware_flops(w: Workload, built: StageLayers, redone: Mix | None) -> float:
    """``stage_step_flops``' hardware FLOPs per token, where Megatron's block method recomputes only the ``redone``
    (dense, MoE) layers of the stage."""
    flops = stage_step_flops(w, built)
    if redone is not None and built.layers:
        flops = replace(flops, recomputed=flops.recomputed * sum(redone) / built.layers)
    return flops.hardware


def recomputed_share(w: Workload, layout: Layout) -> float:
    """Of the model's layers, the share whose forward full recomputation runs again: all of them, but under
    Megatron's block method the first ``recompute_num_layers`` of each chunk of each stage."""
    if w.recompute != "full" or w.recompute_method != "block":
        return 1.0
    stages = layout.stages
    redone = sum(sum(block_layers(w, stages, stage) or (0, 0)) for stage in range(layout.pp))
    return redone / w.model.num_layers


@functools.lru_cache(maxsize=1024)
def _whole_step_flops(w: Workload) -> tuple[float, float]:
    """Model FLOPs per token of a step of the whole model, and the FLOPs recomputation adds."""
    if w.method.kind != "full":  # what the method trains: engine.finetune.flops
        method = method_step_flops(w.model, w.method, w.seq_len, w.recompute, "full")
        return method.model, method.recomputed
    flops = fl.step_flops(w.model, w.seq_len, w.recompute, "full", redone=workload_redone(w))
    return flops.model, flops.recomputed


def step_time(
    w: Workload,
    layout: Layout,
    cluster: Cluster,
    efficiency: float | None = None,
    calibration: rates.Calibration = rates.CALIBRATION,
) -> StepTime:
    """Seconds per step, with the parts it is made of (``step_time_on`` the cluster with this calibration)."""
    return step_time_on(w, layout, rates.Machine(cluster, calibration), efficiency)


def step_time_on(w: Workload, layout: Layout, machine: rates.Machine, efficiency: float | None = None) -> StepTime:
    """Seconds per step, with the parts it is made of, as the slowest pipeline stage lives it: every distinct
    stage (``distinct_stages``) is timed with its own work, layers and parameters, and the pipeline waits for
    the longest."""
    timed = w if efficiency is not None else kernel_workload(w)  # what the stages' times depend on
    slowest = slowest_stage(timed, layout, machine, efficiency)
    return StepTime(w, layout, slowest, _chip_rates(machine, w.precision.compute_dtype), efficiency)


class StageStep(NamedTuple):
    """One pipeline stage's step: what it builds, one micro-batch's time on it and the micro-batches per step, and
    what its step adds once (pipeline sends, bubble, exposed data-parallel and ZeRO traffic, the optimizer)."""

    stage: int
    built: StageLayers
    micro_batch: MicroBatchTime
    grad_accum: int
    pp_p2p: float
    bubble: float
    dp: float
    zero: float
    optimizer: float
    total: float  # seconds: the parts above, added in ``slowest_stage``
    ep_unpaired: float = 0.0  # all-to-alls the overlap's unpaired passes expose beyond the paired (ep_overlap)


@functools.lru_cache(maxsize=16)  # the planner tries a layout's recomputation modes one after the other
def slowest_stage(w: Workload, layout: Layout, machine: rates.Machine, efficiency: float | None) -> StageStep:
    """Time every distinct stage of the layout and keep the slowest (the first of equally slow ones). Timed kernel
    by kernel, the stages' times depend on the workload's kernels alone, so ``step_time`` asks with its
    ``kernel_workload``, which runs without and with selective recomputation share; under ``efficiency`` the
    compute follows the workload's own hardware FLOPs."""
    p, m, zero, replicas, speed = layout.pp, layout.grad_accum, layout.zero, layout.data_replicas, w.framework.speed
    grid, pipeline = layout.grid, layout.stages
    stages = split_stage_layers(w.model, pipeline)  # distinct_stage_layers, its pipeline at hand
    if efficiency is None:
        micro_batches = stage_micro_batches(w, grid, pipeline, machine)
    else:  # the one-number rule: hardware FLOPs at a fraction of the peak, shared out as the kernels share it (what
        # overlaps with what keeps its meaning)
        tokens = layout.dp * m * w.micro_batch * w.seq_len
        peak = machine.hardware.peak_flops(w.precision.compute_dtype)
        micro_batches = tuple(
            micro_batch_time(kernel_workload(w), grid, built, machine,
                             stage_hardware_flops(w, built, block_layers(w, pipeline, stage)) * tokens
                             / (layout.gpus / p * peak * efficiency) / m, block_layers(w, pipeline, stage))
            for stage, built in stages
        )  # fmt: skip
    traffics = stage_state_traffic(states_workload(w), layout.state_shards, layout.cp, pipeline, machine)
    pp_p2p = _pipeline_sends(w, layout.activation_layout, layout.dp, machine)
    bubble_share = (p - 1) / layout.split.chunks  # of a micro-batch's time, with v chunks a stage

    slowest: StageStep | None = None
    slowest_total = 0.0
    for (stage, built), mb, traffic in zip(stages, micro_batches, traffics, strict=True):
        bubble = bubble_share * mb.total if p > 1 else 0.0
        dp_time, zero_time = exposed_traffic(traffic, mb, m, zero, replicas, speed)
        zero_time += m * traffic.fetch  # offloaded weights come over the host link, not overlapped (finetune.offload)
        unpaired = unpaired_micro_batches(layout, stage) * (mb.ep_alone - mb.ep) if w.moe_a2a_overlap else 0.0
        # the step: m micro-batches (compute, host, TP, EP, CP), then pipeline sends, bubble, DP, ZeRO, optimizer
        total = (
            m * mb.compute + m * mb.host + m * mb.tp + m * mb.ep + m * mb.cp + pp_p2p + bubble + dp_time + zero_time
            + traffic.optimizer + unpaired
        )  # fmt: skip
        if slowest is None or total > slowest_total:  # the first of equally slow stages
            slowest = StageStep(
                stage, built, mb, m, pp_p2p, bubble, dp_time, zero_time, traffic.optimizer, total, unpaired
            )
            slowest_total = total
    assert slowest is not None  # every layout has a first stage
    return slowest


@functools.lru_cache(maxsize=1 << 14)  # layouts that differ in EP, ETP or ZeRO alone send the same
def _pipeline_sends(w: Workload, layout: ActivationLayout, dp: int, machine: rates.Machine) -> float:
    """Per step: the activations each stage sends and receives, each way per micro-batch and chunk, unless the
    framework overlaps them with compute. They depend on the micro-batch's activations (TP, SP, CP), the pipeline
    and the step's micro-batches, and on DP, which places the stages' GPUs."""
    t, p, c = layout.tp, layout.pp, layout.cp
    if p == 1 or w.framework.speed.pp_overlap:
        return 0.0
    sp = layout.sequence_parallel and t > 1
    activation = w.micro_batch * w.seq_len / c * w.model.hidden_size * w.precision.activation_bytes / (t if sp else 1)
    stride = t * c * dp
    return layout.grad_accum * layout.split.chunks * 2 * group_time("p2p", activation, 2, stride, machine.cluster)
