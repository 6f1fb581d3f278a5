"""Collective measurements as a result (one row per size, as nccl-tests prints them) and as records to save."""

from __future__ import annotations

from collections.abc import Sequence

from lmcalc.bench.comm.measurement import SOURCE, CommMeasurement
from lmcalc.bench.comm.sizes import size_label
from lmcalc.bench.results import Record, software_versions
from lmcalc.errors import LmcalcError
from lmcalc.result import Input, Result, Section, Term


def comm_result(measurements: Sequence[CommMeasurement], title: str | None = None) -> Result:
    """The ``bench-comm`` result: one row per size (per op and size when several ops were measured)."""
    if not measurements:
        raise LmcalcError("no collective measurements to report")
    first = measurements[0]
    ops = list(dict.fromkeys(m.op for m in measurements))
    several = len(ops) > 1
    sections = tuple(
        Section(
            key=f"{m.op}-{size_label(m.requested_bytes)}" if several else size_label(m.requested_bytes),
            title=f"{m.op} {size_label(m.requested_bytes)}" if several else size_label(m.requested_bytes),
            terms=_terms(m),
        )
        for m in measurements
    )
    inputs = (
        Input("op", "collective", ", ".join(ops)),
        Input("world_size", "world size", first.world_size, "ranks"),
        Input("backend", "backend", first.backend),
        Input("launch", "launched as", "torchrun" if first.launcher == "torchrun" else "local processes, 127.0.0.1"),
        Input("device", "device", first.device),
        Input("dtype", "dtype", first.dtype),
        Input("warmup", "warm-up calls", first.warmup),
        Input("repeats", "timed repeats", first.repeats),
    )
    notes = [
        "algbw = S / t (S in bytes, GB = 1e9 bytes); busbw = algbw × 2(n−1)/n for all-reduce and × (n−1)/n "
        "for all-gather and reduce-scatter, with S the whole array: the bus bandwidth of NVIDIA nccl-tests "
        "(doc/PERFORMANCE.md), comparable with one link's bandwidth whatever the rank count.",
        "t is the median over repeats of the slowest rank's time; each repeat starts after a barrier and "
        "ends after device synchronisation (nccl-tests averages over ranks instead, so it can read a little "
        "faster).",
    ]
    if any(m.backend == "gloo" and m.launcher == "spawn" for m in measurements):
        notes.append(
            "gloo between processes on one machine moves data through loopback sockets and memory copies: it "
            "measures this host's memory and kernel, not a network or a GPU interconnect."
        )
    if first.world_size == 1:
        notes.append("one rank: nothing crosses a link, so busbw is 0 by definition.")
    if all(m.max_error is not None for m in measurements):
        notes.append("every collective's output was checked once against values each rank recomputed locally.")
    return Result(
        command="bench-comm",
        title=title or f"Collective bandwidth: {', '.join(ops)} over {first.world_size} ranks ({first.backend})",
        inputs=inputs,
        sections=sections,
        notes=tuple(notes),
        layout="grid",
    )


def _terms(m: CommMeasurement) -> tuple[Term, ...]:
    n = m.world_size
    factor_text = "2(n−1)/n" if m.op == "all-reduce" else "(n−1)/n"
    factor_numbers = f"2·({n}−1)/{n}" if m.op == "all-reduce" else f"({n}−1)/{n}"
    whole = "the buffer" if m.op == "all-reduce" else "the whole array"
    return (
        Term(
            "size",
            "size",
            float(m.size_bytes),
            "bytes",
            formula=f"S = {whole}",
            note="" if m.size_bytes == m.requested_bytes else f"{m.requested_bytes} requested, rounded to {n} ranks",
        ),
        Term(
            "time",
            "time",
            m.median_s,
            "s",
            formula="median over repeats of the slowest rank",
            substituted=f"fastest {m.fastest_s:.4g} s, slowest {m.slowest_s:.4g} s, {m.repeats} repeats",
        ),
        Term(
            "algbw",
            "algbw",
            m.algbw_gbps,
            "GB/s",
            formula="S / t",
            substituted=f"{m.size_bytes} bytes / {m.median_s:.6g} s / 1e9",
            source=SOURCE,
        ),
        Term(
            "busbw",
            "busbw",
            m.busbw_gbps,
            "GB/s",
            formula=f"algbw × {factor_text}",
            substituted=f"{m.algbw_gbps:.6g} GB/s × {factor_numbers}",
            source=SOURCE,
        ),
    )


def records(measurements: Sequence[CommMeasurement], device_name: str, hardware: str | None = None) -> list[Record]:
    """One ``comm`` record per measurement, for ``lmcalc.bench.results.save``."""
    software = software_versions()
    return [
        Record(
            kind="comm",
            device=device_name,
            hardware=hardware,
            dtype=m.dtype,
            figures={
                "op": m.op,
                "world_size": m.world_size,
                "backend": m.backend,
                "launcher": m.launcher,
                "size_bytes": m.size_bytes,
                "requested_bytes": m.requested_bytes,
                "median_s": m.median_s,
                "fastest_s": m.fastest_s,
                "slowest_s": m.slowest_s,
                "mean_s": m.mean_s,
                "warmup": m.warmup,
                "repeats": m.repeats,
                "algbw_gbps": m.algbw_gbps,
                "busbw_gbps": m.busbw_gbps,
                "busbw_factor": m.factor,
                "time_statistic": "median over repeats of the slowest rank",
                "max_error": m.max_error,
            },
            software=software,
        )
        for m in measurements
    ]
