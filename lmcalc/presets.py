"""Finding and loading presets: built-in YAML, the user's own files and directories, HF config.json.

Built-in presets live in ``presets/`` at the top of the repository and are shipped inside the wheel as
``lmcalc/presets``. ``LMCALC_PRESET_PATH`` (directories separated by ``os.pathsep``) adds the user's
own, laid out the same way: ``models/*.yaml``, ``hardware/*.yaml``, ``frameworks/*.yaml``, ``precisions.yaml``,
``optimizers.yaml``. Wherever a preset name is accepted, a path to a YAML file (or, for models, a
Hugging Face ``config.json``) is accepted too, and for a model a Hugging Face Hub id (``lmcalc.hub``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

from pydantic import BaseModel, ValidationError

from lmcalc.errors import LmcalcError, as_given, echo, token, warn
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.preset_files import (  # noqa: F401  (read_yaml and the limits are the presets' API too)
    CONFIG_FILE_LIMIT,
    MAX_NESTING,
    PRESET_FILE_LIMIT,
    _Loader,
    read_json,
    read_text,
    read_yaml,
)
from lmcalc.preset_names import Names, declared_names
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec, NamedSpec

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


S = TypeVar("S", bound=BaseModel)


def builtin_dir() -> Path:
    """``lmcalc/presets`` in an installed wheel; the repository's ``presets/`` in a checkout."""
    packaged = Path(__file__).parent / "presets"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "presets"


def search_dirs() -> list[Path]:
    """The user's directories first (so they can shadow a built-in name), then the built-in one."""
    extra = [Path(p).expanduser() for p in os.environ.get(PRESET_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, builtin_dir()]


_SEPARATORS = re.compile(r"[\s_]+")


def normalise(name: str) -> str:
    return _SEPARATORS.sub("-", name.strip().lower())


def validate(spec_type: type[S], data: Any, origin: str) -> S:
    """Build a spec; a validation error becomes one line naming the field and the reason."""
    if data is None:
        raise LmcalcError(f"{origin}: empty; expected a mapping of fields (name: ..., and the rest)")
    if not isinstance(data, dict):
        raise LmcalcError(f"{origin}: expected a mapping of fields (name: ..., and the rest), not {_what_is(data)}")
    try:
        return spec_type.model_validate(data)
    except (OverflowError, ArithmeticError, RecursionError) as exc:  # a rule's arithmetic on values out of all reason
        raise LmcalcError(f"{origin}: a value out of range ({type(exc).__name__}); see the field bounds") from None
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt field shows up as one unknown field plus one missing field: name the misspelling.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc, message = first["loc"], first["msg"].removeprefix("Value error, ")
        unnamed = first["type"] == "extra_forbidden" and not _is_name(loc[-1])
        if unnamed:  # likely a line of some other file (/etc/shadow's) read as a key: it is not quoted
            loc, message = loc[:-1], "a key that is not a field name"
        elif first["type"] == "extra_forbidden":
            import difflib

            close = difflib.get_close_matches(str(loc[-1]), list(spec_type.model_fields), n=1)
            message = "unknown field" + (f"; did you mean {close[0]}?" if close else "")
        else:
            message = _own_words(first, message)
        field = ".".join(str(p) if _is_name(p) else "(a key)" for p in loc) or ("" if unnamed else "(top level)")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise LmcalcError(f"{origin}: {field + ': ' if field else ''}{message}{more}") from None


_TYPE_WANTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}
"""What a field of each type must be, in lmcalc's words: the message is ours, not pydantic's (whose wording changes
between releases), and reads as the config.json reader's does."""


_BOUND_WANTED = {
    "greater_than": "greater than {gt:,}",
    "greater_than_equal": "at least {ge:,}",
    "less_than": "less than {lt:,}",
    "less_than_equal": "at most {le:,}",
    "finite_number": "a finite number",
    "string_too_short": "at least {min_length:,} characters long",
    "string_too_long": "at most {max_length:,} characters long",
}
"""What a number out of its field's range must be: the bound pydantic checked, in lmcalc's words (the bounds and why
they are where they are: ``spec_base.MAX_DIMENSION`` and its neighbours)."""


def _what_is(data: Any) -> str:
    """What a file holds at its top level where a mapping belongs, in YAML's words."""
    if isinstance(data, list):
        return "a list"
    return as_given(data) if isinstance(data, str | int | float | bool) else type(data).__name__


def _own_words(error: Any, message: str) -> str:
    """A type, choice or range error in lmcalc's words (``must be an integer, not the text '1:30'``, ``must be at most
    4,096, not 1000000000``); any other error keeps its message (our validators' own words, pydantic's for the
    rest)."""
    if error["type"] in _TYPE_WANTED:
        return f"must be {_TYPE_WANTED[error['type']]}, not {as_given(error['input'])}"
    if error["type"] in _BOUND_WANTED:
        wanted = _BOUND_WANTED[error["type"]].format(**error.get("ctx", {}))
        given = error["input"]
        if given == "":
            return "must not be empty"
        if isinstance(given, str) and error["type"].startswith("string"):
            return f"must be {wanted}, not {len(given):,} characters"
        return f"must be {wanted}, not {as_given(given)}"
    if error["type"] == "literal_error" and "expected" in error.get("ctx", {}):
        return f"must be {error['ctx']['expected']}, not {as_given(error['input'])}"
    return message


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,47}")


def _is_name(part: str | int) -> bool:
    """Whether a key a validation error points at can be shown: a field name, a list index, a dtype; not a stray
    line of some other file (``/etc/shadow``'s, read as a key)."""
    return isinstance(part, int) or part == "[key]" or bool(_NAME.fullmatch(part))


def preset_files(directory: Path, kind: str) -> list[Path]:
    """The preset files of ``kind`` in a presets directory: one file per spec under ``kind/``, or one
    ``kind.yaml`` holding a list."""
    if kind in FILE_PER_SPEC_KINDS:
        folder = directory / kind
        return sorted(folder.glob("*.y*ml")) if folder.is_dir() else []
    path = directory / f"{kind}.yaml"
    return [path] if path.exists() or path.is_symlink() else []  # a directory or a FIFO: read_text says why not


def _entries_in(directory: Path, kind: str, builtin: bool) -> list[tuple[Any, str]]:
    """The presets of ``kind`` in ``directory``, each with where it was read from. A file of the user's that cannot be
    read is left out with a warning that names it: one broken file must not stop every command (a built-in one is a
    bug, and raises). A built-in file whose text declares its names plainly (``declared_names``) gives its ``Names``
    in place of its fields: it is parsed only when the preset is used."""
    entries: list[tuple[Any, str]] = []
    for path in preset_files(directory, kind):
        try:
            declared = declared_names(read_text(path)) if builtin and kind in FILE_PER_SPEC_KINDS else None
            entries += [(declared, str(path))] if declared else _entries_of_file(path, kind)
        except LmcalcError as exc:
            if builtin:
                raise
            warn(f"{exc}; left out")
    return entries


def _empty_file(path: Path, what: str) -> LmcalcError:
    """The error for a preset file that holds nothing (no text, or comments alone): YAML reads it as null."""
    return LmcalcError(f"{path}: the file is empty (or holds only comments); expected {what}")


def _entries_of_file(path: Path, kind: str) -> list[tuple[Any, str]]:
    data = read_yaml(path)
    if data is None:
        wanted = f"a {_SINGULAR[kind]}'s fields" if kind in FILE_PER_SPEC_KINDS else f"a top-level list named '{kind}'"
        raise _empty_file(path, wanted)
    if kind in FILE_PER_SPEC_KINDS:
        return [(data, str(path))]
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


class Entry:
    """One preset as read from its file, before it becomes a spec: its names, and its fields (``data``). A built-in
    file whose text declares its names is parsed the first time its fields are read."""

    def __init__(self, names: Names, origin: str, builtin: bool, data: dict[str, Any] | None = None):
        self.names = names
        self.origin = origin
        self.builtin = builtin
        self._data = data

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            data = read_yaml(Path(self.origin))
            if not isinstance(data, dict) or not isinstance(data.get("name"), str) or Names.of(data) != self.names:
                raise LmcalcError(f"{self.origin}: its YAML does not give the names its text declares ({self.names})")
            self._data = data
        return self._data


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
        """Every preset of this kind, each fully validated (for listing, checking and tests); an invalid one of the
        user's is left out with a warning."""
        spec_type = _SPEC_OF_KIND[self.kind]
        found = {}
        for name, entry in self.entries.items():
            try:
                found[name] = validate(spec_type, entry.data, entry.origin)
            except LmcalcError as exc:
                if entry.builtin:
                    raise
                warn(f"{exc}; left out")
        return found

    def resolve(self, name: str) -> tuple[NamedSpec, str]:
        """The spec for ``name`` and a note when a family name picked a default member."""
        key = normalise(name)
        if key in self.names:
            return self.spec(self.names[key]), ""
        if key in self.families:
            chosen = self.families[key]
            return self.spec(chosen), f"{echo(name)} is a family name; using its default member {chosen}"
        import difflib

        choices = sorted(set(self.names) | set(self.families))
        # a known name with more said after it (H100-80GB, qwen3-9b) means that name before spelling alike does
        stems = sorted((c for c in choices if key.startswith(c + "-")), key=len, reverse=True)
        close = stems[:1] or difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; run 'lmcalc presets list {self.kind}'"
        raise LmcalcError(f"unknown {_SINGULAR[self.kind]} {echo(name)}{hint}")


@cache
def registry(kind: str) -> Registry:
    """Every preset of ``kind`` on the search path, by name (cached for the process). The user's files are read
    whole; a built-in file is read for its names alone, and parsed when its preset is used.

    A preset of the user's with a built-in's ``name`` replaces the built-in (on purpose: docs/presets.md); one
    whose other names take a built-in's is kept, with a warning."""
    entries: dict[str, Entry] = {}
    builtin = builtin_dir()
    for directory in search_dirs():
        for data, origin in _entries_in(directory, kind, builtin=directory == builtin):
            if isinstance(data, Names):
                entry = Entry(data, origin, builtin=True)
            elif not isinstance(data, dict) or not isinstance(data.get("name"), str):
                if directory == builtin:
                    raise LmcalcError(f"{origin}: a preset needs a 'name' field")
                warn(f"{origin}: a preset needs a 'name' field; left out")
                continue
            else:
                entry = Entry(Names.of(data), origin, builtin=directory == builtin, data=data)
            if entry.names.name not in entries:  # a user directory earlier on the path shadows this one
                entries[entry.names.name] = entry
    names: dict[str, str] = {}
    families: dict[str, str] = {}
    for canonical, entry in entries.items():  # the user's first: their names win
        for alias in [canonical, *entry.names.aliases]:
            names.setdefault(normalise(alias), canonical)
        for family in entry.names.family_aliases:
            families.setdefault(normalise(family), canonical)
    _warn_shadowing(kind, entries)
    return Registry(kind, entries, names, families)


def _warn_shadowing(kind: str, entries: dict[str, Entry]) -> None:
    """A warning for each name a user's preset takes from a built-in one of another name: ``-m NAME`` would then
    pick the user's model where the built-in was meant. Names and aliases are looked up before family names, so a
    user's alias takes any of a built-in's names, and a user's family name only a built-in's family name."""
    if all(entry.builtin for entry in entries.values()):
        return
    names: dict[str, str] = {}  # each built-in's name and aliases, and whose they are
    families: dict[str, str] = {}
    for canonical, entry in entries.items():
        if entry.builtin:
            names.update((normalise(a), canonical) for a in [canonical, *entry.names.aliases])
            families.update((normalise(f), canonical) for f in entry.names.family_aliases)
    for canonical, entry in entries.items():
        if entry.builtin:
            continue
        taken = [(a, names.get(normalise(a)) or families.get(normalise(a))) for a in [canonical, *entry.names.aliases]]
        taken += [(f, families.get(normalise(f))) for f in entry.names.family_aliases]
        for alias, owner in taken:
            if owner is not None and owner != canonical:
                warn(
                    f"{entry.origin}: {token(alias)} of {canonical} shadows the built-in {_SINGULAR[kind]} {owner} "
                    f"(to replace a built-in, give your preset its name)"
                )


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith((".yaml", ".yml", ".json"))


def load_spec_file(path: Path, spec_type: type[S], hub_id: str | None = None) -> S:
    """A user's own preset file: YAML for any kind; a HF ``config.json`` for a model (named after ``hub_id``, the
    Hub repository it came from, when given)."""
    if path.is_dir() and (path / "config.json").exists():  # a downloaded model's directory
        path = path / "config.json"
    if not path.exists():
        raise LmcalcError(f"no such file: {path}")
    if path.is_dir():
        raise LmcalcError(f"{path} is a directory without a config.json")
    if path.suffix == ".json":
        data = read_json(path)
        if spec_type is ModelSpec and isinstance(data, dict) and "name" not in data:
            from lmcalc.hf_config import model_from_hf_config
            from lmcalc.hf_layers import with_unused_noted

            name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
            origin = f"{hub_id} (Hugging Face Hub config.json)" if hub_id else str(path)
            spec = validate(ModelSpec, model_from_hf_config(data, hub_id or name, origin), origin)
            return cast(S, with_unused_noted(spec))  # spec_type is ModelSpec
        return validate(spec_type, data, str(path))
    data = read_yaml(path)
    if data is None:
        kind = next((k for k, t in _SPEC_OF_KIND.items() if t is spec_type), "")
        raise _empty_file(path, f"a {_SINGULAR.get(kind, 'preset')}'s fields, one per line (name: ..., and the rest)")
    return validate(spec_type, data, str(path))


@dataclass(frozen=True)
class Resolved:
    """A spec found by name or path, with a line to show the user when the lookup chose something."""

    spec: Any
    origin: str
    note: str = ""


def _names_a_file(name: str) -> bool:
    """Whether ``name`` is a preset file's or config.json's name, or a path that exists."""
    if name.endswith((".yaml", ".yml", ".json")):
        return True
    try:
        return Path(name).expanduser().exists()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL in it
        return False


def _resolve(kind: str, name: str, spec_type: type[S]) -> Resolved:
    if spec_type is ModelSpec and "/" in name and not _names_a_file(name):  # org/name, and no such local file: a Hub id
        from lmcalc import hub  # urllib and http.client: imported only when a name could be a Hub id

        if hub.is_hub_id(name):
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


def framework_profile(name: str = "idealised") -> FrameworkProfile:
    """A framework profile by name: the idealised one (the papers' count) unless named. The engine reads no preset;
    a caller that builds a ``Workload`` chooses its profile with this."""
    return resolve_framework(name).spec


_CLUSTER_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(?:(\d+)\s*[x×]\s*)?(.+?)\s*$", re.IGNORECASE)


def parse_cluster(text: str) -> Cluster:
    """``8xH100`` (8 GPUs), ``1024xH100`` (1024 GPUs, the preset's GPUs per node), ``128x8xH100``."""
    match = _CLUSTER_RE.match(text)
    if not match:
        raise LmcalcError(
            f"cannot read cluster {echo(text)}; expected COUNTxGPU or NODESxGPUS_PER_NODExGPU, "
            "e.g. 8xH100, 1024xH100, 128x8xH100"
        )
    first, per_node, gpu = match.groups()
    hardware = resolve_hardware(gpu).spec
    if int(first) <= 0 or (per_node is not None and int(per_node) <= 0):
        raise LmcalcError(f"cluster {echo(text)}: the number of nodes and of GPUs must be positive")
    if per_node is None:
        count = int(first)
        gpus_per_node = min(hardware.gpus_per_node, count)
    else:
        count, gpus_per_node = int(first) * int(per_node), int(per_node)
    return Cluster(hardware=hardware, count=count, gpus_per_node=gpus_per_node)
