"""The benchmark results file (lmcalc/bench/results.py), issue 18 items 9 and 14: saves from many processes at once
keep every record; a file is checked as it is read, and a figure implausible for its GPU is refused where an estimate
would use it. None of this needs torch."""

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from lmcalc.bench import results
from lmcalc.bench.results import Record
from lmcalc.errors import LmcalcError

PROCESSES, SAVES = 8, 25
WHEN = "2026-11-01T00:00:00+00:00"


def run(args, capsys):
    from lmcalc.cli import main  # here, not at the top: each process of the concurrency test imports this module

    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def one_line_error(code, out, err):
    """An error as the command line gives it: exit code 2, nothing on stdout, one line on stderr, no traceback."""
    assert (code, out) == (2, ""), err
    assert err.startswith("lmcalc: error: ") and err.count("\n") == 1 and "internal error" not in err, err
    return err.removeprefix("lmcalc: error: ").rstrip("\n")


def _save_in_turn(path: str, start, writer: int) -> None:
    """One process: wait until all have started, then save ``SAVES`` records one at a time, numbered."""
    start.wait()
    for number in range(1, SAVES + 1):
        figures = {"bytes_per_s": 1e9, "size": number}
        results.save(Path(path), [Record("memory", f"process {writer}", None, None, figures)])


@pytest.mark.cli
def test_concurrent_saves_keep_every_record(tmp_path):
    # Eight processes save 25 records each into one file, all at once. Each save reads the file, adds its record
    # and renames a new file into place; without a lock across the three, two saves read the same file and the
    # second rename drops the first one's record (before the lock: 31 to 34 of 200 kept, and 3 to 7 of 8 for one
    # save each). With it: 200 of 200, each process's records in the order it saved them.
    path = tmp_path / "bench.json"
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(PROCESSES)
    workers = [spawn.Process(target=_save_in_turn, args=(str(path), start, w)) for w in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    saved = results.load(path)
    assert len(saved) == PROCESSES * SAVES
    for w in range(PROCESSES):
        assert [r.figures["size"] for r in saved if r.device == f"process {w}"] == list(range(1, SAVES + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.json.lock"]  # no temporary left


def record(kind="matmul", hardware="h100-sxm", dtype="bf16", **figures):
    return {"kind": kind, "device": "GPU", "hardware": hardware, "dtype": dtype, "figures": figures, "when": WHEN}


def write(path: Path, *records, text: str | None = None) -> Path:
    path.write_text(text if text is not None else json.dumps({"lmcalc_bench": 1, "records": list(records)}))
    return path


def test_a_file_lmcalc_wrote_reads_back_as_it_was(tmp_path):
    # every kind with the figures its commands write; optional figures may be null (JSON has no NaN)
    written = [
        Record("matmul", "H100", "h100-sxm", "bf16", {"shape": [8192] * 3, "flops_per_s": 7.9e14, "tf32": False}),
        Record("model", "H100", "h100-sxm", "bf16", {"model": "llama-3.1-8b", "flops_per_s": 6.5e14}),
        Record("memory", "AMD EPYC", None, None, {"bytes_per_s": 2.5e10, "size": 2**28}),
        Record(
            "comm",
            "cpu",
            None,
            "fp32",
            {"op": "all-reduce", "backend": "gloo", "world_size": 1, "size_bytes": 2**20, "busbw_gbps": 0.0},
        ),
        Record("step", "AMD EPYC", None, "fp32", {"model": "gpt2-124m", "hardware_flops_per_step": 1e11, "hfu": None}),
    ]
    path = tmp_path / "bench.json"
    results.save(path, written)
    assert results.load(path) == written


BAD_RECORDS = [
    (record(flops_per_s=0), "record 1 (matmul): figures.flops_per_s must be a positive finite number; got 0"),
    (record(flops_per_s=-7.9e14), "figures.flops_per_s must be a positive finite number; got -790000000000000.0"),
    (record(flops_per_s="7.9e14"), 'figures.flops_per_s must be a positive finite number; got "7.9e14"'),
    (record(flops_per_s=True), "figures.flops_per_s must be a positive finite number; got true"),
    (record(), "record 1 (matmul): figures.flops_per_s is missing; it must be a positive finite number"),
    (record(flops_per_s=None), "figures.flops_per_s must be a positive finite number; got null"),
    (record("step", model="llama-3.1-8b"), "figures.hardware_flops_per_step is missing; it must be a positive"),
    (record("step", model="x", hardware_flops_per_step=1e14, hfu=0), "figures.hfu must be a positive finite number"),
    (record("comm", op="all-reduce", backend="nccl", world_size=8.5, size_bytes=1, busbw_gbps=1.0), "world_size must"),
    (record("gemm", flops_per_s=1e14), "record 1: kind must be one of matmul, model, memory, comm, step; got"),
    (record(hardware=5, flops_per_s=1e14), "record 1: hardware must be a hardware preset name or null; got 5"),
    ({**record(flops_per_s=1e14), "peak": 1}, "record 1 has an unknown field 'peak'; a record has kind, device,"),
    (
        {**record(flops_per_s=1e14), "figures": [1e14]},
        "record 1: figures must be an object of figures; got [100000000000000.0]",
    ),
    ([1, 2], "record 1 must be an object of kind, device, hardware, dtype, figures, when, software; got [1, 2]"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_RECORDS)
def test_a_bad_record_is_refused_naming_the_file_record_and_field(bad, message, tmp_path):
    # the second record is the bad one when the first is good: the message counts from 1
    path = write(tmp_path / "bench.json", bad)
    with pytest.raises(LmcalcError) as error:
        results.load(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    write(path, record(flops_per_s=1e14), bad)
    with pytest.raises(LmcalcError, match="record 2"):
        results.load(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"lmcalc_bench": 1, "records": [{"figures": {"flops_per_s": NaN}}]}', "got nan"),
        ('{"lmcalc_bench": 1, "records": [{"figures": {"flops_per_s": 1e400}}]}', "got inf"),
        ('{"lmcalc_bench": 1, "records": {}}', '"records" must be a list of records; got {}'),
        ('{"lmcalc_bench": 2, "records": []}', 'is not an lmcalc benchmark file (expected "lmcalc_bench": 1)'),
        ("[" * 100_000, "is nested too deeply to be a benchmark results file"),
        ("{not json", "is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ],
)
def test_a_file_that_is_not_a_results_file_is_refused(text, message, tmp_path):
    kept = {"kind": "matmul", "device": "GPU", "hardware": None, "dtype": "bf16"}
    path = tmp_path / "bench.json"
    path.write_text(text.replace('{"figures"', "{" + json.dumps(kept)[1:-1] + ', "figures"'))
    with pytest.raises(LmcalcError) as error:
        results.load(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


def test_a_file_that_cannot_be_one_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    path = tmp_path / "bench.json"
    path.write_bytes(b'{"lmcalc_bench": 1, "records": [], "device": "\xff"}')
    with pytest.raises(LmcalcError, match="is not UTF-8 text, so not a benchmark results file"):
        results.load(path)
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 2**20)
    path.write_bytes(b" " * (2**20 + 1))
    with pytest.raises(LmcalcError, match="is larger than 1 MiB, so not a benchmark results file"):
        results.load(path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading one would wait for a writer for ever
    with pytest.raises(LmcalcError, match="fifo.json is not a regular file, not a benchmark results file"):
        results.load(fifo)


def test_a_save_onto_a_bad_file_leaves_it_as_it_was(tmp_path):
    path = write(tmp_path / "bench.json", record(flops_per_s=0))
    before = path.read_text()
    with pytest.raises(LmcalcError, match="figures.flops_per_s must be"):
        results.save(path, [Record("matmul", "H100", "h100-sxm", "bf16", {"flops_per_s": 7.9e14})])
    assert path.read_text() == before


TRAIN_TIME = "train-time -m llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5 --json --calibration"
PLAN = "plan -m llama-3.1-8b --gpus 8xH100 --seq 4096 --global-batch 1M --top 1 --json --calibration"


@pytest.mark.parametrize(
    ("flops", "message"),
    [
        (0, "record 1 (matmul): figures.flops_per_s must be a positive finite number; got 0"),
        (None, "record 1 (matmul): figures.flops_per_s is missing; it must be a positive finite number"),
        (
            1e300,
            f"record 1 (matmul on h100-sxm, {WHEN}): figures.flops_per_s 1e+300 FLOP/s is not plausible on h100-sxm; "
            "accepted: up to 1.237e+15 (25 % above its dense bf16 peak of 9.895e+14)",
        ),
    ],
)
def test_train_time_refuses_a_measured_peak_that_cannot_be(flops, message, tmp_path, capsys):
    # 1e300 FLOP/s gave 1.8e-283 days; 0 a ZeroDivisionError, and no figure a KeyError. The bound is the preset's
    # dense bf16 peak, 989.5 TFLOP/s, and 25 % more (results.RATE_MARGIN): 1.236875e15 FLOP/s.
    path = write(tmp_path / "bench.json", record(flops_per_s=flops) if flops is not None else record())
    assert one_line_error(*run(f"{TRAIN_TIME} {path}", capsys)) == f"{path}: {message}"


def test_a_measured_peak_up_to_the_margin_is_taken(tmp_path, capsys):
    limit = 989.5e12 * (1 + results.RATE_MARGIN)
    path = write(tmp_path / "bench.json", record(flops_per_s=limit))
    code, out, _ = run(f"{TRAIN_TIME} {path}", capsys)
    assert code == 0 and json.loads(out)["results"]["time"]["peak_per_gpu"]["value"] == limit
    write(path, record(flops_per_s=limit * 1.001))
    assert "is not plausible on h100-sxm" in one_line_error(*run(f"{TRAIN_TIME} {path}", capsys))


def step(hfu):
    return record("step", model="llama-3.1-8b", hardware_flops_per_step=4e14, hfu=hfu)


def test_plan_refuses_a_measured_efficiency_above_one(tmp_path, capsys):
    # an HFU of 7.5 gave "MFU 726 %"; an efficiency is a fraction of the dense peak, in (0, 1]
    path = write(tmp_path / "bench.json", step(7.5))
    assert one_line_error(*run(f"{PLAN} {path}", capsys)) == (
        f"{path}: record 1 (step on h100-sxm, {WHEN}): figures.hfu 7.5 is not an efficiency; accepted: a fraction "
        "of the dense peak in (0, 1]"
    )
    write(path, step(1.0))
    code, out, _ = run(f"{PLAN} {path}", capsys)
    assert code == 0 and json.loads(out)["inputs"]["efficiency"]["value"] == 1.0


@pytest.mark.parametrize(
    ("busbw", "accepted"),
    [(0.0, "above 0 and up to 900 (2 × its 450 GB/s link)"), (5000.0, "above 0 and up to 900 (2 × its 450 GB/s link)")],
)
def test_plan_refuses_a_measured_bus_bandwidth_that_cannot_be(busbw, accepted, tmp_path, capsys):
    # 8 ranks of NVLink: the bus bandwidth is above 0, and not beyond twice H100's 450 GB/s link (NVLink SHARP
    # reaches ~480 GB/s; results.BUSBW_MARGIN)
    comm = record("comm", op="all-reduce", backend="nccl", world_size=8, size_bytes=2**30, busbw_gbps=busbw)
    path = write(tmp_path / "bench.json", record(flops_per_s=7e14), comm)
    message = one_line_error(*run(f"{PLAN} {path} --peak measured", capsys))
    assert message.startswith(f"{path}: record 2 (comm on h100-sxm, {WHEN}): figures.busbw_gbps {busbw:g} GB/s over 8")
    assert message.endswith(f"is not plausible on h100-sxm; accepted: {accepted}")
