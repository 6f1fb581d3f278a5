"""The code is ruff-clean and ruff-formatted, and lmcalc/ type-checks with mypy with no error (the configurations
live in pyproject.toml). Each tool is a dev dependency, run as a module: a missing tool fails, never skips."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_clean():
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_formatted():
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_no_error():
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
