"""Why one fraction of the peak cannot time a training step (docs/formulas.md §8.1).

    python docs/examples/one_fraction.py

Times the 86 published runs of benchmarks/published_runs.yaml twice, with everything but the compute the same
(communication, overlap, host, bubble, optimizer): once with the compute as the step's hardware FLOPs at one
fraction of the dense peak (``step_time(..., efficiency=f)``), that fraction fitted to these same runs by
golden-section search on the mean absolute log error; once kernel by kernel, with the shipped constants. Then
the runs the single fraction misses most, with the share of their step that the kernel model gives to GEMMs,
fused attention and memory-bound kernels. Run from the repository root.
"""

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the accuracy harness lives there

from accuracy import load_runs  # noqa: E402
from fit_time import FITTED, _golden  # noqa: E402

from lmcalc.engine.time.steptime import step_time  # noqa: E402

runs = load_runs(FITTED)


def error(run, efficiency):  # predicted / published − 1, in tokens/s per GPU
    t = step_time(run.workload, run.layout, run.cluster, efficiency=efficiency)
    return t.tokens_per_s / run.layout.gpus / run.tokens_per_s_per_gpu - 1


def summary(errors):
    size = [abs(e) for e in errors]
    within = sum(s <= 0.20 for s in size)
    return f"median {statistics.median(size):5.1%}, largest {max(size):5.1%}, within ±20 %: {within} of {len(size)}"


best = _golden(lambda f: statistics.fmean(abs(math.log(1 + error(r, f))) for r in runs), 0.2, 1.0)
print(f"{len(runs)} published runs, predicted tokens/s per GPU against the published")
print(f"  compute at one fraction of the peak ({best:.3f}, fitted): {summary([error(r, best) for r in runs])}")
print(f"  compute kernel by kernel (shipped constants):   {summary([error(r, None) for r in runs])}")
print("missed most by one fraction        one fraction  kernels  GEMMs  attention  memory-bound")
for run in sorted(runs, key=lambda r: -abs(error(r, best)))[:10]:
    k = step_time(run.workload, run.layout, run.cluster)
    shares = "".join(
        f"{part / k.total:>{width}.0%}" for part, width in ((k.gemm, 7), (k.attention, 11), (k.memory, 14))
    )
    print(f"{run.id:<34} {error(run, best):>+12.1%} {error(run, None):>+8.1%}{shares}")
