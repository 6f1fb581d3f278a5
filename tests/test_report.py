"""lmcalc report: one self-contained HTML page, checked as HTML and rendered by headless Chromium."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmcalc.cli import main

ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots land here (git-ignored)


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture
def report(tmp_path, capsys) -> Path:
    path = tmp_path / "report.html"
    code, out, err = run(["report", "--model", "llama-3-70b", "--gpus", "128x8xH100", "-o", str(path)], capsys)
    assert code == 0, err
    assert f"wrote {path}" in out
    return path


def test_report_is_self_contained(report):
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    # no network: nothing is loaded from anywhere (namespace strings inside the inline SVG are not loads)
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", html)
    for title in ("Parameters of Llama 3 70B", "Training FLOPs", "Training time", "Training memory per GPU"):
        assert title in html
    assert html.count("<details>") == 4  # a derivation per section
    if pytest.importorskip("matplotlib"):
        assert "<svg" in html


def test_report_never_replaces_a_file_unasked(tmp_path, capsys):
    path = tmp_path / "mine.html"
    path.write_text("keep me")
    code, _, err = run(["report", "--model", "gpt2", "--gpus", "8xH100", "-o", str(path)], capsys)
    assert code == 2 and "pass --force" in err and path.read_text() == "keep me"


def test_report_renders_in_headless_chromium(report):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-sync",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={report.parent / 'chromium'}",
        f"--screenshot={shot}",
        "--window-size=1200,2400",
    ]
    subprocess.run([chromium, *flags, report.as_uri()], capture_output=True, timeout=120, check=False)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a rendered page, not a blank one
