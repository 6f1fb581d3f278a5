"""The harnesses that check lmcalc against published figures (``accuracy``, ``golden``) live in scripts/, outside
the package: the tests import them from there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
