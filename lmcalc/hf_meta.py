"""``lmcalc params`` on a config.json whose ``model_type`` lmcalc cannot read yet: the count transformers builds.

Where transformers (and torch) are installed, the model is built from the config on the meta device (shapes, no
weights: a 671B model in seconds) and its parameters are summed, module by module. That count is transformers', not
lmcalc's: lmcalc has no spec of the architecture, so the count feeds nothing else. Memory, FLOPs, time, fit, plan,
fine-tuning and inference all need lmcalc's own reading of the layers (docs/hf-types.md lists the types it has).
torch and transformers are imported here only, when that count is asked for.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from typing import Any

from lmcalc.errors import LmcalcError
from lmcalc.estimates.shown import Estimate
from lmcalc.result import Input, Result, Section, Term
from lmcalc.units import group

CANNOT_FEED = ("memory", "flops", "time", "fit", "plan", "report", "finetune", "inference", "validate")
"""The commands a count from transformers cannot feed: each needs lmcalc's own spec of the layers."""


class UnreadType(LmcalcError):
    """A config.json of a decoder-only type transformers registers and lmcalc does not read yet."""

    def __init__(self, message: str, config: dict[str, Any], kind: str, origin: str) -> None:
        super().__init__(message)
        self.config, self.kind, self.origin = config, kind, origin


def transformers_installed() -> bool:
    """Whether torch and transformers can be imported (without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


@dataclass(frozen=True)
class MetaParams(Estimate):
    """The parameters transformers builds from a config.json lmcalc cannot read, by top-level module."""

    kind: str
    total: int
    by_module: tuple[tuple[str, int], ...]


def _modules(model: Any) -> tuple[tuple[str, int], ...]:
    """Parameters by the causal LM's modules one level down (``model.embed_tokens``, ``model.layers``, ``lm_head``),
    each tensor once (a tied head shares the embedding's)."""
    counts: dict[str, int] = {}
    for name, tensor in model.named_parameters():  # named_parameters yields a shared tensor once
        parts = name.split(".")
        key = ".".join(parts[:2]) if len(parts) > 2 else parts[0]
        counts[key] = counts.get(key, 0) + tensor.numel()
    return tuple(counts.items())


def meta_params(unread: UnreadType) -> MetaParams:
    """The count transformers builds from ``unread``'s config on the meta device."""
    import torch
    import transformers

    config = {key: value for key, value in unread.config.items() if key != "quantization_config"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        try:
            built = transformers.AutoConfig.for_model(**config)
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(built)
        except Exception as error:  # noqa: BLE001 (whatever transformers raises: the config does not build)
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise LmcalcError(f"{unread} (transformers could not build it either: {first[:160]})") from None
    by_module = _modules(model)
    total = sum(count for _, count in by_module)
    version = transformers.__version__
    source = f"transformers {version}, {type(model).__name__} built on the meta device"
    terms = [Term(f"module.{name}", name, count, "params", source=source) for name, count in by_module]
    terms.append(Term("total", "Total parameters", total, "params", "sum of the rows above", source=source))
    notes = (
        f"lmcalc does not read model_type {unread.kind!r} yet, so this is transformers' count, not lmcalc's: the "
        "sum of the parameters transformers builds, each shared tensor once",
        f"it feeds no other estimate: {', '.join(CANNOT_FEED)} need lmcalc's own reading of the layers "
        "(docs/hf-types.md lists the types lmcalc reads)",
    )
    report = Result(
        "params",
        f"Parameters of {unread.origin} (counted by transformers)",
        (Input("model", "Model", unread.origin), Input("model_type", "model_type", unread.kind)),
        (Section("params", "Parameters (transformers, meta device)", tuple(terms)),),
        notes,
        headline=(f"{unread.origin}: {group(total)} parameters, counted by transformers {version} on the meta device",),
    )
    return MetaParams(report, unread.kind, total, by_module)
