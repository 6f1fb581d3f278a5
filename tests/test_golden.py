"""Every preset's key figures against the reviewed golden file.

When a formula or a preset changes on purpose, regenerate with ``python scripts/update_golden.py``
and review the diff of tests/golden/presets.json in the commit.
"""

import json
from pathlib import Path

import pytest
from golden import golden_table

GOLDEN = Path(__file__).parent / "golden" / "presets.json"


def _flatten(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), data


def test_golden_figures_unchanged():
    expected = dict(_flatten(json.loads(GOLDEN.read_text())))
    actual = dict(_flatten(json.loads(json.dumps(golden_table()))))
    changed = [
        f"{key}: {expected.get(key)} -> {actual.get(key)}"
        for key in sorted(set(expected) | set(actual))
        if not (
            isinstance(expected.get(key), float | int)
            and isinstance(actual.get(key), float | int)
            and actual[key] == pytest.approx(expected[key], rel=1e-12)
        )
        and expected.get(key) != actual.get(key)
    ]
    assert not changed, "preset figures changed (review, then run python scripts/update_golden.py):\n" + "\n".join(
        changed[:40]
    )
