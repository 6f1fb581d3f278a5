"""``lmcalc bench comm``: collective bandwidth measured with torch.distributed, reported as nccl-tests does.

What is reported (NVIDIA nccl-tests, doc/PERFORMANCE.md and the ``GetBw`` functions in src/*.cu; the
reference notes ``hardware_facts.yaml`` section ``methods.nccl_tests``):

    algbw = S / t                   S in bytes, t in seconds, GB = 1e9 bytes
    busbw = algbw × factor          all-reduce 2(n−1)/n; all-gather and reduce-scatter (n−1)/n

S is the buffer for all-reduce, and the whole array for all-gather (n × each rank's input) and
reduce-scatter (n × each rank's output). busbw is what a ring puts over each rank's busiest link, so it
can be compared with one link's bandwidth whatever the number of ranks (the model of
``lmcalc.engine.time.comm``).

The parts, each knowing nothing of the others' workings:

* ``sizes``: message sizes as nccl-tests reads them (``1M..1G``).
* ``measurement``: what is measured (``CommSettings``, ``Collective``) and the definitions above
  (``busbw_factor``, ``CommMeasurement``).
* ``ranks``: measuring on one rank of a running process group: random inputs, one call checked against
  values each rank recomputes locally (nccl-tests' ``-c``), then ``warmup`` untimed calls and ``repeats``
  timed ones through ``lmcalc.bench.timing.time_calls``, each after a barrier. t is the **median over
  repeats of the slowest rank's time in that repeat**: a collective is finished only when its last rank is.
  nccl-tests instead averages one loop of iterations over ranks, so its t can be a little lower; that mean
  is kept too (``mean_s``).
* ``launch``: under ``torchrun`` every rank measures and rank 0 reports; otherwise local processes are
  spawned, meeting through a file store on the loopback interface only.
* ``report``: the result (one row per size) and the records to save.

No module here imports torch at import time: size parsing, the factors and the result need none.
"""

from lmcalc.bench.choices import BACKENDS, COMM_DTYPES, OPS
from lmcalc.bench.comm.launch import launched_by_torchrun, loopback_interface, run_collectives
from lmcalc.bench.comm.measurement import (
    SOURCE,
    Collective,
    CommMeasurement,
    CommSettings,
    busbw_factor,
    element_count,
)
from lmcalc.bench.comm.ranks import expected_output, rank_input
from lmcalc.bench.comm.report import comm_result, records
from lmcalc.bench.comm.sizes import SIZE_UNITS, parse_size, parse_sizes, size_label

__all__ = [
    "BACKENDS",
    "COMM_DTYPES",
    "OPS",
    "SIZE_UNITS",
    "SOURCE",
    "Collective",
    "CommMeasurement",
    "CommSettings",
    "busbw_factor",
    "comm_result",
    "element_count",
    "expected_output",
    "launched_by_torchrun",
    "loopback_interface",
    "parse_size",
    "parse_sizes",
    "rank_input",
    "records",
    "run_collectives",
    "size_label",
]
