"""One weight tensor of a model (``WeightTensor``), and how ``engine.model.params`` and ``engine.model.mixer_params``
write them: a tensor's shape in sizes and the symbols formulas write them with, where it sits and how many copies of
it the model holds and one token uses."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import NamedTuple

from lmcalc.specs import ModelSpec


@dataclass(frozen=True)
class WeightTensor:
    """``count`` copies of a tensor of ``shape``; ``active`` of them are used by each token."""

    name: str
    group: str
    shape: tuple[int, ...]
    symbols: tuple[str, ...]
    count: int
    count_symbol: str
    active: float
    matmul: bool

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def total(self) -> int:
        return self.count * self.numel

    @property
    def active_total(self) -> float:
        return self.active * self.numel


class Dim(NamedTuple):
    """A size and the symbol formulas write it with: ``Dim(4096, "h")``; a number of rows may be a fraction of a
    whole (an expert capacity's ``k·ρ·s·b``)."""

    size: float
    symbol: str


@dataclass(frozen=True)
class Site:
    """Where tensors sit: their group, how many copies of them the model holds (and the symbol of that count),
    and how many copies one token uses (all of them, unless the tensors are routed experts)."""

    group: str
    count: int
    count_symbol: str
    active: float | None = None

    @property
    def used(self) -> float:
        return self.count if self.active is None else self.active


def tensor(name: str, site: Site, shape: tuple[Dim, ...], matmul: bool) -> WeightTensor:
    used = site.used if matmul or site.active is not None else site.count
    sizes, symbols = tuple(int(d.size) for d in shape), tuple(d.symbol for d in shape)  # a weight's: whole
    return WeightTensor(name, site.group, sizes, symbols, site.count, site.count_symbol, used, matmul)


def norm(name: str, site: Site, size: Dim, spec: ModelSpec) -> list[WeightTensor]:
    """A norm's weight, and its bias where the norm has one (LayerNorm); nothing where the norms have neither."""
    if not spec.norm_weight:
        return []
    tensors = [tensor(f"{name}.weight", site, (size,), False)]
    if spec.norm_kind == "layernorm":
        tensors.append(tensor(f"{name}.bias", site, (size,), False))
    return tensors


def linear(name: str, site: Site, out: Dim, inp: Dim, bias: bool) -> list[WeightTensor]:
    """A linear layer's (out × in) weight, and its bias of ``out`` where it has one."""
    tensors = [tensor(f"{name}.weight", site, (out, inp), True)]
    if bias:
        tensors.append(tensor(f"{name}.bias", site, (out,), False))
    return tensors
