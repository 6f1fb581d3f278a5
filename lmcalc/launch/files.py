"""Reading a launch config: the file (or standard input), its format (JSON, YAML, TOML or a shell script), and which
framework's config it is, by what its keys say, unless the kind is named (``megatron:args.txt``)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from lmcalc.errors import LmcalcError, echo
from lmcalc.launch.config import KINDS, Launch

MAX_BYTES = 1024 * 1024
"""The largest launch config read: the longest published ones (Megatron-Bridge's recipes as arguments, axolotl's
examples) are a few kB."""
SIGNS = {
    "deepspeed": ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"),
    "llamafactory": ("finetuning_type", "cutoff_len", "template"),
    "axolotl": ("base_model", "adapter", "sequence_len", "micro_batch_size"),
    "trainer": ("per_device_train_batch_size", "output_dir", "per_device_eval_batch_size"),
    "torchtitan": ("job", "parallelism", "activation_checkpoint"),
    "megatron": ("--num-layers", "--tensor-model-parallel-size", "--micro-batch-size", "pretrain_gpt", "--seq-length"),
}  # fmt: skip
"""Keys (or, for Megatron, words) that tell a config's kind, in the order they are tried: the first kind with one."""


def read(source: str, text: str | None = None) -> Launch:
    """The launch config ``source`` names: ``PATH``, ``KIND:PATH``, or ``-`` / ``KIND:-`` for ``text`` (standard
    input when ``text`` is None)."""
    kind, _, name = source.partition(":") if source.partition(":")[0] in KINDS else ("", "", source)
    path = None if name == "-" else Path(name).expanduser()
    if text is None:
        text = sys.stdin.read() if path is None else _text(path)
    shown = "standard input" if path is None else str(path)
    data = parsed(text, shown, path.suffix.lower() if path else "")
    kind = kind or kind_of(data, text, name)
    return read_as(kind, data, text, shown, path.parent if path else None)


def read_as(kind: str, data: Any, text: str, source: str, directory: Path | None) -> Launch:
    """``data`` (``text`` parsed) read as a config of ``kind``."""
    if kind == "megatron":
        from lmcalc.launch.megatron import read_megatron

        return read_megatron(text, source)
    if kind == "torchtitan" and not isinstance(data, dict):  # torchtitan 0.3's --section.key overrides
        from lmcalc.launch.torchtitan import arguments_of

        data = arguments_of(text)
    if not isinstance(data, dict):
        raise LmcalcError(f"{source}: a {kind} config is a mapping of settings; this is not")
    if kind == "deepspeed":
        from lmcalc.launch.deepspeed import read_deepspeed

        return read_deepspeed(data, source)
    if kind == "torchtitan":
        from lmcalc.launch.torchtitan import read_torchtitan

        return read_torchtitan(data, source)
    from lmcalc.launch.finetune import read_finetune

    return read_finetune(data, source, kind, directory)


def _text(path: Path) -> str:
    try:
        if not path.is_file():
            raise LmcalcError(f"no such file: {echo(str(path))}" if not path.exists() else f"{path} is not a file")
        size = path.stat().st_size
    except OSError as exc:  # a name too long for the file system, a directory not readable
        raise LmcalcError(f"cannot read {echo(str(path))}: {exc.strerror}") from None
    if size > MAX_BYTES:
        raise LmcalcError(f"{path} is {size:,} bytes; a launch config is at most {MAX_BYTES:,}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LmcalcError(f"{path} is not text (UTF-8)") from None


def parsed(text: str, source: str, suffix: str) -> Any:
    """The text as JSON, TOML or YAML by its suffix, else whichever reads it (a shell script reads as none: its
    text is the config)."""
    if not text.strip():
        raise LmcalcError(f"{source} is empty")
    if suffix == ".json" or (not suffix and text.lstrip().startswith("{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise LmcalcError(f"{source}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise LmcalcError(f"{source}: not TOML: {exc}") from None
    if suffix in (".yaml", ".yml"):
        return _yaml(text, source)
    if suffix in (".sh", ".txt", ".args"):
        return None
    for attempt in (tomllib.loads, lambda t: _yaml(t, source)):
        try:
            data = attempt(text)
        except (tomllib.TOMLDecodeError, LmcalcError):
            continue
        if isinstance(data, dict):
            return data
    return None


def _yaml(text: str, source: str) -> Any:
    """YAML as lmcalc reads its presets (libyaml where installed; ``500_000`` a number, as PyYAML has it)."""
    import yaml

    from lmcalc.preset_files import _Loader

    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader: preset_files._Loader is CSafeLoader's)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise LmcalcError(f"{source}: not YAML: {exc.problem}{where}") from None
    except yaml.YAMLError as exc:
        raise LmcalcError(f"{source}: not YAML: {exc}") from None


def kind_of(data: Any, text: str, source: str) -> str:
    """Which framework's config ``data`` is, by the keys it has (a script's, by its words)."""
    for kind, signs in SIGNS.items():
        if kind == "torchtitan" and ("--parallelism." in text or "--training." in text):
            return kind
        if kind == "megatron":
            if any(sign in text for sign in signs):
                return kind
        elif isinstance(data, dict) and any(sign in data for sign in signs):
            return kind
    raise LmcalcError(
        f"cannot tell which framework's config {source} is; name it: --from KIND:{source} (kinds: {', '.join(KINDS)})"
    )
