"""Shell completion of preset names: ``-m`` completes model names and family names, ``--gpus`` a GPU type after
any ``8x`` or ``64x8x`` counts typed, ``--precision`` and ``--optimizer`` their presets. (``lmcalc
--install-completion`` installs it for the shell.) Read from the same registries ``-m`` resolves names with."""

from __future__ import annotations

import re


def _names(kind: str, families: bool = False, aliases: bool = False) -> list[str]:
    from lmcalc.presets import registry

    found = registry(kind)
    return sorted({*found.entries, *(found.families if families else ()), *(found.names if aliases else ())})


def _starting(names: list[str], typed: str, prefix: str = "") -> list[str]:
    """The names that start with ``typed``, in any case, written on from it as typed (``H1`` → ``H100-sxm``: names
    resolve in any case, and a shell keeps only candidates that start with what is on the line)."""
    return [prefix + typed + name[len(typed) :] for name in names if name.startswith(typed.lower())]


def complete_model(incomplete: str) -> list[str]:
    """Model presets and families whose name starts with what was typed."""
    return _starting(_names("models", families=True), incomplete)


def complete_gpus(incomplete: str) -> list[str]:
    """A cluster: the counts typed so far (``64x8x``), then a GPU type or its alias (``h100``); a bare GPU type is
    completed too."""
    counts, typed = re.fullmatch(r"((?:\d+[xX])*)(.*)", incomplete).groups()  # type: ignore[union-attr]
    return _starting(_names("hardware", aliases=True), typed, counts)


def complete_precision(incomplete: str) -> list[str]:
    return _starting(_names("precisions"), incomplete)


def complete_optimizer(incomplete: str) -> list[str]:
    return _starting(_names("optimizers"), incomplete)
