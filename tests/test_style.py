"""The code is ruff-clean (the project's lint configuration lives in pyproject.toml)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [ruff, "check", "lmcalc", "tests", "benchmarks", "scripts"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
