"""The ground every spec stands on: the strict number and flag types preset files are read with, the kinds a field
may name, and the frozen, hashable ``Spec`` base (``specs`` holds the specs themselves).

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

import weakref
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def whole_float_as_int(value: Any) -> Any:
    """A float with nothing after the point (``540.35e9`` or ``80e9`` in YAML) as the int it writes; anything else
    is left for the strict int to judge (and refuse, when it is not an int)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Numbers and booleans are read strictly: a count is a whole number (not "768", which Python would repeat, nor true,
# nor 1.5; 80e9 is one), a float field takes an int or a float (not text), a flag is true or false (not "false", nor
# 1). Each annotation is strict on its own, not the models: a strict model would refuse the lists a file gives for
# tuples. Spelled with Field(gt=0, strict=True) rather than pydantic's PositiveInt or StrictInt, which would not read
# 80e9 as a whole number (their module, pydantic.types, is loaded either way: pydantic.fields imports it).
WholeNumber = Annotated[int, BeforeValidator(whole_float_as_int), Field(strict=True)]
PositiveInt = Annotated[WholeNumber, Field(gt=0)]
NonNegativeInt = Annotated[WholeNumber, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0, strict=True)]
NonNegativeFloat = Annotated[float, Field(ge=0, strict=True)]
StrictBool = Annotated[bool, Field(strict=True)]

FfnKind = Literal["gelu_mlp", "swiglu", "geglu"]
DropoutSite = Literal["embedding", "attention", "residual"]
NormKind = Literal["layernorm", "layernorm_nobias", "rmsnorm"]
PositionKind = Literal["learned", "rope", "sinusoidal", "none"]
ComputeDtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4", "int8"]
ActivationKind = Literal[
    "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python", "bloom_gelu", "relu", "relu2", "xielu"
]  # fmt: skip


def _hashable(value: Any) -> Any:
    """``value`` with its lists and dicts made tuples, so that it can be hashed by its contents."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    return value


def no_items() -> tuple[Any, ...]:
    """An empty tuple: the default of a spec's lists. A function rather than ``tuple``, because pydantic reads a
    default factory's signature whenever ``model_construct`` fills a default (a built-in preset), and
    ``inspect.signature`` of a builtin such as ``tuple`` parses its text signature with ``tokenize``, whose pattern
    costs some 3 ms to compile in a fresh process. The schema is the same: a factory, no default shown."""
    return ()


def no_entries() -> dict[Any, Any]:
    """An empty dict: the default of a spec's mappings (``no_items``, for the same reason)."""
    return {}


_HASHES: dict[int, int] = {}
"""Each live spec's hash, by ``id``: computed once (a model's walks some thirty fields), forgotten when the spec
is (``weakref.finalize``), before its ``id`` can be reused. A spec is frozen and its sequences are tuples, so its
hash cannot go stale (a hardware spec's dicts are the one thing a caller could still change in place: don't)."""


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def __hash__(self) -> int:
        """Specs are values: equal specs hash equal, so they can key the engine's caches. A frozen spec never
        changes, so its hash is computed once."""
        known = _HASHES.get(id(self))
        if known is None:
            known = _HASHES[id(self)] = hash((type(self), _hashable(tuple(self.__dict__.values()))))
            weakref.finalize(self, _HASHES.pop, id(self), None)
        return known


class NamedSpec(Spec):
    """A spec a preset file holds, found by its name."""

    name: str
