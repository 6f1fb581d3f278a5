"""Regenerate tests/golden/presets.json after a reviewed change to a formula or a preset.

python scripts/update_golden.py          # rewrite the file
python scripts/update_golden.py --check  # exit 1 if the file is out of date
"""

import json
import os
import sys
import tempfile
from pathlib import Path

from lmcalc.golden import golden_table

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "presets.json"


def main() -> int:
    text = json.dumps(golden_table(), indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv:
        current = GOLDEN.read_text() if GOLDEN.exists() else ""
        print("up to date" if current == text else f"{GOLDEN} is out of date")
        return 0 if current == text else 1
    with tempfile.NamedTemporaryFile("w", dir=GOLDEN.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, GOLDEN)  # atomic: a reader never sees half a file
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
