"""What the page asks: a command and its settings as the page's fields give them (text), read into the Python API's
keywords by the types ``estimates.settings`` declares, refused in one line where the page must not go (a file path),
and written back as the ``lmcalc`` command line that asks the same.

A ``Question`` is a frozen value: the server's cache key, and what one request answers.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import re
import shlex
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lmcalc
from lmcalc.errors import LmcalcError, flag
from lmcalc.estimates.setting_groups import fields_of

COMMANDS: dict[str, Callable[..., Any]] = {
    "memory": lmcalc.memory,
    "fit": lmcalc.fit,
    "max-params": lmcalc.max_params,
    "train-time": lmcalc.train_time,
    "plan": lmcalc.plan,
}
"""The commands the page asks, each the API function the command line calls."""

COMMAND_LINE_DEFAULTS: dict[str, dict[str, Any]] = {"plan": {"top": 10}}
"""Where the command's default differs from the function's: ``plan --top`` shows 10 layouts, ``lmcalc.plan`` all."""

MODEL_KEYWORDS = ("model", "like")
"""The settings that name a model: a preset, a Hub id, or the config the page sends beside the question."""

REFUSED = {"calibration": "a results file on the server's disk"}
"""Settings the page does not take, and why: a request names no file on the server."""

MAX_CONFIG_BYTES = 256 * 1024
"""The largest config.json the page takes: the largest Hub configs are about 20 KB (Qwen3-Omni's, with its nested
vision and audio towers), so a tenfold margin."""
MAX_CONFIG_DEPTH = 16
"""The deepest nesting of a config.json the page takes: a model's config nests three or four levels (a vision
tower's text config's rope scaling)."""
MAX_TEXT = 200
"""The longest setting the page takes, in characters: a LoRA target list is the longest a user types."""

_FILE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Config:
    """A model's config.json sent with the question, its text (for the cache key) and the name it was uploaded as."""

    text: str
    name: str = "config.json"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Question:
    """One command and its settings (keyword, value), as the API takes them; what one answer is cached under."""

    command: str
    settings: tuple[tuple[str, Any], ...]
    config: Config | None = None

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.settings)

    def __hash__(self) -> int:
        return hash((self.command, self.settings, self.config.digest if self.config else None))


def kinds_of(command: str) -> dict[str, Any]:
    """Each keyword ``command`` takes, and its type: the function's own keywords and its settings groups'."""
    return _kinds(command_of(command))


@functools.cache
def _kinds(function: Callable[..., Any]) -> dict[str, Any]:
    kinds: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        if name == "return":
            continue
        if typing.get_origin(hint) is typing.Unpack:
            (group,) = typing.get_args(hint)
            kinds |= {field: kind for field, (kind, _) in fields_of(group).items()}
        else:
            kinds[name] = hint
    return kinds


@functools.cache
def defaults_of(command: str) -> dict[str, Any]:
    """Each keyword's default, as the command line has it."""
    function = command_of(command)
    found: dict[str, Any] = {}
    for hint in typing.get_type_hints(function, include_extras=True).values():
        if typing.get_origin(hint) is typing.Unpack:
            (group,) = typing.get_args(hint)
            found |= {field: setting.default for field, (_, setting) in fields_of(group).items()}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            found[name] = parameter.default
    return found | COMMAND_LINE_DEFAULTS.get(command, {})


@functools.cache
def flags_of(command: str) -> dict[str, tuple[str, str | None]]:
    """Each keyword's flag on the command line, and a boolean's negative flag (``--x/--no-x``) where it has one."""
    function = command_of(command)
    found: dict[str, tuple[str, str | None]] = {name: (flag(name), None) for name in kinds_of(command)}
    for hint in typing.get_type_hints(function, include_extras=True).values():
        if typing.get_origin(hint) is typing.Unpack:
            (group,) = typing.get_args(hint)
            for field, (kind, setting) in fields_of(group).items():
                if setting.flags:
                    positive, _, negative = setting.flags[0].partition("/")
                    found[field] = (positive, negative or None)
                elif kind is bool:
                    found[field] = (flag(field), "--no-" + flag(field)[2:])
    return found


def command_of(command: str) -> Callable[..., Any]:
    """The API function of ``command``."""
    if command not in COMMANDS:
        raise LmcalcError(f"no command {command!r} on the page; it asks {', '.join(COMMANDS)}")
    return COMMANDS[command]


def question_of(command: str, fields: Mapping[str, str], config: Config | None = None) -> Question:
    """The page's ``fields`` read for ``command``: each one it takes, read by its declared type; the fields another
    of the page's commands takes are left out; an empty field takes the default."""
    kinds = kinds_of(command)
    known = set().union(*(kinds_of(c) for c in COMMANDS))
    settings: dict[str, Any] = {}
    for name, text in fields.items():
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]}?" if close else f"see lmcalc {command} --help"
            raise FieldError(name, f"no setting {name[:60]!r}; {hint}")
        if name in REFUSED:
            raise FieldError(name, f"{flag(name)} names {REFUSED[name]}: the page takes none; use the command line")
        if name not in kinds or text is None or str(text).strip() == "":
            continue
        settings[name] = read(name, str(text).strip(), kinds[name])
    for name in MODEL_KEYWORDS:
        if name in kinds and name in settings and config is None:
            check_model_name(name, settings[name])
    if config is not None:
        check_config(config)
        named = [name for name in MODEL_KEYWORDS if name in kinds]
        settings |= {name: config.name for name in named}
    return Question(command, tuple(sorted(settings.items(), key=_order)), config)


def _order(item: tuple[str, Any]) -> tuple[int, str]:
    """The command line's order: the model, the GPUs, then the settings by name."""
    first = (*MODEL_KEYWORDS, "gpus")
    return (first.index(item[0]) if item[0] in first else len(first), item[0])


class FieldError(LmcalcError):
    """Input the page refused, and the field it came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def read(name: str, text: str, kind: Any) -> Any:
    """``text`` as the type ``kind`` declares: a whole number, a number, a yes/no, one of a few values, or text (a
    count such as 8K and a preset's name stay text: the API reads them)."""
    if len(text) > MAX_TEXT:
        raise FieldError(name, f"{flag(name)}: {len(text):,} characters; at most {MAX_TEXT}")
    options = [arg for arg in _arms(kind) if arg is not type(None)]
    literals = [value for arm in options if typing.get_origin(arm) is Literal for value in typing.get_args(arm)]
    if literals:
        chosen = [value for value in literals if str(value) == text]
        if not chosen:
            raise FieldError(name, f"{flag(name)} takes {' | '.join(map(str, literals))}; got {text!r}")
        return chosen[0]
    if str in options or any(typing.get_origin(arm) is list for arm in options):
        if name not in MODEL_KEYWORDS:  # a model may be a Hub id: check_model_name
            check_not_a_path(name, text)
        return text
    if bool in options:
        if text.lower() not in _TRUE + _FALSE:
            raise FieldError(name, f"{flag(name)} is on or off (true or false); got {text!r}")
        return text.lower() in _TRUE
    if int in options:
        if not re.fullmatch(r"[+-]?\d{1,18}", text):
            raise FieldError(name, f"{flag(name)} takes a whole number; got {text!r}")
        return int(text)
    if float in options:
        try:
            number = float(text)
        except ValueError:
            raise FieldError(name, f"{flag(name)} takes a number; got {text!r}") from None
        if not math.isfinite(number):
            raise FieldError(name, f"{flag(name)} takes a finite number; got {text!r}")
        return number
    raise FieldError(name, f"{flag(name)} is not a setting the page takes")


def _arms(kind: Any) -> tuple[Any, ...]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return typing.get_args(kind)
    return (kind,)


def check_not_a_path(name: str, text: str) -> None:
    """Refuse a value the API would read as a file: a request names no path on the server's disk."""
    if "/" in text or "\\" in text or text.startswith("~") or text.lower().endswith((".yaml", ".yml", ".json")):
        raise FieldError(name, f"{flag(name)}: {text[:60]!r} reads as a file path; the page takes a preset's name")


def check_model_name(name: str, text: str) -> None:
    """A model is a preset's name, or a Hub id (owner/name) where ``lmcalc[hub]`` is installed: never a path."""
    from lmcalc import hub

    if "/" not in text:
        check_not_a_path(name, text)
        return
    if not hub.HUB_ID.match(text) or text.lower().endswith((".yaml", ".yml", ".json")):
        raise FieldError(name, f"{flag(name)}: {text[:60]!r} is neither a preset's name nor a Hub id (owner/name)")
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FieldError(name, f"{flag(name)}: a Hub id needs lmcalc[hub] (pip install 'lmcalc[hub]'), or paste the "
                         "model's config.json")  # fmt: skip
    if Path(text).exists():  # the API would read the file of that name: the server reads none
        raise FieldError(name, f"{flag(name)}: {text[:60]!r} names a file on the server; the page takes Hub ids only")


def check_config(config: Config) -> None:
    """A config.json within the page's limits: its size, JSON, its nesting."""
    size = len(config.text.encode())
    if size > MAX_CONFIG_BYTES:
        raise FieldError("config", f"the config is {size:,} bytes; the page takes at most {MAX_CONFIG_BYTES:,}")
    if depth_of(config.text) > MAX_CONFIG_DEPTH:
        raise FieldError("config", f"the config nests deeper than {MAX_CONFIG_DEPTH} levels")
    try:
        data = json.loads(config.text)
    except json.JSONDecodeError as exc:
        raise FieldError(
            "config", f"the config is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise FieldError("config", "the config is not a JSON object ({...}): paste the model's config.json")


def depth_of(text: str) -> int:
    """How deep ``text``'s brackets nest, outside strings: counted before parsing, so that no nesting, however
    deep, reaches the parser's recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def config_name(text: str | None) -> str:
    """The name an uploaded config is shown under in the command line: its file name, safe to print."""
    name = _FILE_NAME.sub("-", Path(text or "").name).strip("-.")[:80]
    return name if name.endswith(".json") else "config.json"


def command_line(question: Question) -> str:
    """The ``lmcalc`` command that asks ``question``, with ``--json``: each setting that is not its default."""
    flags, defaults = flags_of(question.command), defaults_of(question.command)
    words = ["lmcalc", question.command]
    for name, value in question.settings:
        if name in defaults and defaults[name] == value and name not in MODEL_KEYWORDS:
            continue
        positive, negative = flags[name]
        if isinstance(value, bool):
            if value or negative:
                words.append(positive if value else negative)  # type: ignore[arg-type]  # negative is set
            continue
        words += [positive, shlex.quote(str(value))]
    return " ".join([*words, "--json"])
