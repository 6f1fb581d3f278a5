"""python scripts/verify_docs.py [PAGE.md ...]: rerun every `$ command` in ```text blocks of the docs and check the shown output against the real one.

How it decides what to rerun:
* Only blocks fenced ```text are rerun. Output that is measured (timings from `lmcalc bench`, which change
  from run to run) or too slow to rerun (`bench step`) is fenced ```console instead: those blocks are
  counted and listed, never rerun.
* Each page's commands run with the terminal width the page declares (the first `COLUMNS=N` in its text);
  a page that declares none runs at COLUMNS=100.
* An expected output without `…` must equal the real one exactly (trailing spaces ignored); with `…`, the
  shown lines must appear in the real output in the same order.
"""

import os
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
files = sys.argv[1:] or sorted(str(p) for p in (root / "docs").rglob("*.md"))
base_env = dict(os.environ)
base_env.pop("LMCALC_PRESET_PATH", None)
# Run this checkout's lmcalc even if another copy was pip-installed in editable mode since.
base_env["PYTHONPATH"] = str(root) + (os.pathsep + base_env["PYTHONPATH"] if base_env.get("PYTHONPATH") else "")
bad = 0
total = 0
skipped = []
for f in files:
    text = pathlib.Path(f).read_text()
    declared = re.search(r"COLUMNS=(\d+)", text)
    env = dict(base_env, COLUMNS=declared.group(1) if declared else "100")
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang != "text":
            skipped += [(f, ln[2:]) for ln in block.split("\n") if ln.startswith("$ ")]
            continue
        lines = block.rstrip("\n").split("\n")
        cmds = []
        for ln in lines:
            if ln.startswith("$ "):
                cmds.append([ln[2:], []])
            elif cmds:
                cmds[-1][1].append(ln.rstrip())
        for cmd, expected in cmds:
            total += 1
            r = subprocess.run(["bash", "-c", cmd], cwd=root, env=env, capture_output=True, text=True)
            actual = [l.rstrip() for l in (r.stdout + r.stderr).rstrip("\n").split("\n")]
            exp = expected[:]
            while exp and exp[-1] == "":
                exp.pop()
            if "…" not in exp:
                ok = exp == actual
                why = "exact"
            else:
                i = 0
                ok = True
                why = ""
                for e in exp:
                    if e == "…":
                        continue
                    while i < len(actual) and actual[i] != e:
                        i += 1
                    if i == len(actual):
                        ok = False
                        why = f"missing/out of order: {e!r}"
                        break
                    i += 1
            if not ok:
                bad += 1
                print(f"FAIL {f}: $ {cmd}\n   {why}")
                if why == "exact":
                    import difflib

                    for d in difflib.unified_diff(exp, actual, lineterm="", n=0):
                        print("     ", d)
for f, cmd in skipped:
    print(f"not rerun (```console, measured or slow) {os.path.relpath(f, root)}: $ {cmd}")
print(f"{total} commands, {bad} failed; {len(skipped)} commands in ```console blocks not rerun")
