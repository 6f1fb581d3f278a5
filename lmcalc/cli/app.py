"""The typer application every command module registers with, how a result is shown, and how an error is said.

Errors in the user's input are printed as one line (``lmcalc: error: ...``) with exit code 2, each setting named
by its flag (``flag``: the one place a setting's name becomes a flag); the accounting commands never import
torch.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from lmcalc import __version__
from lmcalc.errors import LmcalcError, flag
from lmcalc.render import render
from lmcalc.result import Estimate, Result

app = typer.Typer(
    name="lmcalc",
    help="What an LLM training run costs before you rent a GPU: parameters, FLOPs, memory per GPU, time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
presets_app = typer.Typer(help="List, show and check the built-in and your own presets.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Measure what the hardware delivers with PyTorch; results feed the estimates. Plain `lmcalc bench` times "
    "matmuls (one shape, --sweep, or a model's shapes with --model); the subcommands time memory bandwidth, "
    "collectives and training steps."
)


def emit(shown: Estimate | Result, as_json: bool = False, explain: bool = False, brief: bool = False) -> None:
    """Render an estimate (its report) or a result: a table, ``--json``, ``--explain`` or ``--brief``."""
    if brief and (as_json or explain):
        raise LmcalcError(
            f"--brief prints the headline alone; give it without {'--json' if as_json else '--explain'} "
            '(the JSON carries the headline too, under "headline")'
        )
    render(shown.report if isinstance(shown, Estimate) else shown, as_json=as_json, explain=explain, brief=brief)


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


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every error into one line and a non-zero exit code."""
    try:
        code = app(args=argv, prog_name="lmcalc", standalone_mode=False)
    except LmcalcError as exc:
        print(f"lmcalc: error: {error_message(exc)}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("lmcalc: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # typer's usage errors: unknown option, missing value, bad type
        print(f"lmcalc: error: {_one_line(_usage_message(exc))}", file=sys.stderr)
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
    sys.exit(code if isinstance(code, int) else 0)
