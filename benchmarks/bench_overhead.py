"""Does `lmcalc bench` add overhead of its own? Its matmul measurement against a bare torch.matmul loop.

Both time the same shape on the CPU in the same run, alternating, rotating through the same number of
input buffers (lmcalc rotates buffers larger than the cache, so the cache is not what is measured), and
the script prints the ratio of the medians. Target: within 5 %. A third loop that reuses one pair of
inputs, hot in the cache, shows how much the rotation itself changes the figure.
    python benchmarks/bench_overhead.py [--shape 512x512x512] [--rounds 5]
"""

import argparse
import statistics
import time

import torch

from lmcalc.bench import matmul
from lmcalc.bench.device import detect
from lmcalc.units import parse_shape


def bare_median(m: int, n: int, k: int, repeats: int, buffers: int) -> float:
    """The simplest honest loop: random inputs, a few warm-up calls, each call timed alone."""
    pairs = [(torch.randn(m, k), torch.randn(k, n)) for _ in range(buffers)]
    for i in range(5):
        torch.matmul(*pairs[i % buffers])
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        torch.matmul(*pairs[i % buffers])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="512x512x512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    m, n, k = parse_shape(args.shape)
    cpu = detect("cpu")
    buffers, _ = matmul._operands(m, n, k, "fp32", cpu)
    lmcalc_s, bare_s, hot_s = [], [], []
    for _ in range(args.rounds):  # alternate, so drift in the machine's load hits all alike
        settings = matmul.MatmulSettings("fp32", 5, args.repeats)
        lmcalc_s.append(matmul.measure((m, n, k), settings, cpu).stats.median)
        bare_s.append(bare_median(m, n, k, args.repeats, buffers))
        hot_s.append(bare_median(m, n, k, args.repeats, 1))
    lm, bare, hot = (statistics.median(x) for x in (lmcalc_s, bare_s, hot_s))
    flops = 2 * m * n * k
    print(f"shape {m}x{n}x{k} fp32 on {cpu.name}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"lmcalc bench:      median {lm * 1e3:.3f} ms  ({flops / lm / 1e9:.1f} GFLOP/s)")
    print(
        f"bare torch.matmul, same {buffers} rotating buffers: median {bare * 1e3:.3f} ms  "
        f"({flops / bare / 1e9:.1f} GFLOP/s)"
    )
    print(f"ratio lmcalc / bare: {lm / bare:.3f}  (target within 5 %)")
    print(
        f"for reference, one pair hot in the cache: median {hot * 1e3:.3f} ms ({flops / hot / 1e9:.1f} GFLOP/s); "
        f"rotating buffers lowers throughput by {1 - hot / bare:.1%} at this shape"
    )


if __name__ == "__main__":
    main()
