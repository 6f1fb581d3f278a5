"""Reading preset files and Hugging Face ``config.json`` files: strictly, within bounds, every problem one line.

YAML is read by a loader that knows only decimal numbers and true/false (no YAML 1.1 base-60, octal or yes/no), and
refuses a key given twice; JSON refuses a duplicate key too. A file must be a regular UTF-8 file within a size
limit (a FIFO would block, ``/dev/zero`` would never end), and nesting is bounded before a recursive parser meets it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from lmcalc.errors import LmcalcError, token

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe YAML loader (libyaml when available), strict about what is a number, a boolean and a key.

    YAML 1.1 (PyYAML) reads ``1:30`` as 90 (base 60), ``010`` as 8 (octal), ``yes``, ``no``, ``on`` and ``off`` as
    booleans, and keeps the last of two equal keys: a preset would then be silently wrong. Here a number is decimal
    (``4096``, ``1_000``, ``1.5``, and ``15e12`` as well as ``1.5e+13``, which YAML 1.1 alone would not read), a
    boolean is ``true`` or ``false``, anything else is text (which a number or boolean field then refuses), and a key
    given twice in one mapping is an error.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                key = self.construct_object(key_node)
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {token(key)} (first on line {first_line[key]})", key_node.start_mark
                    )
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_STRICT_TAGS = {f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float")}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _STRICT_TAGS]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
MAX_DIGITS = 100
"""The most digits an integer in a preset or config.json may have: no field holds more than 16 (2⁵³,
``spec_base.MAX_WHOLE_NUMBER``), and Python refuses to read one of over 4,300 at all (a ValueError, not a line)."""


def _bounded_int(text: str) -> int:
    """An integer as written, of at most ``MAX_DIGITS`` digits (underscores, as YAML allows, are not digits)."""
    digits = sum(c.isdigit() for c in text)
    if digits > MAX_DIGITS:
        raise _LongNumber(digits)
    return int(text.replace("_", ""))


class _LongNumber(ValueError):
    def __init__(self, digits: int):
        super().__init__(f"an integer of {digits:,} digits, more than any field takes (at most {MAX_DIGITS})")


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    try:
        return _bounded_int(text)
    except _LongNumber as exc:
        raise yaml.constructor.ConstructorError(None, None, str(exc), node.start_mark) from None
    except ValueError:  # an explicit !!int tag on what is not a decimal integer
        raise yaml.constructor.ConstructorError(
            None, None, f"{token(text)} is not a decimal integer", node.start_mark
        ) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
PRESET_FILE_LIMIT = 1 << 20
"""The largest preset file read, in bytes (1 MiB; the largest built-in is some 10 KiB): a link to ``/dev/zero`` or a
stray data file is refused, not read until memory runs out."""
CONFIG_FILE_LIMIT = 4 << 20
"""The largest Hugging Face ``config.json`` read, in bytes (4 MiB; a real one is a few KiB)."""
TABLE_FILE_LIMIT = 16 << 20
"""The largest table of published runs read (benchmarks/*.yaml, by the scripts and tests, never by the command line),
in bytes: 16 MiB, where the held-out runs' file is some 1 MiB."""
MAX_NESTING = 1000
"""The deepest YAML nesting read: libyaml's composer recurses in C, and ``[[[[…`` 50,000 deep would crash Python."""


def read_text(path: Path, limit: int = PRESET_FILE_LIMIT) -> str:
    """The UTF-8 text of the regular file ``path``, of at most ``limit`` bytes. Anything else (a FIFO, which would
    block, a device, a directory) is refused before it is read."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without a writer
    except OSError as exc:
        raise LmcalcError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise LmcalcError(f"{path}: not a regular file")
        chunks, size = [], 0
        while size <= limit:  # straight from the descriptor: a file object costs more than reading a preset
            chunk = os.read(descriptor, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise LmcalcError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if len(data) > limit:
        raise LmcalcError(f"{path}: larger than {limit >> 20} MiB, more than any preset or config.json")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LmcalcError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def _check_nesting(text: str, path: Path) -> None:
    """Refuse nesting deeper than ``MAX_NESTING`` before libyaml's recursive composer meets it. Only a text with
    that many ``[``, ``{``, ``-`` or ``?`` can nest that deep (a block mapping's nesting costs indentation: 1 MiB holds
    fewer than 1,500 levels), so an ordinary preset is not parsed twice."""
    if sum(text.count(c) for c in "[{-?") <= MAX_NESTING:
        return
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):  # events come one at a time, without recursion
        if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                line = event.start_mark.line + 1
                raise LmcalcError(f"{path}:{line}: YAML nested deeper than {MAX_NESTING} levels")
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            depth -= 1


def read_yaml(path: Path, limit: int = PRESET_FILE_LIMIT) -> Any:
    """Parse a YAML file of at most ``limit`` bytes; syntax errors become one line naming the file and line."""
    text = read_text(path, limit)
    try:
        _check_nesting(text, path)
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        kind = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise LmcalcError(f"{where}: {kind}: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # a control character: libyaml reads printable text only
        raise LmcalcError(
            f"{path}: YAML error: a control character (#x{exc.character:04x}) at offset {exc.position}"
        ) from None
    except yaml.YAMLError as exc:
        raise LmcalcError(f"{path}: YAML error: {type(exc).__name__}") from None
    except RecursionError:  # the pure-Python loader, where libyaml is missing
        raise LmcalcError(f"{path}: YAML nested too deeply") from None
    except (ValueError, LookupError, AttributeError, TypeError, OverflowError) as exc:
        # PyYAML's constructors for an explicit tag (!!float abc, !!bool abc, !!timestamp abc) raise these as they are
        raise LmcalcError(f"{path}: YAML error: a value its explicit tag cannot read ({type(exc).__name__})") from None


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys all differ (``json.loads`` keeps the last of two equal keys without a word)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


def read_json(path: Path) -> Any:
    """Parse a JSON file (a Hugging Face ``config.json``, or a preset written as JSON) of at most
    ``CONFIG_FILE_LIMIT`` bytes; every problem becomes one line naming the file."""
    text = read_text(path, CONFIG_FILE_LIMIT)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int)
    except _LongNumber as exc:
        raise LmcalcError(f"{path}: JSON error: {exc}") from None
    except json.JSONDecodeError as exc:
        raise LmcalcError(f"{path}:{exc.lineno}: JSON syntax error: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise LmcalcError(f"{path}: JSON error: duplicate key {token(exc.args[0])} in one object") from None
    except RecursionError:
        raise LmcalcError(f"{path}: JSON nested too deeply") from None
