"""Write lmcalc/hf_defaults.py: for each model type lmcalc reads from config.json, the defaults its transformers
configuration class gives the fields lmcalc's reader would otherwise fill with a fallback of its own.

A config.json may leave out a field its class defines; transformers then builds the model with the class default
(GptOssConfig's ``attention_bias`` is True, Qwen3Config's ``head_dim`` is 128). lmcalc keeps transformers out of its
runtime, so the defaults are read here, once, from the installed transformers, and written as data.

    python scripts/hf_class_defaults.py    # needs transformers (a dev dependency)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hf_tiny import TINY  # noqa: E402  (each type's configuration class, as the tests build it)

from lmcalc.atomic import write_atomic  # noqa: E402
from lmcalc.hf_config import SUPPORTED  # noqa: E402

FIELDS = ("attention_bias", "mlp_bias", "use_bias", "head_dim", "num_key_value_heads")
"""The fields the reader fills with a fallback of its own when config.json leaves them out."""


def class_defaults() -> dict[str, tuple[str, dict[str, object]]]:
    """Each supported type's class and its defaults for ``FIELDS`` (None, computed by the class, left out)."""
    found = {}
    for kind in SUPPORTED:
        name = TINY[kind][0]
        parameters = inspect.signature(getattr(transformers, name).__init__).parameters
        defaults = {
            field: parameters[field].default
            for field in FIELDS
            if field in parameters and parameters[field].default not in (inspect.Parameter.empty, None)
        }
        if defaults:
            found[kind] = (name, defaults)
    return found


def main() -> None:
    lines = [
        f'"""What transformers {transformers.__version__}\'s configuration classes give the fields lmcalc\'s reader',
        "(``hf_config``) would otherwise fill itself, by model type, where a config.json leaves them out: written by",
        '``python scripts/hf_class_defaults.py`` from each class\'s ``__init__`` defaults. Do not edit by hand."""',
        "",
        "CLASS_DEFAULTS: dict[str, dict[str, object]] = {",
    ]
    for kind, (name, defaults) in class_defaults().items():  # written as ruff formats them: double quotes
        fields = ", ".join(f'"{field}": {value!r}' for field, value in defaults.items())
        lines.append(f'    "{kind}": {{{fields}}},  # {name}')
    lines.append("}")
    write_atomic(ROOT / "lmcalc" / "hf_defaults.py", "\n".join(lines) + "\n")
    print(f"wrote lmcalc/hf_defaults.py ({len(lines) - 6} types, transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
