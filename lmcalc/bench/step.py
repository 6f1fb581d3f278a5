"""``lmcalc bench step``: real training steps of the reference model, timed, turned into tokens/s and MFU.

One step is what a training loop does: forward, fp32 cross-entropy, backward, ``AdamW.step()`` and
``zero_grad``. The model is ``ReferenceModel`` (the module ``lmcalc validate`` checks the engine
against) in one dtype throughout, with ``torch.optim.AdamW`` keeping its states in that dtype, on one
fixed batch of random tokens, scored against the next token (so the loss must fall: proof that the
optimizer really steps). AdamW's multi-tensor ``foreach`` kernels, its default on a GPU, are asked for
on every device, so that the memory prediction describes what runs.

Conventions, each stated once here and again in the result's notes:

* **Model FLOPs** per step = 3 × the engine's forward count per token × b·s (backward = 2 × forward,
  Kaplan et al. 2020 §2.1), with attention counted **full** (every query against all s keys): the
  convention of Korthikanti et al. 2022 eq. (7) and PaLM (Chowdhery et al. 2022 Appendix B), and the
  one ``FlopCounterMode`` agrees with. The causal count (half the attention) is shown beside it.
  Recomputation is hardware work, not model work: it enters HFU only (PaLM §4.1).
* **MFU** = model FLOPs per step / (median step time × the device's dense peak for the dtype), the
  peak from ``Device.peak`` (a hardware preset, or a labelled estimate on a CPU). Where the device has
  no peak for the dtype, MFU is reported as not available; no peak is ever invented.
* **Memory**: the engine's peak of a plain PyTorch step (``engine.step_peak``: the largest of backward
  start, backward end and the optimizer step, with the precision recipe plain PyTorch matches: ``fp32``
  for an fp32 model, ``bf16-pure`` for a bf16 one; AdamW), against ``torch.cuda.max_memory_allocated``
  on CUDA, and against the live storages of one more, untimed step on a CPU (``measure.StorageTracker``,
  as a CPU has no allocator statistics), both less the module's buffers (rotary tables, causal mask),
  and on CUDA less cuBLAS's workspaces too (``measure.cuda_workspaces``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lmcalc import measure
from lmcalc.bench.device import Device
from lmcalc.bench.results import Record, software_versions
from lmcalc.bench.timing import Stats, synchronize, time_calls
from lmcalc.engine import flops as fl
from lmcalc.engine.choices import Attention, AttnConvention, Recompute
from lmcalc.engine.gpu_memory import gpu_memory
from lmcalc.engine.layout import Layout
from lmcalc.engine.params import count_params
from lmcalc.engine.step_peak import PHASES, StepPeak, plain_step_peak
from lmcalc.engine.workload import MASK_BYTES, Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_optimizer, resolve_precision
from lmcalc.reference_model import ReferenceModel, loss
from lmcalc.result import Input, Result, Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import format_quantity, group
from lmcalc.validate import cpu_fallback_reason

FLOP_CONVENTION: AttnConvention = "full"  # Korthikanti et al. 2022 eq. (7); Chowdhery et al. 2022 App. B
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RECIPE_FOR_DTYPE = {"fp32": "fp32", "bf16": "bf16-pure"}  # what a model in that dtype + torch.optim.AdamW keeps
OPTIMIZER = "adamw"
LEARNING_RATE = 1e-3  # any rate times the same; this one makes the loss visibly fall on a fixed batch
SEED = 0
MEMINFO = "/proc/meminfo"
CPU_RAM_FRACTION = 0.5  # leave the other half of the machine's RAM to everything else
CPU_FALLBACK_LIMIT_BYTES = 4e9  # when MemTotal cannot be read: a limit any laptop meets
SMALLER_PRESETS = ("llama-3.2-1b", "gpt2-124m")


def default_dtype(device: Device) -> str:
    """bf16 on CUDA (what GPUs train in), fp32 elsewhere (CPUs have no fast bf16 matmul to rely on)."""
    return "bf16" if device.torch_device.type == "cuda" else "fp32"


def peak_key(device: Device, dtype: str) -> str:
    """The ``peak_tflops_dense`` key the matmuls run at: fp32 on CUDA is TF32 when torch allows it."""
    if dtype == "fp32" and device.torch_device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return dtype


def model_flops_per_step(
    spec: ModelSpec, seq_len: int, micro_batch: int, convention: AttnConvention = FLOP_CONVENTION
) -> float:
    """3 · forward FLOPs per token · b · s: the work MFU is measured against (no recomputation)."""
    return fl.step_flops(spec, seq_len, convention=convention).model * seq_len * micro_batch


def hardware_flops_per_step(spec: ModelSpec, seq_len: int, micro_batch: int, recompute: Recompute) -> float:
    """Model FLOPs plus the forward work recomputation redoes in backward (Korthikanti et al. 2022 App. A)."""
    extra = fl.step_flops(spec, seq_len, recompute, FLOP_CONVENTION).recomputed
    return model_flops_per_step(spec, seq_len, micro_batch) + extra * seq_len * micro_batch


@dataclass(frozen=True)
class MemoryPrediction:
    """The engine's bytes for this step: model states under ``recipe`` with AdamW, and activations."""

    recipe: str
    bytes_per_param: float
    params: int
    states: float
    activations: float
    step: StepPeak  # the phases of the step: states and activations do not all live at once

    @property
    def total(self) -> float:
        return self.step.peak


def predict_memory(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    dtype: str,
    attention: Attention,
    recompute: Recompute,
    device_type: str,
) -> MemoryPrediction:
    """States and saved activations of the whole model on one device (``gpu_memory`` on the trivial layout)
    and the step's peak, phase by phase (``plain_step_peak``).

    Dropout masks are bool on CUDA; PyTorch's CPU dropout keeps its mask in the input's dtype.
    """
    precision = resolve_precision(RECIPE_FOR_DTYPE[dtype]).spec
    optimizer = resolve_optimizer(OPTIMIZER).spec
    mask_bytes = MASK_BYTES if device_type == "cuda" else precision.activation_bytes
    w = Workload(spec, precision, optimizer, seq_len, micro_batch, attention, recompute, mask_bytes)
    one_device = gpu_memory(w, Layout(), 0)  # the whole model on one device, no ZeRO
    n = count_params(spec).total
    return MemoryPrediction(
        precision.name, one_device.states / n, n, one_device.states, one_device.activations, plain_step_peak(w)
    )


def _gb(value: float) -> str:
    return format_quantity(value, "bytes", compact=True)


def ram_bytes() -> float | None:
    """MemTotal from ``/proc/meminfo`` (kB there are KiB), or None where it cannot be read."""
    try:
        with open(MEMINFO, encoding="utf-8") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit(device: Device) -> tuple[float, str]:
    """The most a step may need here, and how that limit was set."""
    if device.torch_device.type == "cuda":
        capacity = float(torch.cuda.get_device_properties(device.torch_device).total_memory)
        return capacity, f"the {_gb(capacity)} of the {device.name}"
    ram = ram_bytes()
    if ram is None:
        return CPU_FALLBACK_LIMIT_BYTES, f"{CPU_FALLBACK_LIMIT_BYTES / 1e9:g} GB (the machine's RAM is unknown)"
    limit = CPU_RAM_FRACTION * ram
    return limit, f"half of this machine's {_gb(ram)} RAM"


def smaller_presets(spec: ModelSpec) -> str:
    """The presets to suggest instead of ``spec``: ``a smaller preset (llama-3.2-1b, gpt2-124m)``."""
    names = [name for name in SMALLER_PRESETS if name != spec.name]
    return f"a smaller preset ({', '.join(names)})"


def check_fits(prediction: MemoryPrediction, spec: ModelSpec, seq_len: int, micro_batch: int, device: Device) -> None:
    """Refuse, in one line, a step the engine predicts will not fit (before anything is allocated)."""
    limit, why = memory_limit(device)
    if prediction.total <= limit:
        return
    raise LmcalcError(
        f"{spec.name} at s={seq_len}, b={micro_batch} needs about {_gb(prediction.total)} at its peak "
        f"({prediction.bytes_per_param:g} bytes × {group(prediction.params)} parameters for {prediction.recipe} "
        f"AdamW, {_gb(prediction.activations)} of activations), more than {why}; "
        f"try {smaller_presets(spec)} or a shorter --seq / smaller --micro-batch"
    )


@dataclass(frozen=True)
class StepMeasurement:
    """What ``run_steps`` timed and read, with the figures derived from it."""

    spec: ModelSpec
    seq_len: int
    micro_batch: int
    device: Device
    dtype: str
    attention: Attention
    recompute: Recompute
    warmup: int
    seconds: tuple[float, ...]  # one per timed step
    losses: tuple[float, ...]  # every step, warm-up included, in order
    predicted: MemoryPrediction
    measured_peak_bytes: float | None  # less module buffers: CUDA allocator or CPU live storages; None on MPS
    threads: int
    learning_rate: float

    @property
    def stats(self) -> Stats:
        return Stats.of(list(self.seconds))

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.stats.median

    @property
    def model_flops(self) -> float:
        return model_flops_per_step(self.spec, self.seq_len, self.micro_batch)

    @property
    def hardware_flops(self) -> float:
        return hardware_flops_per_step(self.spec, self.seq_len, self.micro_batch, self.recompute)

    @property
    def achieved_flops_per_s(self) -> float:
        return self.model_flops / self.stats.median

    @property
    def peak_key(self) -> str:
        return peak_key(self.device, self.dtype)

    @property
    def peak_flops_per_s(self) -> float | None:
        return self.device.peak(self.peak_key)

    def utilisation(self, flops_per_step: float) -> float | None:
        """``flops_per_step`` / (median step time × peak), or None where the device has no peak."""
        peak = self.peak_flops_per_s
        return flops_per_step / (self.stats.median * peak) if peak else None

    @property
    def mfu(self) -> float | None:
        return self.utilisation(self.model_flops)

    @property
    def hfu(self) -> float | None:
        return self.utilisation(self.hardware_flops)


def _timed_steps(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    torch_device: torch.device,
    dtype: str,
    attention: Attention,
    recompute: Recompute,
    warmup: int,
    repeats: int,
    learning_rate: float,
) -> tuple[list[float], list[float], float | None]:
    """Seconds per timed step, the loss of every step, and the peak bytes of a step less the module's
    buffers: on CUDA the allocator's peak over the timed steps, less cuBLAS's workspaces (allocated
    before the model, ``measure.cuda_workspaces``); on a CPU the live storages of one more,
    untimed step (``measure.StorageTracker``: tracking every operator would slow the timed ones)."""
    workspaces = measure.cuda_workspaces(torch_device) if torch_device.type == "cuda" else 0
    torch.manual_seed(SEED)
    model = ReferenceModel(spec, attention, max_seq=seq_len, device=torch_device, dtype=TORCH_DTYPES[dtype])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, foreach=True)  # the GPU default, everywhere
    tokens = torch.randint(0, spec.vocab_size, (micro_batch, seq_len)).to(torch_device)
    losses: list[torch.Tensor] = []

    def training_step(_: int) -> None:
        value = loss(model, tokens, recompute)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(value.detach())  # read after the timing: no host sync inside a step

    for i in range(warmup):
        training_step(i)
    synchronize(torch_device)
    if torch_device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(torch_device)
    seconds = time_calls(training_step, torch_device, 0, repeats)
    synchronize(torch_device)
    buffers = measure.tensor_bytes(model.buffers())
    peak: float | None = None
    if torch_device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(torch_device) - buffers - workspaces)
    elif torch_device.type == "cpu":
        peak = float(measure.tracked_step(model, optimizer, tokens, recompute).peak - buffers)
    return seconds, [float(v) for v in losses], peak


def run_steps(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    device: Device,
    dtype: str | None = None,
    attention: Attention = "flash",
    recompute: Recompute = "none",
    warmup: int = 2,
    repeats: int = 5,
    learning_rate: float = LEARNING_RATE,
    threads: int | None = None,
) -> StepMeasurement:
    """Time ``repeats`` AdamW training steps of ``spec`` after ``warmup`` untimed ones.

    On CUDA the allocator's peak is reset after the warm-up, once the optimizer states exist, and read
    after the timed steps. ``threads`` sets ``torch.set_num_threads`` for the run (restored after): on a
    CPU shared with other work, fewer threads than cores can be several times faster.
    """
    dtype = dtype or default_dtype(device)
    if dtype not in TORCH_DTYPES:
        raise LmcalcError(f"--dtype must be one of {', '.join(TORCH_DTYPES)} for a training step; got {dtype!r}")
    if seq_len < 1 or micro_batch < 1 or repeats < 1 or warmup < 0 or (threads is not None and threads < 1):
        raise LmcalcError("--seq, --micro-batch, --repeats and --threads must be at least 1, --warmup at least 0")
    if seq_len > spec.max_seq_len:
        raise LmcalcError(f"--seq {seq_len} exceeds {spec.name}'s context of {spec.max_seq_len} tokens")
    torch_device = device.torch_device
    prediction = predict_memory(spec, seq_len, micro_batch, dtype, attention, recompute, torch_device.type)
    # A step that falls back to the math kernel materialises the scores as eager attention does.
    worst_case = (
        predict_memory(spec, seq_len, micro_batch, dtype, "eager", recompute, torch_device.type)
        if torch_device.type == "cpu" and cpu_fallback_reason(spec, attention)
        else prediction
    )
    check_fits(worst_case, spec, seq_len, micro_batch, device)

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        seconds, losses, peak = _timed_steps(
            spec, seq_len, micro_batch, torch_device, dtype, attention, recompute, warmup, repeats, learning_rate
        )
    except torch.OutOfMemoryError:
        raise LmcalcError(
            f"{spec.name} at s={seq_len}, b={micro_batch} ran out of memory on the {device.name}; "
            f"try {smaller_presets(spec)} or a shorter --seq / smaller --micro-batch"
        ) from None
    finally:
        torch.set_num_threads(previous_threads)
    return StepMeasurement(
        spec=spec,
        seq_len=seq_len,
        micro_batch=micro_batch,
        device=device,
        dtype=dtype,
        attention=attention,
        recompute=recompute,
        warmup=warmup,
        seconds=tuple(seconds),
        losses=tuple(losses),
        predicted=prediction,
        measured_peak_bytes=peak,
        threads=used_threads,
        learning_rate=learning_rate,
    )


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
                f"{st.repeats} steps after {m.warmup} warm-up",
                f"lmcalc.bench.timing.time_calls ({timing})",
                note="forward + backward + optimizer.step() + zero_grad()",
            ),
            Term("fastest", "Fastest step", st.fastest, "s"),
            Term("slowest", "Slowest step", st.slowest, "s"),
            Term("spread", "Spread", 100 * st.spread, "%", "(slowest − fastest) / median"),
            Term(
                "tokens_per_step",
                "Tokens per step",
                m.tokens_per_step,
                "tokens",
                "b · s",
                f"{m.micro_batch} × {m.seq_len}",
            ),
            Term(
                "tokens_per_s",
                "Throughput",
                m.tokens_per_s,
                "tokens/s",
                "b · s / median step time",
                f"{m.tokens_per_step} / {st.median:.4g} s",
            ),
        ),
    )


def _flops_section(m: StepMeasurement) -> Section:
    spec, s, b = m.spec, m.seq_len, m.micro_batch
    forward = fl.step_flops(spec, s, convention=FLOP_CONVENTION).forward.total
    causal = model_flops_per_step(spec, s, b, "causal")
    peak = m.peak_flops_per_s
    no_peak = f"not available: the {m.device.name} has no {m.peak_key} peak (none is invented)"
    peak_note = "an estimate, not a spec-sheet figure" if m.device.peak_is_estimate else ""
    median = f"{m.stats.median:.4g} s"
    peak_text = format_quantity(peak, "FLOP/s") if peak else "n/a"
    return Section(
        "flops",
        "FLOPs and utilisation (full-attention convention)",
        (
            Term(
                "forward_per_token",
                "Forward FLOPs per token",
                forward,
                "FLOPs",
                "engine detailed count, attention full (s keys per query)",
                source="lmcalc.engine.flops.step_flops",
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
                f"Hardware FLOPs per step (recompute {m.recompute})",
                m.hardware_flops,
                "FLOPs",
                "(3 · forward + recompute) per token · b · s",
                source="Korthikanti et al. 2022 Appendix A",
            ),
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
        ),
    )


def _memory_section(m: StepMeasurement) -> Section:
    p = m.predicted
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
                f"s={m.seq_len}, b={m.micro_batch}, {m.attention} attention, recompute {m.recompute}",
                "Korthikanti et al. 2022 §4.1, tensor by tensor (lmcalc.engine.activations, lmcalc.engine.gpu_memory)",
            ),
            *(term for term in p.step.terms() if term.key in PHASES),
            Term(
                "predicted",
                "Predicted peak",
                p.total,
                "bytes",
                "max(backward start, backward end, optimizer step)",
                source="lmcalc.engine.step_peak (docs/formulas.md §5.8)",
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
    m = measurement
    dev = m.device
    hardware = dev.hardware.name if dev.hardware else "no hardware preset"
    inputs = [
        Input("model", "Model", m.spec.name, origin=m.spec.label),
        Input("seq_len", "Sequence length", m.seq_len, "tokens", "--seq"),
        Input("micro_batch", "Micro-batch", m.micro_batch, "sequences", "--micro-batch"),
        Input("device", "Device", dev.name, origin=f"{dev.torch_device.type}, {hardware}"),
        Input("dtype", "Dtype", m.dtype, origin="weights, gradients, AdamW states and activations"),
        Input("attention", "Attention", m.attention),
        Input("recompute", "Recomputation", m.recompute),
        Input("warmup", "Warm-up steps", m.warmup),
        Input("repeats", "Timed steps", m.stats.repeats),
        Input("optimizer", "Optimizer", f"torch.optim.AdamW (foreach), lr {m.learning_rate:g}"),
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
    reason = cpu_fallback_reason(m.spec, m.attention) if dev.torch_device.type == "cpu" else ""
    if reason:
        notes.append(f"{reason}; the activation prediction assumes the fused kernel.")
    notes.append(f"One fixed batch of random tokens (seed {SEED}); torch {torch.__version__}.")
    title = f"{m.spec.label}: training step on {dev.name} ({m.dtype}, s={m.seq_len}, b={m.micro_batch})"
    sections = (_time_section(m), _flops_section(m), _memory_section(m), _loss_section(m))
    return Result("bench-step", title, tuple(inputs), sections, tuple(notes))


def records(measurement: StepMeasurement) -> list[Record]:
    """One ``step`` record for the benchmark file."""
    m = measurement
    st = m.stats
    figures = {
        "model": m.spec.name,
        "seq_len": m.seq_len,
        "micro_batch": m.micro_batch,
        "attention": m.attention,
        "recompute": m.recompute,
        "warmup": m.warmup,
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
