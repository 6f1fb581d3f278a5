"""Rerun every `$ command` shown in README.md and docs/ and check its output is what the page shows.

    python scripts/verify_docs.py [PAGE.md ...] [--processes] [--record FILE]

* Only blocks fenced ```text are rerun. Measured output (timings from `lmcalc bench`, which change from
  run to run) and slow commands are fenced ```console instead: those are listed, never rerun.
* A page's commands run at the terminal width it declares (its first `COLUMNS=N`), else 100 columns; a
  block preceded by the line `<!-- COLUMNS=N -->` runs at N. README.md and every page under docs/ are
  checked.
* An expected output without `…` must equal the real one (trailing spaces ignored); with `…`, the shown
  lines must appear in the real output, in order.
* The pages' commands run a page per CPU at once (a page's commands one after another, in order), each with
  `bash -c` in the repository's folder, and each is given COMMAND_TIMEOUT seconds (then it fails, killed).
* `lmcalc` in a command is served by a fork server (scripts/command_server.py): one process imports lmcalc once
  (a second one torch too, for `lmcalc validate` and `bench`), and each `lmcalc` forks from it instead of starting
  Python and importing lmcalc again: about 0.2 s of CPU saved a command (1 s more where it imports torch). It
  behaves as the installed `lmcalc` does: the same output, exit status, working folder and environment (a command
  whose interpreter or typer variables differ from the server's runs the real `lmcalc`). With `--processes` every
  `lmcalc` is a new process, as a user's is: the same checks, more than twice the CPU.
* `--record FILE` writes every command's page, text, exit status, stdout, stderr and wall time, one JSON line each,
  in the pages' order: two runs (with and without `--processes`) compare field for field.
* Python examples fenced ```pycon (`>>> ` prompts and what they print, as in a Python session) are run as
  doctests, the blocks of one page in order in one namespace; `...` in an expected output matches anything.
"""

import argparse
import doctest
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from command_server import CommandServer

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND_TIMEOUT = 300
"""Seconds a documented command may take (the slowest, `lmcalc validate -m deepseek-v3 --recompute none`, took 35 to
62 s beside other work): past it the command and what it started are killed, and it fails."""
STOPPING = threading.Event()
"""Set when the run is interrupted: the pages' commands not yet started are not run."""
RUNNING: set[int] = set()
"""The process groups of the commands running now (killed when the run is interrupted)."""


def matches(expected: list[str], actual: list[str]) -> str:
    """'' when ``actual`` shows ``expected``, else why not."""
    while expected and expected[-1] == "":
        expected = expected[:-1]
    if "…" not in expected:
        return "" if expected == actual else "output differs"
    position = 0
    for line in expected:
        if line == "…":
            continue
        while position < len(actual) and actual[position] != line:
            position += 1
        if position == len(actual):
            return f"missing or out of order: {line!r}"
        position += 1
    return ""


def run_python(page: str, text: str) -> tuple[int, int]:
    """Run the ```pycon blocks of ``page`` as doctests, in order, sharing one namespace: (examples, failures)."""
    blocks = [(m.group(1), text.count("\n", 0, m.start(1))) for m in re.finditer(r"```pycon\n(.*?)```", text, re.S)]
    if not blocks:
        return 0, 0
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.pop("LMCALC_PRESET_PATH", None)  # the built-in presets, as for the commands
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    namespace: dict = {}
    for n, (block, line) in enumerate(blocks, start=1):
        test = parser.get_doctest(block, namespace, f"{page} python block {n}", page, line)
        runner.run(test, clear_globs=False)
        namespace = test.globs  # a doctest runs in a copy: the next block goes on from this one
    result = runner.summarize(verbose=False)
    return result.attempted, result.failed


def run_shell(command: str, env: dict[str, str], timeout: float = COMMAND_TIMEOUT) -> tuple[int, str, str]:
    """Run ``command`` with ``bash -c`` in the repository's folder: (exit status, stdout, stderr). It runs in a
    process group of its own, killed whole when the command is still running after ``timeout`` seconds."""
    process = subprocess.Popen(
        ["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0
    )
    RUNNING.add(process.pid)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout (or an interrupt): nothing it started is left running
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        RUNNING.discard(process.pid)
    return process.returncode, stdout.decode(errors="surrogateescape"), stderr.decode(errors="surrogateescape")


def run_commands(page: str, text: str, env: dict[str, str]) -> tuple[list[dict], list[str], list[tuple[str, str, str]]]:
    """Rerun the ```text blocks of ``page``, in order: (what each command gave, failure messages, commands not
    rerun)."""
    declared = re.search(r"(?<!<!-- )COLUMNS=(\d+)", text)  # the page's width, not a block's marker
    page_env = dict(env, COLUMNS=declared.group(1) if declared else "100")
    ran, failures, skipped = [], [], []
    for width, fence, block in re.findall(r"(?:<!-- COLUMNS=(\d+) -->\n)?```(\w*)\n(.*?)```", text, re.S):
        commands = [line for line in block.split("\n") if line.startswith("$ ")]
        if fence == "pycon":
            continue
        if fence != "text":
            skipped += [(page, fence or "plain", c[2:]) for c in commands]
            continue
        block_env = dict(page_env, COLUMNS=width) if width else page_env
        lines = block.rstrip("\n").split("\n")
        starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        for n, start in enumerate(starts):
            if STOPPING.is_set():
                return ran, failures, skipped
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            expected = [line.rstrip() for line in lines[start + 1 : end]]
            started = time.perf_counter()
            try:
                status, stdout, stderr = run_shell(lines[start][2:], block_env)
            except subprocess.TimeoutExpired:
                status, stdout, stderr = "killed", "", f"still running after {COMMAND_TIMEOUT} s: killed"
            seconds = round(time.perf_counter() - started, 3)
            gave = {"status": status, "stdout": stdout, "stderr": stderr, "seconds": seconds}
            ran.append({"page": page, "command": lines[start][2:], **gave})
            if status == "killed":
                failures.append(f"FAIL {page}: {lines[start]}\n     {stderr}")
                continue
            actual = [line.rstrip() for line in (stdout + stderr).rstrip("\n").split("\n")]
            why = matches(expected, actual)
            if why:
                failures.append(f"FAIL {page}: {lines[start]}\n     {why}")
    return ran, failures, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="*", help="the pages to check (default: README.md and docs/)")
    parser.add_argument("--processes", action="store_true", help="run every lmcalc as a new process")
    parser.add_argument("--record", type=pathlib.Path, help="write what each command gave here, as JSON lines")
    args = parser.parse_args()
    pages = args.pages or [str(ROOT / "README.md"), *sorted(str(p) for p in (ROOT / "docs").rglob("*.md"))]
    env = {k: v for k, v in os.environ.items() if k != "LMCALC_PRESET_PATH"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # `lmcalc` is the one installed beside this Python (its environment's), whatever PATH says or lacks
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    texts = {page: pathlib.Path(page).read_text() for page in pages}
    serving = not args.processes and any("\n```text\n$ " in text for text in texts.values())
    with CommandServer(env) if serving else nullcontext() as shim_folder:
        if shim_folder:  # the server's `lmcalc` first on the commands' PATH
            env["PATH"] = shim_folder + os.pathsep + env["PATH"]
        examples, failed, total, records, skipped = run_pages(pages, texts, env)
    if args.record:
        args.record.write_text("".join(json.dumps(record) + "\n" for record in records))
    for page, fence, command in skipped:
        print(f"not rerun (```{fence}) {page}: $ {command}")
    not_rerun = f"{len(skipped)} commands in other blocks not rerun"
    print(f"{total} commands and {examples} Python examples, {failed} failed; {not_rerun}")
    return 1 if failed else 0


def run_pages(pages: list[str], texts: dict[str, str], env: dict[str, str]) -> tuple[int, int, int, list, list]:
    """Run the pages' commands and Python examples, printing each failure: (examples, failures, commands, what
    each command gave, commands not rerun)."""
    # the pages' commands run a page per worker (a page's commands in order: one may read what another wrote), the
    # longest pages first (a `validate` builds PyTorch models: about ten commands' time); the Python examples
    # meanwhile, here
    longest = sorted(pages, key=lambda page: -texts[page].count("\n$ ") - 10 * texts[page].count("\n$ lmcalc validate"))
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        running = {page: pool.submit(run_commands, page, texts[page], env) for page in longest}
        examples = failed = 0
        for page in pages:
            ran, wrong = run_python(page, texts[page])
            examples, failed = examples + ran, failed + wrong
        total, records, skipped = 0, [], []
        for page in pages:
            ran_commands, failures, not_rerun = running[page].result()
            total, failed, skipped = total + len(ran_commands), failed + len(failures), skipped + not_rerun
            records += ran_commands
            for failure in failures:
                print(failure)
    except BaseException:  # an interrupt: the commands running are killed, no other starts
        STOPPING.set()
        for group in list(RUNNING):
            os.killpg(group, signal.SIGKILL)
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return examples, failed, total, records, skipped


if __name__ == "__main__":
    sys.exit(main())
