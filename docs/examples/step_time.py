"""Recompute, term by term, the step time lmcalc's planner gives a layout (docs/formulas.md §8).

    python docs/examples/step_time.py MODEL CLUSTER --seq S --dp D --tp T --pp P --cp C [--ep E] [--zero Z]
        [--micro-batch B] [--grad-accum M] [--sequence-parallel] [--virtual-stages V] [--recompute R]
        [--framework F]

The kernels of each stage come from ``lmcalc.engine.time.kernels.stage_work`` (the inventory of formulas.md §8.3-8.5);
everything else is written out here from the formulas of docs/formulas.md §8: each GEMM by its roofline, fused
attention at its rate, the memory-bound bytes at η × HBM bandwidth, the host, each collective by
``lmcalc.engine.time.comm.group_time`` (§8.7) with what the framework profile overlaps (§8.9), the bubble, the
data-parallel reduction and ZeRO's gathers, and the optimizer. Every stage that can be the slowest is timed and
the longest is the step. The result is printed beside ``lmcalc.engine.time.steptime.step_time`` for the same layout.
``--virtual-stages`` above 1 means the interleaved schedule. bf16-mixed, AdamW, flash attention, the shipped
constants (``lmcalc.engine.time.rates.CALIBRATION``).
"""

import argparse

from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, distinct_stages, stage_layers
from lmcalc.engine.parallel.sharding import stage_params
from lmcalc.engine.parallel.states import optimizer_bytes_per_param
from lmcalc.engine.time import rates
from lmcalc.engine.time.comm import collective_time, group_time, intra_link
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.state_traffic import FOREACH_PASSES
from lmcalc.engine.time.steptime import step_time
from lmcalc.engine.workload import Workload
from lmcalc.presets import parse_cluster, resolve_framework, resolve_model, resolve_optimizer, resolve_precision

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("cluster")
parser.add_argument("--seq", type=int, required=True)
for flag in ("dp", "tp", "pp", "cp", "ep", "micro-batch", "grad-accum", "virtual-stages"):
    parser.add_argument(f"--{flag}", type=int, default=1)
parser.add_argument("--zero", type=int, default=0)
parser.add_argument("--sequence-parallel", action="store_true")
parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
parser.add_argument("--framework", default="megatron")
a = parser.parse_args()

model, cluster = resolve_model(a.model).spec, parse_cluster(a.cluster)
hw, precision = cluster.hardware, resolve_precision("bf16-mixed").spec
profile = resolve_framework(a.framework).spec
speed, cal = profile.speed, rates.CALIBRATION
layout = Layout(
    dp=a.dp,
    tp=a.tp,
    pp=a.pp,
    cp=a.cp,
    ep=a.ep,
    zero=a.zero,
    sequence_parallel=a.sequence_parallel,
    grad_accum=a.grad_accum,
    split=PipelineSplit("interleaved" if a.virtual_stages > 1 else "1f1b", a.virtual_stages),
)
adamw = resolve_optimizer("adamw").spec
w = Workload(model, precision, adamw, a.seq, a.micro_batch, recompute=a.recompute, framework=profile)
s, b, h, e = a.seq, a.micro_batch, model.hidden_size, precision.activation_bytes
t, p, c, d, m, v = a.tp, a.pp, a.cp, a.dp, a.grad_accum, a.virtual_stages
sp = a.sequence_parallel and t > 1
grad_bytes = profile.states.grad_bytes or precision.grad_bytes
rate = rates.matmul_rate(hw, "bf16").flops_per_s  # R: the measured maximum achievable matmul rate
attention_rate = rates.attention_rate(hw, speed.attention_kernel, "bf16", rates.matmul_rate(hw, "bf16"))
hbm = hw.memory_bandwidth_tbps * 1e12 * cal.hbm_efficiency  # η · B


def gemm(m_: float, n: float, k: float, extra: float = 0.0) -> float:
    """max(2mnk / (φ·R·w), bytes / (η·B)) + t₀ (formulas.md §8.2)."""
    wave = rates.wave_efficiency(hw, m_, n)
    arithmetic = 2 * m_ * n * k / (cal.gemm_fraction_for(hw) * rate * wave)
    moved = e * (m_ * k + k * n + m_ * n) + extra
    return max(arithmetic, moved / hbm) + cal.kernel_overhead_s


# One collective of each kind the micro-batch needs, on the links its group's placement gives it (§8.7).
activation = b * s / c * h * e  # one micro-batch's hidden states on one CP rank
tp_one = group_time("all-reduce", activation, t, 1, cluster) if t > 1 else 0.0
ep_one = 0.0
if model.moe and a.ep > 1:
    routed = activation / (t if sp else 1) * model.moe.experts_per_token  # k copies of each token
    per_node = max(1, cluster.gpus_per_node // (t * c))
    if model.moe.node_limit and a.ep > per_node:  # each token crosses the network once per node it visits
        visited = min(model.moe.experts_per_token, model.moe.node_limit, -(-a.ep // per_node))
        remote = group_time("all-to-all", routed * visited / model.moe.experts_per_token, a.ep, t * c, cluster)
        near = collective_time("all-to-all", routed, min(a.ep, per_node), intra_link(hw))
        ep_one = max(remote, near)
    else:
        ep_one = group_time("all-to-all", routed, a.ep, t * c, cluster)
kv_chunk = 2 * (s / c) * b * model.kv_heads * model.qk_head_dim * e / t
cp_per_layer = 3 * (c - 1) * group_time("p2p", kv_chunk, c, t, cluster) if c > 1 else 0.0


def stage_rows(stage: int) -> dict[str, float]:
    """The step as ``stage`` lives it."""
    built = stage_layers(model, layout, stage)
    work = stage_work(w, Grid(t, c, a.ep, sp), built)
    # GEMMs: forward, input gradient (m × n)·(n × k), weight gradient (k × m)·(m × n) with the fp32 accumulator
    forward = sum(g.count * gemm(g.m, g.n, g.k) for g in work.gemms + work.head)
    input_grad = sum(g.count * gemm(g.m, g.k, g.n) for g in work.gemms + work.head)
    weight_grad = sum(
        g.count * gemm(g.n, g.k, g.m, work.wgrad_accumulator_bytes * g.n * g.k) for g in work.gemms + work.head
    )
    batched = sum(g.count * gemm(g.m, g.n, g.k) for g in work.batched)  # eager attention's scores and values
    forward, input_grad = forward + batched, input_grad + 2 * batched
    recomputed = work.recomputed_gemms * (forward - sum(g.count * gemm(g.m, g.n, g.k) for g in work.head))
    gemms = forward + input_grad + weight_grad + recomputed
    # fused attention: forward and 2.5 × forward FLOPs at the kernel's rates, one kernel per layer each way
    attention_forward = attention_backward = 0.0
    if work.attention_forward:
        attention_forward = (work.attention_forward + work.attention_recomputed) / attention_rate.forward
        attention_backward = work.attention_backward / attention_rate.backward
        attention_forward += work.layers * cal.kernel_overhead_s
        attention_backward += work.layers * cal.kernel_overhead_s
    attention = attention_forward + attention_backward
    # memory-bound kernels: bytes / (η · B) + kernels · t₀
    moved = work.memory_forward + work.memory_backward + work.accumulation_bytes + work.fp8_cast_bytes
    memory = moved / hbm + work.memory_kernels * cal.kernel_overhead_s
    compute = gemms + attention + memory
    # TP: 2 forward (4 under full recomputation), 2 backward (+1 with SP), less what the profile hides
    tp_forward = built.layers * (4 if a.recompute == "full" else 2) * tp_one
    tp_backward = built.layers * (3 if sp else 2) * tp_one
    if speed.tp_overlap == "full":
        tp = max(0.0, tp_forward - forward) + max(0.0, tp_backward - input_grad - weight_grad)
    elif speed.tp_overlap == "backward":
        tp = tp_forward + max(0.0, tp_backward - input_grad - weight_grad)
    else:
        tp = tp_forward + tp_backward
    a2a = built.moe * (4 + (2 if a.recompute == "full" else 0)) * ep_one
    ep = max(0.0, a2a - compute) if speed.moe_overlap else a2a
    cp = max(0.0, built.layers * cp_per_layer - attention)
    busy = compute + tp + ep + cp
    per_micro_batch = max(busy, work.operations * speed.host_seconds_per_op)  # the host runs ahead, or not
    rows = {
        "GEMMs": m * gemms,
        "attention": m * attention,
        "memory-bound": m * memory,
        "host not hidden": m * (per_micro_batch - busy),
        "TP collectives": m * tp,
        "EP all-to-all": m * ep,
        "CP K/V exchange": m * cp,
    }
    # the pipeline: sends between stages, each way per micro-batch and chunk, and the bubble
    sends = m * v * 2 * group_time("p2p", activation / (t if sp else 1), 2, t * c * d, cluster)
    rows["pipeline sends"] = sends if p > 1 and not speed.pp_overlap else 0.0
    rows["pipeline bubble"] = (p - 1) / v * per_micro_batch
    # data parallelism and ZeRO over the DP·CP replicas of this stage's parameters
    held = stage_params(w, layout, stage)
    params, replicas, stride = held.total, d * c, t * c
    grads = zero = 0.0
    if replicas > 1 and a.zero == 3:
        flat = speed.zero3_network == "one_nic"
        gather = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster, flat)
        scatter = group_time("reduce-scatter", params * grad_bytes, replicas, stride, cluster, flat)
        zero = m * (max(0.0, 2 * gather + scatter - compute) if speed.param_gather_overlap else 2 * gather + scatter)
    elif replicas > 1:
        op = "reduce-scatter" if a.zero == 2 else "all-reduce"
        reduce = group_time(op, params * grad_bytes, replicas, stride, cluster)
        bucketed = speed.dp_overlap == "always" or speed.dp_overlap == "without_zero" and a.zero == 0
        grads = max(0.0, reduce - (input_grad + weight_grad + attention_backward)) if bucketed else reduce
        if a.zero >= 1:
            gather = group_time("all-gather", params * precision.param_bytes, replicas, stride, cluster)
            zero = max(0.0, gather - (forward + attention_forward)) if speed.param_gather_overlap else gather
    rows["gradient reduction"], rows["ZeRO gathers"] = grads, zero
    # the optimizer: 2 gradient reads, master weights and states read and written, weights written
    local = held.dense / replicas + held.experts / max(1, replicas // a.ep) if a.zero >= 1 else held.total
    states = optimizer_bytes_per_param(model, precision, adamw)
    per_param = 2 * grad_bytes + 2 * (precision.master_bytes + states) + precision.param_bytes
    passes = FOREACH_PASSES if profile.optimizer_step.temporaries == "foreach" else 1
    rows["optimizer"] = local * per_param * passes / hbm + 4 * passes * cal.kernel_overhead_s
    return rows


stages = {stage: stage_rows(stage) for stage in distinct_stages(model, layout)}
slowest = max(stages, key=lambda stage: sum(stages[stage].values()))
lmcalc = step_time(w, layout, cluster)
theirs = [
    lmcalc.gemm,
    lmcalc.attention,
    lmcalc.memory,
    lmcalc.host,
    lmcalc.tp,
    lmcalc.ep,
    lmcalc.cp,
    lmcalc.pp_p2p,
    lmcalc.bubble,
    lmcalc.dp,
    lmcalc.zero,
    lmcalc.optimizer,
]
print(f"{layout.label}, mb={b}, GA={m}, recompute {a.recompute}, {profile.name}")
print(f"slowest stage: {slowest + 1} of {p} (lmcalc: {lmcalc.slowest_stage + 1})")
print(f"{'term':<20} {'by hand (s)':>14} {'lmcalc (s)':>14}")
for (name, mine), value in zip(stages[slowest].items(), theirs, strict=True):
    print(f"{name:<20} {mine:>14.6g} {value:>14.6g}")
print(f"{'step':<20} {sum(stages[slowest].values()):>14.6g} {lmcalc.total:>14.6g}")
print(f"MFU {lmcalc.mfu:.4f}   tokens/s {lmcalc.tokens_per_s:.6g}")
