"""Writing a file so that a reader never sees half of it, with the permissions the user's umask gives."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmcalc.errors import LmcalcError


def new_file(path: str, force: bool) -> Path:
    """``path`` as a place to write: refused if a file is there and ``force`` is not given (nothing the user
    had is overwritten unasked), if a directory is there (not even ``force`` replaces one), or if its folder does
    not exist."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise LmcalcError(f"{target} is a directory; give a file name")
    if target.exists() and not force:
        raise LmcalcError(f"{target} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise LmcalcError(f"no such directory: {target.parent}")
    return target


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    with atomic_target(path) as temporary:
        if isinstance(data, bytes):
            temporary.write_bytes(data)
        else:
            temporary.write_text(data, encoding="utf-8")
    return path


@contextmanager
def atomic_target(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary file beside ``path`` for the block to write; renamed to ``path`` when the block ends, and removed
    if anything stops it (an error, Ctrl-C): no half-written file is left behind, under either name."""
    try:
        handle, name = tempfile.mkstemp(suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise LmcalcError(f"cannot write in {path.parent}: {exc.strerror or exc}") from None
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        finish_atomic(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise LmcalcError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def finish_atomic(temporary: Path, path: Path) -> None:
    """Give a finished temporary file ordinary permissions (0666 less the umask) and rename it to ``path``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    os.replace(temporary, path)
