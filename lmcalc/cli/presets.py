"""``lmcalc presets``: list, show and check the built-in presets and the user's own. Its commands register
themselves on ``presets_app`` when this module is imported."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from lmcalc import presets as pr
from lmcalc.cli.app import presets_app
from lmcalc.cli.options import JsonOpt, alternatives
from lmcalc.errors import LmcalcError


def _kind(value: str, where: str) -> str:
    key = value.strip().lower()
    if key not in pr.KINDS:
        raise LmcalcError(f"{where} KIND must be one of {', '.join(pr.KINDS)}; got {value!r}")
    return key


def presets_list(
    kind: Annotated[str | None, typer.Argument(help=f"{alternatives(pr.KINDS)} (default: all).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List presets with their aliases and where each was loaded from."""
    from lmcalc.preset_views import list_presets

    list_presets(pr.KINDS if kind is None else (_kind(kind, "presets list"),), as_json)


def presets_show(
    name: Annotated[str, typer.Argument(help="A preset name or alias of any kind.")],
    as_json: JsonOpt = False,
) -> None:
    """Show every field of a preset."""
    from lmcalc.preset_views import show_preset

    show_preset(name, as_json)


def presets_schema(
    kind: Annotated[str, typer.Argument(help=f"{alternatives(pr.KINDS)}.")] = "models",
) -> None:
    """Print the JSON Schema of a preset file, for editors that validate YAML."""
    from lmcalc.preset_views import preset_schema

    print(json.dumps(preset_schema(_kind(kind, "presets schema")), indent=2))


def presets_check(
    files: Annotated[
        list[str] | None, typer.Argument(help="Preset files to check (default: every preset on the path).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate preset files (schema; computed vs published parameter count); exit 1 on any failure."""
    from lmcalc.preset_views import check_presets

    if not check_presets(files or [], as_json):
        raise typer.Exit(1)


for name, command in (
    ("list", presets_list),
    ("show", presets_show),
    ("schema", presets_schema),
    ("check", presets_check),
):
    presets_app.command(name)(command)
