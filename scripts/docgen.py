"""Shared by the scripts that regenerate tables in docs/: keep the prose, replace what follows a marker."""

import os
import tempfile
from pathlib import Path


def write_generated(doc: Path, marker: str, lines: list[str]) -> None:
    """Replace everything after ``marker`` in ``doc`` with ``lines`` (the marker itself is the first line),
    atomically: a reader never sees half a file."""
    head = doc.read_text().split(marker)[0]
    with tempfile.NamedTemporaryFile("w", dir=doc.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(head + "\n".join(lines))
    os.replace(tmp.name, doc)
    print(f"wrote {doc}")
