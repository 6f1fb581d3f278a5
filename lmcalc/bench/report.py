"""Benchmark measurements as result objects (tables, --json, --explain) and as records to save."""

from __future__ import annotations

from lmcalc.bench.bandwidth import BandwidthMeasurement
from lmcalc.bench.device import Device
from lmcalc.bench.matmul import MatmulMeasurement, ModelMeasurement
from lmcalc.bench.results import Record, software_versions
from lmcalc.result import Input, Result, Section, Term
from lmcalc.units import group


def _device_inputs(device: Device) -> tuple[Input, ...]:
    return (
        Input("device", "Device", device.name, origin=str(device.torch_device)),
        Input(
            "hardware",
            "Hardware preset",
            device.hardware.name if device.hardware else "none",
            origin=device.peak_source,
        ),
        *(Input(k, k, v) for k, v in software_versions().items()),
    )


def _vs_peak(rate: float, peak: float | None, dtype: str, device: Device) -> tuple[Term, ...]:
    if peak is None:
        return ()
    label = "estimated" if device.peak_is_estimate else "spec sheet, dense"
    return (
        Term("peak", f"Peak ({label} {dtype})", peak, "FLOP/s", device.peak_source),
        Term("ratio", "Achieved / peak", 100 * rate / peak, "%", "median FLOP/s / peak"),
    )


def matmul_section(key: str, title: str, meas: MatmulMeasurement, device: Device) -> Section:
    return Section(
        key,
        title,
        (
            Term(
                "achieved",
                "Achieved (median)",
                meas.flops_per_s,
                "FLOP/s",
                "2·m·n·k / median time",
                f"2 × {meas.m} × {meas.n} × {meas.k} / {meas.stats.median:.4g} s",
            ),
            Term("best", "Achieved (fastest call)", meas.best_flops_per_s, "FLOP/s", "2·m·n·k / fastest time"),
            Term(
                "median_time",
                "Median time per matmul",
                meas.stats.median,
                "s",
                note=f"{meas.stats.repeats} timed calls, spread {100 * meas.stats.spread:.1f} % (slowest − fastest)",
            ),
            *_vs_peak(meas.flops_per_s, device.peak(meas.dtype), meas.dtype, device),
            Term("error", "Relative error vs float64", meas.relative_error, "", "‖C − C₆₄‖ / ‖C₆₄‖ on sampled rows"),
        ),
    )


def matmul_result(measurements: list[MatmulMeasurement], device: Device, sweep: bool) -> Result:
    dtype = measurements[0].dtype
    inputs = (*_device_inputs(device), Input("dtype", "dtype", dtype + (" (TF32 on)" if dtype == "tf32" else "")))
    if not sweep:
        meas = measurements[0]
        section = matmul_section("matmul", f"Matmul {meas.m}x{meas.n}x{meas.k} {dtype}", meas, device)
        return Result("bench", f"Matmul throughput on {device.name}", inputs, (section,), _notes(device))
    ranked = sorted(measurements, key=lambda mm: -mm.flops_per_s)
    rates = sorted(mm.flops_per_s for mm in measurements)
    summary = Section(
        "sweep",
        f"Sweep of {len(measurements)} shapes",
        (
            Term("best", f"Best: {ranked[0].m}x{ranked[0].n}x{ranked[0].k}", ranked[0].flops_per_s, "FLOP/s"),
            Term("median", "Median over shapes", rates[len(rates) // 2], "FLOP/s"),
            Term("worst", f"Worst: {ranked[-1].m}x{ranked[-1].n}x{ranked[-1].k}", ranked[-1].flops_per_s, "FLOP/s"),
            *_vs_peak(ranked[0].flops_per_s, device.peak(dtype), dtype, device),
        ),
    )
    shapes = tuple(matmul_section(f"{mm.m}x{mm.n}x{mm.k}", f"{mm.m}x{mm.n}x{mm.k}", mm, device) for mm in ranked[:10])
    return Result("bench", f"Matmul sweep on {device.name}", inputs, (summary, *shapes), _notes(device))


def model_result(measurement: ModelMeasurement, device: Device) -> Result:
    """The FLOP-weighted rate of a model's matmuls against the peak, then each matmul's own rate."""
    model_name, measured, rate = measurement.shapes.model.name, measurement.measured, measurement.flops_per_s
    dtype = measurement.dtype
    total = sum(mm.flops for mm, _ in measured)
    sections = [
        Section(
            "model",
            f"{model_name}: FLOP-weighted over its matmuls",
            (
                Term(
                    "achieved",
                    "Achievable for this model",
                    rate,
                    "FLOP/s",
                    "Σ FLOPs / Σ (FLOPs / rate of each shape)",
                    f"{total:.4e} FLOPs over {len(measured)} shapes",
                ),
                *_vs_peak(rate, device.peak(dtype), dtype, device),
            ),
        )
    ]
    for mm, meas in measured:
        sections.append(
            Section(
                mm.name.replace(" ", "_"),
                mm.name,
                (
                    Term(
                        "shape",
                        f"{mm.m}x{mm.n}x{mm.k} × {mm.count}",
                        meas.flops_per_s,
                        "FLOP/s",
                        note=f"{100 * mm.flops / total:.1f} % of the step's matmul FLOPs",
                    ),
                ),
            )
        )
    inputs = (
        *_device_inputs(device),
        Input("model", "Model", model_name),
        Input("tokens", "Tokens per matmul (micro-batch × seq)", measurement.shapes.tokens, "tokens"),
        Input("tp", "TP", measurement.shapes.tp),
        Input("dtype", "dtype", dtype),
    )
    notes = ("a better MFU ceiling than one square matmul: these are the shapes the model's step runs", *_notes(device))
    return Result("bench", f"Matmul shapes of {model_name} on {device.name}", inputs, tuple(sections), notes)


def bandwidth_result(meas: BandwidthMeasurement, device: Device) -> Result:
    terms = [
        Term(
            "achieved",
            "Achieved (median)",
            meas.bytes_per_s / 1e9,
            "GB/s",
            "2 × buffer bytes / median time",
            f"2 × {group(meas.size)} / {meas.stats.median:.4g} s",
        ),
        Term("median_time", "Median time per copy", meas.stats.median, "s"),
    ]
    if device.hardware:
        spec = device.hardware.memory_bandwidth_tbps * 1e3
        terms += [
            Term("peak", "Spec sheet", spec, "GB/s", device.hardware.sources.get("memory", "")),
            Term("ratio", "Achieved / spec", 100 * meas.bytes_per_s / 1e9 / spec, "%"),
        ]
    return Result(
        "bench",
        f"Memory bandwidth on {device.name}",
        _device_inputs(device),
        (Section("memory", "Copy bandwidth (read + write)", tuple(terms)),),
    )


def _notes(device: Device) -> tuple[str, ...]:
    if device.peak_is_estimate:
        return (f"the peak is an estimate, not a spec sheet: {device.peak_source}",)
    if device.hardware is None:
        return (device.peak_source,)
    return ()


def matmul_records(measurements: list[MatmulMeasurement], device: Device) -> list[Record]:
    hardware = device.hardware.name if device.hardware else None
    return [
        Record(
            "matmul",
            device.name,
            hardware,
            mm.dtype,
            {
                "shape": [mm.m, mm.n, mm.k],
                "flops_per_s": mm.flops_per_s,
                "best_flops_per_s": mm.best_flops_per_s,
                "median_s": mm.stats.median,
                "tf32": mm.tf32,
                "relative_error": mm.relative_error,
            },
            software=software_versions(),
        )
        for mm in measurements
    ]


def model_record(measurement: ModelMeasurement, device: Device) -> Record:
    hardware = device.hardware.name if device.hardware else None
    figures = {"model": measurement.shapes.model.name, "flops_per_s": measurement.flops_per_s}
    return Record("model", device.name, hardware, measurement.dtype, figures, software=software_versions())


def bandwidth_record(meas: BandwidthMeasurement, device: Device) -> Record:
    hardware = device.hardware.name if device.hardware else None
    return Record(
        "memory",
        device.name,
        hardware,
        None,
        {"bytes_per_s": meas.bytes_per_s, "size": meas.size},
        software=software_versions(),
    )
