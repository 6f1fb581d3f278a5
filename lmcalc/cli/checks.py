"""The counting and checking commands: ``params``, ``tensor``, ``dtypes`` and ``validate``. Parse, call, render;
torch is imported only when ``validate`` runs."""

from __future__ import annotations

from typing import Annotated

import typer

from lmcalc.cli.app import emit
from lmcalc.cli.options import VALIDATE_AGAINST, AgainstOpt, BriefOpt, ExplainOpt, JsonOpt, ModelOpt, alternatives
from lmcalc.engine.choices import RECOMPUTE_MODES
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import choice


def params(model: ModelOpt, as_json: JsonOpt = False, explain: ExplainOpt = False, brief: BriefOpt = False) -> None:
    """The exact parameter count, tensor group by tensor group."""
    from lmcalc.estimates import counts as estimates

    emit(estimates.params(model=model), as_json, explain, brief)


def tensor(
    shape: Annotated[str, typer.Argument(help="Shape, e.g. 12288x49152.")],
    dtype: Annotated[str, typer.Option("--dtype", help="fp32, bf16, fp16, fp8, int8, int4, ...")] = "fp32",
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Bytes of one tensor: elements × bytes per element."""
    from lmcalc.estimates import counts as estimates

    emit(estimates.tensor(shape=shape, dtype=dtype), as_json, explain, brief)


def dtypes(as_json: JsonOpt = False, explain: ExplainOpt = False) -> None:
    """Floating-point formats: bits, largest value, smallest normal, machine epsilon."""
    from lmcalc.estimates import counts as estimates

    emit(estimates.dtypes(), as_json, explain)


def validate(
    model: ModelOpt,
    seq: Annotated[
        str, typer.Option("--seq", help="Sequence length for the FLOP check (the CPU check caps it at 512).")
    ] = "1024",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per step.")] = 1,
    recompute: Annotated[
        str | None,
        typer.Option(
            "--recompute", help=f"Check one recomputation mode: {alternatives(RECOMPUTE_MODES)} (default: all of them)."
        ),
    ] = None,
    against: AgainstOpt = "pytorch",
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Check lmcalc's counts against PyTorch's reference model or (--against transformers) transformers' model."""
    from lmcalc.validate import passed, validate
    from lmcalc.validate_hf import validate_against_transformers

    if choice(against, VALIDATE_AGAINST, "against") == "transformers":
        if recompute is not None:
            raise LmcalcError("--recompute applies to --against pytorch: transformers' check counts no activations")
        result = validate_against_transformers(model=model, seq=seq, micro_batch=micro_batch)
    else:
        result = validate(model=model, seq=seq, micro_batch=micro_batch, recompute=recompute)
    emit(result, as_json, explain, brief)
    if not passed(result):
        raise typer.Exit(1)
