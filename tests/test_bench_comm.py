"""bench-comm: nccl-tests' bandwidth definitions, size parsing, and a real 2-process gloo run on loopback."""

import json
from dataclasses import asdict
from io import StringIO

import pytest

from lmcalc.bench import comm
from lmcalc.errors import LmcalcError

pytestmark = pytest.mark.torch

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
        comm.CommSettings("broadcast", [M])
    # the library names the setting by its keyword; the command line says --dtype (below)
    with pytest.raises(LmcalcError, match="^dtype for collectives"):
        comm.CommSettings("all-reduce", [M], dtype="fp64")
    with pytest.raises(LmcalcError, match="no message sizes"):
        comm.CommSettings("all-reduce", [])
    with pytest.raises(LmcalcError, match="^backend must be one of"):
        comm.run_collectives(comm.CommSettings("all-reduce", [M]), 2, backend="mpi")
    with pytest.raises(LmcalcError, match="^world_size must be a positive number"):
        comm.run_collectives(comm.CommSettings("all-reduce", [M]), 0)


def test_settings_read_collectives_as_the_command_line_writes_them():
    settings = comm.CommSettings(["All_Reduce", " all-gather", "all-reduce"], [M, 64 * K])
    assert settings.ops == ("all-reduce", "all-gather") and settings.sizes == (M, 64 * K)


def test_expected_output_is_the_sum_or_concatenation_of_rank_inputs():
    torch = pytest.importorskip("torch")
    cpu = torch.device("cpu")
    inputs = [comm.rank_input(comm.Collective("all-reduce", 6, 2), r, cpu) for r in range(2)]
    assert not torch.equal(inputs[0], inputs[1])
    assert torch.equal(comm.expected_output(comm.Collective("all-reduce", 6, 2), 1, cpu), inputs[0] + inputs[1])
    scatter = comm.Collective("reduce-scatter", 6, 2)
    assert torch.equal(comm.expected_output(scatter, 1, cpu), (inputs[0] + inputs[1])[3:])
    gather = comm.Collective("all-gather", 6, 2)
    halves = [comm.rank_input(gather, r, cpu) for r in range(2)]
    assert halves[0].numel() == 3
    assert torch.equal(comm.expected_output(gather, 0, cpu), torch.cat(halves))
    assert comm.rank_input(comm.Collective("all-reduce", 6, 2, "bf16"), 0, cpu).dtype == torch.bfloat16


def _measured(op: str, size_bytes: int, n: int, median_s: float) -> comm.CommMeasurement:
    """A measurement with chosen figures, for checking the definitions by hand."""
    return comm.CommMeasurement(
        op=op,
        size_bytes=size_bytes,
        requested_bytes=size_bytes,
        world_size=n,
        backend="nccl",
        launcher="torchrun",
        device="cuda",
        dtype="fp32",
        warmup=5,
        repeats=20,
        median_s=median_s,
        fastest_s=median_s / 2,
        slowest_s=2 * median_s,
        mean_s=median_s,
        rank_medians_s=(median_s,) * n,
        max_error=0.0,
    )


# nccl-tests doc/PERFORMANCE.md: algbw = S / t, busbw = algbw · 2(n−1)/n (all-reduce), · (n−1)/n (all-gather,
# reduce-scatter); GB = 1e9 bytes. Each row worked by hand:
#   all-reduce of 1 MiB over 4 ranks in 0.5 ms: 1,048,576 / 0.0005 / 1e9 = 2.097152 GB/s; × 2·3/4 = 3.145728
#   all-gather of 8 MiB over 8 ranks in 2 ms:   8,388,608 / 0.002 / 1e9 = 4.194304 GB/s; × 7/8 = 3.670016
#   reduce-scatter of 64 KiB over 2 ranks in 0.1 ms: 65,536 / 0.0001 / 1e9 = 0.65536 GB/s; × 1/2 = 0.32768
@pytest.mark.parametrize(
    ("op", "size", "n", "seconds", "algbw", "busbw"),
    [
        ("all-reduce", M, 4, 5e-4, 2.097152, 3.145728),
        ("all-gather", 8 * M, 8, 2e-3, 4.194304, 3.670016),
        ("reduce-scatter", 64 * K, 2, 1e-4, 0.65536, 0.32768),
    ],
)
def test_algbw_and_busbw_by_hand(op, size, n, seconds, algbw, busbw):
    m = _measured(op, size, n, seconds)
    assert m.algbw_gbps == pytest.approx(algbw, rel=1e-12)
    assert m.busbw_gbps == pytest.approx(busbw, rel=1e-12)
    section = comm.comm_result([m]).sections[0]
    assert section.term("algbw").value == pytest.approx(algbw, rel=1e-12)
    assert section.term("busbw").value == pytest.approx(busbw, rel=1e-12)
    (record,) = comm.records([m], "GPU")
    assert record.figures["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
    assert record.figures["busbw_gbps"] == pytest.approx(busbw, rel=1e-12)


# nccl-tests' src/all_gather.cu (AllGatherGetCollByteCount: sendcount = count/nranks, recvcount =
# (count/nranks)*nranks; reduce_scatter.cu alike) sizes these two by the per-rank count in integer division, and
# S is the whole array. 1,000 bytes of fp32 over 3 ranks: 1000 / 4 = 250 elements, 250 // 3 = 83 a rank,
# S = 83 × 3 × 4 = 996 bytes. Timed at 4 µs: algbw = 996 / 4e-6 / 1e9 = 0.249 GB/s (the 1,000 bytes asked for
# would read 0.25), busbw = 0.249 × 2/3 = 0.166.
@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
def test_algbw_counts_the_bytes_moved_after_rounding_to_the_ranks(op, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from lmcalc.bench.comm import ranks

    timed = []

    def fake_timed(collective, settings, device):  # 3 ranks, every repeat 4 µs: no process group needed
        timed.append(collective)
        return None, [[4e-6] * settings.repeats] * collective.world_size

    monkeypatch.setattr(dist, "get_world_size", lambda *args, **kwargs: 3)
    monkeypatch.setattr(ranks, "_timed", fake_timed)
    settings = comm.CommSettings(op, [1000], warmup=0, repeats=3)
    (m,) = ranks.measure_all(settings, torch.device("cpu"), "gloo", "spawn")
    # the collective timed is the rounded one: 83 elements a rank, whether gathered from or scattered to it
    (collective,) = timed
    cpu = torch.device("cpu")
    held = comm.expected_output if op == "reduce-scatter" else comm.rank_input  # the scattered or gathered share
    per_rank = held(collective, 0, cpu)
    assert per_rank.numel() == 83
    assert (m.size_bytes, m.requested_bytes, m.world_size) == (996, 1000, 3)
    assert m.algbw_gbps == pytest.approx(0.249, rel=1e-12)
    assert m.busbw_gbps == pytest.approx(0.166, rel=1e-12)
    size = comm.comm_result([m]).sections[0].term("size")
    assert size.value == 996 and size.note == "1000 requested, rounded to 3 ranks"


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
    settings = comm.CommSettings(["all-reduce", "all-gather"], [64 * K, M], warmup=2, repeats=5)
    return comm.run_collectives(settings, 2, "gloo")


def test_gloo_two_processes(gloo_run):
    assert [(m.op, m.size_bytes) for m in gloo_run] == [
        ("all-reduce", 64 * K),
        ("all-reduce", M),
        ("all-gather", 64 * K),
        ("all-gather", M),
    ]
    for m in gloo_run:
        assert (m.world_size, m.backend, m.launcher, m.device, m.repeats) == (2, "gloo", "spawn", "cpu", 5)
        # The checked call matched the locally computed sum (all-reduce: a + b is exact in fp32) or the
        # concatenation (all-gather), on every rank.
        assert m.max_error == 0.0
        assert 0 < m.fastest_s <= m.median_s <= m.slowest_s
        assert m.mean_s > 0 and len(m.rank_medians_s) == 2 and all(t > 0 for t in m.rank_medians_s)
        assert m.median_s >= max(m.rank_medians_s)  # the median of per-repeat maxima bounds each rank's median
        # over 2 ranks busbw is algbw × 2·1/2 = algbw for all-reduce and algbw × 1/2 for all-gather
        assert m.busbw_gbps == pytest.approx({"all-reduce": 1.0, "all-gather": 0.5}[m.op] * m.algbw_gbps, rel=1e-12)


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
    assert saved[1].figures["median_s"] == gloo_run[1].median_s
    assert saved[1].figures["size_bytes"] == M and saved[1].dtype == "fp32"
    json.dumps([asdict(r) for r in saved])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "fp64"], "lmcalc: error: --dtype for collectives must be one of fp32, bf16, fp16; got 'fp64'"),
        (["--backend", "mpi"], "lmcalc: error: --backend must be one of auto, gloo, nccl; got 'mpi'"),
        (["--world-size", "0"], "lmcalc: error: --world-size must be a positive number of processes; got 0"),
    ],
)
def test_the_command_line_names_the_flags(args, message, capsys):
    from lmcalc.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "comm", "--sizes", "1M", "--no-save", *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == message
