"""A question answered for the page: the API's estimate, its ``--json`` document (what "copy JSON" gives), the
command line that asks the same, and the page's view of the same Result: each figure's text, formula, numbers
substituted and source (what hovering over it shows), the memory bars and the verdict. The view computes nothing; it
lays out the Result's terms, as the other renderers do.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from lmcalc import presets as pr
from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES, SCHEDULES, ZERO_STAGES
from lmcalc.engine.finetune.method import METHODS
from lmcalc.engine.finetune.offload import OFFLOAD_TARGETS
from lmcalc.errors import LmcalcError
from lmcalc.estimates.memory import MemoryEstimate
from lmcalc.result import Estimate, Input, Result, Term
from lmcalc.serve.questions import COMMAND_LINE_DEFAULTS, MODEL_KEYWORDS, Config, Question, command_line, command_of
from lmcalc.specs import ModelSpec


def answer(question: Question) -> dict[str, Any]:
    """What the page shows for ``question``: ``json`` (the command's ``--json``), ``command`` (the command line)
    and ``view`` (the same figures laid out for the page)."""
    estimate: Estimate = command_of(question.command)(**keywords_of(question))
    return {"command": command_line(question), "json": estimate.to_dict(), "view": view_of(estimate)}


def keywords_of(question: Question) -> dict[str, Any]:
    """The API's keywords for ``question``: its settings, the command line's defaults where they differ from the
    function's, and the model a sent config describes."""
    keywords = COMMAND_LINE_DEFAULTS.get(question.command, {}) | question.keywords
    if question.config is not None:
        spec = model_of_config(question.config)
        keywords |= {name: spec for name in MODEL_KEYWORDS if name in keywords}
    return keywords


def emitted(question: Question, kind: str, rank: int) -> tuple[str, str]:
    """The plan ``question`` asks, its layout of ``rank`` as a ``kind`` config (``plan --emit``), and the command
    line that prints the same."""
    from lmcalc.estimates.plan import plan
    from lmcalc.launch.emit import emit_plan

    found = plan(**(keywords_of(question) | {"top": None}))
    line = command_line(question).removesuffix(" --json") + f" --emit {kind}" + (f" --rank {rank}" if rank > 1 else "")
    return emit_plan(found, kind, rank), line


def model_of_config(config: Config) -> ModelSpec:
    """The model a pasted or uploaded config.json describes: a Hugging Face config, or an lmcalc model preset in
    JSON (one with a ``name``), read as ``--model config.json`` reads the file."""
    from lmcalc.hf_config import model_from_hf_config
    from lmcalc.hf_layers import with_unused_noted

    data = json.loads(config.text)
    origin = f"{config.name} (sent from the page)"
    if "name" in data:
        return pr.validate(ModelSpec, data, origin)
    name = config.name.removesuffix(".json")
    return with_unused_noted(pr.validate(ModelSpec, model_from_hf_config(data, name, origin), origin))


def view_of(estimate: Estimate) -> dict[str, Any]:
    """The page's view of an estimate's Result."""
    result = estimate.report
    view: dict[str, Any] = {
        "title": result.title,
        "headline": list(result.headline),
        "inputs": [_input(given) for given in result.inputs],
        "layout": result.layout,
        "sections": [{"key": s.key, "title": s.title, "terms": [_term(t) for t in s.terms]} for s in result.sections],
        "notes": list(result.notes),
    }
    if result.stack:
        view["bars"] = _bars(result)
    if isinstance(estimate, MemoryEstimate):
        gpus = estimate.stages or (estimate.gpu,)
        verdicts = [gpu.verdict(estimate.capacity) for gpu in gpus]
        view["verdict"] = next((v for v in ("does not fit", "tight") if v in verdicts), "fits")
    return view


def _term(term: Term) -> dict[str, Any]:
    shown = {"key": term.key, "label": term.label, "text": term.text, "value": term.value, "unit": term.unit}
    return shown | {
        name: getattr(term, name) for name in ("formula", "substituted", "source", "note") if getattr(term, name)
    }


def _input(given: Input) -> dict[str, Any]:
    return {"key": given.key, "label": given.label, "text": given.text, "origin": given.origin}


def _bars(result: Result) -> list[dict[str, Any]]:
    return [
        {"label": label or "this GPU", "capacity": capacity, "parts": [_term(t) for t in terms]}
        for label, terms, capacity in result.stack_rows()
    ]


@functools.cache
def choices() -> dict[str, Any]:
    """What the page's fields offer: every preset by name (a model's with its display name), and each setting's
    alternatives, read from the tuples the code checks against."""
    import importlib.util

    def names(kind: str) -> list[dict[str, Any]]:
        registry = pr.registry(kind)
        found = []
        for name in sorted(registry.entries):
            try:
                spec = registry.spec(name)
            except LmcalcError:  # a user's own preset that does not validate: `lmcalc presets check` says why
                continue
            label = getattr(spec, "display_name", None) or getattr(spec, "memory_label", "") or ""
            found.append({"name": name, "label": str(label), "aliases": list(getattr(spec, "aliases", ()))})
        return found

    return {
        "models": names("models"),
        "hardware": names("hardware"),
        "precisions": names("precisions"),
        "optimizers": names("optimizers"),
        "frameworks": names("frameworks"),
        "methods": list(METHODS),
        "offload": list(OFFLOAD_TARGETS),
        "recompute": list(RECOMPUTE_MODES),
        "zero": list(ZERO_STAGES),
        "attention": list(ATTENTION_KERNELS),
        "schedules": list(SCHEDULES),
        "hub": importlib.util.find_spec("huggingface_hub") is not None,
    }
