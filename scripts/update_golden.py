"""Regenerate tests/golden/presets.json after a reviewed change to a formula or a preset.

python scripts/update_golden.py          # rewrite the file
python scripts/update_golden.py --check  # exit 1 if the file is out of date
"""

import json
import sys
from pathlib import Path

from golden import golden_table

from lmcalc.atomic import write_atomic

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "presets.json"


def main() -> int:
    text = json.dumps(golden_table(), indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv:
        current = GOLDEN.read_text() if GOLDEN.exists() else ""
        print("up to date" if current == text else f"{GOLDEN} is out of date")
        return 0 if current == text else 1
    write_atomic(GOLDEN, text)  # a reader never sees half a file; ordinary permissions, not tempfile's 0600
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
