"""Write lmcalc/hf_defaults.py: how each model type's transformers configuration class reads a config.json, as data.

A config.json may leave out a field its class defines; transformers then builds the model with the class default
(GptOssConfig's ``attention_bias`` is True, Qwen3Config's ``head_dim`` is 128). It may spell a field by an alias the
class maps (ExaoneConfig reads ``num_layers`` as ``num_hidden_layers``). And some types build another type's model:
transformers' causal-LM mapping gives ``exaone`` and ``internlm3`` LlamaForCausalLM itself. lmcalc keeps transformers
out of its runtime, so these are read here, once, from the installed transformers, and written as data:

* ``DECODER_TYPES``: the decoder-only types transformers registers, to tell a type lmcalc cannot read yet from a
  misspelt one;
* ``BUILDS_AS``: each decoder-only type whose causal-LM class is another type's own, and that type;
* ``CLASS_DEFAULTS``: for each type lmcalc reads (its own or through ``BUILDS_AS``), the class defaults of the fields
  the reader reads (``hf_fields.READ_FIELDS``), where the class gives one (None, computed later, is left out);
* ``LAYER_PATTERNS``: which layers those types' classes make global among sliding ones when config.json gives no
  ``layer_types`` (its ``__post_init__`` writes them from the depth);
* ``ATTRIBUTE_MAPS``: those types' ``attribute_map``, alias → field, where the reader reads either name.

    python scripts/hf_class_defaults.py            # needs transformers (a dev dependency)
    python scripts/hf_class_defaults.py --check    # writes nothing: exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from hf_coverage import decoder_only_types  # noqa: E402

from lmcalc.atomic import write_atomic  # noqa: E402
from lmcalc.hf_config import MULTIMODAL, SUPPORTED  # noqa: E402
from lmcalc.hf_fields import READ_FIELDS  # noqa: E402


def builds_as() -> dict[str, str]:
    """Each decoder-only type whose causal-LM class belongs to another type (the one whose configuration class is the
    model class's ``config_class``)."""
    from transformers.models.auto import configuration_auto, modeling_auto

    models, configs = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, configuration_auto.CONFIG_MAPPING_NAMES
    found = {}
    for kind in decoder_only_types():
        home_config = getattr(transformers, models[kind]).config_class.__name__
        if configs[kind] == home_config or "text_config" in getattr(transformers, configs[kind]).sub_configs:
            continue  # its own class (gpt-sw3 is GPT2Config's), or a wrapper read through its text_config
        home = next((k for k in models if models[k] == models[kind] and configs.get(k) == home_config), kind)
        if home != kind:
            found[kind] = home
    return found


def _plain(value: Any) -> bool:
    """A value JSON holds as it is: a number, a boolean, text, or a list of them."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, bool | int | float | str)


def _literal(value: Any) -> str:
    """``value`` as ruff formats a Python literal: strings in double quotes."""
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def class_defaults(kind: str) -> dict[str, Any]:
    """``kind``'s class defaults for ``READ_FIELDS`` (None, computed by the class, left out)."""
    from transformers.models.auto import configuration_auto

    parameters = inspect.signature(getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[kind])).parameters
    return {
        field: parameters[field].default
        for field in sorted(READ_FIELDS)
        if field in parameters and _plain(parameters[field].default)
    }


def layer_pattern(kind: str) -> tuple[int, bool] | None:
    """The global layers ``kind``'s class puts among sliding ones when config.json gives no ``layer_types``: every N-th
    from the N-th (False) or from the first (True); None where the class gives no such pattern."""
    from transformers.models.auto import configuration_auto

    cls = getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[kind])
    try:
        types = cls(num_hidden_layers=24).layer_types
    except Exception:  # noqa: BLE001 (a class without that field or that pattern)
        return None
    if not isinstance(types, list) or "sliding_attention" not in types or "full_attention" not in types:
        return None
    full = [t == "full_attention" for t in types]
    for first in (False, True):
        for every in range(2, 25):
            if all(f == ((i if first else i + 1) % every == 0) for i, f in enumerate(full)):
                return every, first
    return None


def source() -> str:
    """lmcalc/hf_defaults.py as this transformers reads its classes."""
    from transformers.models.auto import configuration_auto

    aliases = builds_as()
    kinds = [*SUPPORTED, *MULTIMODAL.values(), *(k for k, home in aliases.items() if home in SUPPORTED)]
    kinds = list(dict.fromkeys(kinds))
    lines = [
        f'"""How transformers {transformers.__version__}\'s configuration classes read a config.json, by model type: '
        "written by",
        '``python scripts/hf_class_defaults.py`` (see its docstring). Do not edit by hand."""',
        "",
        "from typing import Any",
        "",
        "# one line a type: the lines are long, and pyproject.toml lets this file have them",
        "# fmt: off",
        "BUILDS_AS: dict[str, str] = {",
        *(f'    "{kind}": "{home}",' for kind, home in sorted(aliases.items())),
        "}",
        '"""A type whose causal-LM class is another type\'s own: read as that type."""',
        "DECODER_TYPES: tuple[str, ...] = (",
        *textwrap.wrap(
            ", ".join(f'"{kind}"' for kind in sorted(decoder_only_types())) + ",",
            116,
            initial_indent="    ",
            subsequent_indent="    ",
        ),
        ")",
        '"""The decoder-only types transformers registers as causal LMs (``scripts/hf_coverage.py``)."""',
        "CLASS_DEFAULTS: dict[str, dict[str, Any]] = {",
    ]
    for kind in kinds:
        name = configuration_auto.CONFIG_MAPPING_NAMES[kind]
        fields = ", ".join(f'"{field}": {_literal(value)}' for field, value in class_defaults(kind).items())
        lines.append(f'    "{kind}": {{{fields}}},  # {name}')
    lines += ["}", "LAYER_PATTERNS: dict[str, tuple[int, bool]] = {"]
    for kind in kinds:
        pattern = layer_pattern(kind)
        if pattern:
            lines.append(f'    "{kind}": {pattern},')
    lines += [
        "}",
        '"""Where config.json has no layer_types, the class\'s own: every N-th layer global, from the N-th (False) or '
        'the first (True)."""',
        "ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {",
    ]
    for kind in kinds:
        cls = getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[kind])
        mapped = {alias: field for alias, field in cls.attribute_map.items()
                  if (field in READ_FIELDS or alias in READ_FIELDS) and alias != field}  # fmt: skip
        if mapped:
            pairs = ", ".join(f"{_literal(alias)}: {_literal(field)}" for alias, field in mapped.items())
            lines.append(f'    "{kind}": {{{pairs}}},')
    lines += ["}", "# fmt: on"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is not what it writes")
    args = parser.parse_args()
    text, path = source(), ROOT / "lmcalc" / "hf_defaults.py"
    if args.check:
        same = path.read_text(encoding="utf-8") == text
        stale = "stale: run python scripts/hf_class_defaults.py"
        print(f"lmcalc/hf_defaults.py is {'up to date' if same else stale}")
        return 0 if same else 1
    write_atomic(path, text)
    print(f"wrote lmcalc/hf_defaults.py (transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
