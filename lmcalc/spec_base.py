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
# Every number is bounded too: a file of absurd sizes gets a line naming the field, never an overflow or a hang in a
# formula later (issue #32). A count is at most MAX_WHOLE_NUMBER, a float is finite (YAML's .inf and .nan are
# refused); a model's shape is bounded more closely (``Dimension``, ``LayerCount``).
MAX_WHOLE_NUMBER = 2**53
"""The largest whole number a preset holds (9.007·10¹⁵): the engine computes in floats, which hold every whole number
up to 2⁵³ exactly. Bytes of device memory, published parameter counts and token counts all sit far below it."""
MAX_DIMENSION = 2**30
"""The largest size of one dimension of a model (1.07·10⁹): a width, a head count, a vocabulary, an expert count, a
context length. A hundred times the longest context published (Llama 4 Scout's 10M tokens), a thousand times the
largest expert count (PEER's 2²⁰) and over ten thousand times any width or vocabulary, so no real model is refused;
yet a product of the few dimensions a formula multiplies stays far inside a float (2³⁰·⁶ = 2¹⁸⁰ ≪ 1.8·10³⁰⁸)."""
MAX_LAYERS = 4096
"""The most layers a model may have: four times DeepNet's 1,000-layer transformer (Wang et al. 2022), thirty times
the deepest LLM published (Llama 3.1 405B: 126). The engine walks the layers one by one (which attend, which route,
each pipeline stage's share), and the planner does so for every layout it tries: at this bound ``lmcalc plan`` on
1,024 GPUs still answers in seconds, where 10⁹ layers would never answer."""
_Whole = Annotated[int, BeforeValidator(whole_float_as_int), Field(strict=True)]
WholeNumber = Annotated[_Whole, Field(ge=-MAX_WHOLE_NUMBER, le=MAX_WHOLE_NUMBER)]
PositiveInt = Annotated[_Whole, Field(gt=0, le=MAX_WHOLE_NUMBER)]
NonNegativeInt = Annotated[_Whole, Field(ge=0, le=MAX_WHOLE_NUMBER)]
Dimension = Annotated[_Whole, Field(gt=0, le=MAX_DIMENSION)]
"""The size of one dimension of a model: a whole number from 1 to ``MAX_DIMENSION``."""
LayerCount = Annotated[_Whole, Field(gt=0, le=MAX_LAYERS)]
"""A number of layers: from 1 to ``MAX_LAYERS``."""
LayerIndex = Annotated[_Whole, Field(ge=0, le=MAX_LAYERS)]
"""A layer's index (from 0), or a number of layers that may be none: from 0 to ``MAX_LAYERS``."""
PositiveFloat = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
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


MAX_NAME_LENGTH = 200
"""The longest name a preset may have, in characters: a name is quoted in messages and tables, and the longest
built-in one is some 30."""


class NamedSpec(Spec):
    """A spec a preset file holds, found by its name."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
