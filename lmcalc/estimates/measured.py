"""Figures measured by ``lmcalc bench`` and read back for the estimates: a GPU's matmul peak, a training step's
efficiency, an all-reduce's bus bandwidth. The results file is read without importing torch, each record checked
as it is read (``results.load``), and the figure taken checked against the GPU's preset: no faster than its peak
allows, an efficiency no more than 1.

``lmcalc.bench.results`` (and with it ``tempfile`` and ``fcntl``, for writing results) is imported when a figure is
read from a file: an estimate from the spec sheet, what most commands make, reads none."""

from __future__ import annotations

from pathlib import Path

from lmcalc.engine.choices import PEAK_SOURCES
from lmcalc.errors import LmcalcError, setting
from lmcalc.estimates.inputs import Given, choice
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.specs import HardwareSpec


def bench_file(calibration: str | None, run: str) -> Path:
    """The benchmark results file: ``calibration``, else the default one; refused if it does not exist."""
    from lmcalc.bench import results

    path = Path(calibration).expanduser() if calibration else results.default_path()
    try:
        found = path.is_file()
    except OSError as error:  # a name longer than the file system takes, say
        raise LmcalcError(f"cannot read the benchmark file {str(path)!r}: {error.strerror}") from None
    if not found:
        raise LmcalcError(
            f"no such benchmark file: {path}" if calibration else f"no benchmark results yet ({path}): {run}"
        )
    return path


def measured_peak(
    peak: str, calibration: str | None, hardware: HardwareSpec, recipe: PrecisionRecipe
) -> tuple[float, str] | None:
    """The measured FLOP/s for this GPU and the recipe's dtype from a benchmark file, or None for the spec
    sheet's peak (``peak`` "spec" and no ``calibration``)."""
    if choice(peak, PEAK_SOURCES, "peak") == "spec" and calibration is None:
        return None
    path = bench_file(calibration, f"run 'lmcalc bench --dtype {recipe.compute_dtype}' on one {hardware.name}")
    from lmcalc.bench import results

    records = results.load(path)
    found = results.measured_peak(records, hardware.name, recipe.compute_dtype)
    if found is None:
        raise LmcalcError(
            f"{path} has no {recipe.compute_dtype} measurement for {hardware.name}; run "
            f"'lmcalc bench --dtype {recipe.compute_dtype}' on one (or use {setting('peak')} spec)"
        )
    flops, record = found
    dense_tflops = hardware.peak_tflops_dense.get(recipe.compute_dtype)
    results.check_rate(path, records, record, dense_tflops * 1e12 if dense_tflops else None)
    return flops, f"{record.kind} benchmark on {record.device}, {record.when}, {path}"


def measured_efficiency(calibration: str | None, hardware: HardwareSpec, recipe: PrecisionRecipe, model: str) -> Given:
    """The compute efficiency from ``lmcalc bench step`` results: the HFU of a measured step on this GPU."""
    from lmcalc.bench import results

    dtype = recipe.compute_dtype
    run = f"run 'lmcalc bench step -m MODEL --dtype {dtype}' on one {hardware.name} (or give {setting('efficiency')})"
    path = bench_file(calibration, run)
    records = results.load(path)
    found = results.measured_step_efficiency(records, hardware.name, dtype, model)
    if found is None:
        raise LmcalcError(f"{path} has no {dtype} training step measured on {hardware.name}; {run}")
    hfu, record = found
    results.check_efficiency(path, records, record)
    measured = record.figures["model"]
    which = "this model's" if measured == model else f"{measured}'s (the largest step measured)"
    return Given(hfu, f"measured: HFU of {which} step, {record.device}, {record.when}, {path}")


def measured_busbw(calibration: str | None, hardware: HardwareSpec) -> tuple[float, str] | None:
    """The NCCL all-reduce bus bandwidth ``lmcalc bench comm`` measured within a node of this GPU type (bytes/s),
    with its source; None where it measured none (the preset's figure stands)."""
    from lmcalc.bench import results

    path = bench_file(calibration, f"run 'lmcalc bench' on one {hardware.name}")
    records = results.load(path)
    found = results.measured_busbw(records, hardware.name)
    if found is None:
        return None
    busbw, record = found
    results.check_busbw(path, records, record, hardware.intra_node_gbps)
    size = record.figures["size_bytes"]
    return busbw, (
        f"lmcalc bench comm: all-reduce of {size:,} bytes over {record.figures['world_size']} GPUs, {record.device}, "
        f"{record.when}, {path}"
    )
