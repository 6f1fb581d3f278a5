"""Shared by the scripts that regenerate tables in docs/: keep the prose, replace what follows a marker."""

from pathlib import Path

from lmcalc.atomic import write_atomic


def write_generated(doc: Path, marker: str, lines: list[str]) -> None:
    """Replace everything after ``marker`` in ``doc`` with ``lines`` (the marker itself is the first line),
    atomically: a reader never sees half a file."""
    head = doc.read_text().split(marker)[0]
    write_atomic(doc, head + "\n".join(lines))
    print(f"wrote {doc}")
