"""The class of lmcalc's commands: typer's, with ``--help`` as ``cli.help`` lays it out, and an option given twice
refused.

click keeps the last value of an option given twice, so ``--gpus 1024xH100 --gpus 1024xB200`` answered for the
B200s alone, without a word. A user who writes an option twice meant something by each: the command says so and
asks for one (two runs compare two clusters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typer.core import TyperCommand

from lmcalc.cli.help import print_help
from lmcalc.errors import LmcalcError

if TYPE_CHECKING:
    from typer import _click as click


class Command(TyperCommand):
    """A typer command whose ``--help`` is ``print_help``'s and which refuses an option given twice."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        print_help(self, ctx)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        repeated(self, args)
        return super().parse_args(ctx, args)


def repeated(command: click.Command, args: list[str]) -> None:
    """Refuse ``args`` that give one of ``command``'s single-valued options twice with two meanings (under one name
    or two: ``--model`` and ``-m``; ``--x`` and ``--no-x``)."""
    by_name = {name: param for param in command.params for name in (*param.opts, *param.secondary_opts)}
    given: dict[str, tuple[str, str]] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            break
        name, has_value, value = token.partition("=")
        param: Any = by_name.get(name) if name.startswith("-") else None
        if param is None:
            continue
        if not param.is_flag and not has_value:
            value = next(tokens, "")
        if param.multiple or param.count:
            continue
        shown = f"{name} {value}".strip() if not param.is_flag else name
        if param.name in given and given[param.name] != (shown, value):  # the same twice says one thing
            raise LmcalcError(
                f"{given[param.name][0]} and {shown}: {param.opts[0]} is given twice; give it once "
                "(to compare two answers, run the command twice)"
            )
        given[param.name] = (shown, value)
