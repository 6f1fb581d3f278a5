"""What ``--from FILE`` adds to a command, for each published launch config in tests/data/launch, in one run.

For each config, ``lmcalc memory --from FILE ... --brief`` and the same command with the settings the file gives typed
as flags (``lmcalc.launch.read`` makes them, in this process, before the timing) run end to end, each in a fresh
interpreter, interleaved, ``--repeats`` times; printed: the median CPU time (user + system of the child, from
``os.wait4``) of each and their difference, the time reading the config adds. The model and the GPUs are given
beside ``--from`` where the file does not say them, in both commands alike.

Target (issue #36): reading a config adds under 50 ms to the command. Run: python benchmarks/launch_read.py
[--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "launch"
LMCALC = [sys.executable, "-m", "lmcalc"]
TARGET_MS = 50.0
GPUS = {"megatron/gpt3-175b-distributed.sh": "128xH100", "megatron/mixtral-8x7b-distributed.sh": "32xH100",
        "megatron/deepseek-v3-megatron-fsdp-sbatch.sh": "64xH100"}  # fmt: skip
"""Clusters the layouts of those scripts need (their scripts launch on one node unless told more)."""
MODEL_FOR = {"deepspeed": "llama-3.1-8b", "torchtitan/deepseek-v3-16b.toml": "deepseek-v2-lite",
             "megatron/deepseek-v3-megatron-fsdp-sbatch.sh": "deepseek-v3"}  # fmt: skip
"""Models given beside a config that names none lmcalc can build (a DeepSpeed JSON names no model)."""


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of ``argv`` run to the end (a non-zero exit is an error)."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)}: {process.stderr.read().decode() if process.stderr else ''}")
    return usage.ru_utime + usage.ru_stime


def typed(path: Path, beside: list[str], folder: Path) -> list[str]:
    """The flags that say what ``--from path`` says (the file's settings a ``memory`` command takes); a model built
    from Megatron's shape flags is given as the YAML preset of it (written in ``folder``), as a user would."""
    from lmcalc.cli.launch import apply_launch
    from lmcalc.estimates.settings import MemorySettings

    kwargs: dict[str, object] = {name: None for name in MemorySettings.__annotations__}
    kwargs |= {"model": None, "gpus": None}
    given = set()
    for flag, value in zip(beside[::2], beside[1::2], strict=True):
        key = flag.removeprefix("--").replace("-", "_")
        kwargs[key], _ = value, given.add(key)
    apply_launch(str(path), kwargs, given)
    words: list[str] = []
    for key, value in kwargs.items():
        if value is None:
            continue
        if key == "model" and not isinstance(value, str):
            import yaml

            preset = folder / f"{path.stem}.yaml"
            preset.write_text(yaml.safe_dump(value.model_dump(mode="json", exclude_none=True), sort_keys=False))
            value = preset
        name = "--" + key.replace("_", "-")
        words += [name] if value is True else [] if value is False else [name, str(value)]
    return words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    repeats = parser.parse_args().repeats
    print(f"{'config':<52} {'typed ms':>9} {'--from ms':>10} {'added ms':>9}")
    added_all = []
    folder = Path(tempfile.mkdtemp(prefix="lmcalc-launch-"))
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md"):
        name = str(path.relative_to(DATA))
        beside = ["--gpus", GPUS.get(name, "8xH100")]
        model = MODEL_FOR.get(name) or MODEL_FOR.get(name.split("/")[0])
        beside += ["--model", model] if model else []
        flags = typed(path, beside, folder)
        with_from = [*LMCALC, "memory", "--from", str(path), *beside, "--brief"]
        plain = [*LMCALC, "memory", *flags, "--brief"]
        times = {"typed": [], "from": []}
        for _ in range(repeats):
            times["typed"].append(cpu_seconds(plain))
            times["from"].append(cpu_seconds(with_from))
        typed_ms, from_ms = (1000 * statistics.median(times[k]) for k in ("typed", "from"))
        added_all.append(from_ms - typed_ms)
        print(f"{name:<52} {typed_ms:9.0f} {from_ms:10.0f} {from_ms - typed_ms:9.1f}")
    worst = max(added_all)
    print(f"\nmedian added {statistics.median(added_all):.1f} ms, largest {worst:.1f} ms; target < {TARGET_MS:.0f} ms: "
          f"{'met' if worst < TARGET_MS else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
