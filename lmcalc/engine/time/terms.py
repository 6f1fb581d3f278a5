"""The step time of a layout as terms: each part of ``engine.time.steptime.StepTime`` with its formula, its numbers and
the source of its constants, for ``plan --explain``, ``--json`` and the tables alike."""

from __future__ import annotations

from lmcalc.engine.finetune.offload import NO_OFFLOAD, Offload
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.sharding import gathered_to_backward
from lmcalc.engine.time import rates
from lmcalc.engine.time.steptime import StepTime
from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import SpeedRule
from lmcalc.result import Section, Term
from lmcalc.specs import Cluster

DISPATCH_SOURCE = "docs/formulas.md §8.8.1 (engine.time.dispatch: NCCL's all-to-all, DeepEP, HybridEP)"
ZERO_GATHER_FORMULA = {
    0: "none: no ZeRO sharding over data parallelism",
    1: "all-gather of the updated parameters, behind the next step's first forward pass where the framework "
    "prefetches it",
    2: "all-gather of the updated parameters, behind the next step's first forward pass where the framework "
    "prefetches it",
    3: "micro-batches · (2 · all-gather + reduce-scatter of the stage's parameters), behind each micro-batch's "
    "compute where the framework prefetches",
}

_HSDP_TEXT = (
    "; HSDP: within a group of DP·CP / {groups} replicas, then an all-reduce of each GPU's shard of the gradients "
    "across the {groups} groups"
)


def speed_text(speed: SpeedRule, a2a_overlap: bool = False) -> str:
    """What the framework profile hides behind computation, in words (the plan's stated assumptions); ``a2a_overlap``:
    the workload's Megatron-Core all-to-all overlap (``Workload.moe_a2a_overlap``)."""
    tp = {
        "none": "TP collectives exposed",
        "backward": "TP collectives of the backward pass behind its GEMMs",
        "full": "TP collectives behind the GEMMs",
    }[speed.tp_overlap]
    dp = {
        "always": "gradient reduction bucketed behind the last backward pass",
        "without_zero": "gradient reduction bucketed behind the backward pass without ZeRO, after it with ZeRO",
        "never": "gradient reduction after the backward pass",
    }[speed.dp_overlap]
    parts = [
        f"{speed.attention_kernel} attention",
        tp,
        dp,
        "ZeRO gathers prefetched" if speed.param_gather_overlap else "ZeRO gathers exposed",
        "pipeline sends overlapped" if speed.pp_overlap else "pipeline sends exposed",
        "expert all-to-alls overlapped (DualPipe)"
        if speed.moe_overlap
        else "expert all-to-alls overlapped phase by phase (combined 1F1B)"
        if a2a_overlap
        else "expert all-to-alls exposed",
        f"host {speed.host_seconds_per_op * 1e6:g} µs per GPU operation",
    ]
    return "; ".join(parts)


def compute_text(w: Workload, cluster: Cluster) -> str:
    """How compute is timed: the GEMMs' rate and where it comes from, the attention kernel, the HBM bandwidth."""
    hardware, dtype, cal = cluster.hardware, w.precision.compute_dtype, rates.CALIBRATION
    matmul = rates.matmul_rate(hardware, dtype)
    phi = cal.gemm_fraction_for(hardware)
    return (
        f"kernel by kernel: GEMMs at {phi:g} × {matmul.flops_per_s / 1e12:,.1f} TFLOP/s ({matmul.source}); "
        f"{w.framework.speed.attention_kernel if w.attention == 'flash' else 'eager'} attention; memory-bound kernels "
        f"at {cal.hbm_efficiency:g} × {hardware.memory_bandwidth_tbps:g} TB/s; constants fitted on published runs "
        "(docs/plan-accuracy.md)"
    )


def step_time_section(
    t: StepTime, layout: Layout, title: str = "Step time of the best layout", offload: Offload = NO_OFFLOAD
) -> Section:
    """The step's parts, each with its formula and numbers (under ``offload``, the optimizer's offloaded cost)."""
    return Section(
        "time",
        title,
        (
            *_compute_terms(t, layout),
            *_communication_terms(t, layout),
            _optimizer_term(t, offload),
            Term("total", "Step time", t.total, "s", "sum of the rows above"),
            _mfu_term(t),
        ),
    )


def _pace_note(t: StepTime, layout: Layout) -> str:
    """With pipeline stages, which one sets the pace and its share of the step's FLOPs."""
    if layout.pp > 1:
        return (
            f"stage {t.slowest_stage + 1} of {layout.pp} sets the pace: it does "
            f"{t.stage_flops / t.hardware_flops:.1%} of the step's {t.hardware_flops:.4e} FLOPs, against an even "
            f"{1 / layout.pp:.1%}"
        )
    return ""


def _compute_terms(t: StepTime, layout: Layout) -> tuple[Term, ...]:
    """Compute: the slowest stage's hardware FLOPs at a given efficiency of the peak, or kernel by kernel."""
    pace = _pace_note(t, layout)
    if t.efficiency is not None:
        return (
            Term(
                "compute",
                "Compute",
                t.compute,
                "s",
                "hardware FLOPs of the slowest stage / (GPUs per stage · peak · efficiency)",
                f"{t.stage_flops:.4e} / ({t.gpus // layout.pp} × {t.peak:.4g} × {t.efficiency:g})",
                note=pace,
            ),
        )
    return _kernel_terms(t, layout, pace)


def _kernel_terms(t: StepTime, layout: Layout, pace: str) -> tuple[Term, ...]:
    """Compute timed kernel by kernel, over the step's micro-batches: GEMMs, attention, memory-bound kernels, and
    the host time they leave exposed."""
    m, cal = layout.grad_accum, rates.CALIBRATION
    scans = t.workload.model.other_mixer_layers > 0  # a state-space or linear-attention mixer's, timed beside attention
    return (
        Term(
            "gemm",
            "GEMMs",
            t.gemm,
            "s",
            "micro-batches · Σ (max(2mnk / (φ·R·w), bytes / (η·B)) + t₀) over forward, input-gradient, "
            "weight-gradient and recomputed GEMMs",
            f"{m} × {t.gemm / m:.4g} s; R = {t.matmul_rate / 1e12:,.1f} TFLOP/s, φ = "
            f"{t.gemm_fraction:g}, t₀ = {cal.kernel_overhead_s * 1e6:g} µs",
            source=t.matmul_source,
            note=pace,
        ),
        Term(
            "attention",
            "Attention and scans" if scans else "Attention",
            t.attention,
            "s",
            "micro-batches · (forward FLOPs / forward rate + 2.5 · forward FLOPs / backward rate"
            + (f" + 3 · scan FLOPs / ({rates.SCAN_FRACTION:.3f} · R_bf16))" if scans else ")"),
            f"{m} × {t.attention / m:.4g} s",
            source="FlashAttention-2/-3 benchmarks (engine/time/rates.py ATTENTION_FRACTIONS)"
            + ("; scans: Mamba-2's chunked SSD measured on H100 (vLLM PR 27299; rates.SCAN_FRACTION)" if scans else ""),
        ),
        Term(
            "memory",
            "Memory-bound kernels",
            t.memory,
            "s",
            "micro-batches · (bytes of norms, activations, residuals, rotary, loss, copies, gradient "
            "accumulation / (η · HBM bandwidth) + kernels · t₀)",
            f"{m} × {t.memory / m:.4g} s; η = {cal.hbm_efficiency:g}",
        ),
        Term(
            "host",
            "Host time not hidden",
            t.host,
            "s",
            "micro-batches · max(0, operations · host seconds per operation − GPU time)",
            note="the CPU issues every kernel; small models at high TP wait for it",
        ),
    )


def _communication_terms(t: StepTime, layout: Layout) -> tuple[Term, ...]:
    """What the GPUs wait for beyond compute: the collectives of each parallel dimension, the pipeline's sends and
    bubble, the gradient reduction and ZeRO's gathers, each as far as it is not hidden."""
    hsdp, zero3 = layout.hsdp > 1, layout.zero == 3 or gathered_to_backward(t.workload, layout.zero)
    per_micro_batch = zero3 and t.workload.framework.speed.hsdp_reduce == "every_micro_batch"  # else once a step
    return (
        Term(
            "tp",
            "Tensor-parallel collectives (exposed)",
            t.tp,
            "s",
            "micro-batches · layers · (2 forward + 2 backward, + 1 with sequence parallelism, + 2 with full "
            "recompute) · all-reduce(s·b·h), less what hides behind the GEMMs",
        ),
        _ep_term(t, layout),
        Term(
            "cp",
            "Context-parallel K/V exchange (exposed)",
            t.cp,
            "s",
            "micro-batches · max(0, layers · 3 · (CP − 1) · p2p(K, V) − attention)",
        ),
        Term("pp_p2p", "Pipeline sends", t.pp_p2p, "s", "micro-batches · chunks · 2 · p2p(s·b·h)"),
        Term(
            "bubble",
            "Pipeline bubble",
            t.bubble,
            "s",
            "(p − 1)/v · one micro-batch of the slowest stage",
            source="Narayanan et al. 2021 §2.2",
        ),
        Term(
            "dp",
            "Gradient reduction (exposed)",
            t.dp,
            "s",
            "all-reduce (reduce-scatter under ZeRO-2) of the gradients, less the last backward pass where bucketed"
            + (_HSDP_TEXT.format(groups=layout.hsdp) if hsdp and not per_micro_batch else ""),
        ),
        Term(
            "zero",
            "ZeRO parameter gathers (exposed)",
            t.zero,
            "s",
            ZERO_GATHER_FORMULA[layout.zero if layout.data_replicas > 1 else 0]
            + (_HSDP_TEXT.format(groups=layout.hsdp) if hsdp and per_micro_batch else ""),
        ),
    )


def _ep_term(t: StepTime, layout: Layout) -> Term:
    """The expert all-to-alls: exposed whole, or as Megatron-Core's overlap leaves them (engine.time.ep_overlap)."""
    if t.workload.moe_dispatcher == "alltoall":
        plain = "micro-batches · MoE layers · 4 · all-to-all(k copies of s·b·h)"
    else:  # engine.time.dispatch: one copy a GPU reached over NVLink, one a node reached over the NICs
        plain = (f"micro-batches · MoE layers · 4 · {t.workload.moe_dispatcher}(a copy of s·b·h to each GPU and "
                 "each node its experts reach)")  # fmt: skip
    if not t.workload.moe_a2a_overlap:
        return Term("ep", "Expert all-to-alls (exposed)", t.ep, "s", plain, source=DISPATCH_SOURCE)
    m, step = layout.grad_accum, t.slowest
    return Term(
        "ep",
        "Expert all-to-alls (exposed)",
        t.ep,
        "s",
        "micro-batches · MoE layers · [max(0, a − F_o) + max(0, 2a − E_f − E_b) + max(0, a − B_o)] + unpaired "
        "micro-batches · (4a · MoE layers − the same); a: one all-to-all, F_o, B_o: a layer's work outside the "
        "routed experts, E_f, E_b: theirs (the overlap's three phases)",
        f"{m} × {step.micro_batch.ep:.4g} s + {step.ep_unpaired:.4g} s; each micro-batch alone "
        f"{step.micro_batch.ep_alone:.4g} s",
        source="Megatron-Core combined_1f1b.py, model_chunk_schedule_plan.py (--overlap-moe-expert-parallel-comm)",
    )


def _optimizer_term(t: StepTime, offload: Offload) -> Term:
    """The optimizer step and clipping: on the GPU at HBM bandwidth, or offloaded over the host link to the CPU."""
    return Term(
        "optimizer",
        "Optimizer step and clipping" + (" (offloaded)" if offload.optimizer else ""),
        t.optimizer,
        "s",
        "this GPU's trained parameters · (gradient + weight bytes) / host link + GPUs of the host · trained "
        "parameters / CPU optimizer rate"
        if offload.optimizer
        else "this GPU's states · (2 gradient reads + master and states read and written + weights written) "
        "/ (η · HBM bandwidth)" + _orthogonalised_text(t.workload.optimizer.newton_schulz_steps),
        f"host link {offload.host_link_gbps:g} GB/s, CPU {offload.cpu_optimizer_params_per_s:.3g} "
        "parameters/s (assumptions unless given); not overlapped"
        if offload.optimizer
        else "",
        source="Ren et al. 2021 (ZeRO-Offload) §4" if offload.optimizer else "",
    )


def _orthogonalised_text(steps: int) -> str:
    """Muon's Newton-Schulz iterations, where the optimizer runs them (engine.time.newton_schulz)."""
    if not steps:
        return ""
    return (
        f" + {steps} Newton-Schulz iterations on each matrix whose states this GPU holds: (m·m·n, m·m·m, m·n·m) GEMMs "
        "at the bf16 rate, 4·m²·n + 2·m³ FLOPs an iteration, m ≤ n"
    )


def _mfu_term(t: StepTime) -> Term:
    """Model FLOPs utilisation: the model's FLOPs (recomputation not counted) against the peak for the step time."""
    return Term(
        "mfu",
        "MFU",
        100 * t.mfu,
        "%",
        "model FLOPs / (step time · GPUs · peak)",
        f"{t.model_flops:.4e} / ({t.total:.4g} × {t.gpus} × {t.peak:.4g})",
        note="model FLOPs count attention in full (the Korthikanti/PaLM convention)",
    )
