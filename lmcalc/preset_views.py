"""``lmcalc presets list|show|check``: presenting and checking preset files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcalc import presets as pr
from lmcalc.engine.model.params import count_params
from lmcalc.engine.model.published import as_published, matches_published, precision_text
from lmcalc.errors import LmcalcError
from lmcalc.specs import ModelSpec
from lmcalc.units import group


def _console():
    from rich.console import Console

    return Console(highlight=False, markup=False, emoji=False)


def _summary(kind: str, spec: Any) -> str:
    if kind == "models":
        return f"{group(count_params(spec).total)} params"
    if kind == "hardware":
        bf16 = spec.peak_tflops_dense.get("bf16")
        return f"{spec.capacity_label}; " + (f"bf16 {bf16:g} TFLOP/s dense" if bf16 else "no bf16 peak")
    if kind == "precisions":
        return f"compute {spec.compute_dtype}"
    if kind == "frameworks":
        return spec.version
    return ", ".join(s.name for s in spec.states) or "no state"


def list_presets(kinds: tuple[str, ...], as_json: bool) -> None:
    data: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        reg = pr.registry(kind)
        data[kind] = [
            {
                "name": name,
                "aliases": list(getattr(spec, "aliases", [])),
                "family_aliases": list(getattr(spec, "family_aliases", [])),
                "summary": _summary(kind, spec),
                "origin": reg.origins[name],
            }
            for name, spec in sorted(reg.specs.items())
        ]
    if as_json:
        print(json.dumps(data, indent=2))
        return
    from rich.table import Table

    console = _console()
    for kind, rows in data.items():
        table = Table(title=f"{kind} ({len(rows)})", title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("Name")
        table.add_column("Also known as", style="dim")
        table.add_column("Summary", justify="right")
        table.add_column("From", style="dim")
        for row in rows:
            also = ", ".join(row["aliases"] + [f"{f} (family default)" for f in row["family_aliases"]])
            origin = "built-in" if _is_builtin(row["origin"]) else row["origin"]
            table.add_row(row["name"], also, row["summary"], origin)
        console.print(table)
        console.print()


def _shown_origin(origin: str) -> str:
    """A built-in preset's file named inside lmcalc's presets (``built-in optimizers.yaml [optimizers[5]]``), the
    same on every machine; a user's file by its full path."""
    builtin = str(pr.builtin_dir())
    return "built-in " + origin[len(builtin) :].lstrip("/\\") if _is_builtin(origin) else origin


def _is_builtin(origin: str) -> bool:
    return origin.startswith(str(pr.builtin_dir()))


def _find_any(name: str) -> tuple[str, Any, str]:
    errors = []
    for kind in pr.KINDS:
        try:
            spec, _ = pr.registry(kind).resolve(name)
            return kind, spec, _shown_origin(pr.registry(kind).entries[spec.name].origin)
        except LmcalcError as exc:
            errors.append(str(exc))
    suggestions = [e.split("did you mean ", 1)[1].rstrip("?") for e in errors if "did you mean" in e]
    hint = f"; did you mean {' or '.join(suggestions)}?" if suggestions else "; run 'lmcalc presets list'"
    raise LmcalcError(f"unknown preset '{name}'{hint}")


def _listed(value: Any) -> Any:
    """A spec's dump with its tuples as lists: YAML writes lists, and the preset file's own numbers stay as
    written (a JSON-mode dump would turn a float field's ``67`` into ``67.0``)."""
    if isinstance(value, dict):
        return {key: _listed(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_listed(item) for item in value]
    return value


def show_preset(name: str, as_json: bool) -> None:
    kind, spec, origin = _find_any(name)
    data = {"kind": kind, "origin": origin, **_listed(spec.model_dump(exclude_none=True))}
    if isinstance(spec, ModelSpec):
        counts = count_params(spec)
        data["computed_params"] = {"total": counts.total, "active": counts.active, "by_group": counts.by_group}
    if as_json:
        print(json.dumps(data, indent=2))
        return
    import yaml

    # Plain print: YAML has its own line breaks, which a terminal-width wrap would break again.
    print(f"# {spec.name} ({kind[:-1] if kind != 'hardware' else kind}) from {origin}")
    print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=float("inf")).rstrip())


@dataclass(frozen=True)
class CheckOutcome:
    origin: str
    ok: bool
    message: str


def _check_model(spec: ModelSpec, origin: str) -> CheckOutcome:
    total = count_params(spec).total
    if spec.published_params is None:
        return CheckOutcome(origin, True, f"valid; {group(total)} params (no published count to compare)")
    digits = spec.published_params_sig_figs
    counted = group(total) + (f" ({group(as_published(spec, total))} without the embeddings)"
                              if spec.published_params_scope != "total" else "")  # fmt: skip
    if not matches_published(spec, total):
        return CheckOutcome(
            origin,
            False,
            f"computed {counted} params != published {group(spec.published_params)}"
            + (f" ({precision_text(spec)})" if digits else ""),
        )
    return CheckOutcome(
        origin, True, f"valid; {counted} params = published " + (precision_text(spec) if digits else "exactly")
    )


def _check_file(path: Path) -> list[CheckOutcome]:
    """Validate one file of any kind: a model or hardware YAML, or a precisions/optimizers list."""
    try:
        data = pr.read_yaml(path) if path.suffix != ".json" else None
        if data is None:
            return [_check_model(pr.load_spec_file(path, ModelSpec), str(path))]
        for kind in ("precisions", "optimizers"):
            if isinstance(data, dict) and kind in data:
                return [CheckOutcome(o, True, "valid") for o in _validate_list(data[kind], kind, path)]
        kind = _kind_of(data)
        if kind == "models":
            return [_check_model(pr.validate(ModelSpec, data, str(path)), str(path))]
        pr.validate(pr._SPEC_OF_KIND[kind], data, str(path))
        return [CheckOutcome(str(path), True, f"valid {kind[:-1] if kind != 'hardware' else kind} preset")]
    except LmcalcError as exc:
        return [CheckOutcome(str(path), False, str(exc).removeprefix(f"{path}: "))]


# Fields only one kind of preset has: a file is checked as the kind whose fields it uses most.
_KIND_FIELDS = {
    "models": {"vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size", "ffn_kind", "norm_kind"},
    "hardware": {"vendor", "memory_bytes", "memory_label", "peak_tflops_dense", "memory_bandwidth_tbps"},
    "precisions": {"compute_dtype", "param_bytes", "grad_bytes", "master_bytes", "optimizer_state_bytes"},
    "optimizers": {"states"},
    "frameworks": {"norm", "mlp", "rotary", "loss", "buffers", "allocator", "optimizer_step"},
}


def _kind_of(data: Any) -> str:
    keys = set(data) if isinstance(data, dict) else set()
    return max(_KIND_FIELDS, key=lambda kind: len(keys & _KIND_FIELDS[kind]))


def _validate_list(items: Any, kind: str, path: Path) -> list[str]:
    if not isinstance(items, list):
        raise LmcalcError(f"{path}: '{kind}' must be a list")
    spec_type = pr._SPEC_OF_KIND[kind]
    checked = []
    for i, item in enumerate(items):
        where = f"{path} [{kind}[{i}]]"
        pr.validate(spec_type, item, where)  # raises, naming the field, when the item is not a valid preset
        checked.append(where)
    return checked


def _all_preset_files() -> list[Path]:
    """Every preset file on the search path, directory by directory, kind by kind."""
    return [path for directory in pr.search_dirs() for kind in pr.KINDS for path in pr.preset_files(directory, kind)]


def check_presets(files: list[str], as_json: bool) -> bool:
    paths = [Path(f) for f in files] or _all_preset_files()
    outcomes = [o for p in paths for o in _check_file(p)]
    ok = all(o.ok for o in outcomes)
    if as_json:
        print(json.dumps({"ok": ok, "files": [o.__dict__ for o in outcomes]}, indent=2))
        return ok
    console = _console()
    for o in outcomes:
        console.print(f"{'ok  ' if o.ok else 'FAIL'} {o.origin}: {o.message}", style=None if o.ok else "bold red")
    console.print(f"{sum(o.ok for o in outcomes)} ok, {sum(not o.ok for o in outcomes)} failed")
    return ok


def preset_schema(kind: str) -> dict[str, Any]:
    """JSON Schema of a preset file of ``kind``: one spec per file, or a list under the kind's name."""
    schema = pr._SPEC_OF_KIND[kind].model_json_schema()
    if kind in pr.FILE_PER_SPEC_KINDS:
        return {**schema, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    definitions = schema.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"lmcalc {kind} file",
        "type": "object",
        "properties": {kind: {"type": "array", "items": schema}},
        "required": [kind],
        **({"$defs": definitions} if definitions else {}),
    }
