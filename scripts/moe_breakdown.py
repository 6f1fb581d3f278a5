"""Where an MoE run's predicted step goes, term by term, against its published step, and how far each mechanism
issue #30 names could move it (docs/plan-accuracy.md, "Why MoE runs are predicted too fast").

    python scripts/moe_breakdown.py                # the representative runs, then every MoE held-out run
    python scripts/moe_breakdown.py RUN_ID ...     # the breakdown of these runs only

Nothing is fitted here: the shipped constants, the runs of benchmarks/heldout_runs.yaml at their published layouts.
The second table's columns are bounds computed from lmcalc's own terms, not predictions:

* **experts alone**: the fraction of lmcalc's rate the routed experts' GEMMs would have to run at for them alone to
  close the gap to the published step.
* **one grouped launch**: the step's change if each expert weight's GEMMs ran as one kernel whose waves cover every
  local expert's 128 × 128 tiles (one launch, no split-K), where lmcalc times each expert as its own GEMM.
* **all-to-alls exposed**: the step's change if the overlap (``moe_a2a_overlap``) hid none of them.
* **forced balance**: an upper bound on the busiest expert rank's extra rows where the recipe routes by random
  logits (Megatron-Core's ``moe_router_force_load_balancing``: each token's top-k a uniform k-subset of the E
  experts), as a share of the step: rows at a rank have variance R·(1 − 1/EP)·(E − k)/(E − 1) for R balanced rows,
  and the largest of EP such ranks exceeds R by at most σ·√(2 ln EP).
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

from accuracy import PublishedRun, load_runs
from fit_time import HELDOUT

from lmcalc.engine.time import rates
from lmcalc.engine.time.ep_overlap import MOE_LAYER, routed_work
from lmcalc.engine.time.kernels import kernel_workload, stage_work
from lmcalc.engine.time.microbatch import kernel_times
from lmcalc.engine.time.steptime import StepTime, step_time
from lmcalc.specs import HardwareSpec

REPRESENTATIVE = (
    "nemo-26.02-qwen3-30b-a3b-8gpus-b200-mxfp8",
    "nemo-25.09-qwen3-30b-a3b-8gpus-b200-tokendrop",
    "nemo-26.02-gpt-oss-120b-64gpus-gb200-bf16",
    "nemo-26.02-gpt-oss-120b-64gpus-gb300-bf16",
    "nemo-26.02-qwen3-235b-a22b-256gpus-b200-mxfp8",
    "nemo-26.02-qwen3-235b-a22b-256gpus-b300-mxfp8",
    "nemo-26.02-deepseek-v3-256gpus-b200-mxfp8",
    "nemo-25.11-deepseek-v3-256gpus-b200-mxfp8",
)
"""Dropless and token-drop Qwen3 30B-A3B at one layout; GPT-OSS 120B on GB200 and GB300; Qwen3 235B-A22B on B200 and
B300; DeepSeek-V3 at one layout in two releases."""


class Breakdown(NamedTuple):
    """A predicted step's seconds by term, on its slowest stage, beside the published step."""

    published: float
    predicted: float
    experts: float  # the routed experts' GEMMs (forward, both gradients, recomputed)
    other_gemms: float
    attention: float  # fused attention and a mixer's scans
    memory: float  # memory-bound kernels
    all_to_all: float  # exposed expert all-to-alls
    tp_cp: float  # exposed tensor- and context-parallel collectives
    host: float  # host time the GPU waits for
    pipeline: float  # bubble and stage-to-stage sends
    states: float  # exposed DP and ZeRO traffic, the optimizer
    routed_rows: float  # one MoE layer's routed rows on this GPU, one micro-batch
    all_to_all_alone: float  # the all-to-alls if none were hidden


def _step(run: PublishedRun) -> StepTime:
    return step_time(run.workload, run.layout, run.cluster)


def breakdown(run: PublishedRun) -> Breakdown:
    """The terms of the run's predicted step (the shipped constants), its routed experts' GEMMs timed apart."""
    t = _step(run)
    w, stage, mb = run.workload, t.slowest, t.slowest.micro_batch
    m, k = stage.grad_accum, mb.kernels
    experts = rows = 0.0
    if w.model.moe and stage.built.moe:
        work = stage_work(kernel_workload(w), run.layout.grid, MOE_LAYER)
        routed = routed_work(w.model, work)
        kernel = w.framework.speed.attention_kernel if w.attention == "flash" else "eager"
        hw, dtype, e = run.cluster.hardware, w.precision.compute_dtype, w.precision.activation_bytes
        experts = m * stage.built.moe * kernel_times(routed, hw, dtype, kernel, e, rates.CALIBRATION).gemm
        rows = sum(g.m * g.count for g in routed.gemms) / len(routed.gemms)
    published = t.tokens / (run.tokens_per_s_per_gpu * run.layout.gpus)
    return Breakdown(
        published=published,
        predicted=t.total,
        experts=experts,
        other_gemms=m * k.gemm - experts,
        attention=m * k.attention,
        memory=m * k.memory,
        all_to_all=t.ep,
        tp_cp=m * (mb.tp + mb.cp),
        host=m * mb.host,
        pipeline=stage.bubble + stage.pp_p2p,
        states=stage.dp + stage.zero + stage.optimizer,
        routed_rows=rows,
        all_to_all_alone=m * mb.ep_alone + stage.ep_unpaired,
    )


def one_launch_seconds(
    hardware: HardwareSpec, rate: float, shape: tuple[float, float, float], count: float, operand: float
) -> float:
    """``count`` equal (m × k)·(k × n) GEMMs as one kernel, ``operand`` bytes an element: the roofline of their FLOPs
    and bytes together, its waves counted over all their 128 × 128 tiles (no split-K), one kernel overhead."""
    cal, (m, n, k) = rates.CALIBRATION, shape
    tiles = math.ceil(m / rates.GEMM_TILE[0]) * math.ceil(n / rates.GEMM_TILE[1]) * count
    units = hardware.compute_units or tiles
    waves = tiles / (math.ceil(tiles / units) * units)
    arithmetic = 2 * m * n * k * count / (cal.gemm_fraction_for(hardware) * rate * waves)
    moved = operand * (m * k + k * n + m * n) * count
    return max(arithmetic, moved / rates.hbm_bandwidth(hardware, cal)) + cal.kernel_overhead_s


def grouped_launch_change(run: PublishedRun) -> float:
    """Seconds the step would change by if each routed weight's GEMMs (forward, input and weight gradients) ran as
    one launch over all local experts (``one_launch_seconds``), where lmcalc times each expert as its own GEMM."""
    t, w = _step(run), run.workload
    hw, cal = run.cluster.hardware, rates.CALIBRATION
    if not (w.model.moe and t.slowest.built.moe and hw.compute_units):
        return 0.0
    rate = rates.matmul_rate(hw, w.precision.compute_dtype).flops_per_s
    operand = rates.LOW_PRECISION_OPERAND_BYTES.get(w.precision.compute_dtype, w.precision.activation_bytes)
    routed = routed_work(w.model, stage_work(kernel_workload(w), run.layout.grid, MOE_LAYER))
    change = 0.0
    for g in routed.gemms:
        for shape in ((g.m, g.n, g.k), (g.m, g.k, g.n), (g.n, g.k, g.m)):
            apart = g.count * rates.gemm_seconds(hw, rate, shape, operand, 0.0, cal)
            change += one_launch_seconds(hw, rate, shape, g.count, operand) - apart
    return change * t.slowest.grad_accum * t.slowest.built.moe


def forced_balance_bound(run: PublishedRun, b: Breakdown) -> float:
    """Upper bound, in seconds a step, of the busiest expert rank's extra routed rows under random-logit routing: the
    experts' GEMMs times σ·√(2 ln EP)/R (module docstring)."""
    moe, ep = run.workload.model.moe, run.layout.ep
    if moe is None or ep == 1 or not b.routed_rows:
        return 0.0
    e, k, rows = moe.num_experts, moe.k, b.routed_rows
    sigma = math.sqrt(rows * (1 - 1 / ep) * (e - k) / (e - 1))
    return b.experts * sigma * math.sqrt(2 * math.log(ep)) / rows


def _terms_table(runs: list[PublishedRun]) -> None:
    print("| run | published s | predicted s | error | routed experts' GEMMs | other GEMMs | attention | memory-bound "
          "| all-to-alls exposed | TP, CP | host | bubble, sends | DP, ZeRO, optimizer |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        b = breakdown(run)
        parts = (b.experts, b.other_gemms, b.attention, b.memory, b.all_to_all, b.tp_cp, b.host, b.pipeline, b.states)
        assert math.isclose(sum(parts), b.predicted, rel_tol=1e-6), run.id
        cells = " | ".join(f"{p:.2f}" for p in parts)
        print(f"| {run.id} | {b.published:.2f} | {b.predicted:.2f} | {b.published / b.predicted - 1:+.1%} | {cells} |")


def _bounds_table(runs: list[PublishedRun]) -> None:
    print("| run | error | experts alone | one grouped launch | all-to-alls exposed | forced balance |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for run in runs:
        b = breakdown(run)
        gap = b.published - b.predicted
        alone = f"{b.experts / (b.experts + gap):.2f}" if gap > 0 and b.experts else "n/a"
        grouped = grouped_launch_change(run) / b.predicted
        exposed = (b.all_to_all_alone - b.all_to_all) / b.predicted if run.workload.moe_a2a_overlap else 0.0
        balance = forced_balance_bound(run, b) / b.predicted
        cells = f"{alone} | {grouped:+.1%} | {exposed:+.1%} | {balance:+.1%}"
        error = b.published / b.predicted - 1  # predicted tokens/s against published, as docs/plan-accuracy.md
        rows.append((error, f"| {run.id} | {error:+.1%} | {cells} |"))
    for _, row in sorted(rows, reverse=True):
        print(row)


def main() -> None:
    wanted = sys.argv[1:] or list(REPRESENTATIVE)
    heldout = {r.id: r for r in load_runs(HELDOUT, None) if r.family != "playbook-multinode"}
    _terms_table([heldout[i] for i in wanted])
    if not sys.argv[1:]:
        print()
        _bounds_table([r for r in heldout.values() if r.workload.model.moe])


if __name__ == "__main__":
    main()
