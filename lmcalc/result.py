"""Result objects: every figure the engine returns, with the formula and numbers that made it.

The table, ``--json`` and ``--explain`` renderers all read the same ``Result``, so they cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lmcalc.units import format_quantity


@dataclass(frozen=True)
class Term:
    """One named figure: ``value`` in ``unit``, from ``formula`` with the numbers in ``substituted``."""

    key: str
    label: str
    value: float
    unit: str
    formula: str = ""
    substituted: str = ""
    source: str = ""
    note: str = ""
    ok: bool | None = None  # for checks: passed, failed, or not a check

    @property
    def text(self) -> str:
        return self.formatted()

    def formatted(self, compact: bool = False) -> str:
        verdict = {True: " ✓", False: " ✗ FAIL", None: ""}[self.ok]
        return format_quantity(self.value, self.unit, compact) + verdict

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"value": self.value, "unit": self.unit, "label": self.label}
        for name in ("formula", "substituted", "source", "note"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        if self.ok is not None:
            data["pass"] = self.ok
        return data


@dataclass(frozen=True)
class Input:
    """A value the calculation started from, and where it came from (user, preset, default)."""

    key: str
    label: str
    value: Any
    unit: str = ""
    origin: str = ""

    @property
    def text(self) -> str:
        if isinstance(self.value, int | float) and not isinstance(self.value, bool) and self.unit:
            return format_quantity(float(self.value), self.unit)
        return f"{self.value}{' ' + self.unit if self.unit else ''}"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"value": self.value}
        if self.unit:
            data["unit"] = self.unit
        if self.origin:
            data["origin"] = self.origin
        return data


@dataclass(frozen=True)
class Section:
    """A titled group of terms inside a result (e.g. one row per ZeRO stage)."""

    key: str
    title: str
    terms: tuple[Term, ...]
    details: tuple[tuple[str, Any], ...] = ()  # what the title names, as fields for scripts (a plan's layout)

    def term(self, key: str) -> Term:
        return next(t for t in self.terms if t.key == key)


@dataclass(frozen=True)
class Result:
    """What a command computed: its inputs, its sections of terms, and notes on assumptions."""

    command: str
    title: str
    inputs: tuple[Input, ...]
    sections: tuple[Section, ...]
    notes: tuple[str, ...] = field(default=())
    layout: str = "sections"  # "grid": one row per section, one column per term (comparisons)
    stack: tuple[str, ...] = ()  # term keys drawn as one stacked bar against ``capacity`` (memory)
    capacity: str = ""
    headline: tuple[str, ...] = ()  # the answer, first: what the table prints above its inputs and --brief alone
    inputs_header: str = "Input"  # what the inputs table's first column is headed ("Figure" where they are answers)

    def term(self, key: str) -> Term:
        """The term named ``key`` in any section (``section.key`` for a specific one)."""
        section_key, _, term_key = key.rpartition(".")
        for section in self.sections:
            if section_key and section.key != section_key:
                continue
            for term in section.terms:
                if term.key == term_key:
                    return term
        raise KeyError(key)

    def value(self, key: str) -> float:
        return self.term(key).value

    @property
    def summary(self) -> str:
        """The answer in a line: the headline's first (the title where there is none)."""
        return self.headline[0] if self.headline else self.title

    def __repr__(self) -> str:
        return f"<Result {self.command}: {self.summary}; {len(self.sections)} sections>"

    def stack_rows(self, single: str = "") -> list[tuple[str, list[Term], float]]:
        """What a memory picture stacks: for each row (a sweep's sections, else the one result, labelled
        ``single``), the ``stack`` terms that are not zero in every row, and the ``capacity`` they are drawn
        against."""
        if self.layout == "grid":
            rows = [(s.title, [s.term(k) for k in self.stack], s.term(self.capacity).value) for s in self.sections]
        else:
            rows = [(single, [self.term(k) for k in self.stack], self.term(self.capacity).value)]
        shown = [i for i in range(len(self.stack)) if any(terms[i].value for _, terms, _ in rows)]  # none all-zero
        return [(label, [terms[i] for i in shown], capacity) for label, terms, capacity in rows]

    def as_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "title": self.title,
            "headline": list(self.headline),
            "inputs": {i.key: i.as_json() for i in self.inputs},
            "results": {s.key: {t.key: t.as_json() for t in s.terms} for s in self.sections},
            "section_titles": {s.key: s.title for s in self.sections},
            **({"details": {s.key: dict(s.details) for s in self.sections if s.details}} if self._details else {}),
            "notes": list(self.notes),
        }

    @property
    def _details(self) -> bool:
        return any(s.details for s in self.sections)


@dataclass(frozen=True)
class Estimate:
    """What a command computes, for Python: the ``report`` that tables, ``--json`` and ``--explain`` render,
    and, in each command's subclass, the figures as typed attributes. Its ``repr`` is the headline in a line (the
    fields hold every workload, layout and figure, which a plan's default ``repr`` printed in millions of
    characters); ``estimates.shown.Estimate`` adds the command's tables (the renderers import this module)."""

    report: Result

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__repr__" not in cls.__dict__:  # each command's estimate is a dataclass: keep the short repr over the
            cls.__repr__ = Estimate.__repr__  # type: ignore[method-assign]  # field-by-field one its decorator writes

    def to_dict(self) -> dict[str, Any]:
        """The command's ``--json`` document."""
        return json_safe(self.report.as_json())

    def value(self, key: str) -> float:
        """The figure ``key`` of the report (``section.term``), as ``--json`` gives it."""
        return self.report.value(key)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.report.summary}>"


def json_safe(data: Any) -> Any:
    """``data`` with every NaN or infinity replaced by None: JSON has no such numbers (``NaN`` is not
    JSON, and strict parsers reject it), and a figure that is not available is ``null``."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: json_safe(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(value) for value in data]
    return data
