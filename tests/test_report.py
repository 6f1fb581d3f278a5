"""lmcalc report: one self-contained HTML page, checked as HTML and rendered by headless Chromium."""

import importlib.util
import json
import re
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest

from lmcalc.cli import main

pytestmark = pytest.mark.cli

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
    for title in ("Summary", "Parameters of Llama 3 70B", "Training FLOPs", "Training time", "Training memory per GPU"):
        assert title in html
    assert "Layouts for Llama 3 70B" in html and "The best layout for Llama 3 70B" in html
    assert html.count("<details>") == 7  # a derivation per result: the summary, 4 figures, the layouts, the best
    if importlib.util.find_spec("matplotlib"):
        assert html.count("<svg") == 2  # the memory bars and the ranked layouts
    else:
        assert html.count("install matplotlib for the picture") == 2


def test_report_ranks_the_layouts_plan_ranks(report, capsys):
    # the page's table is the plan command's top 10, in the same order, for the same defaults
    code, out, err = run(["plan", "-m", "llama-3-70b", "--gpus", "128x8xH100", "--json"], capsys)
    assert code == 0, err
    best = list(json.loads(out)["section_titles"].values())[:10]
    html = report.read_text()
    shown = re.findall(r"<tr><td class='code'>(\d+\. DP[^<]*)</td>", html)
    assert shown == [escape(title) for title in best]


def test_report_says_when_no_layout_fits(tmp_path, capsys):
    path = tmp_path / "405b.html"
    code, _, err = run(["report", "-m", "llama-3.1-405b", "--gpus", "8xH100", "-o", str(path)], capsys)
    assert code == 0, err
    html = path.read_text()
    # 405B needs about 16 bytes per parameter of model states: ~6.5 TB, far beyond 8 × 80 GB
    assert "nothing fits on 8xh100-sxm" in html and "mostly model states" in html


def test_report_layouts_use_the_tokens_asked_for(tmp_path, capsys):
    # the ranked layouts' days column and the best layout's derivation count the --tokens given, as the
    # FLOPs and time sections do, not the preset's published count
    path = tmp_path / "8b.html"
    code, _, err = run(["report", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--tokens", "1T", "-o", str(path)], capsys)
    assert code == 0, err
    rows = re.findall(r"Training tokens</td><td class='value'>([^<]*)</td><td class='muted'>([^<]*)<", path.read_text())
    assert rows == [("1 T tokens", "--tokens")] * 2  # the ranked layouts and the best one


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
