"""Writing a file so that a reader never sees half of it, with the permissions the user's umask gives."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from lmcalc.errors import LmcalcError


def new_file(path: str, force: bool) -> Path:
    """``path`` as a place to write: refused if a file is there and ``force`` is not given (nothing the user
    had is overwritten unasked), or if its folder does not exist."""
    target = Path(path).expanduser()
    if target.exists() and not force:
        raise LmcalcError(f"{target} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise LmcalcError(f"no such directory: {target.parent}")
    return target


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    mode = "wb" if isinstance(data, bytes) else "w"
    encoding = None if isinstance(data, bytes) else "utf-8"
    with tempfile.NamedTemporaryFile(mode, dir=path.parent, delete=False, suffix=".tmp", encoding=encoding) as tmp:
        tmp.write(data)
    finish_atomic(Path(tmp.name), path)
    return path


def finish_atomic(temporary: Path, path: Path) -> None:
    """Give a finished temporary file ordinary permissions (0666 less the umask) and rename it to ``path``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    os.replace(temporary, path)
