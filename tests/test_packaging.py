"""A non-editable install must carry the presets: build the wheel and run lmcalc from it alone."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
