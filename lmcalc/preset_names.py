"""What a preset is called, read from its file's text without parsing the YAML: its ``name``, its aliases and the
families it is the default member of. The presets registry reads only these lines of every built-in file, and parses
a file when its preset is used (``presets.registry``)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcalc.preset_files import _Loader


@dataclass(frozen=True)
class Names:
    """What a preset is called: its canonical ``name``, its other names, and the families it is the default member
    of (only the text items of a list count, as in any preset)."""

    name: str
    aliases: tuple[str, ...] = ()
    family_aliases: tuple[str, ...] = ()

    @classmethod
    def of(cls, data: dict[str, Any]) -> Names:
        return cls(data["name"], tuple(names_listed(data, "aliases")), tuple(names_listed(data, "family_aliases")))


# Each searched for after a line break (the text is read with one in front), which the regex engine finds quickly.
_FIELD_LINE = re.compile(r"\n(name|aliases|family_aliases):[ \t]*(.*?)(?:[ \t]+#.*)?[ \t]*$", re.MULTILINE)
_OTHER_TOP_LEVEL_LINE = re.compile(r"\n(?=[^ \t#\n])(?![A-Za-z_]\w*:(?:[ \t]|$))", re.MULTILINE)
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_QUOTED = re.compile(r'"([^"\\]*)"|\'([^\']*)\'')
_FLOW_LIST = re.compile(r"\[(.*)\]")


def declared_names(text: str) -> Names | None:
    """The names a preset file's text declares, read without parsing it: ``name``, ``aliases`` and
    ``family_aliases`` as top-level lines of the form the built-in files use (``name: llama-3-70b``,
    ``aliases: [meta-llama-3-70b, "Llama 3 70B"]``). None when the text could say them any other way (another form
    of top-level line, a value in another form, a field given twice, no name): the file is then parsed, and its
    YAML says. A test checks this against the YAML of every built-in file, and ``Entry.data`` when a file is parsed."""
    text = "\n" + text
    if _OTHER_TOP_LEVEL_LINE.search(text):
        return None
    fields: dict[str, str] = {}
    for match in _FIELD_LINE.finditer(text):
        if match[1] in fields:
            return None
        fields[match[1]] = match[2]
    name = _scalar(fields.get("name", ""))
    aliases, families = _flow_list(fields.get("aliases", "[]")), _flow_list(fields.get("family_aliases", "[]"))
    if name is None or aliases is None or families is None:
        return None
    return Names(name, aliases, families)


def _scalar(value: str) -> str | None:
    """A one-line YAML scalar that the preset reader reads as this text: quoted without escapes, or plain and read as
    neither a number, a boolean, a date nor null; else None."""
    quoted = _QUOTED.fullmatch(value)
    if quoted:
        return quoted[1] if quoted[1] is not None else quoted[2]
    if not _PLAIN.fullmatch(value):
        return None
    resolvers = _Loader.yaml_implicit_resolvers.get(value[0], []) + _Loader.yaml_implicit_resolvers.get(None, [])
    return None if any(regexp.match(value) for _, regexp in resolvers) else value


def _flow_list(value: str) -> tuple[str, ...] | None:
    """A one-line YAML flow list of such scalars (``[a, "b c"]``); else None."""
    listed = _FLOW_LIST.fullmatch(value)
    if listed is None:
        return None
    if not listed[1].strip():
        return ()
    items = [_scalar(item.strip()) for item in listed[1].split(",")]
    return None if None in items else tuple(item for item in items if item is not None)


def names_listed(data: dict[str, Any], field: str) -> list[str]:
    value = data.get(field, [])
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


BUILTIN_MODELS = (
    Path(__file__).parent / "presets" / "models"
    if (Path(__file__).parent / "presets").is_dir()  # an installed wheel, as presets.builtin_dir finds it
    else Path(__file__).parent.parent / "presets" / "models"
)
"""The built-in model presets' folder, found without the registry."""


def builtin_model_exactly(name: str) -> str | None:
    """The built-in model preset whose name or alias is ``name`` (case, spaces and underscores aside), and no other."""
    return _builtin_names().get(_normalised(name))


def builtin_model_named(name: str) -> str | None:
    """The built-in model preset whose name or alias is ``name`` (``Qwen3-8B``: qwen3-8b; case, spaces and
    underscores aside), or, failing that, the longest one ``name`` starts with and says more after
    (``Qwen3-8B-Instruct``: qwen3-8b). Read from the files' name lines alone (``preset_names``), as the registry
    reads them, without the registry (which resolves a Hub id through ``hub``, which names presets with this)."""
    key = _normalised(name)
    names = _builtin_names()
    if key in names:
        return names[key]
    stems = sorted((known for known in names if key.startswith(known + "-")), key=len, reverse=True)
    return names[stems[0]] if stems else None


@functools.cache  # the built-in files do not change while lmcalc runs
def _builtin_names() -> dict[str, str]:
    """Each built-in model preset's name and aliases, normalised (``_normalised``), and the preset's name."""
    from lmcalc.preset_files import read_text

    names: dict[str, str] = {}
    for path in sorted(BUILTIN_MODELS.glob("*.yaml")):
        declared = declared_names(read_text(path))
        if declared is not None:
            for alias in (declared.name, *declared.aliases):
                names.setdefault(_normalised(alias), declared.name)
    return names


def _normalised(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())
