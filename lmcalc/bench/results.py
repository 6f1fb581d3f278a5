"""Benchmark results on disk: written atomically, read back as the measured peak the estimates use.

The file is JSON: ``{"lmcalc_bench": 1, "records": [...]}``, one record per measurement, each naming
its kind (matmul, model, memory, comm, step), device, matched hardware preset, dtype and figures, and
stamped with the date and software versions. A new run adds its records to the file; it never drops
what was there. Saves by several processes at once are serialised by an advisory lock (``flock``) on
``<file>.lock`` beside it, held from reading the file to renaming the new one into place, so none is lost.

Every record is checked when the file is read: its fields and the figures the estimates use must be
there, of their type, finite and positive (``FIGURES``). Whether a figure is physically plausible for a
GPU (a rate no faster than the preset's dense peak allows, an efficiency in (0, 1]) is checked where it
is used, against that GPU's preset (``check_rate``, ``check_efficiency``, ``check_busbw``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmcalc.atomic import write_atomic
from lmcalc.errors import LmcalcError
from lmcalc.result import json_safe

if sys.platform != "win32":
    import fcntl

FORMAT_VERSION = 1
KINDS = ("matmul", "model", "memory", "comm", "step")

MAX_FILE_BYTES = 64 * 2**20
"""The largest results file read: a record is about a kilobyte, so this is some 60,000 measurements; a larger
file (or /dev/zero behind a symlink) is not one lmcalc wrote."""

RATE_MARGIN = 0.25
"""How far above a preset's dense peak a measured FLOP/s may be before it is refused as implausible: spec
sheets quote the peak at the rated boost clock, and a card can run some 10 % above it (consumer GPUs' boost
exceeds their rated one); a quarter more than the peak is no clock, but a wrong preset, dtype or file."""

BUSBW_MARGIN = 2.0
"""How many times a preset's scale-up link bandwidth (one direction) a measured all-reduce bus bandwidth may
reach: NVLink SHARP reduces in the switch, so nccl-tests' busbw can exceed the link (H100 NVLS ~480 GB/s
against 450), but not twice it."""


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


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Accepted:
    """What a figure may hold: ``test`` of the value, and ``text`` saying it in a message."""

    text: str
    test: Callable[[Any], bool]


POSITIVE = Accepted("a positive finite number", lambda v: _number(v) and v > 0)
NON_NEGATIVE = Accepted("0 or a positive finite number", lambda v: _number(v) and v >= 0)
WHOLE = Accepted("a positive whole number", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0)
TEXT = Accepted("a non-empty string", lambda v: isinstance(v, str) and v != "")

FIGURES: dict[str, dict[str, tuple[Accepted, bool]]] = {
    # per kind: figure -> (what it accepts, whether it must be there); the figures the estimates read, and the
    # rates each kind reports. Other figures (shapes, timings, notes) are kept as they are. An optional figure
    # may be null (JSON has no NaN: a figure that was not available is written null).
    "matmul": {"flops_per_s": (POSITIVE, True), "best_flops_per_s": (POSITIVE, False)},
    "model": {"flops_per_s": (POSITIVE, True), "model": (TEXT, False)},
    "memory": {"bytes_per_s": (POSITIVE, True), "size": (WHOLE, False)},
    "comm": {
        "op": (TEXT, True),
        "backend": (TEXT, True),
        "world_size": (WHOLE, True),
        "size_bytes": (WHOLE, True),
        "busbw_gbps": (NON_NEGATIVE, True),  # 0 for one rank: nothing crosses a link
        "algbw_gbps": (POSITIVE, False),
    },
    "step": {
        "model": (TEXT, True),
        "hardware_flops_per_step": (POSITIVE, True),
        "hfu": (POSITIVE, False),  # null where the device has no peak for the dtype
        "mfu": (POSITIVE, False),
        "flops_per_s": (POSITIVE, False),
        "peak_key": (TEXT, False),
    },
}

_FIELDS: dict[str, tuple[Accepted, bool]] = {
    "kind": (Accepted(f"one of {', '.join(KINDS)}", lambda v: v in KINDS), True),
    "device": (TEXT, True),
    "hardware": (Accepted("a hardware preset name or null", lambda v: v is None or TEXT.test(v)), True),
    "dtype": (Accepted("a dtype name or null", lambda v: v is None or TEXT.test(v)), True),
    "figures": (Accepted("an object of figures", lambda v: isinstance(v, dict)), True),
    "when": (TEXT, False),
    "software": (
        Accepted("an object of strings", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())),
        False,
    ),
}


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _record(path: Path, number: int, raw: Any) -> Record:
    """Record ``number`` (from 1) of ``path``, checked field by field and figure by figure."""
    where = f"{path}: record {number}"
    if not isinstance(raw, dict):
        raise LmcalcError(f"{where} must be an object of {', '.join(_FIELDS)}; got {_shown(raw)}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise LmcalcError(f"{where} has an unknown field {unknown[0]!r}; a record has {', '.join(_FIELDS)}")
    _check(where, "", raw, _FIELDS)
    _check(f"{where} ({raw['kind']})", "figures.", raw["figures"], FIGURES[raw["kind"]])
    return Record(**raw)


def _check(where: str, prefix: str, values: dict[str, Any], wanted: dict[str, tuple[Accepted, bool]]) -> None:
    for name, (accepted, required) in wanted.items():
        if name not in values or (values[name] is None and not required):
            if required:
                raise LmcalcError(f"{where}: {prefix}{name} is missing; it must be {accepted.text}")
            continue
        if not accepted.test(values[name]):
            raise LmcalcError(f"{where}: {prefix}{name} must be {accepted.text}; got {_shown(values[name])}")


def _read(path: Path) -> str:
    """The text of the results file at ``path`` (which exists), refused if it is not a regular file, is larger
    than any results file, or cannot be read as UTF-8."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file"
        raise LmcalcError(f"{path} is {what}, not a benchmark results file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise LmcalcError(f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB, so not a benchmark results file")
        return data.decode("utf-8")
    except OSError as exc:
        raise LmcalcError(f"cannot read benchmark results {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise LmcalcError(f"{path} is not UTF-8 text, so not a benchmark results file") from None


def load(path: Path) -> list[Record]:
    """The records of the results file at ``path`` (none if there is no file), each checked: a file that is
    not one lmcalc writes, or a record with a missing, mistyped, non-finite or non-positive figure, is refused
    with one line naming the file, the record and the field."""
    if not path.exists():
        return []
    try:
        data = json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise LmcalcError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise LmcalcError(f"{path} is nested too deeply to be a benchmark results file") from None
    if not isinstance(data, dict) or data.get("lmcalc_bench") != FORMAT_VERSION:
        raise LmcalcError(f'{path} is not an lmcalc benchmark file (expected "lmcalc_bench": {FORMAT_VERSION})')
    records = data.get("records", [])
    if not isinstance(records, list):
        raise LmcalcError(f'{path}: "records" must be a list of records; got {_shown(records)}')
    return [_record(path, number, raw) for number, raw in enumerate(records, start=1)]


def check_target(path: Path) -> None:
    """Refuse ``path`` as a place to save results before anything is measured: an existing file must be a
    results file that reads and checks, and be writable; the file is replaced by a rename, so its folder (or
    the nearest folder that exists, under which the missing ones are made) must be writable too."""
    if path.exists():
        load(path)
        if not os.access(path, os.W_OK):
            raise LmcalcError(f"cannot save to {path}: the file is read-only")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise LmcalcError(f"cannot save to {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LmcalcError(f"cannot save to {path}: the folder {folder} is not writable")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``<path>.lock`` (created if needed and left in place: removing it
    would let two processes lock two different files). No lock where ``flock`` does not exist (Windows)."""
    if sys.platform == "win32":
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def save(path: Path, records: list[Record]) -> Path:
    """Add ``records`` to the file at ``path`` (created if needed, with its folders), replacing it atomically.
    The read, the write and the rename happen under one lock, so concurrent saves each keep every record."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            existing = load(path)
            payload = {"lmcalc_bench": FORMAT_VERSION, "records": [asdict(r) for r in [*existing, *records]]}
            return write_atomic(path, json.dumps(json_safe(payload), indent=1, allow_nan=False))
    except OSError as exc:
        raise LmcalcError(f"cannot save to {path}: {exc.strerror or exc}") from None


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


def _where(path: Path, records: list[Record], record: Record) -> str:
    return f"{path}: record {records.index(record) + 1} ({record.kind} on {record.hardware}, {record.when})"


def check_rate(path: Path, records: list[Record], record: Record, peak_flops: float | None) -> None:
    """Refuse ``record``'s FLOP/s, read from ``records`` in ``path``, if it is more than ``RATE_MARGIN`` above
    ``peak_flops``, the dense peak of its hardware preset for its dtype (nothing to compare where that is None)."""
    if peak_flops is None:
        return
    rate, limit = record.figures["flops_per_s"], peak_flops * (1 + RATE_MARGIN)
    if rate > limit:
        raise LmcalcError(
            f"{_where(path, records, record)}: figures.flops_per_s {rate:.4g} FLOP/s is not plausible on "
            f"{record.hardware}; accepted: up to {limit:.4g} ({100 * RATE_MARGIN:g} % above its dense {record.dtype} "
            f"peak of {peak_flops:.4g})"
        )


def check_efficiency(path: Path, records: list[Record], record: Record) -> None:
    """Refuse a step's HFU (the fraction of the dense peak it reached) outside (0, 1]."""
    hfu = record.figures["hfu"]
    if not 0 < hfu <= 1:
        raise LmcalcError(
            f"{_where(path, records, record)}: figures.hfu {hfu:g} is not an efficiency; accepted: a fraction of "
            "the dense peak in (0, 1]"
        )


def check_busbw(path: Path, records: list[Record], record: Record, link_gbps: float | None) -> None:
    """Refuse an all-reduce bus bandwidth that is 0, or more than ``BUSBW_MARGIN`` times ``link_gbps``, the
    preset's scale-up bandwidth per GPU in one direction (no upper bound where that is None)."""
    busbw = record.figures["busbw_gbps"]
    limit = None if link_gbps is None else link_gbps * BUSBW_MARGIN
    if busbw <= 0 or (limit is not None and busbw > limit):
        bound = "above 0" + (f" and up to {limit:g} ({BUSBW_MARGIN:g} × its {link_gbps:g} GB/s link)" if limit else "")
        raise LmcalcError(
            f"{_where(path, records, record)}: figures.busbw_gbps {busbw:g} GB/s over {record.figures['world_size']}"
            f" ranks is not plausible on {record.hardware}; accepted: {bound}"
        )
