"""The typer application every command module registers with, how a result is shown, and how an error is said.

Errors in the user's input are printed as one line (``lmcalc: error: ...``) with exit code 2, each setting named
by its flag (``flag``: the one place a setting's name becomes a flag); the accounting commands never import
torch.

A command is registered by where it lives (``SUBCOMMANDS``), and its module is imported only when the command runs
or shows its own help: ``lmcalc train-time`` loads neither the planner nor ``bench``, and ``lmcalc --help`` lists
every command from its docstring without importing one.
"""

from __future__ import annotations

import ast
import copy
import difflib
import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info, get_group_from_info, solve_typer_info_help
from typer.models import CommandInfo, TyperInfo

from lmcalc import __version__
from lmcalc.errors import LmcalcError, cut_echoes, flag

if TYPE_CHECKING:
    from typer import _click as click  # typer's own copy of click, whose classes its commands are

    from lmcalc.result import Estimate, Result


CLOSE_ENOUGH = 0.7
"""How alike a misspelt option and a suggestion must be (difflib's ratio): click offers any option within its own
cutoff, so ``--zerro`` drew ``--from`` (0.62) beside ``--zero`` (0.92)."""


@dataclass(frozen=True)
class Subcommand:
    """Where a subcommand of ``lmcalc`` lives: ``module`` defines its function ``function``, or registers its own
    subcommands on the typer app ``group`` when imported."""

    module: str
    function: str = ""
    group: typer.Typer | None = None


class LazyCommands(MutableMapping[str, "click.Command"]):
    """A group's subcommands by name, in the order ``--help`` lists them; each is built (its module imported) the
    first time it is looked up."""

    def __init__(self, subcommands: dict[str, Subcommand], build: Callable[[str, Subcommand], click.Command]):
        self.subcommands = dict(subcommands)
        self._build = build
        self._built: dict[str, click.Command] = {}

    def built(self, name: str) -> click.Command | None:
        """The subcommand ``name`` if it has been built, without building it."""
        return self._built.get(name)

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._built:
            self._built[name] = self._build(name, self.subcommands[name])  # KeyError: no such command
        return self._built[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.subcommands.pop(name, None)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.subcommands), **dict.fromkeys(self._built)})

    def __len__(self) -> int:
        return len({**self.subcommands, **self._built})


class LazyGroup(TyperGroup):
    """``lmcalc`` itself: a typer group whose subcommands (``SUBCOMMANDS``) are built when one is run, and whose
    ``--help`` lists them by their docstrings, read from their modules' source without importing them."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        registered = self.commands
        self.commands = LazyCommands(SUBCOMMANDS, self._build)
        for name, command in registered.items():
            self.commands[name] = command

    def _build(self, name: str, subcommand: Subcommand) -> click.Command:
        """The subcommand as typer builds it from ``app.command(name)`` or ``app.add_typer(group, name=name)``."""
        module = importlib.import_module(subcommand.module)
        if subcommand.group is not None:
            return get_group_from_info(
                TyperInfo(subcommand.group, name=name),
                pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=self.rich_markup_mode,
                suggest_commands=self.suggest_commands,
            )
        from lmcalc.cli.command import Command

        return get_command_from_info(
            CommandInfo(name=name, callback=getattr(module, subcommand.function), cls=Command),
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=self.rich_markup_mode,
        )

    def _summary(self, name: str) -> click.Command:
        """What ``--help`` reads of a subcommand (its name and help): the subcommand if built, else a command that
        carries its docstring (or, for a group, the group's own help) and nothing to run."""
        assert isinstance(self.commands, LazyCommands)
        built = self.commands.built(name)
        if built is not None:
            return built
        subcommand = self.commands.subcommands[name]
        help_text = (
            solve_typer_info_help(TyperInfo(subcommand.group, name=name))
            if subcommand.group is not None
            else docstring(subcommand.module, subcommand.function)
        )
        if help_text is None:  # no source to read: import the module after all
            return self.commands[name]
        return TyperCommand(name=name, help=help_text, rich_markup_mode=self.rich_markup_mode)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listing = copy.copy(self)
        listing.commands = {name: self._summary(name) for name in self.commands}
        TyperGroup.format_help(listing, ctx, formatter)


def docstring(module: str, function: str) -> str | None:
    """The docstring of ``function`` in ``module``, read from the module's source without running it, cleaned as
    ``inspect.getdoc`` cleans it; None when there is no source to read or no such function in it."""
    if sys.flags.optimize >= 2:  # python -OO: the functions have no docstrings, and nor shall the listing
        return None
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    for node in _functions(spec.origin):
        if node.name == function:
            return ast.get_docstring(node)
    return None


@cache
def _functions(path: str) -> list[ast.FunctionDef]:
    """The functions a Python source file defines at its top level."""
    tree = ast.parse(Path(path).read_bytes(), path)
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)]


app = typer.Typer(
    name="lmcalc",
    help="What an LLM training run costs before you rent a GPU: parameters, FLOPs, memory per GPU, time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    cls=LazyGroup,
)
presets_app = typer.Typer(help="List, show and check the built-in and your own presets.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Measure what the hardware delivers with PyTorch; results feed the estimates. Plain `lmcalc bench` times "
    "matmuls (one shape, --sweep, or a model's shapes with --model); the subcommands time memory bandwidth, "
    "collectives and training steps."
)
SUBCOMMANDS = {
    "train-time": Subcommand("lmcalc.cli.training", "train_time"),
    "max-params": Subcommand("lmcalc.cli.training", "max_params"),
    "flops": Subcommand("lmcalc.cli.training", "flops"),
    "memory": Subcommand("lmcalc.cli.training", "memory"),
    "fit": Subcommand("lmcalc.cli.training", "fit"),
    "plan": Subcommand("lmcalc.cli.training", "plan"),
    "optimal": Subcommand("lmcalc.cli.training", "optimal"),
    "report": Subcommand("lmcalc.cli.report", "report"),
    "serve": Subcommand("lmcalc.cli.serve", "serve"),
    "params": Subcommand("lmcalc.cli.checks", "params"),
    "tensor": Subcommand("lmcalc.cli.checks", "tensor"),
    "dtypes": Subcommand("lmcalc.cli.checks", "dtypes"),
    "validate": Subcommand("lmcalc.cli.checks", "validate"),
    "presets": Subcommand("lmcalc.cli.presets", group=presets_app),
    "bench": Subcommand("lmcalc.cli.bench", group=bench_app),
}
"""Every subcommand of ``lmcalc``, in the order ``lmcalc --help`` lists them."""


def emit(shown: Estimate | Result, as_json: bool = False, explain: bool = False, brief: bool = False) -> None:
    """Render an estimate (its report) or a result: a table, ``--json``, ``--explain`` or ``--brief``."""
    from lmcalc.render import render
    from lmcalc.result import Estimate

    if brief and (as_json or explain):
        raise LmcalcError(
            f"--brief prints the headline alone; give it without {'--json' if as_json else '--explain'} "
            '(the JSON carries the headline too, under "headline")'
        )
    from lmcalc.cli.launch import added_notes

    result = shown.report if isinstance(shown, Estimate) else shown
    if added_notes():  # --from: what was read from the launch config, and what it asks that lmcalc cannot express
        from dataclasses import replace

        result = replace(result, notes=(*result.notes, *added_notes()))
    render(result, as_json=as_json, explain=explain, brief=brief)


def _version(value: bool) -> None:
    if value:
        print(f"lmcalc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """What an LLM training run costs before you rent a GPU: parameters, FLOPs, memory per GPU, time."""


def flags_given(ctx: typer.Context, names: set[str] | tuple[str, ...]) -> list[str]:
    """The flags (as typed: ``--batch``) among the parameters ``names`` that the command line set. (The
    source is compared by name: typer carries its own copy of click's ``ParameterSource``.)"""
    given = [p for p in ctx.command.params if p.name in names]
    return [p.opts[0] for p in given if getattr(ctx.get_parameter_source(p.name or ""), "name", "") == "COMMANDLINE"]


def error_message(error: LmcalcError) -> str:
    """The error as the command line says it: each setting by its flag, on one printable line."""
    return _one_line(error.message(flag))


def _usage_message(exc: Exception) -> str:
    """A typer usage error (unknown option, missing value, bad type) as one line, with the help to read. The two a
    user meets most are said in lmcalc's words, from the error's fields rather than typer's text (which changes
    between releases); the rest keep typer's message."""
    option, close = getattr(exc, "option_name", None), getattr(exc, "possibilities", None)
    param = getattr(exc, "param", None)
    kind = getattr(param, "param_type_name", None)
    if option and close is not None:  # click's NoSuchOption, as typer vendors it
        close = [name for name in close if difflib.SequenceMatcher(None, option, name).ratio() >= CLOSE_ENOUGH]
        message = f"unknown option {option}" + (f"; did you mean {', '.join(sorted(close))}?" if close else "")
    elif type(exc).__name__ == "MissingParameter" and param is not None and kind in ("option", "argument"):
        names = list(param.opts) if kind == "option" else [str(param.name).upper()]
        message = f"missing {kind} {names[0]}" + (f" ({', '.join(names[1:])})" if names[1:] else "")
    else:
        message = " ".join(getattr(exc, "format_message", exc.__str__)().split("\n"))
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see '{getattr(ctx, 'command_path', '') or 'lmcalc'} --help')"


def _one_line(text: str) -> str:
    """The message on one printable line: control characters from the user's input are escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


TORCH_COMMANDS = frozenset({"validate", "bench"})
"""The subcommands that run PyTorch; every other one only accounts."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every error into one line and a non-zero exit code.

    An accounting command runs with Python's cycle collector off, and leaves what it made out of the collection at
    exit: the process ends once it has printed. ``lmcalc plan`` makes millions of objects and no reference cycle,
    and the collector walked them all, several times, for nothing (3 s of the DeepSeek-V3 plan of
    docs/performance.md). Commands that run PyTorch keep it."""
    args = sys.argv[1:] if argv is None else argv
    accounting = not TORCH_COMMANDS.intersection(args[:1])
    if accounting:
        gc.disable()
    try:
        code = app(args=argv, prog_name="lmcalc", standalone_mode=False)
    except LmcalcError as exc:
        print(f"lmcalc: error: {error_message(exc)}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("lmcalc: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # typer's usage errors: unknown option, missing value, bad type
        print(f"lmcalc: error: {_one_line(cut_echoes(_usage_message(exc)))}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # never show a traceback to a user, unless asked
        if os.environ.get("LMCALC_DEBUG"):
            raise
        print(
            f"lmcalc: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(set LMCALC_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        sys.exit(1)
    finally:
        if accounting:
            gc.freeze()
    sys.exit(code if isinstance(code, int) else 0)
