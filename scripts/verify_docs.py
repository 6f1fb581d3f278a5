"""Rerun every `$ command` shown in README.md and docs/ and check its output is what the page shows.

    python scripts/verify_docs.py [PAGE.md ...]

* Only blocks fenced ```text are rerun. Measured output (timings from `lmcalc bench`, which change from
  run to run) and slow commands are fenced ```console instead: those are listed, never rerun.
* A page's commands run at the terminal width it declares (its first `COLUMNS=N`), else 100 columns; a
  block preceded by the line `<!-- COLUMNS=N -->` runs at N. README.md and every page under docs/ are
  checked.
* An expected output without `…` must equal the real one (trailing spaces ignored); with `…`, the shown
  lines must appear in the real output, in order.
* The pages' commands run a page per CPU at once (a page's commands one after another, in order).
* Python examples fenced ```pycon (`>>> ` prompts and what they print, as in a Python session) are run as
  doctests, the blocks of one page in order in one namespace; `...` in an expected output matches anything.
"""

import doctest
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent


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


def run_commands(page: str, text: str, env: dict[str, str]) -> tuple[int, list[str], list[tuple[str, str, str]]]:
    """Rerun the ```text blocks of ``page``, in order: (commands run, failure messages, commands not rerun)."""
    declared = re.search(r"(?<!<!-- )COLUMNS=(\d+)", text)  # the page's width, not a block's marker
    page_env = dict(env, COLUMNS=declared.group(1) if declared else "100")
    total, failures, skipped = 0, [], []
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
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            expected = [line.rstrip() for line in lines[start + 1 : end]]
            run = subprocess.run(
                ["bash", "-c", lines[start][2:]], cwd=ROOT, env=block_env, capture_output=True, text=True
            )
            actual = [line.rstrip() for line in (run.stdout + run.stderr).rstrip("\n").split("\n")]
            total += 1
            why = matches(expected, actual)
            if why:
                failures.append(f"FAIL {page}: {lines[start]}\n     {why}")
    return total, failures, skipped


def main() -> int:
    pages = sys.argv[1:] or [str(ROOT / "README.md"), *sorted(str(p) for p in (ROOT / "docs").rglob("*.md"))]
    env = {k: v for k, v in os.environ.items() if k != "LMCALC_PRESET_PATH"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # `lmcalc` is the one installed beside this Python (its environment's), whatever PATH says or lacks
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    texts = {page: pathlib.Path(page).read_text() for page in pages}
    # the pages' commands run a page per worker (a page's commands in order: one may read what another wrote), the
    # longest pages first (a `validate` builds PyTorch models: about ten commands' time); the Python examples
    # meanwhile, here
    longest = sorted(pages, key=lambda page: -texts[page].count("\n$ ") - 10 * texts[page].count("\n$ lmcalc validate"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        running = {page: pool.submit(run_commands, page, texts[page], env) for page in longest}
        examples = failed = 0
        for page in pages:
            ran, wrong = run_python(page, texts[page])
            examples, failed = examples + ran, failed + wrong
        total, skipped = 0, []
        for page in pages:
            ran, failures, not_rerun = running[page].result()
            total, failed, skipped = total + ran, failed + len(failures), skipped + not_rerun
            for failure in failures:
                print(failure)
    for page, fence, command in skipped:
        print(f"not rerun (```{fence}) {page}: $ {command}")
    not_rerun = f"{len(skipped)} commands in other blocks not rerun"
    print(f"{total} commands and {examples} Python examples, {failed} failed; {not_rerun}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
