"""Benchmark results on disk: written atomically, read back as the measured peak the estimates use.

The file is JSON: ``{"lmcalc_bench": 1, "records": [...]}``, one record per measurement, each naming
its kind (matmul, model, memory, comm, step), device, matched hardware preset, dtype and figures, and
stamped with the date and software versions. A new run adds its records to the file; it never drops
what was there.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmcalc.atomic import write_atomic
from lmcalc.errors import LmcalcError
from lmcalc.result import json_safe

FORMAT_VERSION = 1


def default_path() -> Path:
    """``$XDG_DATA_HOME/lmcalc/bench.json`` (``~/.local/share/lmcalc/bench.json``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "lmcalc" / "bench.json"


@dataclass(frozen=True)
class Record:
    kind: str
    device: str
    hardware: str | None
    dtype: str | None
    figures: dict[str, Any]
    when: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    software: dict[str, str] = field(default_factory=dict)


def software_versions() -> dict[str, str]:
    import torch

    versions = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        versions["hip"] = torch.version.hip  # type: ignore[assignment]
    return versions


def load(path: Path) -> list[Record]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LmcalcError(f"cannot read benchmark results {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("lmcalc_bench") != FORMAT_VERSION:
        raise LmcalcError(f'{path} is not an lmcalc benchmark file (expected "lmcalc_bench": {FORMAT_VERSION})')
    return [Record(**r) for r in data.get("records", [])]


def save(path: Path, records: list[Record]) -> Path:
    """Add ``records`` to the file at ``path`` (created if needed), replacing it atomically."""
    existing = load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"lmcalc_bench": FORMAT_VERSION, "records": [asdict(r) for r in [*existing, *records]]}
    return write_atomic(path, json.dumps(json_safe(payload), indent=1, allow_nan=False))


def measured_peak(records: list[Record], hardware: str, dtype: str) -> tuple[float, Record] | None:
    """The measured FLOP/s for ``hardware`` and ``dtype``: a model-shape benchmark if there is one
    (the FLOP-weighted rate of the model's own matmuls), else the best matmul median."""
    for kind in ("model", "matmul"):
        matching = [r for r in records if r.kind == kind and r.hardware == hardware and r.dtype == dtype]
        if matching:
            best = max(matching, key=lambda r: r.figures["flops_per_s"])
            return best.figures["flops_per_s"], best
    return None


def measured_busbw(records: list[Record], hardware: str) -> tuple[float, Record] | None:
    """The NCCL ring bus bandwidth ``lmcalc bench comm`` measured within one node of ``hardware``: the all-reduce
    at its largest message (nccl-tests' plateau), bytes/s; None where none was measured with NCCL."""
    measured = [
        r
        for r in records
        if r.kind == "comm"
        and r.hardware == hardware
        and r.figures.get("backend") == "nccl"
        and r.figures.get("op") == "all-reduce"
        and r.figures.get("world_size", 1) > 1
    ]
    if not measured:
        return None
    largest = max(measured, key=lambda r: (r.figures["size_bytes"], r.when))
    return largest.figures["busbw_gbps"] * 1e9, largest


def measured_step_efficiency(
    records: list[Record], hardware: str, dtype: str, model: str
) -> tuple[float, Record] | None:
    """The fraction of the dense peak a measured training step reached on ``hardware`` in ``dtype``: its HFU,
    hardware FLOPs (recomputation included) over step time × peak, which is what the planner's compute
    efficiency means. The latest step of ``model`` if one was measured, else the step that did the most
    hardware FLOPs (the latest of those), the measured workload closest to a large run's kernels."""
    steps = [  # matched on the peak the HFU was taken against: TF32's for an fp32 step with TF32 matmuls
        r
        for r in records
        if r.kind == "step" and r.hardware == hardware and r.figures.get("peak_key", r.dtype) == dtype
        if r.figures.get("hfu")
    ]
    if not steps:
        return None
    same = [r for r in steps if r.figures.get("model") == model]
    largest = max(steps, key=lambda r: (r.figures.get("hardware_flops_per_step", 0.0), r.when))
    best = max(same, key=lambda r: r.when) if same else largest
    return best.figures["hfu"], best
