"""What a launch config says, in lmcalc's settings: each setting read (its keyword, its value, and the file's own name
for it), what the file asks that lmcalc cannot express, and what it says that has no bearing on memory or time.

A reader per kind (``megatron``, ``deepspeed``, ``torchtitan``, ``finetune``) fills a ``Reading`` as it goes and
returns its ``Launch``; ``read`` finds the kind when it is not named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lmcalc.errors import LmcalcError, flag

KINDS = ("megatron", "deepspeed", "torchtitan", "trainer", "axolotl", "llamafactory")
"""The launch configs lmcalc reads: Megatron-LM's arguments, a DeepSpeed JSON, a torchtitan TOML, Hugging Face
``TrainingArguments`` (JSON or YAML), an axolotl YAML and a LLaMA-Factory YAML."""
EMIT_KINDS = ("megatron", "deepspeed", "torchtitan", "trainer")
"""The configs ``plan --emit`` writes (``launch.emit``)."""


@dataclass(frozen=True)
class Taken:
    """One lmcalc setting read from the file: ``keyword`` (the API's), its value, and the file's ``key`` for it."""

    keyword: str
    value: Any
    key: str


@dataclass(frozen=True)
class Unexpressed:
    """A setting of the file that bears on memory or time but that lmcalc does not model, and why."""

    key: str
    value: Any
    why: str


@dataclass(frozen=True)
class VocabPadding:
    """Megatron's padded vocabulary (``_vocab_size_with_padding``, megatron/training/tokenizer/tokenizer.py): the
    tokenizer's ``size`` rounded up to a multiple of ``divisor`` (``--make-vocab-size-divisible-by``) × TP, so that the
    embedding and output layer are that size and TP splits them evenly."""

    size: int
    divisor: int
    tp: int

    def padded(self, tp: int | None = None) -> int:
        multiple = self.divisor * (tp or self.tp)
        return math.ceil(self.size / multiple) * multiple

    def said(self, tp: int | None = None) -> str:
        return (f"the vocabulary of {self.size:,} padded to {self.padded(tp):,} (a multiple of {self.divisor} × TP "
                f"{tp or self.tp}, as Megatron pads it)")  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """A launch config read: its kind, the settings lmcalc takes from it (``settings``, each once), the model it names
    (a preset's name, a Hub id, or a ``ModelSpec`` built from the shape it gives), what lmcalc cannot express, and
    the keys it left alone (``ignored``: training hyperparameters, paths, logging, and keys it does not know)."""

    kind: str
    source: str
    settings: tuple[Taken, ...] = ()
    model: Taken | None = None
    unexpressed: tuple[Unexpressed, ...] = ()
    ignored: tuple[str, ...] = ()
    global_batch_sequences: int | None = None  # what grad_accum follows from once the GPUs are known
    gpu_count: int | None = None  # where the file says how many GPUs it launches on
    vocab_padding: VocabPadding | None = None  # a model built from Megatron's shape flags

    def keywords(self) -> dict[str, Any]:
        """The settings as the API takes them: keyword → value (the model under ``model``)."""
        found = {taken.keyword: taken.value for taken in self.settings}
        if self.model is not None:
            found["model"] = self.model.value
        return found

    def key_of(self, keyword: str) -> str | None:
        """The file's name for the setting ``keyword``, where it gave one."""
        if self.model is not None and keyword == "model":
            return self.model.key
        return next((taken.key for taken in self.settings if taken.keyword == keyword), None)

    def model_for(self, tp: int) -> Any:
        """The model, its vocabulary padded for ``tp`` where Megatron pads it by TP (a TP given beside the file)."""
        model = self.model.value if self.model is not None else None
        if self.vocab_padding is None or model is None or self.vocab_padding.padded(tp) == model.vocab_size:
            return model
        return model.model_copy(update={"vocab_size": self.vocab_padding.padded(tp)})

    def notes(self, tp: int | None = None) -> tuple[str, ...]:
        """What an answer says of the file: what it read, what it could not express, what it left alone (``tp``: the
        TP the answer takes, where it is not the file's)."""
        read = ", ".join(f"{t.key} → {flag(t.keyword)} {_shown(t.value)}" for t in self.settings)
        notes = [f"from {self.source} ({self.kind}): {read or 'no setting lmcalc takes'}"]
        if self.vocab_padding is not None:
            notes.append(f"the model from {self.model.key if self.model else 'its shape flags'}: "
                         f"{self.vocab_padding.said(tp)}")  # fmt: skip
        if self.unexpressed:
            said = "; ".join(f"{u.key} = {_shown(u.value)} ({u.why})" for u in self.unexpressed)
            notes.append(f"{self.source} asks what lmcalc does not model: {said}")
        if self.ignored:
            notes.append(f"{self.source}: left alone (no bearing on memory or time, or not known): "
                         f"{', '.join(self.ignored)}")  # fmt: skip
        return tuple(notes)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(getattr(value, "name", value))
    return text if len(text) <= 60 else text[:57] + "…"


@dataclass
class Reading:
    """A reader's notes as it goes through a file: what it took, what it could not express, what it left."""

    kind: str
    source: str
    taken: dict[str, Taken] = field(default_factory=dict)
    model: Taken | None = None
    unexpressed: list[Unexpressed] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    global_batch_sequences: int | None = None
    gpu_count: int | None = None
    vocab_padding: VocabPadding | None = None

    def take(self, keyword: str, value: Any, key: str) -> None:
        """Take ``value`` for the setting ``keyword`` from the file's ``key`` (a later key overrides: the file said it
        last)."""
        self.taken[keyword] = Taken(keyword, value, key)

    def cannot(self, key: str, value: Any, why: str) -> None:
        """``key`` asks what lmcalc does not model (where it is on: a feature turned off asks nothing)."""
        if value is False or value in ("false", "False", "off", "none"):
            self.leave(key)
            return
        self.unexpressed.append(Unexpressed(key, value, why))

    def leave(self, key: str) -> None:
        if key not in self.ignored:
            self.ignored.append(key)

    def launch(self) -> Launch:
        return Launch(
            self.kind, self.source, tuple(self.taken.values()), self.model, tuple(self.unexpressed),
            tuple(self.ignored), self.global_batch_sequences, self.gpu_count, self.vocab_padding,
        )  # fmt: skip


def whole(value: Any, key: str, source: str) -> int:
    """A whole number the file gives (text or number), or a one-line error naming the key."""
    if isinstance(value, bool):
        raise LmcalcError(f"{source}: {key} is {value}; a whole number belongs there")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        return int(value.strip())
    raise LmcalcError(f"{source}: {key} is {str(value)[:40]!r}; a whole number belongs there")


def number(value: Any, key: str, source: str) -> float:
    """A number the file gives, or a one-line error naming the key."""
    if isinstance(value, bool):
        raise LmcalcError(f"{source}: {key} is {value}; a number belongs there")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise LmcalcError(f"{source}: {key} is {str(value)[:40]!r}; a number belongs there") from None


def exact_preset(name: str) -> str | None:
    """The built-in model preset named (or aliased) exactly ``name``: a flavor such as ``deepseek_v3-16B`` is not the
    preset whose name it begins with."""
    from lmcalc.preset_names import builtin_model_exactly

    return builtin_model_exactly(name)
