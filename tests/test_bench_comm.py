"""bench-comm: nccl-tests' bandwidth definitions, size parsing, and a real 2-process gloo run on loopback."""

import json
from dataclasses import asdict
from io import StringIO

import pytest

from lmcalc.bench import comm
from lmcalc.errors import LmcalcError

K, M = 2**10, 2**20


# nccl-tests doc/PERFORMANCE.md, written out by hand: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n.
@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all-reduce", 1, 0.0),
        ("all-reduce", 2, 1.0),
        ("all-reduce", 4, 1.5),
        ("all-reduce", 8, 1.75),
        ("all-gather", 2, 0.5),
        ("all-gather", 4, 0.75),
        ("all-gather", 8, 0.875),
        ("reduce-scatter", 2, 0.5),
        ("reduce-scatter", 8, 0.875),
    ],
)
def test_busbw_factor_is_nccl_tests(op, n, factor):
    assert comm.busbw_factor(op, n) == pytest.approx(factor, rel=1e-15)


def test_busbw_factor_rejects_unknown_op():
    with pytest.raises(LmcalcError, match="all-to-all"):
        comm.busbw_factor("all-to-all", 4)


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("1M..4M", [M, 2 * M, 4 * M]),
        ("1M", [M]),
        ("1M,16M", [M, 16 * M]),
        ("64K, 1M..2M", [64 * K, M, 2 * M]),
        ("1k..1K", [K]),
        ("1MiB,1M,4096B,8", [M, 4096, 8]),
        ("1G", [2**30]),
        ("1M..1G", [2**k for k in range(20, 31)]),
    ],
)
def test_parse_sizes(text, sizes):
    assert comm.parse_sizes(text) == sizes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no message sizes"),
        ("abc", "cannot read message size 'abc'"),
        ("1.5M", "cannot read message size"),
        ("-1M", "cannot read message size"),
        ("1X", "cannot read message size"),
        ("0", "at least 1 byte"),
        ("1MB", "ambiguous"),
        ("4M..1M", "backwards"),
        ("1M..3M", "doubled"),
        ("1M..", "FIRST..LAST"),
        ("1M..2M..4M", "FIRST..LAST"),
        ("1M,,2M", "cannot read message size ''"),
    ],
)
def test_parse_sizes_rejects(text, message):
    with pytest.raises(LmcalcError, match=message):
        comm.parse_sizes(text)


def test_size_label():
    assert [comm.size_label(s) for s in (64 * K, M, 3 * M, 2**30, 1000)] == ["64K", "1M", "3M", "1G", "1000"]


def test_element_count_rounds_to_rank_count_like_nccl_tests():
    assert comm.element_count("all-reduce", 1000, 3) == 250
    assert comm.element_count("all-gather", 1000, 3) == 249  # 250 fp32 elements, rounded down to 3 ranks
    with pytest.raises(LmcalcError, match="too small"):
        comm.element_count("reduce-scatter", 8, 4)


def test_bad_arguments_fail_before_spawning():
    with pytest.raises(LmcalcError, match="unknown collective"):
        comm.run_collectives("broadcast", [M], 2)
    with pytest.raises(LmcalcError, match="--backend"):
        comm.run_collectives("all-reduce", [M], 2, backend="mpi")
    with pytest.raises(LmcalcError, match="--world-size"):
        comm.run_collectives("all-reduce", [M], 0)


def test_expected_output_is_the_sum_or_concatenation_of_rank_inputs():
    torch = pytest.importorskip("torch")
    cpu = torch.device("cpu")
    inputs = [comm.rank_input("all-reduce", 6, 2, r, "fp32", cpu) for r in range(2)]
    assert not torch.equal(inputs[0], inputs[1])
    assert torch.equal(comm.expected_output("all-reduce", 6, 2, 1, "fp32", cpu), inputs[0] + inputs[1])
    assert torch.equal(comm.expected_output("reduce-scatter", 6, 2, 1, "fp32", cpu), (inputs[0] + inputs[1])[3:])
    halves = [comm.rank_input("all-gather", 6, 2, r, "fp32", cpu) for r in range(2)]
    assert halves[0].numel() == 3
    assert torch.equal(comm.expected_output("all-gather", 6, 2, 0, "fp32", cpu), torch.cat(halves))


def _gloo_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not (dist.is_available() and dist.is_gloo_available()):
        return False
    try:
        comm.loopback_interface()
    except LmcalcError:
        return False
    return True


@pytest.fixture(scope="module")
def gloo_run():
    """One spawn of 2 gloo processes on loopback: all-reduce and all-gather at 64K and 1M."""
    if not _gloo_available():
        pytest.skip("torch.distributed with gloo (and a loopback interface) is not available")
    return comm.run_collectives(["all-reduce", "all-gather"], [64 * K, M], 2, "gloo", warmup=2, repeats=5)


def test_gloo_two_processes(gloo_run):
    assert [(m.op, m.size_bytes) for m in gloo_run] == [
        ("all-reduce", 64 * K),
        ("all-reduce", M),
        ("all-gather", 64 * K),
        ("all-gather", M),
    ]
    hand_factor = {"all-reduce": 2 * (2 - 1) / 2, "all-gather": (2 - 1) / 2}
    for m in gloo_run:
        assert (m.world_size, m.backend, m.launcher, m.device, m.repeats) == (2, "gloo", "spawn", "cpu", 5)
        # The checked call matched the locally computed sum (all-reduce: a + b is exact in fp32) or the
        # concatenation (all-gather), on every rank.
        assert m.max_error == 0.0
        assert 0 < m.fastest_s <= m.median_s <= m.slowest_s
        assert m.mean_s > 0 and len(m.rank_medians_s) == 2 and all(t > 0 for t in m.rank_medians_s)
        assert m.median_s >= max(m.rank_medians_s)  # the median of per-repeat maxima bounds each rank's median
        assert m.algbw_gbps == pytest.approx(m.size_bytes / m.median_s / 1e9, rel=1e-12)
        assert m.busbw_gbps == pytest.approx(m.algbw_gbps * hand_factor[m.op], rel=1e-12)


def test_comm_result_and_records(gloo_run):
    from lmcalc.render import print_table

    result = comm.comm_result(gloo_run)
    assert (result.command, result.layout) == ("bench-comm", "grid")
    assert [s.key for s in result.sections] == ["all-reduce-64K", "all-reduce-1M", "all-gather-64K", "all-gather-1M"]
    for section, m in zip(result.sections, gloo_run, strict=True):
        assert [(t.key, t.unit) for t in section.terms] == [
            ("size", "bytes"),
            ("time", "s"),
            ("algbw", "GB/s"),
            ("busbw", "GB/s"),
        ]
        assert section.term("size").value == m.size_bytes
        assert section.term("time").value == m.median_s
        assert section.term("busbw").value == pytest.approx(section.term("algbw").value * m.factor)
    inputs = {i.key: i.value for i in result.inputs}
    assert inputs["world_size"] == 2 and inputs["backend"] == "gloo" and inputs["repeats"] == 5
    notes = " ".join(result.notes)
    assert "nccl-tests" in notes and "PERFORMANCE.md" in notes and "loopback" in notes
    json.dumps(result.as_json())
    out = StringIO()
    print_table(result, out)
    assert "busbw" in out.getvalue()

    single = comm.comm_result(gloo_run[:2])
    assert [s.key for s in single.sections] == ["64K", "1M"]

    saved = comm.records(gloo_run, "CPU")
    assert [r.kind for r in saved] == ["comm"] * 4
    assert saved[1].figures["busbw_gbps"] == gloo_run[1].busbw_gbps
    assert saved[1].figures["size_bytes"] == M and saved[1].dtype == "fp32"
    json.dumps([asdict(r) for r in saved])
