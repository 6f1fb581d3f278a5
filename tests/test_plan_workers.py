"""A layout search split over processes (``engine.search.workers``) finds the plan one process finds: the same
layouts fit, in the same order, with the same figures, the same closest miss and the same refusal."""

import multiprocessing
import os
import threading

import pytest

from lmcalc.engine.search import workers
from lmcalc.engine.search.plan import Pins, plan
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.cli  # it starts processes

BF16, ADAMW = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec


def base(model: str, seq: int = 4096) -> Workload:
    return Workload(resolve_model(model).spec, BF16, ADAMW, seq, framework=framework_profile("megatron"))


def figures(found):
    return [(c.layout, c.workload, c.memory_total, c.tokens_per_s, c.mfu, c.step_s) for c in found.fitting]


@pytest.mark.parametrize(
    "model,gpus,sequences",
    [("llama-3.1-8b", "2x8xH100", 64), ("qwen3-30b-a3b", "4x8xH100", 128), ("mixtral-8x7b", "2x8xH100", 32)],
)
def test_a_split_search_finds_the_same_plan(model, gpus, sequences):
    cluster = parse_cluster(gpus)
    one = plan(base(model), cluster, sequences, Pins(), workers=1)
    three = plan(base(model), cluster, sequences, Pins(), workers=3)
    assert three.evaluated == one.evaluated > 0
    assert figures(three) == figures(one)
    # what the workers sent back as figures is what their memory and step time say when asked in full
    best, again = three.fitting[0], one.fitting[0]
    assert best.memory.total == again.memory.total == best.memory_total
    assert best.time.tokens_per_s == again.time.tokens_per_s == best.tokens_per_s
    assert best.time.mfu == again.time.mfu == best.mfu
    assert best.time.total == again.time.total == best.step_s


def test_a_split_search_keeps_the_closest_miss_and_the_refusal():
    cluster = parse_cluster("1x8xH100")
    model = base("llama-3.1-70b", 8192)  # 70B on one node of 8: nothing fits at a 64-sequence batch, TP ≤ 8
    one = plan(model, cluster, 64, Pins(recompute="none"), workers=1)
    two = plan(model, cluster, 64, Pins(recompute="none"), workers=2)
    assert not one.fitting and not two.fitting
    assert (two.closest.layout, two.closest.memory_total) == (one.closest.layout, one.closest.memory_total)
    with pytest.raises(LmcalcError, match="EP=2 needs a mixture-of-experts model") as single:
        plan(base("llama-3.1-8b"), cluster, 8, Pins(ep=2), workers=1)
    with pytest.raises(LmcalcError, match="EP=2 needs a mixture-of-experts model") as split:
        plan(base("llama-3.1-8b"), cluster, 8, Pins(ep=2), workers=2)
    assert str(split.value) == str(single.value)


def test_parts_merge_in_the_searchs_order():
    # the first of the deepest pipeline's refusals, and the first of the smallest overflows, whatever part holds them
    from lmcalc.engine.search.plan import _merged, _Part

    cluster = parse_cluster("1x8xH100")
    refused = [_Part(refusal=(2, "pp 2")), _Part(refusal=(8, "first at pp 8")), _Part(refusal=(8, "second at pp 8"))]
    with pytest.raises(LmcalcError, match="first at pp 8"):
        _merged(refused, cluster)
    one = plan(base("llama-3.1-70b", 8192), cluster, 64, Pins(recompute="none"), workers=1).closest
    tied = [_Part(evaluated=1), _Part(evaluated=1, closest=one), _Part(evaluated=1, closest=one)]
    merged = _merged(tied, cluster)
    assert merged.closest is one and merged.evaluated == 3


def test_small_searches_and_threaded_callers_search_in_one_process(monkeypatch):
    monkeypatch.setattr(workers, "cores", lambda: 4)
    assert workers.search_workers(workers.PARALLEL_FROM - 1) == 1
    assert workers.search_workers(workers.PARALLEL_FROM) == 4
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:  # forking a process that runs other threads is unsafe
        assert workers.search_workers(workers.PARALLEL_FROM) == 1
    finally:
        stop.set()
        thread.join()


def _each_takes_one(barrier):
    """A job whose first two runs wait for each other: with two processes, each takes one of the first two jobs."""

    def work(job):
        if job < 2:
            barrier.wait(timeout=60)
        return job, os.getpid()

    return work


def test_balanced_jobs_run_once_each_in_order_and_only_a_forked_process_sends():
    barrier = multiprocessing.get_context("fork").Barrier(2)
    results = workers.run_balanced(
        _each_takes_one(barrier), 12, 2, pack=lambda r: ("sent", *r), unpack=lambda p: (*p[1:], "unpacked")
    )
    assert [r[0] for r in results] == list(range(12))
    mine = [r for r in results if r[1] == os.getpid()]
    theirs = [r for r in results if r[1] != os.getpid()]
    assert mine and theirs
    assert all(len(r) == 2 for r in mine) and all(r[2] == "unpacked" for r in theirs)


def test_a_worker_that_fails_or_dies_is_reported_in_one_line():
    parent = os.getpid()
    context = multiprocessing.get_context("fork")

    def failing(barrier):
        def work(job):
            _each_takes_one(barrier)(job)
            if os.getpid() != parent:
                raise LmcalcError("DP=3 does not divide the batch")
            return job

        return work

    def dying(barrier):
        def work(job):
            _each_takes_one(barrier)(job)
            if os.getpid() != parent:
                os._exit(3)
            return job

        return work

    with pytest.raises(LmcalcError, match="DP=3 does not divide the batch"):
        workers.run_balanced(failing(context.Barrier(2)), 6, 2, pack=lambda r: r, unpack=lambda p: p)
    with pytest.raises(LmcalcError, match=r"ended without its results \(exit code 3\)"):
        workers.run_balanced(dying(context.Barrier(2)), 6, 2, pack=lambda r: r, unpack=lambda p: p)
