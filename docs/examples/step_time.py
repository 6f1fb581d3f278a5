"""Recompute, term by term, the step time lmcalc's planner gives a layout (docs/formulas.md §9).

    python docs/examples/step_time.py MODEL CLUSTER --seq S --dp D --tp T --pp P --cp C [--ep E] [--zero Z]
        [--micro-batch B] [--grad-accum M] [--sequence-parallel] [--virtual-stages V] [--recompute R]

Each term is written out from the formulas of docs/formulas.md §9, with the ring costs of
``lmcalc.engine.comm`` (§8), and printed beside the value of ``lmcalc.engine.steptime.step_time`` for the
same layout. ``--virtual-stages`` above 1 means the interleaved schedule. bf16-mixed, the default
compute efficiency.
"""

import argparse

from lmcalc.engine import flops as fl
from lmcalc.engine.comm import collective_time, link_for
from lmcalc.engine.layout import Layout
from lmcalc.engine.pipeline import PipelineSplit
from lmcalc.engine.sharding import stage_params
from lmcalc.engine.steptime import DEFAULT_COMPUTE_EFFICIENCY, step_time
from lmcalc.engine.workload import Workload
from lmcalc.presets import parse_cluster, resolve_model, resolve_optimizer, resolve_precision

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("cluster")
parser.add_argument("--seq", type=int, required=True)
for flag in ("dp", "tp", "pp", "cp", "ep", "micro-batch", "grad-accum", "virtual-stages"):
    parser.add_argument(f"--{flag}", type=int, default=1)
parser.add_argument("--zero", type=int, default=0)
parser.add_argument("--sequence-parallel", action="store_true")
parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
a = parser.parse_args()

model, cluster = resolve_model(a.model).spec, parse_cluster(a.cluster)
hw, per_node, bf16 = cluster.hardware, cluster.gpus_per_node, resolve_precision("bf16-mixed").spec
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
w = Workload(model, bf16, resolve_optimizer("adamw").spec, a.seq, a.micro_batch, recompute=a.recompute)
s, b, h = a.seq, a.micro_batch, model.hidden_size
t, p, c, d, m, v = a.tp, a.pp, a.cp, a.dp, a.grad_accum, a.virtual_stages
sp = t if a.sequence_parallel else 1
peak, eff = hw.peak_flops("bf16"), DEFAULT_COMPUTE_EFFICIENCY

# Compute: the slowest stage's hardware FLOPs over its GPUs × peak × efficiency. By hand for a dense model:
# every layer costs forward.layers / L; stage k holds L // p layers, one more for the first L % p stages;
# the last stage adds the logits.
forward = fl.forward_flops_per_token(model, s, "full")
per_layer = forward.layers / model.num_layers
redone = fl.recompute_flops_per_token(forward, a.recompute) / model.num_layers
stage_work = []
for stage in range(p):
    n = model.num_layers // p + (1 if stage < model.num_layers % p else 0)
    logits = forward.logits if stage == p - 1 else 0.0
    stage_work.append((3 * (n * per_layer + logits) + n * redone, n, stage, n * per_layer + logits))
work, layers, slowest, stage_forward = max(stage_work)
tokens = d * m * b * s
compute = work * tokens / (d * t * c * peak * eff)
moe_layers = layers if model.moe else 0
# TP: 4 collectives of one activation per layer and micro-batch (6 with full recomputation).
activation = s * b * h * 2 / c
collectives = 6 if a.recompute == "full" else 4
tp = m * layers * collectives * collective_time("all-reduce", activation, t, link_for(hw, t, per_node))
# EP: dispatch and combine, forward and backward, of the k routed copies of each token.
ep = 0.0
if model.moe and a.ep > 1:
    routed = model.moe.experts_per_token * activation / sp
    ep = m * moe_layers * 4 * collective_time("all-to-all", routed, a.ep, link_for(hw, a.ep * t * c, per_node))
# CP: the K and V chunk passes CP − 1 times forward and twice that backward.
kv_chunk = 2 * (s / c) * b * model.kv_heads * model.qk_head_dim * 2 / t
cp = m * layers * 3 * (c - 1) * collective_time("p2p", kv_chunk, 2, link_for(hw, c * t, per_node)) if c > 1 else 0.0
# PP: one activation each way per micro-batch, and the bubble.
pp_sends = m * 2 * collective_time("p2p", activation / sp, 2, link_for(hw, t * c * d * p, per_node)) if p > 1 else 0.0
bubble = (p - 1) / (v * m) * (compute + tp + ep + cp) if p > 1 else 0.0
# DP and ZeRO over the DP·CP replicas of the slowest stage's parameters.
held = stage_params(w, layout, slowest)
params, replicas, dp_link = held.dense + held.experts, d * c, link_for(hw, t * c * d, per_node)
grads, zero = 0.0, 0.0
if replicas > 1 and a.zero >= 3:
    per_micro_batch = 2 * collective_time("all-gather", params * 2, replicas, dp_link) + collective_time(
        "reduce-scatter", params * 2, replicas, dp_link
    )
    zero = m * max(0.0, per_micro_batch - compute / m)
elif replicas > 1:
    reduce = collective_time("reduce-scatter" if a.zero == 2 else "all-reduce", params * 2, replicas, dp_link)
    grads = max(0.0, reduce - (work - stage_forward) / work * compute / m)  # 2/3 without recomputation
    gather = collective_time("all-gather", params * 2, replicas, dp_link)  # hidden behind the next first forward
    first_forward = stage_forward / work * compute / m  # 1/3 of a micro-batch without recomputation
    zero = max(0.0, gather - first_forward) if a.zero >= 1 else 0.0

lmcalc = step_time(w, layout, cluster)
rows = [
    ("compute", compute, lmcalc.compute),
    ("TP collectives", tp, lmcalc.tp),
    ("EP all-to-all", ep, lmcalc.ep),
    ("CP K/V exchange", cp, lmcalc.cp),
    ("pipeline sends", pp_sends, lmcalc.pp_p2p),
    ("pipeline bubble", bubble, lmcalc.bubble),
    ("gradient reduction", grads, lmcalc.dp),
    ("ZeRO gathers", zero, lmcalc.zero),
]
print(f"{layout.label}, mb={b}, GA={m}, recompute {a.recompute}")
print(f"{'term':<20} {'by hand (s)':>14} {'lmcalc (s)':>14}")
for name, mine, theirs in rows:
    print(f"{name:<20} {mine:>14.6g} {theirs:>14.6g}")
print(f"{'step':<20} {sum(r[1] for r in rows):>14.6g} {lmcalc.total:>14.6g}")
print(f"MFU {lmcalc.mfu:.4f}   tokens/s {lmcalc.tokens_per_s:.6g}")
