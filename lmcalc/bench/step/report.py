"""A benchmark step as a result (time, FLOPs and MFU, memory, loss; inputs and conventions) and as a record."""

from __future__ import annotations

import math

import torch

from lmcalc.bench.results import Record, software_versions
from lmcalc.bench.step.config import FLOP_CONVENTION, SEED
from lmcalc.bench.step.measurement import StepMeasurement
from lmcalc.bench.step.predict import model_flops_per_step
from lmcalc.engine.memory.step_peak import PHASES
from lmcalc.engine.model import flops as fl
from lmcalc.result import Input, Result, Section, Term
from lmcalc.units import format_quantity, group
from lmcalc.validate import cpu_fallback_reason


def _percent(fraction: float | None) -> float:
    return 100 * fraction if fraction is not None else math.nan


def _time_section(m: StepMeasurement) -> Section:
    st = m.stats
    timing = "CUDA events" if m.device.torch_device.type == "cuda" else "time.perf_counter around a synchronised call"
    return Section(
        "time",
        "Step time and throughput",
        (
            Term(
                "median",
                "Step time (median)",
                st.median,
                "s",
                "median of the timed steps",
                f"{st.repeats} steps after {m.setup.warmup} warm-up",
                f"lmcalc.bench.timing.time_calls ({timing})",
                note="forward + backward + optimizer.step() + zero_grad()",
            ),
            Term("fastest", "Fastest step", st.fastest, "s"),
            Term("slowest", "Slowest step", st.slowest, "s"),
            Term("spread", "Spread", 100 * st.spread, "%", "(slowest − fastest) / median"),
            Term(
                "tokens_per_step",
                "Tokens per step",
                m.setup.tokens,
                "tokens",
                "b · s",
                f"{m.setup.micro_batch} × {m.setup.seq_len}",
            ),
            Term(
                "tokens_per_s",
                "Throughput",
                m.tokens_per_s,
                "tokens/s",
                "b · s / median step time",
                f"{m.setup.tokens} / {st.median:.4g} s",
            ),
        ),
    )


def _flops_section(m: StepMeasurement) -> Section:
    causal = model_flops_per_step(m.setup.model, m.setup.seq_len, m.setup.micro_batch, "causal")
    return Section(
        "flops",
        "FLOPs and utilisation (full-attention convention)",
        (*_flop_count_terms(m, causal), *_utilisation_terms(m, causal)),
    )


def _flop_count_terms(m: StepMeasurement, causal: float) -> tuple[Term, ...]:
    """The engine's FLOPs of the step measured: forward per token, then the step's model FLOPs (``causal``: with
    attention counted causal) and hardware FLOPs."""
    spec, s, b = m.setup.model, m.setup.seq_len, m.setup.micro_batch
    forward = fl.step_flops(spec, s, convention=FLOP_CONVENTION).forward.total
    return (
        Term(
            "forward_per_token",
            "Forward FLOPs per token",
            forward,
            "FLOPs",
            "engine detailed count, attention full (s keys per query)",
            source="lmcalc.engine.model.flops.step_flops",
        ),
        Term(
            "model_flops",
            "Model FLOPs per step",
            m.model_flops,
            "FLOPs",
            "3 · forward per token · b · s",
            f"3 × {forward:.6g} × {b} × {s}",
            "Kaplan et al. 2020 §2.1 (backward = 2 × forward); Korthikanti et al. 2022 eq. (7) and "
            "Chowdhery et al. 2022 App. B count attention non-causal",
            note=f"causal count: {causal:.4e} FLOPs",
        ),
        Term(
            "hardware_flops",
            f"Hardware FLOPs per step (recompute {m.setup.recompute})",
            m.hardware_flops,
            "FLOPs",
            "(3 · forward + recompute) per token · b · s",
            source="Korthikanti et al. 2022 Appendix A",
        ),
    )


def _utilisation_terms(m: StepMeasurement, causal: float) -> tuple[Term, ...]:
    """The FLOP/s achieved at the median step time, the device's dense peak (never invented where it has none), and
    the utilisations: MFU, HFU, and MFU with attention counted causal (``causal`` model FLOPs)."""
    peak = m.peak_flops_per_s
    no_peak = f"not available: the {m.device.name} has no {m.peak_key} peak (none is invented)"
    peak_note = "an estimate, not a spec-sheet figure" if m.device.peak_is_estimate else ""
    median = f"{m.stats.median:.4g} s"
    peak_text = format_quantity(peak, "FLOP/s") if peak else "n/a"
    return (
        Term(
            "achieved",
            "Achieved model FLOP/s",
            m.achieved_flops_per_s,
            "FLOP/s",
            "model FLOPs per step / median step time",
            f"{m.model_flops:.4e} / {median}",
        ),
        Term(
            "peak",
            f"Peak FLOP/s ({m.peak_key}, dense)",
            peak if peak else math.nan,
            "FLOP/s",
            source=m.device.peak_source,
            note=peak_note if peak else no_peak,
        ),
        Term(
            "mfu",
            "MFU",
            _percent(m.mfu),
            "%",
            "model FLOPs per step / (median step time × peak)",
            f"{m.model_flops:.4e} / ({median} × {peak_text})",
            "Chowdhery et al. 2022 (PaLM) §4.1",
            note="" if peak else no_peak,
        ),
        Term(
            "hfu",
            "HFU",
            _percent(m.hfu),
            "%",
            "hardware FLOPs per step / (median step time × peak)",
            source="Chowdhery et al. 2022 (PaLM) §4.1: recomputation counted",
            note="" if peak else no_peak,
        ),
        Term(
            "mfu_causal",
            "MFU with causal attention counted",
            _percent(m.utilisation(causal)),
            "%",
            "causal model FLOPs per step / (median step time × peak)",
            note="half the attention scores and values: lower than the full-attention MFU" if peak else no_peak,
        ),
    )


def _memory_section(m: StepMeasurement) -> Section:
    p, setup = m.predicted, m.setup
    measured = m.measured_peak_bytes
    error = (p.total - measured) / measured if measured else math.nan
    sources = {
        "cuda": "torch.cuda.max_memory_allocated over the timed steps − module buffers − cuBLAS workspaces",
        "cpu": "live storages of one more, untimed step (measure.StorageTracker) − module buffers",
    }
    return Section(
        "memory",
        f"Memory of the step (engine: {p.recipe} recipe, AdamW)",
        (
            Term(
                "states",
                "Model states (predicted)",
                p.states,
                "bytes",
                "N · bytes per parameter (weights + grads + master + 2 AdamW states)",
                f"{group(p.params)} × {p.bytes_per_param:g} B",
                f"precision recipe {p.recipe}; Rajbhandari et al. 2020 (ZeRO) §3.1",
            ),
            Term(
                "activations",
                "Activations (predicted)",
                p.activations,
                "bytes",
                "tensors saved for backward",
                f"s={setup.seq_len}, b={setup.micro_batch}, {setup.attention} attention, recompute {setup.recompute}",
                "Korthikanti et al. 2022 §4.1, tensor by tensor "
                "(lmcalc.engine.memory.activations, lmcalc.engine.memory.gpu_memory)",
            ),
            *(term for term in p.step.terms() if term.key in PHASES),
            Term(
                "predicted",
                "Predicted peak",
                p.total,
                "bytes",
                "max(backward start, backward end, optimizer step)",
                source="lmcalc.engine.memory.step_peak (docs/formulas.md §5.8)",
                note=f"at the {p.step.peak_phase.replace('_', ' ')}; no overhead allowance (the CUDA context "
                "is not a tensor)",
            ),
            Term(
                "measured",
                "Measured peak",
                measured if measured is not None else math.nan,
                "bytes",
                source=sources.get(m.device.torch_device.type, ""),
                note="" if measured is not None else "not measured on this device (no allocator statistics)",
            ),
            Term("error", "Prediction error", 100 * error, "%", "(predicted − measured) / measured"),
        ),
    )


def _loss_section(m: StepMeasurement) -> Section:
    return Section(
        "loss",
        "Loss on the fixed batch (falls when the optimizer steps)",
        (
            Term("first", "Loss, first step", m.losses[0], "nats", source="fp32 next-token cross-entropy"),
            Term("last", "Loss, last step", m.losses[-1], "nats", f"after {len(m.losses)} steps"),
        ),
    )


def step_result(measurement: StepMeasurement) -> Result:
    """The measurement as a ``Result``: time, FLOPs and MFU, memory, loss; inputs and conventions."""
    m, setup, dev = measurement, measurement.setup, measurement.device
    hardware = dev.hardware.name if dev.hardware else "no hardware preset"
    inputs = [
        Input("model", "Model", setup.model.name, origin=setup.model.label),
        Input("seq_len", "Sequence length", setup.seq_len, "tokens", "--seq"),
        Input("micro_batch", "Micro-batch", setup.micro_batch, "sequences", "--micro-batch"),
        Input("device", "Device", dev.name, origin=f"{dev.torch_device.type}, {hardware}"),
        Input("dtype", "Dtype", m.dtype, origin="weights, gradients, AdamW states and activations"),
        Input("attention", "Attention", setup.attention),
        Input("recompute", "Recomputation", setup.recompute),
        Input("warmup", "Warm-up steps", setup.warmup),
        Input("repeats", "Timed steps", m.stats.repeats),
        Input("optimizer", "Optimizer", f"torch.optim.AdamW (foreach), lr {setup.learning_rate:g}"),
    ]
    if dev.torch_device.type == "cpu":
        inputs.append(Input("threads", "CPU threads", m.threads, origin="torch.get_num_threads()"))
    notes = [
        "FLOP convention: attention counted full (non-causal), as Korthikanti et al. 2022 eq. (7) and PaLM "
        "(Chowdhery et al. 2022 App. B) count it for MFU; model FLOPs = 3 × forward (backward = 2 × forward); "
        "recomputation enters HFU only; the optimizer step and element-wise work are in the time, not the FLOPs.",
        f"Peak: {dev.peak_source}"
        if m.peak_flops_per_s
        else f"MFU not available: no {m.peak_key} peak for {dev.name} ({dev.peak_source}).",
        f"Memory predicted with the {m.predicted.recipe} recipe: a {m.dtype} model with torch.optim.AdamW keeps "
        f"weights, gradients and both AdamW states in {m.dtype}, with no master copy "
        f"({m.predicted.bytes_per_param:g} bytes per parameter).",
    ]
    if m.measured_peak_bytes is None:
        where = dev.torch_device.type.upper()
        notes.append(f"{where} peak memory is not measured (no allocator statistics): the prediction stands alone.")
    reason = cpu_fallback_reason(setup.model, setup.attention) if dev.torch_device.type == "cpu" else ""
    if reason:
        notes.append(f"{reason}; the activation prediction assumes the fused kernel.")
    notes.append(f"One fixed batch of random tokens (seed {SEED}); torch {torch.__version__}.")
    title = f"{setup.model.label}: training step on {dev.name} ({m.dtype}, s={setup.seq_len}, b={setup.micro_batch})"
    sections = (_time_section(m), _flops_section(m), _memory_section(m), _loss_section(m))
    return Result("bench-step", title, tuple(inputs), sections, tuple(notes))


def records(measurement: StepMeasurement) -> list[Record]:
    """One ``step`` record for the benchmark file."""
    m, setup, st = measurement, measurement.setup, measurement.stats
    figures = {
        "model": setup.model.name,
        "seq_len": setup.seq_len,
        "micro_batch": setup.micro_batch,
        "attention": setup.attention,
        "recompute": setup.recompute,
        "warmup": setup.warmup,
        "repeats": st.repeats,
        "median_s": st.median,
        "fastest_s": st.fastest,
        "slowest_s": st.slowest,
        "tokens_per_s": m.tokens_per_s,
        "flop_convention": FLOP_CONVENTION,
        "model_flops_per_step": m.model_flops,
        "hardware_flops_per_step": m.hardware_flops,
        "flops_per_s": m.achieved_flops_per_s,
        "peak_key": m.peak_key,
        "peak_flops_per_s": m.peak_flops_per_s,
        "peak_source": m.device.peak_source,
        "mfu": m.mfu,
        "hfu": m.hfu,
        "memory_recipe": m.predicted.recipe,
        "predicted_memory_bytes": m.predicted.total,
        "measured_peak_memory_bytes": m.measured_peak_bytes,
        "first_loss": m.losses[0],
        "last_loss": m.losses[-1],
        "threads": m.threads,
    }
    hardware = m.device.hardware.name if m.device.hardware else None
    return [Record("step", m.device.name, hardware, m.dtype, figures, software=software_versions())]
