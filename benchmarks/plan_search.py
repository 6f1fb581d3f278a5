"""How fast `lmcalc plan` searches, on two large clusters:

* Llama 3.1 405B on 16,384 H100s (2048 nodes of 8), 2,048 sequences of 8,192 tokens (16M tokens) a step, with the
  idealised framework profile and no overhead allowance, as the earlier figures in docs/performance.md were
  measured; end to end, `lmcalc plan -m llama-3.1-405b --gpus 2048x8xH100 --seq 8192 --global-batch 16M`.
  Target: under 1.5 s.
* DeepSeek-V3 on 2,048 H800s (256 nodes of 8), 15,360 sequences of 4,096 tokens (60M tokens) a step, set up as
  `lmcalc plan -m deepseek-v3 --gpus 256x8xH800 --seq 4096 --global-batch 60M` sets it up (its default precision,
  optimizer, attention and framework profile); end to end, that command. Target: under 8 s.

For each: the layouts evaluated, how many fit, the median wall time of a fresh search (the engine's caches cleared
and the previous result dropped before each run, as a fresh `lmcalc plan` process starts), the fastest layout, and
the median wall time of the command end to end, each run a new process. A search of 100,000 layouts or more runs in
as many processes as the machine has cores (``engine.search.workers``), this one among them; its CPU time in the
search, which an idle machine's wall time follows, and the same search in one process are timed beside it.
``--caches`` also prints every engine cache's hits and misses after one search in one process, to check that a
change keeps them (issue #28). Targets are for the 2-core development machine.
    python benchmarks/plan_search.py [--repeats 5] [--caches]
"""

import argparse
import gc
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from lmcalc.engine import clear_caches
from lmcalc.engine.search.plan import Pins, Plan, plan
from lmcalc.engine.search.space import layout_estimate
from lmcalc.engine.search.workers import search_workers
from lmcalc.engine.workload import Workload
from lmcalc.estimates.settings import TrainingSettings
from lmcalc.estimates.training import training_setup
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster


@dataclass(frozen=True)
class Case:
    title: str
    workload: Workload
    cluster: Cluster
    sequences: int  # the global batch
    target_s: float
    command: tuple[str, ...]  # `lmcalc plan`'s arguments for the same search, end to end


def llama_405b() -> Case:
    model = resolve_model("llama-3.1-405b").spec
    precision, optimizer = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    base = Workload(
        model, precision, optimizer, 8192, overhead_bytes=0.0, framework=framework_profile()
    )  # no allowance: the figures of earlier runs
    command = ("plan", "-m", "llama-3.1-405b", "--gpus", "2048x8xH100", "--seq", "8192", "--global-batch", "16M")
    return Case("Llama 3.1 405B on 16,384 H100 (2048x8xH100)", base, parse_cluster("2048x8xH100"), 2048, 1.5, command)


def deepseek_v3() -> Case:
    setup = training_setup("deepseek-v3", "256x8xH800", TrainingSettings(seq=4096))  # as `lmcalc plan` does
    sequences = 60 * 2**20 // 4096  # --global-batch 60M tokens (binary) of 4,096-token sequences: 15,360
    command = ("plan", "-m", "deepseek-v3", "--gpus", "256x8xH800", "--seq", "4096", "--global-batch", "60M")
    return Case("DeepSeek-V3 on 2,048 H800 (256x8xH800)", setup.workload, setup.cluster, sequences, 8.0, command)


def fresh_searches(case: Case, repeats: int, workers: int | None = None) -> tuple[Plan, list[float], list[float]]:
    """Search ``repeats`` times, each from cleared caches, and return the last result, the wall times and this
    process's CPU times (its forked workers' left out); ``workers``: processes (None: as ``lmcalc plan`` chooses,
    ``engine.search.workers``). This process searches a share itself and takes in the others' results, so on an
    idle machine the wall time follows its CPU time; on a busy one the CPU time is the steadier figure."""
    seconds, cpu = [], []
    found: Plan | None = None
    for _ in range(repeats):
        found = None  # a fresh process holds no earlier result for the garbage collector to walk
        clear_caches()
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        found = plan(case.workload, case.cluster, case.sequences, Pins(), workers=workers)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    assert found is not None
    return found, seconds, cpu


def end_to_end(case: Case, repeats: int) -> list[float]:
    """Wall seconds of ``lmcalc plan`` for the case, each run a new process (``python -m lmcalc``)."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lmcalc", *case.command], check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
    return seconds


def cache_counts() -> dict[str, tuple[int, int]]:
    """Every memoised engine function's (hits, misses), by its module and name."""
    counts = {}
    for name, module in sorted(sys.modules.items()):
        if name.startswith("lmcalc.engine.") and module is not None:
            for attr, value in vars(module).items():
                if callable(getattr(value, "cache_info", None)) and getattr(value, "__module__", "") == name:
                    info = value.cache_info()
                    counts[f"{name}.{attr}"] = (info.hits, info.misses)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--caches", action="store_true", help="print every engine cache's hits and misses")
    args = parser.parse_args()
    repeats = args.repeats
    for case in (llama_405b(), deepseek_v3()):
        chosen = search_workers(layout_estimate(case.workload, case.cluster, case.sequences, Pins()))
        found, seconds, cpu = fresh_searches(case, repeats, 1 if args.caches else None)  # caches: of one process
        if args.caches:
            for function, (hits, misses) in cache_counts().items():
                print(f"  cache {function}: {hits:,} hits, {misses:,} misses")
        best = found.fitting[0]
        print(f"{case.title}: {found.evaluated:,} layouts evaluated, {len(found.fitting):,} fit")
        print(
            f"  search time in {1 if args.caches else chosen} process(es): median {statistics.median(seconds):.3f} s "
            f"over {repeats} runs (min {min(seconds):.3f}, max {max(seconds):.3f}; target < {case.target_s:g} s)"
        )
        if chosen > 1 and not args.caches:
            print(f"  this process's CPU time in it: median {statistics.median(cpu):.3f} s")
            _, alone, _ = fresh_searches(case, repeats, 1)
            print(f"  the same search in 1 process: median {statistics.median(alone):.3f} s")
        print(
            f"  fastest: {best.layout.label}, mb={best.micro_batch}, GA={best.layout.grad_accum}, "
            f"recompute {best.recompute}, {best.time.tokens_per_s:,.0f} tokens/s, MFU {best.time.mfu:.3f}"
        )
        whole = end_to_end(case, repeats)
        print(
            f"  end to end (lmcalc {' '.join(case.command)}): median {statistics.median(whole):.3f} s "
            f"(min {min(whole):.3f}, max {max(whole):.3f}; target < {case.target_s:g} s)"
        )


if __name__ == "__main__":
    main()
