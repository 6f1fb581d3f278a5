"""A non-editable install must carry the presets: build the wheel and run lmcalc from it alone."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return next(out.glob("lmcalc-*.whl"))


def test_wheel_ships_every_preset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (ROOT / "presets").rglob("*.yaml"):
        assert f"lmcalc/presets/{path.relative_to(ROOT / 'presets').as_posix()}" in names


def test_installed_wheel_finds_presets_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import lmcalc.presets as p; print(p.builtin_dir()); "
        "print(p.resolve_model('llama-70b').spec.name, p.resolve_hardware('H100').spec.name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[0] == str(site / "lmcalc" / "presets")
    assert out[1] == "llama-3.1-70b h100-sxm"


def test_readme_install_notes_agree_with_the_package():
    """Issue #18 item 5: the README says which Python, to use a virtual environment, and how to get the CPU-only
    torch wheel for the bench extra; and what it says agrees with pyproject.toml."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Installing") : readme.index("## A short tour")]
    assert project["requires-python"] == ">=3.11" and "Python 3.11 or newer" in section
    assert "python3 -m venv" in section and "PEP 668" in section
    assert "--index-url https://download.pytorch.org/whl/cpu" in section
    for extra in set(project["optional-dependencies"]) - {"dev"}:  # dev: the second command at the top
        assert f"[{extra}]" in section, extra


def test_ci_runs_the_readme_test_command_in_a_new_environment():
    """Issue #35: CI installs what a new user gets. The README's second command is the last line of .ci/run, run
    after any environment left from before is removed, so pip resolves every dependency afresh."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```bash\n") + len("```bash\n") :]
    commands = block[: block.index("```")].strip().splitlines()
    assert len(commands) == 2 and all(
        c.startswith("python3 -m venv .venv && . .venv/bin/activate && ") for c in commands
    )
    assert commands[1].endswith("pip install -e '.[dev]' && python -m pytest")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[1]
    assert ci[-2].startswith("rm -rf .venv")
    assert "python -m pytest -m fast" in readme


def test_every_lower_bound_is_one_that_check_deps_installs():
    """Each dependency has a lower bound (or an exact pin), which scripts/check_deps.sh installs as ==."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    for requirement in requirements:
        assert re.search(r"(>=|==)\s*\d", requirement), f"{requirement}: no lower bound"
