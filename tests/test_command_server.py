"""The fork server that serves the docs replay's `lmcalc` commands (scripts/command_server.py) gives what the
installed `lmcalc` gives: the same stdout, stderr and exit status, in the same working folder and environment,
through pipes; a command that dies or hangs is reported and cleaned up."""

import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from command_server import STOP_TIMEOUT, TORCH_COMMANDS, CommandServer
from verify_docs import ROOT, run_shell

pytestmark = pytest.mark.cli

TINY = ROOT / "docs" / "examples" / "my-presets" / "models" / "tiny-100m.yaml"

COMMANDS = [
    "lmcalc params -m llama-3.1-8b --brief",
    # the table's width follows the command's own COLUMNS
    "COLUMNS=60 lmcalc params -m llama-3.1-8b",
    "lmcalc params -m llama-3.1-8b --json | head -3",
    # a file named relative to the command's folder, found through the variable set for this command alone
    "LMCALC_PRESET_PATH=my-presets lmcalc params -m tiny --brief",
    "cd my-presets/models && lmcalc presets check tiny-100m.yaml",
    # failures: a one-line usage error (exit 2), a failed check (exit 1), and the status seen by the shell
    "lmcalc memory -m llama-3.1-8b --zerro 1",
    "lmcalc presets check typo.yaml",
    "lmcalc params -m tiny --brief; echo status $?",
    # a variable read at start-up that differs from the server's: the real lmcalc runs
    "PYTHONUTF8=1 lmcalc params -m llama-3.1-8b --brief",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A working folder with a user's preset folder and a preset with a misspelt field."""
    folder = tmp_path_factory.mktemp("work")
    (folder / "my-presets" / "models").mkdir(parents=True)
    shutil.copy(TINY, folder / "my-presets" / "models")
    (folder / "typo.yaml").write_text(TINY.read_text().replace("vocab_size", "vocab_sise"))
    return folder


def commands_env() -> dict[str, str]:
    """The commands' environment as verify_docs makes it: the installed lmcalc first on PATH, this checkout's
    lmcalc on PYTHONPATH, no user presets."""
    env = {k: v for k, v in os.environ.items() if k not in ("LMCALC_PRESET_PATH", "COLUMNS")}
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    return env


def run(command: str, env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_served_commands_give_what_the_installed_lmcalc_gives(folder):
    env = commands_env()
    with CommandServer(env, torch=False) as shim_folder:  # the torch server is the replay's (test_docs.py)
        served_env = dict(env, PATH=shim_folder + os.pathsep + env["PATH"])
        assert run("command -v lmcalc", served_env, folder)[1] == f"{shim_folder}/lmcalc\n"
        for command in COMMANDS:
            assert run(command, served_env, folder) == run(command, env, folder), command
    assert not Path(shim_folder).exists()

    # what each command printed, read from the real process's output: not a copied figure, the checks' shape
    status, stdout, stderr = run("COLUMNS=60 lmcalc params -m llama-3.1-8b", env, folder)
    assert status == 0 and max(len(line) for line in stdout.splitlines()) <= 60
    status, _, stderr = run("lmcalc memory -m llama-3.1-8b --zerro 1", env, folder)
    assert status == 2 and stderr.startswith("lmcalc: error: unknown option --zerro") and stderr.count("\n") == 1
    status, stdout, _ = run("lmcalc presets check typo.yaml", env, folder)
    assert status == 1 and "vocab_sise" in stdout
    assert run("lmcalc params -m tiny --brief; echo status $?", env, folder)[1] == "status 2\n"


def test_a_command_that_dies_or_hangs(tmp_path):
    env = commands_env()
    # os.abort in place of lmcalc's entry point: the shell sees the command killed by SIGABRT, as for a process
    with CommandServer(env, entry="os:abort") as shim_folder:
        served_env = dict(env, PATH=shim_folder + os.pathsep + env["PATH"])
        aborted = run(f"{sys.executable} -c 'import os; os.abort()'; echo status $?", env, tmp_path)[1]
        assert aborted == f"status {128 + signal.SIGABRT}\n"
        assert run("lmcalc; echo status $?", served_env, tmp_path)[1] == aborted
    # signal.pause never returns: the timeout kills the shell and the shim, and the server the command, so that
    # the server then ends at once (it waits for its commands)
    with CommandServer(env, entry="signal:pause") as shim_folder:
        served_env = dict(env, PATH=shim_folder + os.pathsep + env["PATH"])
        with pytest.raises(subprocess.TimeoutExpired):
            run_shell("lmcalc", served_env, timeout=1)
        stopping = time.perf_counter()
    assert time.perf_counter() - stopping < STOP_TIMEOUT / 2


def test_the_torch_server_takes_the_commands_that_import_torch():
    assert set(TORCH_COMMANDS) == importlib.import_module("lmcalc.cli.app").TORCH_COMMANDS
