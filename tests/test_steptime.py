"""How engine.time.steptime puts a step together from the kernels, the collectives and the host: each rule checked by a
hand derivation, or against another engine function that computes the same quantity another way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_layers
from lmcalc.engine.time import rates
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.microbatch import kernel_times
from lmcalc.engine.time.steptime import step_time
from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster

BF16 = resolve_precision("bf16-mixed").spec
FP8 = resolve_precision("fp8-mixed").spec
ADAMW = resolve_optimizer("adamw").spec
H100 = resolve_hardware("h100-sxm").spec
LLAMA_8B = resolve_model("llama-3.1-8b").spec
CAL = rates.CALIBRATION


def with_speed(name: str, **changes) -> FrameworkProfile:
    profile = framework_profile(name)
    return profile.model_copy(update={"speed": profile.speed.model_copy(update=changes)})


def work(framework: FrameworkProfile, mb: int = 1, seq: int = 4096, precision=BF16) -> Workload:
    return Workload(LLAMA_8B, precision, ADAMW, seq, mb, framework=framework, overhead_bytes=0.0)


def node(count: int = 8) -> Cluster:
    return Cluster(hardware=H100, count=count, gpus_per_node=8)


def test_one_gpu_step_is_its_micro_batches_kernels_and_optimizer():
    """One GPU, no parallelism, no host cost: step = m · (GEMMs + attention + memory-bound kernels) + optimizer."""
    w = work(with_speed("megatron", host_seconds_per_op=0.0))
    layout = Layout(grad_accum=4)
    t = step_time(w, layout, Cluster(hardware=H100, count=1, gpus_per_node=1))
    built = stage_layers(LLAMA_8B, layout, 0)
    times = kernel_times(stage_work(w, Grid(), built), H100, "bf16", "flash3", 2, CAL)
    assert t.compute == pytest.approx(4 * times.total)
    assert t.total == pytest.approx(4 * times.total + t.optimizer)
    assert t.tp == t.dp == t.bubble == t.host == 0


def test_host_bound_micro_batches_take_the_host_time():
    """When issuing a micro-batch's operations takes longer than running them, the host sets the pace:
    step = m · operations · host seconds per op (+ the optimizer)."""
    slow = work(with_speed("megatron", host_seconds_per_op=1e-2))
    layout = Layout(grad_accum=2)
    t = step_time(slow, layout, Cluster(hardware=H100, count=1, gpus_per_node=1))
    ops = stage_work(slow, Grid(), stage_layers(LLAMA_8B, layout, 0)).operations
    assert t.compute + t.host == pytest.approx(2 * ops * 1e-2)
    assert t.host > 0


def test_tensor_parallel_overlap_hides_backward_collectives_behind_backward_gemms():
    """TP 8 with sequence parallelism: 2 all-reduces' worth forward and 3 backward (the input gathered again for
    the weight gradients) per layer. Without overlap all are exposed; Megatron's asynchronous TP hides the
    backward ones behind the backward GEMMs, so the difference is min(backward comm, backward GEMMs) a layer."""
    layout = Layout(tp=8, sequence_parallel=True)
    exposed = step_time(work(with_speed("megatron", tp_overlap="none", host_seconds_per_op=0.0)), layout, node())
    hidden = step_time(work(with_speed("megatron", tp_overlap="backward", host_seconds_per_op=0.0)), layout, node())
    one = group_time("all-reduce", 4096 * LLAMA_8B.hidden_size * 2, 8, 1, node())
    assert exposed.tp == pytest.approx(LLAMA_8B.num_layers * 5 * one)
    assert hidden.tp == pytest.approx(LLAMA_8B.num_layers * 2 * one)  # the backward 3 fit behind the GEMMs
    assert hidden.total < exposed.total


def test_the_bubble_is_p_minus_one_over_v_micro_batch_times():
    """1F1B over p stages: (p − 1) micro-batch times of the slowest stage (Narayanan et al. 2021 §2.2.1); the
    interleaved schedule with v chunks divides it by v (§2.2.2)."""
    w = work(with_speed("megatron", host_seconds_per_op=0.0))
    plain = Layout(pp=4, grad_accum=8)
    t = step_time(w, plain, node(4))
    per_micro_batch = (t.compute + t.tp) / 8
    assert t.bubble == pytest.approx(3 * per_micro_batch)
    interleaved = replace(plain, split=PipelineSplit(schedule="interleaved", virtual_stages=2))
    ti = step_time(w, interleaved, node(4))
    assert ti.bubble == pytest.approx(3 / 2 * (ti.compute + ti.tp) / 8)


def test_bucketed_gradient_reduction_hides_behind_the_last_backward():
    """DP 8 across 8 nodes (TP 8 inside): the gradient all-reduce is exposed when the profile does not bucket it
    behind the backward pass, and shrinks by the backward's GEMMs and attention when it does."""
    layout = Layout(tp=8, dp=8, sequence_parallel=True, grad_accum=1)
    cluster = node(64)
    never = step_time(work(with_speed("megatron", dp_overlap="never", host_seconds_per_op=0.0)), layout, cluster)
    always = step_time(work(with_speed("megatron", dp_overlap="always", host_seconds_per_op=0.0)), layout, cluster)
    assert never.dp > always.dp >= 0
    assert never.dp - always.dp <= never.compute


def test_efficiency_replaces_the_kernels_with_one_fraction_of_the_peak():
    """--efficiency: compute = hardware FLOPs of the stage / (GPUs per stage · dense peak · efficiency)."""
    w = work(with_speed("megatron", host_seconds_per_op=0.0))
    t = step_time(w, Layout(grad_accum=2), Cluster(hardware=H100, count=1, gpus_per_node=1), efficiency=0.5)
    assert t.compute == pytest.approx(t.stage_flops / (H100.peak_flops("bf16") * 0.5))
    assert t.efficiency == 0.5
    assert t.gemm + t.attention + t.memory == pytest.approx(t.compute)  # shared out as the kernels share it


def test_fp8_gemms_run_faster_but_attention_stays_in_bf16():
    """fp8-mixed: the GEMMs at the fp8 matmul rate with one-byte operands, the casts as memory traffic, the fused
    attention at its bf16 rate."""
    profile = with_speed("megatron", host_seconds_per_op=0.0)
    layout, one = Layout(), Cluster(hardware=H100, count=1, gpus_per_node=1)
    bf16, fp8 = step_time(work(profile), layout, one), step_time(work(profile, precision=FP8), layout, one)
    assert fp8.gemm < bf16.gemm
    assert fp8.attention == pytest.approx(bf16.attention)
    assert fp8.memory > bf16.memory


def test_node_limited_routing_sends_fewer_bytes_across_nodes_under_deepep():
    """DeepSeek-V3 (8 experts per token, at most 4 nodes): with EP over 8 nodes DeepEP sends a token over the
    network once per node it visits, so the limit shortens its all-to-all; NCCL's all-to-all sends the 8 copies
    whatever the limit (engine.time.dispatch, tests/test_dispatch.py)."""
    deepseek = resolve_model("deepseek-v3").spec
    assert deepseek.moe and deepseek.moe.node_limit == 4
    unlimited = deepseek.model_copy(update={"moe": deepseek.moe.model_copy(update={"node_limit": None})})
    h800 = resolve_hardware("h800").spec
    layout = Layout(dp=64, ep=64, pp=1, grad_accum=1)
    cluster = Cluster(hardware=h800, count=64, gpus_per_node=8)

    def ep_time(model, dispatcher):
        framework = with_speed("megatron", host_seconds_per_op=0.0)
        w = Workload(model, BF16, ADAMW, 4096, 1, framework=framework, moe_dispatcher=dispatcher)
        return step_time(w, layout, cluster).ep

    assert ep_time(deepseek, "deepep") < ep_time(unlimited, "deepep") < ep_time(deepseek, "alltoall")
    assert ep_time(deepseek, "alltoall") == ep_time(unlimited, "alltoall")
