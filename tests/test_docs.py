"""Every command shown in the README and docs/, and every Python example there, gives the output the page shows
(scripts/verify_docs.py): a page that drifts from the code fails here, not in front of a user."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_documented_commands_print_what_the_pages_show():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_docs.py")], cwd=ROOT, capture_output=True, text=True
    )
    failures = [line for line in result.stdout.splitlines() if not line.startswith("not rerun")]
    assert result.returncode == 0, "\n".join(failures[-60:]) + result.stderr


def test_python_examples_are_checked_against_what_the_page_shows(tmp_path, capsys, monkeypatch):
    # A page of two ```pycon blocks run as one session (the second uses the first's name): with the right
    # output it passes; with one wrong line the example fails, and the report names the page, the line of the
    # failing `>>>` and the lines expected and got.
    import verify_docs

    monkeypatch.delenv("LMCALC_PRESET_PATH", raising=False)  # run_python unsets it; restored after the test
    page = "# Page\n\n```pycon\n>>> x = 40\n```\n\n```pycon\n>>> print(x + 2, x + 3, sep='\\n')\n{}\n```\n"
    right, wrong = tmp_path / "right.md", tmp_path / "wrong.md"
    right.write_text(page.format("42\n43"))
    wrong.write_text(page.format("42\n44"))

    assert verify_docs.run_python(str(right), right.read_text()) == (2, 0)
    assert "Failed example" not in capsys.readouterr().out
    assert verify_docs.run_python(str(wrong), wrong.read_text()) == (2, 1)
    report = capsys.readouterr().out
    # the `>>> print` line is line 8 of the page: title, blank, fence, x = 40, fence, blank, fence, print
    assert f'File "{wrong}", line 8' in report
    assert "Expected:\n    42\n    44\nGot:\n    42\n    43\n" in report

    # the script's entry point, given the pages: exit status 0 for the right page, 1 for the wrong one
    for path, status in ((right, 0), (wrong, 1)):
        monkeypatch.setattr(sys, "argv", ["verify_docs.py", str(path)])
        assert verify_docs.main() == status
        assert f"0 commands and 2 Python examples, {status} failed" in capsys.readouterr().out
