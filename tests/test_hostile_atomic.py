"""A save killed before its rename (issue #32 item 15: ``kill -9`` during a save left ``tmp*.tmp`` beside the results
file in 4 of 40 tries): the next write of that file removes what the killed one left, and nothing else. Only a
temporary file named as lmcalc names its own (``<file>.lmcalc-tmp-<pid>-<8 random>.<suffix>``), a regular file of this
user, whose writer is gone or which is over a day old, is removed."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmcalc import atomic

NO_SUCH_PROCESS = 2**31 - 1  # above any pid_max Linux allows (2^22): kill(pid, 0) answers ESRCH


def left_by(target: Path, pid: int, suffix: str = ".tmp", age_s: float = 0.0) -> Path:
    """A half-written temporary file of ``target``'s, as a writer of process ``pid`` killed ``age_s`` ago left it."""
    path = target.parent / f"{target.name}{atomic.TEMPORARY_MARK}{pid}-k3x9q1ab{suffix}"
    path.write_text("half")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_a_temporary_file_is_named_for_its_target_and_its_writer(tmp_path):
    target = tmp_path / "results.json"
    with atomic.atomic_target(target) as temporary:
        assert temporary.parent == tmp_path
        assert temporary.name.startswith(f"results.json.lmcalc-tmp-{os.getpid()}-")
        assert atomic._temporary_name(target).fullmatch(temporary.name)
        temporary.write_text("{}")
    assert target.read_text() == "{}" and list(tmp_path.iterdir()) == [target]


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path):
    target = tmp_path / "results.json"
    left = [left_by(target, NO_SUCH_PROCESS), left_by(target, NO_SUCH_PROCESS, suffix=".png")]
    atomic.write_atomic(target, "whole")
    assert target.read_text() == "whole"
    assert not any(path.exists() for path in left)
    assert list(tmp_path.iterdir()) == [target]


def test_a_write_in_progress_is_kept_until_it_is_a_day_old(tmp_path):
    target = tmp_path / "results.json"
    running = left_by(target, os.getpid())  # this process: a write in progress
    atomic.write_atomic(target, "whole")
    assert running.exists()
    hours = left_by(target, os.getpid(), suffix=".dat", age_s=3 * 3600)
    old = left_by(target, os.getpid(), suffix=".bak", age_s=atomic.STALE_AFTER_SECONDS + 60)  # its pid reused
    assert atomic.remove_stale_temporaries(target) == [old]
    assert running.exists() and hours.exists() and not old.exists()


def test_nothing_but_our_own_stale_temporary_files_is_ever_removed(tmp_path):
    target = tmp_path / "results.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / "precious.txt"
    precious.write_text("the user's")
    dead = f"{atomic.TEMPORARY_MARK}{NO_SUCH_PROCESS}-k3x9q1ab"
    kept = {
        "tmpk3x9q1ab.tmp": "a temporary file of another program's (lmcalc's own, before they were named)",
        "results.json.tmp": "the user's",
        f"results.json{dead}.tmp.bak": "a copy the user made of one",
        f"results.json{atomic.TEMPORARY_MARK}12ab-k3x9q1ab.tmp": "not a process id",
        f"results.json{atomic.TEMPORARY_MARK}{NO_SUCH_PROCESS}-short.tmp": "not mkstemp's eight characters",
        f"other.json{dead}.tmp": "another file's: its own next write removes it",
        f"xresults.json{dead}.tmp": "another file's name that ends the same",
    }
    for name, text in kept.items():
        (tmp_path / name).write_text(text)
    (tmp_path / f"results.json{dead}.dir").mkdir()  # named as ours, but a directory
    (tmp_path / f"results.json{dead}.lnk").symlink_to(precious)  # named as ours, but a link: not followed, kept
    atomic.write_atomic(target, "whole")
    for name, text in kept.items():
        assert (tmp_path / name).read_text() == text, name
    assert (tmp_path / f"results.json{dead}.dir").is_dir()
    assert (tmp_path / f"results.json{dead}.lnk").is_symlink() and precious.read_text() == "the user's"


def test_a_long_file_name_still_has_a_temporary_file(tmp_path):
    target = tmp_path / ("r" * 250 + ".json")  # 255 bytes, NAME_MAX: the temporary repeats 100 of them
    left = tmp_path / f"{target.name[:100]}{atomic.TEMPORARY_MARK}{NO_SUCH_PROCESS}-k3x9q1ab.tmp"
    left.write_text("half")
    atomic.write_atomic(target, "whole")
    assert target.read_text() == "whole" and not left.exists()


WRITER = """
import sys, time
from pathlib import Path
from lmcalc.atomic import atomic_target

with atomic_target(Path(sys.argv[1])) as temporary:
    temporary.write_text("half of a results file")
    print(temporary, flush=True)
    time.sleep(120)  # killed here, before the rename
"""


@pytest.mark.cli
def test_kill_9_during_a_save_leaves_a_file_the_next_save_removes(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("before")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        temporary = Path(writer.stdout.readline().strip())
    finally:
        writer.kill()  # SIGKILL: no handler runs, nothing is cleaned up
        writer.wait(timeout=30)
        writer.stdout.close()
    assert temporary.exists() and target.read_text() == "before"  # the results file was never touched
    atomic.write_atomic(target, "after")
    assert target.read_text() == "after"
    assert list(tmp_path.iterdir()) == [target]
