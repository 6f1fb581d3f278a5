"""Writing a file so that a reader never sees half of it, with the permissions the user's umask gives.

The temporary file a write goes through is named for the file it becomes and for the process writing it
(``results.json.lmcalc-tmp-4242-k3x9q1ab.tmp``): a writer killed before its rename (``kill -9``, a power cut) leaves
one behind, and the next write of that file removes it once it is stale. Only a name of exactly that form is ever
removed, and only a regular file of the user's own: never a file lmcalc did not make.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmcalc.errors import LmcalcError

TEMPORARY_MARK = ".lmcalc-tmp-"
"""What names a temporary file of ours, between the name of the file it becomes and its writer's process id."""
STALE_AFTER_SECONDS = 24 * 3600.0
"""A temporary file whose writer still seems to run is stale after a day all the same: its process id may have been
reused, and no write of lmcalc's lasts a minute."""
_USER = os.getuid() if hasattr(os, "getuid") else 0  # Windows reports every file's st_uid as 0
_NAME_KEPT = 100  # characters of the target's name a temporary file's name repeats: the whole stays within NAME_MAX


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
    if anything stops it (an error, Ctrl-C): no half-written file is left behind, under either name. The stale
    temporary files an earlier, killed write of ``path`` left are removed first (``remove_stale_temporaries``)."""
    remove_stale_temporaries(path)
    try:
        handle, name = tempfile.mkstemp(suffix=suffix, prefix=_temporary_prefix(path, os.getpid()), dir=path.parent)
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


def _temporary_prefix(path: Path, pid: int) -> str:
    return f"{path.name[:_NAME_KEPT]}{TEMPORARY_MARK}{pid}-"


def _temporary_name(path: Path) -> re.Pattern[str]:
    """The names of ``path``'s temporary files, the writer's process id captured: the prefix, ``mkstemp``'s eight
    random characters, and a suffix of letters and digits (``.tmp``, or a plot's ``.png``)."""
    return re.compile(re.escape(path.name[:_NAME_KEPT] + TEMPORARY_MARK) + r"(\d+)-[a-z0-9_]{8}(?:\.\w+)?")


def remove_stale_temporaries(path: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary files of ``path`` that earlier writes left (killed before they renamed them), and say
    which. One is stale when its writer's process is gone, or when it is older than ``STALE_AFTER_SECONDS``; one
    whose writer still runs is a write in progress, and is kept. Only regular files of this user named as
    ``atomic_target`` names them are removed; nothing that cannot be checked is touched."""
    pattern = _temporary_name(path)
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        candidate = path.parent / name
        try:
            info = os.lstat(candidate)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != _USER:
                continue
            if _process_runs(int(match.group(1))) and now - info.st_mtime < STALE_AFTER_SECONDS:
                continue
            candidate.unlink()
        except OSError:
            continue  # gone already (another writer cleaned it), or not ours to remove
        removed.append(candidate)
    return removed


def _process_runs(pid: int) -> bool:
    """Whether a process of this id runs on this machine (``kill(pid, 0)`` sends nothing; a process of another user
    answers that it exists all the same)."""
    if os.name != "posix":  # Windows' os.kill ends the process it is given: only the age rule applies there
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # it exists but is not ours, or the id cannot be asked about: keep its file
    return True
