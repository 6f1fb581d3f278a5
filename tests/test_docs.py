"""Every command shown in the README and docs/, and every Python example there, gives the output the page shows
(scripts/verify_docs.py): a page that drifts from the code fails here, not in front of a user."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_documented_commands_print_what_the_pages_show():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_docs.py")], cwd=ROOT, capture_output=True, text=True
    )
    failures = [line for line in result.stdout.splitlines() if not line.startswith("not rerun")]
    assert result.returncode == 0, "\n".join(failures[-60:]) + result.stderr
