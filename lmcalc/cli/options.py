"""The command line's options, made from the settings' one declaration (``estimates.settings``): each group of
settings becomes a group of options that the commands taking it share (``with_options``), and a command taking
one setting alone takes its annotation (``option_of``).

Each option is named like the Python API's keyword (``--first-stage-layers`` is ``first_stage_layers``), with the
declared help and default, so a command passes what it parsed straight to the API.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer

from lmcalc.cli import completion
from lmcalc.cli.completion import complete_model
from lmcalc.cli.help import OUTPUT_PANEL
from lmcalc.errors import flag
from lmcalc.estimates.layout_settings import LayoutSettings, PinSettings, SearchSettings, SplitSettings
from lmcalc.estimates.setting_groups import Setting, alternatives, fields_of
from lmcalc.estimates.settings import (
    BatchSettings,
    EnergySettings,
    FineTuneSettings,
    MethodSettings,
    OffloadSettings,
    PlanSettings,
    ReportSettings,
    RunSettings,
    ServingSettings,
    TrainingSettings,
    WorkloadSettings,
)

PANELS: dict[type, str] = {
    FineTuneSettings: "Fine-tuning and offload",
    MethodSettings: "Fine-tuning and offload",
    OffloadSettings: "Fine-tuning and offload",
    WorkloadSettings: "Training",
    TrainingSettings: "Training",
    SplitSettings: "Pipeline split",
    LayoutSettings: "Layout",
    PinSettings: "Layout pins (the search varies what is not pinned)",
    SearchSettings: "Search and time model",
    ReportSettings: "Search and time model",
    BatchSettings: "Run",
    RunSettings: "Run",
    EnergySettings: "Cost and energy",
    ServingSettings: "Serving (with --inference)",
    PlanSettings: OUTPUT_PANEL,
}
"""The ``--help`` panel of each settings group's own options: a setting is shown in the panel of the smallest group
that declares it within the group a command takes (``--dp`` is under "Layout" for ``memory``, under the pins for
``plan``)."""

VsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vs",
        help="Also answer for these GPUs, a row each beside --gpus's, in one table (repeatable): --gpus 1024xH100 "
        "--vs 1024xB200.",
        autocompletion=completion.complete_gpus,
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Let --plot replace an existing file.", rich_help_panel=OUTPUT_PANEL)
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document with the same figures.", rich_help_panel=OUTPUT_PANEL)
]
ExplainOpt = Annotated[
    bool,
    typer.Option("--explain", help="Print the derivation: formula, numbers, sources.", rich_help_panel=OUTPUT_PANEL),
]
BriefOpt = Annotated[
    bool, typer.Option("--brief", help="Print only the answer: the headline's lines.", rich_help_panel=OUTPUT_PANEL)
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model preset name, family name, YAML file, HF config.json (or its directory), or Hugging Face Hub "
        "id (org/name: the local cache first, then the Hub; needs lmcalc[hub]).",
        autocompletion=complete_model,
    ),
]


@dataclass(frozen=True)
class Option:
    """One command-line option: its keyword (the API's), its annotation (type and typer's option: the flag and its
    help), and its default."""

    name: str
    annotation: Any
    default: Any

    def parameter(self) -> inspect.Parameter:
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default, annotation=self.annotation
        )


def command_line_type(kind: Any) -> Any:
    """The type the command line parses for a setting of type ``kind``: a name where the API also takes a spec or
    a number written with a unit (``str | PrecisionRecipe``, ``str | float | int``: str), an integer for a choice of
    integers (the ZeRO stage), else ``kind`` itself; optional where ``kind`` is."""
    if typing.get_origin(kind) is Literal:
        return type(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = typing.get_args(kind)
        optional = type(None) in members
        named = [command_line_type(m) for m in members if m is not type(None)]
        plain = str if str in named or len(set(named)) > 1 else named[0]
        return plain | None if optional else plain
    return kind


def options_of(group: type, leave_out: Collection[str] = ()) -> tuple[Option, ...]:
    """The command line's options for a settings group (``estimates.settings``), in its order: each flag is the
    keyword with dashes (or the declared flags), its help and default the declared ones."""
    return tuple(option for name, option in _options(group).items() if name not in leave_out)


def option_of(group: type, name: str) -> Any:
    """One setting of a group as a command's parameter annotation (a command taking it alone)."""
    return _options(group)[name].annotation


def _options(group: type) -> dict[str, Option]:
    return {
        name: _option(name, kind, declared, panel_of(group, name))
        for name, (kind, declared) in fields_of(group).items()
    }


def panel_of(group: type, name: str) -> str:
    """The ``--help`` panel of setting ``name`` in a command taking ``group``: that of the smallest group in
    ``PANELS`` that holds the setting and is part of ``group``."""
    within = group.__annotations__.keys()
    holders = [g for g in PANELS if name in g.__annotations__ and g.__annotations__.keys() <= within]
    return PANELS[min(holders, key=lambda g: len(g.__annotations__))]


@functools.cache  # each setting's option is made once per panel, whichever groups and commands take it
def _option(name: str, kind: Any, declared: Setting, panel: str) -> Option:
    complete = getattr(completion, declared.complete) if declared.complete else None
    typer_option = typer.Option(
        *(declared.flags or (flag(name),)), help=declared.help, autocompletion=complete, rich_help_panel=panel
    )
    return Option(name, Annotated[command_line_type(kind), typer_option], declared.default)


PrecisionOpt = option_of(TrainingSettings, "precision")
OptimizerOpt = option_of(TrainingSettings, "optimizer")
SeqOpt = option_of(TrainingSettings, "seq")
AttentionOpt = option_of(TrainingSettings, "attention")
RecomputeOpt = option_of(TrainingSettings, "recompute")
OverheadOpt = option_of(TrainingSettings, "overhead")
TrainingFrameworkOpt = option_of(TrainingSettings, "framework")
MfuOpt = option_of(ReportSettings, "mfu")

SPLIT_OPTIONS = options_of(SplitSettings)
"""How the layers split over the pipeline stages (``estimates.layout_settings.SplitSettings``)."""
LAYOUT_OPTIONS = options_of(LayoutSettings)
"""A parallel layout (``estimates.layout_settings.LayoutSettings``), as ``memory`` and ``fit`` take it (``plan`` and
``report`` search the layout: they take ``PIN_OPTIONS``)."""
FINETUNE_OPTIONS = options_of(FineTuneSettings)
"""The fine-tuning method (``estimates.settings.FineTuneSettings``)."""
OFFLOAD_OPTIONS = options_of(OffloadSettings)
"""What leaves the GPU (``estimates.settings.OffloadSettings``), as ``train-time`` takes it beside the method."""
METHOD_OPTIONS = options_of(MethodSettings)
"""The fine-tuning method and offload (``estimates.settings.MethodSettings``)."""
TRAINING_OPTIONS = options_of(TrainingSettings)
"""What is trained and how (``estimates.settings.TrainingSettings``), as ``memory`` and ``fit`` take it."""
PIN_OPTIONS = options_of(PinSettings)
"""The layout's settings ``plan`` and ``report`` search (the degrees, the ZeRO stage, the schedule and its virtual
stages, sequence parallelism, the micro-batch and the recomputation), each of which the user may pin instead."""
WORKLOAD_OPTIONS = options_of(WorkloadSettings, leave_out=MethodSettings.__annotations__)
"""What is trained and how besides the method, the micro-batch and the recomputation (``WorkloadSettings``): what
``plan`` and ``report`` take, since their search varies the other two."""
SEARCH_OPTIONS = options_of(SearchSettings)
"""How far ``plan`` searches and how it times what it finds (``estimates.layout_settings.SearchSettings``)."""
BATCH_OPTIONS = options_of(BatchSettings)
"""The global batch a layout search fills (``estimates.settings.BatchSettings``)."""
RUN_OPTIONS = options_of(RunSettings)
"""The run's tokens, or a fine-tune's dataset and epochs (``estimates.settings.RunSettings``)."""
SERVING_OPTIONS = options_of(ServingSettings)
"""Serving memory's settings (``estimates.settings.ServingSettings``), as ``memory --inference`` takes them."""
ENERGY_OPTIONS = options_of(EnergySettings)
"""The cost, energy and emissions (``estimates.settings.EnergySettings``), as ``train-time`` and ``report`` take
them."""


def with_options(options: tuple[Option, ...], at: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command ``options`` in place of its parameter ``at``, which then receives them as one dict of
    keyword → value: a group of options declared once, shared by every command that takes it. (typer reads a
    command's options from its signature, so the wrapper's signature lists the group's options.)"""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)  # the annotations as objects, as typer reads them
        names = [o.name for o in options]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            group = {name: kwargs.pop(name) for name in names}
            command(**kwargs, **{at: group})

        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name == at:
                parameters += [o.parameter() for o in options]
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return wrapper

    return decorate


VALIDATE_AGAINST = ("pytorch", "transformers")
AGAINST_MEANINGS = {
    "pytorch": "lmcalc's reference model; default",
    "transformers": "the model transformers builds from the config.json: parameters and FLOPs",
}
AgainstOpt = Annotated[
    str, typer.Option("--against", help=f"What to check against: {alternatives(VALIDATE_AGAINST, AGAINST_MEANINGS)}.")
]
