"""``--from FILE``: a launch config's settings given to a command as if typed as its flags (``lmcalc.launch`` reads
them). A flag typed beside ``--from`` wins over the file's setting, and the answer says so; what the file asks that
lmcalc cannot express, and what it left alone, are said in the answer's notes."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from lmcalc.errors import LmcalcError, flag
from lmcalc.launch.config import KINDS, Launch

FROM_HELP = (
    "Read the settings from a launch config: Megatron-LM arguments (a launch script), a DeepSpeed JSON, a torchtitan "
    f"TOML, HF TrainingArguments, an axolotl or a LLaMA-Factory YAML; the kind is found, or named: {KINDS[0]}:FILE "
    "(- reads standard input). A flag given beside it overrides the file's setting."
)
FROM_PANEL = "Launch config"
FromOpt = Annotated[str | None, typer.Option("--from", help=FROM_HELP, rich_help_panel=FROM_PANEL)]
ASSUMED_GPU = "H100"
"""The GPU type taken where a launch script says how many GPUs it runs on but not which (said in the notes)."""

_notes: list[str] = []


@contextlib.contextmanager
def noted(notes: list[str]) -> Iterator[None]:
    """``notes`` added to what the command shows while it runs (``app.emit`` adds them)."""
    _notes.extend(notes)
    try:
        yield
    finally:
        del _notes[: len(notes)]


def added_notes() -> tuple[str, ...]:
    return tuple(_notes)


def with_launch(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` a ``--from`` option (the last before the output options): the file's settings fill the flags
    the command line left at their defaults. ``--model`` becomes optional, since a config may name the model."""
    signature = inspect.signature(command, eval_str=True)
    wants_context = "ctx" in signature.parameters

    @functools.wraps(command)
    def wrapper(ctx: typer.Context, launch_from: str | None = None, **kwargs: Any) -> None:
        if launch_from is None:
            if kwargs.get("model") is None:
                raise LmcalcError("give --model (or --from a launch config that names the model)")
            command(**({"ctx": ctx} if wants_context else {}), **kwargs)
            return
        given = _given(ctx, kwargs)
        gpus = kwargs.get("gpus")
        notes = apply_launch(launch_from, kwargs, given)
        try:
            with noted(notes):
                command(**({"ctx": ctx} if wants_context else {}), **kwargs)
        except LmcalcError as exc:
            if "gpus" in given or kwargs.get("gpus") == gpus or "GPU" not in str(exc):
                raise
            raise LmcalcError(f"{exc} ({kwargs['gpus']}: the GPUs {launch_from} launches on; give --gpus)") from None

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for parameter in signature.parameters.values():
        if parameter.name == "ctx":
            continue
        if parameter.name == "model":
            parameter = parameter.replace(default=None, annotation=_optional(parameter.annotation))
        parameters.append(parameter)
    at = next((i for i, p in enumerate(parameters) if p.name == "as_json"), len(parameters))
    parameters.insert(
        at, inspect.Parameter("launch_from", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=FromOpt)
    )
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return wrapper


def _optional(annotation: Any) -> Any:
    """``--model``'s annotation, its type made optional (typer then does not require it)."""
    return Annotated[str | None, *annotation.__metadata__]


def _given(ctx: typer.Context, kwargs: dict[str, Any]) -> set[str]:
    """The parameters the command line set (typed), as against left at their defaults."""
    return {name for name in kwargs if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}


def apply_launch(source: str, kwargs: dict[str, Any], given: set[str]) -> list[str]:
    """Fill ``kwargs`` (the command's parameters) from the launch config ``source``; the notes that say what was
    read, what the command line overrode, and what the command does not take."""
    from lmcalc.launch import read

    launch = read(source)
    tp = kwargs.get("tp") if "tp" in given and isinstance(kwargs.get("tp"), int) else None
    notes = list(launch.notes(tp))
    overridden, unused = [], []
    for keyword, value in launch.keywords().items():
        if keyword not in kwargs:
            unused.append(flag(keyword))
        elif keyword in given:
            if kwargs[keyword] != value:
                overridden.append(f"{flag(keyword)} {kwargs[keyword]} (the file's {launch.key_of(keyword)}: "
                                  f"{getattr(value, 'name', value)})")  # fmt: skip
        else:
            kwargs[keyword] = launch.model_for(tp) if keyword == "model" and tp else value
    if "gpus" in kwargs and "gpus" not in given and launch.gpu_count is not None:
        kwargs["gpus"] = f"{launch.gpu_count}x{ASSUMED_GPU}"
        notes.append(f"{launch.source} launches on {launch.gpu_count} GPUs and does not say which: {ASSUMED_GPU} "
                     "assumed (give --gpus)")  # fmt: skip
    accumulation = _grad_accum(launch, kwargs, given)
    if accumulation is not None:
        kwargs["grad_accum"] = accumulation
        notes.append(f"--grad-accum {accumulation}: the file's global batch of {launch.global_batch_sequences} "
                     "sequences over micro-batches and data-parallel replicas")  # fmt: skip
    if overridden:
        notes.append("given beside --from, and taken over the file: " + "; ".join(overridden))
    if unused:
        notes.append(f"read from the file but not a setting of this command: {', '.join(unused)}")
    if kwargs.get("model") is None:
        raise LmcalcError(f"{launch.source} does not name the model (or lmcalc cannot build it): give --model")
    return notes


def _grad_accum(launch: Launch, kwargs: dict[str, Any], given: set[str]) -> int | None:
    """The micro-batches per step a global batch in sequences makes on the cluster given, where the command takes
    the accumulation and neither the file nor the command line gave it."""
    if "grad_accum" not in kwargs or "grad_accum" in given or launch.key_of("grad_accum") is not None:
        return None
    if launch.global_batch_sequences is None or not isinstance(kwargs.get("gpus"), str):
        return None
    from lmcalc.launch.batch import grad_accum_of

    return grad_accum_of(launch.global_batch_sequences, kwargs)
