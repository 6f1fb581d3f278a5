"""How fast `lmcalc plan` searches: Llama 3.1 405B on 16,384 H100s (2048 nodes of 8), 16M-token batches.

Prints the number of layouts evaluated, how many fit, and the wall time of the search (median of
several runs in this process). Target: under 2 s on the 2-core development machine.
    python benchmarks/plan_search.py
"""

import statistics
import time

from lmcalc.engine import clear_caches
from lmcalc.engine.plan import Pins, plan
from lmcalc.engine.workload import Workload
from lmcalc.presets import parse_cluster, resolve_model, resolve_optimizer, resolve_precision


def main(repeats: int = 5) -> None:
    model = resolve_model("llama-3.1-405b").spec
    cluster = parse_cluster("2048x8xH100")
    precision, optimizer = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    base = Workload(model, precision, optimizer, 8192, overhead_bytes=0.0)  # no allowance: the figures of earlier runs
    seconds = []
    for _ in range(repeats):
        clear_caches()  # each run searches as a fresh `lmcalc plan` process does
        start = time.perf_counter()
        found = plan(base, cluster, 2048, Pins())
        seconds.append(time.perf_counter() - start)
    best = found.fitting[0]
    print(f"405B on {cluster.count} GPUs: {found.evaluated} layouts evaluated, {len(found.fitting)} fit")
    print(f"search time: median {statistics.median(seconds):.3f} s over {repeats} runs (target < 2 s)")
    print(f"fastest: {best.layout.label}, mb={best.micro_batch}, recompute {best.recompute}, MFU {best.time.mfu:.3f}")


if __name__ == "__main__":
    main()
