"""``--help`` for lmcalc's commands: each option on its own lines with its flags whole, its options in panels.

typer lays options out as a table of six columns (flag, short flag, negative flag, its short form, type, help).
With the estimating commands' long flags (``--cpu-optimizer-params-per-s``, ``--no-account-for-loss-in-pipeline-
split``) the columns outgrow 80 characters and rich cuts the flag names, which a reader can then neither read nor
copy. Here an option's flags, its negative form and its type are one left column, as wide as the panel's
widest option up to a cap; an option wider than that has its help start on the next line (as ``argparse`` does).
The help is printed as written, never as rich markup (``lmcalc[hub]`` stays whole).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.panel import Panel
    from rich.text import Text
    from typer import _click as click

OPTIONS_PANEL = "Options"
"""The panel of an option that names none (typer's default): the command's own, shown first."""
OUTPUT_PANEL = "Output"
"""The panel of the options that choose how an answer is shown or where it is written, shown last."""
MAX_LEFT = 30
"""The widest the flags column grows (characters): a wider option's help starts below its flags."""
MIN_HELP = 30
"""The narrowest the help column shrinks (characters) before the flags column gives way."""


def print_help(command: click.Command, ctx: click.Context) -> None:
    """The command's usage, its description, and its options panel by panel, in the order they are declared."""
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    console = Console(highlight=False)
    console.print(Padding(Text.assemble(("Usage: ", "yellow"), command.get_usage(ctx).removeprefix("Usage: ")), 1))
    for paragraph in _paragraphs(command.help or ""):
        console.print(Padding(Text(paragraph), (0, 1, 1, 1)))
    for title, rows in _panels(command, ctx).items():
        console.print(_panel(title, rows, console.width))


def _paragraphs(text: str) -> list[str]:
    """The description's paragraphs, each one line (a single line break is a space), as typer reads them."""
    return [" ".join(paragraph.split()) for paragraph in text.strip().split("\n\n") if paragraph.strip()]


def _panels(command: click.Command, ctx: click.Context) -> dict[str, list[tuple[Text, Text]]]:
    """Each panel's rows (flags, help): the command's own options first, the output's last, the others in the
    order their first option is declared."""
    panels: dict[str, list[tuple[Text, Text]]] = {OPTIONS_PANEL: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        panel = getattr(param, "rich_help_panel", None) or OPTIONS_PANEL
        panels.setdefault(panel, []).append((_flags(param, ctx), _help(param)))
    last = panels.pop(OUTPUT_PANEL, [])
    return {title: rows for title, rows in {**panels, OUTPUT_PANEL: last}.items() if rows}


def _flags(param: Any, ctx: click.Context) -> Text:
    """``* --model, -m <str>``: required or not, the flags (long first), the negative form, the value's type."""
    from rich.text import Text

    names = sorted(param.opts, key=lambda name: not name.startswith("--"))
    text = Text("* " if param.required else "  ", style="red")
    text.append(", ".join(names), style="bold cyan")
    if param.secondary_opts:
        text.append(" / ")
        text.append(", ".join(param.secondary_opts), style="bold magenta")
    if not getattr(param, "is_flag", False):
        text.append(f" {param.make_metavar(ctx=ctx)}", style="yellow")
    return text


def _help(param: Any) -> Text:
    """The option's help, then its default (``[default: …]``) or ``[required]``."""
    from rich.text import Text

    text = Text(" ".join((param.help or "").split()))
    default = _default(param)
    if param.required:
        text.append(" [required]", style="red")
    elif default is not None:
        text.append(f" [default: {default}]", style="dim")
    return text


def _default(param: Any) -> str | None:
    """What an option is when not given, as the user would write it: the flag itself for an on/off pair (``--no-
    sequence-parallel``), nothing for a lone flag or an option whose default is "not given"."""
    if getattr(param, "is_flag", False):
        if not param.secondary_opts:
            return None
        return (param.opts if param.default else param.secondary_opts)[0]
    default = param.default
    if default is None or callable(default):
        return None
    if isinstance(default, (list, tuple)):
        return ", ".join(str(value) for value in default) or None
    return str(default)


def _panel(title: str, rows: list[tuple[Text, Text]], width: int) -> Panel:
    """One panel: the flags column as wide as its widest row up to ``MAX_LEFT`` (and leaving ``MIN_HELP`` for the
    help), each help wrapped beside its flags, or below them where the flags are wider."""
    from rich.console import Group
    from rich.panel import Panel

    inner = width - 4  # the panel's border and padding
    left = min(max(row[0].cell_len for row in rows), MAX_LEFT, max(inner - MIN_HELP - 2, 12))
    lines = [line for flags, help_text in rows for line in _option_lines(flags, help_text, left, inner)]
    return Panel(Group(*lines), title=title, title_align="left", border_style="dim")


def _option_lines(flags: Text, help_text: Text, left: int, inner: int) -> Iterator[Text]:
    """An option's lines: its flags and the first line of help side by side, the help's other lines indented
    under the first; flags wider than ``left`` on a line of their own (folded only where wider than the panel)."""
    from rich.console import Console
    from rich.text import Text

    indent = left + 2
    wrapped = help_text.wrap(Console(width=inner - indent), inner - indent)
    if flags.cell_len > left:
        yield from flags.wrap(Console(width=inner), inner, overflow="fold")
        first = 0
    else:
        yield Text.assemble(flags, " " * (indent - flags.cell_len), wrapped[0] if wrapped else "")
        first = 1
    for line in list(wrapped)[first:]:
        yield Text.assemble(" " * indent, line)
