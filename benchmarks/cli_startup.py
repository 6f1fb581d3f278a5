"""Start-up cost of the accounting CLI against the libraries it cannot avoid, in one run.

Times ``lmcalc train-time ...`` end to end (a fresh interpreter each time) against a bare
``python -c "import typer, pydantic, rich, yaml"`` and prints the ratio of the medians.
Target: ratio <= 1.5 (issue #2). Run: python benchmarks/cli_startup.py [--repeats 15]
"""

import argparse
import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import typer, pydantic, rich, yaml"]
# What any CLI whose specs are pydantic models pays on top: pydantic's BaseModel machinery and the
# rich console that prints a table (``import pydantic`` alone is lazy and loads neither).
FLOOR = [
    sys.executable,
    "-c",
    "import typer, pydantic, rich, yaml; from pydantic import BaseModel; import rich.console, rich.table",
]
LMCALC = [
    sys.executable,
    "-m",
    "lmcalc",
    "train-time",
    "--model",
    "llama-3-70b",
    "--gpus",
    "1024xH100",
    "--tokens",
    "15T",
    "--mfu",
    "0.5",
]


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    wall_time(BASELINE), wall_time(FLOOR), wall_time(LMCALC)  # warm the file-system cache
    baseline, floor, lmcalc = [], [], []
    for _ in range(args.repeats):  # interleaved, so drift affects all alike
        baseline.append(wall_time(BASELINE))
        floor.append(wall_time(FLOOR))
        lmcalc.append(wall_time(LMCALC))
    b, f, m = (statistics.median(x) for x in (baseline, floor, lmcalc))
    print(f"python -c 'import typer, pydantic, rich, yaml':   median {b * 1000:.0f} ms over {args.repeats} runs")
    print(f"  + from pydantic import BaseModel; rich.console: median {f * 1000:.0f} ms (ratio {f / b:.2f})")
    print(f"lmcalc train-time (llama-3-70b, 1024xH100):       median {m * 1000:.0f} ms")
    print(f"ratio lmcalc / baseline: {m / b:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
