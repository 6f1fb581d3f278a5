"""Start-up cost of the accounting CLI against the libraries it cannot avoid, in one run.

Runs four commands end to end, each in a fresh interpreter, interleaved with a bare
``python -c "import typer, pydantic, rich, yaml"`` (the baseline), with the baseline plus pydantic's ``BaseModel``
and rich's console and table (the floor), and with the floor plus ``pydantic.fields`` (which pydantic imports to define
the first model with a field, and with it ``pydantic.types`` and ``annotated_types``: the floor of any command that
defines a spec and prints a table), and prints for each the median CPU time (user + system of the child process, from
``os.wait4``) and wall time, and their ratios to the baseline's medians:

- ``lmcalc train-time --model llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5`` (an accounting command);
- ``lmcalc --help``;
- ``lmcalc memory -m llama-3.1-8b --gpus 8xH100`` (the memory engine and a framework profile);
- ``lmcalc params -m tests/data/hf/llama-3.1-8b/config.json`` (a Hugging Face config read and counted).

Targets: CPU time <= 1.5x the baseline's for train-time and --help (issue #28) and for params on a config.json
(issue #31). CPU time is the figure compared: on a
shared machine it moves less than wall time. The lmcalc measured is the one ``python -m lmcalc`` imports from the
current directory. Run: python benchmarks/cli_startup.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LIBRARIES = "import typer, pydantic, rich, yaml"
BASELINE = [sys.executable, "-c", LIBRARIES]
# What any CLI whose specs are pydantic models pays on top: pydantic's BaseModel machinery and the
# rich console that prints a table (``import pydantic`` alone is lazy and loads neither).
FLOOR = [sys.executable, "-c", f"{LIBRARIES}; from pydantic import BaseModel; import rich.console, rich.table"]
# What defining a model with a field adds to that (pydantic.fields, and through it pydantic.types and annotated_types).
SPEC_FLOOR = [FLOOR[0], FLOOR[1], f"{FLOOR[2]}; import pydantic.fields"]
LMCALC = [sys.executable, "-m", "lmcalc"]
CONFIG = str(Path(__file__).resolve().parent.parent / "tests" / "data" / "hf" / "llama-3.1-8b" / "config.json")
TRAIN_TIME = ["train-time", "--model", "llama-3-70b", "--gpus", "1024xH100", "--tokens", "15T", "--mfu", "0.5"]
COMMANDS = {
    "baseline": BASELINE,
    "floor": FLOOR,
    "spec floor": SPEC_FLOOR,
    "train-time": [*LMCALC, *TRAIN_TIME],
    "--help": [*LMCALC, "--help"],
    "memory": [*LMCALC, "memory", "-m", "llama-3.1-8b", "--gpus", "8xH100"],
    "params": [*LMCALC, "params", "-m", CONFIG],
}
LABELS = {
    "baseline": f"python -c '{LIBRARIES}'",
    "floor": "  + from pydantic import BaseModel; import rich.console, rich.table",
    "spec floor": "  + import pydantic.fields (what a model with a field imports)",
    "train-time": "lmcalc train-time --model llama-3-70b --gpus 1024xH100 …",
    "--help": "lmcalc --help",
    "memory": "lmcalc memory -m llama-3.1-8b --gpus 8xH100",
    "params": "lmcalc params -m tests/data/hf/llama-3.1-8b/config.json",
}
TARGET = 1.5
TARGETED = ("train-time", "--help", "params")


@dataclass(frozen=True)
class Run:
    cpu: float
    """User + system seconds of the child process."""
    wall: float


# Each child may write its bytecode, so that the warm-up run leaves every module compiled, as installing a package
# does: with PYTHONDONTWRITEBYTECODE set, a module changed since its .pyc was written is compiled again on every run.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def run(command: list[str]) -> Run:
    """One run of ``command`` to the end, its output discarded."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {child.returncode}")
    return Run(usage.ru_utime + usage.ru_stime, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    for command in COMMANDS.values():  # warm the file-system cache and the bytecode caches
        run(command)
    runs: dict[str, list[Run]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):  # interleaved, so drift affects all alike
        for name, command in COMMANDS.items():
            runs[name].append(run(command))
    cpu = {name: statistics.median(r.cpu for r in rs) for name, rs in runs.items()}
    wall = {name: statistics.median(r.wall for r in rs) for name, rs in runs.items()}
    print(f"median of {args.repeats} interleaved runs; ratios to the baseline's median")
    print(f"{'command':<66} {'CPU ms':>7} {'ratio':>6} {'wall ms':>8} {'ratio':>6}")
    for name in COMMANDS:
        print(
            f"{LABELS[name]:<66} {cpu[name] * 1000:7.0f} {cpu[name] / cpu['baseline']:6.2f} "
            f"{wall[name] * 1000:8.0f} {wall[name] / wall['baseline']:6.2f}"
        )
    for name in TARGETED:
        ratio = cpu[name] / cpu["baseline"]
        print(f"CPU ratio {name}: {ratio:.2f} (target <= {TARGET}: {'met' if ratio <= TARGET else 'not met'})")


if __name__ == "__main__":
    main()
