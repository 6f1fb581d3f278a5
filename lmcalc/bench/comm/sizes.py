"""Message sizes as nccl-tests reads them: ``64K``, ``1M..1G`` (doubling), ``1M,16M``; K, M, G, T are binary."""

from __future__ import annotations

import re

from lmcalc.errors import LmcalcError

SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
"""K, M, G, T are binary, as nccl-tests reads ``-b 1M -e 1G``."""

_SIZE_RE = re.compile(r"^(\d+)([KMGT]?)(IB|B)?$", re.IGNORECASE)
_SIZE_HELP = "expected bytes with an optional binary suffix K, M, G, T (2^10 … 2^40, as nccl-tests), e.g. 64K or 1MiB"


def parse_size(text: str) -> int:
    """Bytes in ``64K``, ``1M``, ``1MiB``, ``1G``, ``4096`` or ``4096B``; K/M/G/T are powers of 2^10."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise LmcalcError(f"cannot read message size {text!r}; {_SIZE_HELP}")
    digits, unit, tail = match.group(1), match.group(2).upper(), (match.group(3) or "").upper()
    if unit and tail == "B":
        raise LmcalcError(
            f"message size {text!r} is ambiguous: write {digits}{unit} or {digits}{unit}iB "
            f"({unit} = 2^{10 * 'KMGT'.index(unit) + 10} bytes, as nccl-tests)"
        )
    if not unit and tail == "IB":
        raise LmcalcError(f"cannot read message size {text!r}; {_SIZE_HELP}")
    value = int(digits) * SIZE_UNITS[unit]
    if value <= 0:
        raise LmcalcError(f"message size must be at least 1 byte, got {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """Message sizes from ``1M..1G`` (doubling from the first to the last, both included), ``1M,16M``
    or a mix (``64K,1M..4M``); repeats are dropped, the order kept."""
    if not text or not text.strip():
        raise LmcalcError("no message sizes given; expected e.g. 1M..1G or 64K,1M,16M")
    sizes: list[int] = []
    for item in text.split(","):
        if ".." in item:
            sizes += _doubling(item.strip())
        else:
            sizes.append(parse_size(item))
    return list(dict.fromkeys(sizes))


def _doubling(item: str) -> list[int]:
    """``FIRST..LAST``: the first size doubled until it is the last."""
    ends = item.split("..")
    if len(ends) != 2 or not ends[0].strip() or not ends[1].strip():
        raise LmcalcError(f"cannot read size range {item!r}; expected FIRST..LAST, e.g. 1M..1G")
    first, last = parse_size(ends[0]), parse_size(ends[1])
    if first > last:
        raise LmcalcError(f"size range {item!r} runs backwards; write the smaller size first")
    ratio, rest = divmod(last, first)
    if rest or ratio & (ratio - 1):
        raise LmcalcError(
            f"size range {item!r}: the last size must be the first doubled a whole number of times (e.g. 1M..1G)"
        )
    return [first * 2**i for i in range(ratio.bit_length())]


def size_label(nbytes: int) -> str:
    """``65536`` → ``64K``, ``1048576`` → ``1M``; a size that is no whole K, M, G or T stays in bytes."""
    for unit in ("T", "G", "M", "K"):
        if nbytes >= SIZE_UNITS[unit] and nbytes % SIZE_UNITS[unit] == 0:
            return f"{nbytes // SIZE_UNITS[unit]}{unit}"
    return str(nbytes)
