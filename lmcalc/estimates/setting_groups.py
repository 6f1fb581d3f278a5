"""A settings group's fields, as ``estimates.settings`` declares them and the API, the command line and the server
read them: each field's ``Setting`` (its default, help and flags), the help text's alternatives, and a group's
defaults and subsets."""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """What a field of a settings group says besides its type: its default and its help (the command line's
    ``--help``), and where the command line differs: its flags (``--x/--no-x``) and how it completes a name."""

    default: Any
    help: str
    flags: tuple[str, ...] = ()
    complete: str | None = None  # a completion function of lmcalc.cli.completion


def alternatives(options: tuple[object, ...], meanings: dict[object, str] | None = None) -> str:
    """The values a help text offers, read from the tuple the code checks against: ``a | b``, each with its
    meaning where one is given (``flash (fused, no s² scores) | eager (...)``)."""
    meanings = meanings or {}
    return " | ".join(f"{o} ({meanings[o]})" if o in meanings else str(o) for o in options)


@functools.cache  # read once per group: the command line makes its options from them at start-up
def fields_of(group: type) -> dict[str, tuple[Any, Setting]]:
    """Each field of a settings group, in its declaration order (a base group's first): its type and its
    ``Setting``."""
    hints = typing.get_type_hints(group, include_extras=True)
    fields = {}
    for name, hint in hints.items():
        kind, *extras = typing.get_args(hint)
        (declared,) = [extra for extra in extras if isinstance(extra, Setting)]
        fields[name] = (kind, declared)
    return fields


def defaults(group: type) -> dict[str, Any]:
    """Each setting of the group and its default."""
    return {name: declared.default for name, (_, declared) in fields_of(group).items()}


def with_defaults(given: typing.Mapping[str, Any], group: type) -> dict[str, Any]:
    """The settings given, and for those left out their defaults."""
    return {**defaults(group), **given}


def subset(given: typing.Mapping[str, Any], group: type) -> dict[str, Any]:
    """The settings among ``given`` that ``group`` holds."""
    return {name: value for name, value in given.items() if name in group.__annotations__}
