"""Finding and loading presets: built-in YAML, the user's own files and directories, HF config.json.

Built-in presets live in ``presets/`` at the top of the repository and are shipped inside the wheel as
``lmcalc/presets``. ``LMCALC_PRESET_PATH`` (directories separated by ``os.pathsep``) adds the user's
own, laid out the same way: ``models/*.yaml``, ``hardware/*.yaml``, ``frameworks/*.yaml``, ``precisions.yaml``,
``optimizers.yaml``. Wherever a preset name is accepted, a path to a YAML file (or, for models, a
Hugging Face ``config.json``) is accepted too, and for a model a Hugging Face Hub id (``lmcalc.hub``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from lmcalc import hub
from lmcalc.errors import LmcalcError
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import (
    Cluster,
    HardwareSpec,
    ModelSpec,
    NamedSpec,
    OptimizerSpec,
    PrecisionRecipe,
)

PRESET_PATH_ENV = "LMCALC_PRESET_PATH"
KINDS = ("models", "hardware", "precisions", "optimizers", "frameworks")
FILE_PER_SPEC_KINDS = (
    "models",
    "hardware",
    "frameworks",
)  # one spec per file in a folder; the others: a list in one file
_SPEC_OF_KIND: dict[str, type[NamedSpec]] = {
    "models": ModelSpec,
    "hardware": HardwareSpec,
    "precisions": PrecisionRecipe,
    "optimizers": OptimizerSpec,
    "frameworks": FrameworkProfile,
}
_SINGULAR = {
    "models": "model",
    "hardware": "hardware",
    "precisions": "precision",
    "optimizers": "optimizer",
    "frameworks": "framework",
}


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe YAML loader (libyaml when available) that also reads ``15e12`` and ``1.5e+13`` as numbers.

    YAML 1.1 (PyYAML) only takes exponents with a dot and a sign (``1.5e+13``); a preset author writing
    ``15e12`` would otherwise get a string.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
S = TypeVar("S", bound=BaseModel)


def builtin_dir() -> Path:
    """``lmcalc/presets`` in an installed wheel; the repository's ``presets/`` in a checkout."""
    packaged = Path(__file__).parent / "presets"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "presets"


def search_dirs() -> list[Path]:
    """The user's directories first (so they can shadow a built-in name), then the built-in one."""
    extra = [Path(p).expanduser() for p in os.environ.get(PRESET_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, builtin_dir()]


def normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; syntax errors become one line naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LmcalcError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise LmcalcError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise LmcalcError(f"{path}: YAML error: {exc}") from None


def validate(spec_type: type[S], data: Any, origin: str) -> S:
    """Build a spec; a validation error becomes one line naming the field and the reason."""
    if not isinstance(data, dict):
        raise LmcalcError(f"{origin}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return spec_type.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt field shows up as one unknown field plus one missing field: name the misspelling.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(first["loc"][-1]), list(spec_type.model_fields), n=1)
            message = "unknown field" + (f"; did you mean {close[0]}?" if close else "")
        raise LmcalcError(f"{origin}: {field}: {message}{more}") from None


def preset_files(directory: Path, kind: str) -> list[Path]:
    """The preset files of ``kind`` in a presets directory: one file per spec under ``kind/``, or one
    ``kind.yaml`` holding a list."""
    if kind in FILE_PER_SPEC_KINDS:
        folder = directory / kind
        return sorted(folder.glob("*.y*ml")) if folder.is_dir() else []
    path = directory / f"{kind}.yaml"
    return [path] if path.is_file() else []


def _entries_in(directory: Path, kind: str) -> list[tuple[dict[str, Any], str]]:
    files = preset_files(directory, kind)
    if kind in FILE_PER_SPEC_KINDS:
        return [(read_yaml(p), str(p)) for p in files]
    if not files:
        return []
    path = files[0]
    data = read_yaml(path)
    items = data.get(kind) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise LmcalcError(f"{path}: expected a top-level list named '{kind}'")
    return [(item, f"{path} [{kind}[{i}]]") for i, item in enumerate(items)]


def construct_trusted(spec_type: type[S], data: dict[str, Any]) -> S:
    """Build a spec from a built-in preset without running validation.

    Built-in presets ship with the package and every one of them is validated by the test suite and by
    ``lmcalc presets check``; skipping pydantic's validator here keeps the accounting commands quick to
    start (the validator is compiled on first use). User files are always validated.
    """
    fields: dict[str, Any] = {}
    for key, value in data.items():
        info = spec_type.model_fields.get(key)
        nested = _nested_spec_type(info.annotation) if info else None
        if nested and isinstance(value, dict):
            value = construct_trusted(nested, value)
        elif isinstance(value, list):  # a spec's sequences are tuples, as validation makes them
            value = tuple(construct_trusted(nested, v) if nested and isinstance(v, dict) else v for v in value)
        fields[key] = value
    return spec_type.model_construct(**fields)


def _nested_spec_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _nested_spec_type(arg)
        if found:
            return found
    return None


@dataclass(frozen=True)
class Entry:
    """One preset as read from its file, before it becomes a spec."""

    data: dict[str, Any]
    origin: str
    builtin: bool


class Registry:
    """All presets of one kind, indexed by canonical name, alias and family name; specs built on demand."""

    def __init__(self, kind: str, entries: dict[str, Entry], names: dict[str, str], families: dict[str, str]):
        self.kind = kind
        self.entries = entries
        self.names = names
        self.families = families
        self._built: dict[str, NamedSpec] = {}

    @property
    def origins(self) -> dict[str, str]:
        return {name: entry.origin for name, entry in self.entries.items()}

    def spec(self, name: str) -> NamedSpec:
        """The spec of canonical ``name``: validated for user files, constructed directly for built-ins."""
        if name not in self._built:
            entry = self.entries[name]
            spec_type = _SPEC_OF_KIND[self.kind]
            self._built[name] = (
                construct_trusted(spec_type, entry.data)
                if entry.builtin
                else validate(spec_type, entry.data, entry.origin)
            )
        return self._built[name]

    @property
    def specs(self) -> dict[str, NamedSpec]:
        """Every preset of this kind, each fully validated (for listing, checking and tests)."""
        spec_type = _SPEC_OF_KIND[self.kind]
        return {name: validate(spec_type, e.data, e.origin) for name, e in self.entries.items()}

    def resolve(self, name: str) -> tuple[NamedSpec, str]:
        """The spec for ``name`` and a note when a family name picked a default member."""
        key = normalise(name)
        if key in self.names:
            return self.spec(self.names[key]), ""
        if key in self.families:
            chosen = self.families[key]
            return self.spec(chosen), f"'{name}' is a family name; using its default member {chosen}"
        choices = sorted(set(self.names) | set(self.families))
        close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; run 'lmcalc presets list {self.kind}'"
        raise LmcalcError(f"unknown {_SINGULAR[self.kind]} '{name}'{hint}")


def _names(data: dict[str, Any], field: str) -> list[str]:
    value = data.get(field, [])
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


@cache
def registry(kind: str) -> Registry:
    """Read every preset file of ``kind`` on the search path (cached for the process)."""
    entries: dict[str, Entry] = {}
    names: dict[str, str] = {}
    families: dict[str, str] = {}
    builtin = builtin_dir()
    for directory in search_dirs():
        for data, origin in _entries_in(directory, kind):
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                raise LmcalcError(f"{origin}: a preset needs a 'name' field")
            canonical = data["name"]
            if canonical in entries:
                continue  # a user directory earlier on the path shadows this one
            entries[canonical] = Entry(data, origin, builtin=directory == builtin)
            for alias in [canonical, *_names(data, "aliases")]:
                names.setdefault(normalise(alias), canonical)
            for family in _names(data, "family_aliases"):
                families.setdefault(normalise(family), canonical)
    return Registry(kind, entries, names, families)


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith((".yaml", ".yml", ".json"))


def load_spec_file(path: Path, spec_type: type[S], hub_id: str | None = None) -> S:
    """A user's own preset file: YAML for any kind; a HF ``config.json`` for a model (named after ``hub_id``, the
    Hub repository it came from, when given)."""
    if path.is_dir() and (path / "config.json").is_file():  # a downloaded model's directory
        path = path / "config.json"
    if not path.is_file():
        raise LmcalcError(f"no such file: {path}")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise LmcalcError(f"cannot read {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise LmcalcError(f"{path}:{exc.lineno}: JSON syntax error: {exc.msg}") from None
        if spec_type is ModelSpec and isinstance(data, dict) and "name" not in data:
            name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
            origin = f"{hub_id} (Hugging Face Hub config.json)" if hub_id else str(path)
            return validate(spec_type, model_from_hf_config(data, hub_id or name, origin), origin)
        return validate(spec_type, data, str(path))
    return validate(spec_type, read_yaml(path), str(path))


@dataclass(frozen=True)
class Resolved:
    """A spec found by name or path, with a line to show the user when the lookup chose something."""

    spec: Any
    origin: str
    note: str = ""


def _resolve(kind: str, name: str, spec_type: type[S]) -> Resolved:
    if spec_type is ModelSpec and hub.is_hub_id(name):  # org/name, and no such local file
        return Resolved(load_spec_file(hub.config_path(name), spec_type, hub_id=name), f"Hugging Face Hub: {name}")
    if _looks_like_path(name):
        return Resolved(load_spec_file(Path(name).expanduser(), spec_type), name)
    reg = registry(kind)
    spec, note = reg.resolve(name)
    return Resolved(spec, reg.entries[spec.name].origin, note)


def resolve_model(name: str) -> Resolved:
    return _resolve("models", name, ModelSpec)


def resolve_hardware(name: str) -> Resolved:
    return _resolve("hardware", name, HardwareSpec)


def resolve_precision(name: str) -> Resolved:
    return _resolve("precisions", name, PrecisionRecipe)


def resolve_optimizer(name: str) -> Resolved:
    return _resolve("optimizers", name, OptimizerSpec)


def resolve_framework(name: str) -> Resolved:
    return _resolve("frameworks", name, FrameworkProfile)


_CLUSTER_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(?:(\d+)\s*[x×]\s*)?(.+?)\s*$", re.IGNORECASE)


def parse_cluster(text: str) -> Cluster:
    """``8xH100`` (8 GPUs), ``1024xH100`` (1024 GPUs, the preset's GPUs per node), ``128x8xH100``."""
    match = _CLUSTER_RE.match(text)
    if not match:
        raise LmcalcError(
            f"cannot read cluster {text!r}; expected COUNTxGPU or NODESxGPUS_PER_NODExGPU, "
            "e.g. 8xH100, 1024xH100, 128x8xH100"
        )
    first, per_node, gpu = match.groups()
    hardware = resolve_hardware(gpu).spec
    if int(first) <= 0 or (per_node is not None and int(per_node) <= 0):
        raise LmcalcError(f"cluster {text!r}: the number of nodes and of GPUs must be positive")
    if per_node is None:
        count = int(first)
        gpus_per_node = min(hardware.gpus_per_node, count)
    else:
        count, gpus_per_node = int(first) * int(per_node), int(per_node)
    return Cluster(hardware=hardware, count=count, gpus_per_node=gpus_per_node)
