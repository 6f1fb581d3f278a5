"""The answer first (#18 items 2 and 3): every accounting command prints its headline right under its title, before
the inputs; ``--brief`` prints only that; ``--json`` carries it; and the tables stay whole at 80 columns."""

from __future__ import annotations

import json
import re

import pytest

from lmcalc import api
from lmcalc.cli import main
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.units import column_format, format_quantity

COMMANDS = [
    "train-time -m llama-2-7b --gpus 64xH100 --tokens 2T --price-per-gpu-hour 2",
    "train-time -m llama-2-7b --gpu H100 --days 30 --tokens 2T",
    "memory -m llama-2-7b --gpus 8xH100 --zero 3",
    "memory -m llama-2-7b --gpus 8xH100 --pp 4 --stages",
    "memory -m llama-2-7b --gpus 8xH100 --zero 3 --sweep seq=1k,4k,16k,64k",
    "memory -m llama-3.1-70b --gpus 8xH100 --inference --context 32K --batch 8",
    "fit -m llama-2-7b --gpus 8xH100 --zero 3",
    "fit -m llama-2-7b --gpus 8xH100",
    "plan -m llama-3-8b --gpus 64xH100 --top 3",
    "max-params --gpus 8xH100",
    "flops -m llama-2-7b",
    "optimal --compute 1e24",
    "params -m llama-2-7b",
    "tensor 4096x4096 --dtype bf16",
]


def run(args: str, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.split()[:2]))
def test_the_headline_comes_first_and_brief_prints_it_alone(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one headline line a line of the terminal
    code, out, _ = run(command + " --json", capsys)
    headline = json.loads(out)["headline"]
    assert code == 0 and headline and all(headline)
    code, out, _ = run(command, capsys)
    lines = out.splitlines()
    assert code == 0 and lines[1 : 1 + len(headline)] == headline  # under the title, before the inputs table
    assert "Inputs" not in "\n".join(lines[: 1 + len(headline)])
    code, out, _ = run(command + " --brief", capsys)
    assert code == 0 and out.splitlines() == headline


@pytest.mark.parametrize("other", ["--json", "--explain"])
def test_brief_with_json_or_explain_is_refused_in_one_line(other, capsys):
    code, out, err = run(f"params -m llama-2-7b --brief {other}", capsys)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and f"without {other}" in err


def test_train_time_headline_is_six_n_d_over_the_cluster_by_hand(capsys):
    # Llama 2 7B (6,738,415,616 parameters, Touvron et al. 2023) on 2T tokens, 64 H100 SXM at 989.5 TFLOP/s dense
    # bf16 (NVIDIA's spec sheet) and MFU 0.4: 6·N·D / (64 · 989.5e12 · 0.4) / 86,400 days
    seconds = 6 * 6_738_415_616 * 2e12 / (64 * 989.5e12 * 0.4)
    _, out, _ = run("train-time -m llama-2-7b --gpus 64xH100 --tokens 2T --price-per-gpu-hour 2 --brief", capsys)
    gpu_hours = 64 * seconds / 3600
    assert f"{seconds / 86_400:.2f} days" in out
    assert f"{gpu_hours:,.0f} GPU-hours" in out and f"${2 * gpu_hours:,.0f}" in out
    assert "t CO2e" in out.splitlines()[1]  # energy and emissions on the second line


def test_memory_headline_says_fits_by_the_capacity_and_names_the_largest_part():
    h100 = 85_028_896_768  # what CUDA gives a process on an H100 80GB HBM3: deviceQuery's 81090 MBytes
    for zero, verdict in ((0, "does NOT fit"), (3, "fits")):
        estimate = api.memory(model="llama-2-7b", gpus="8xH100", zero=zero)
        line = estimate.report.headline[0]
        assert (estimate.total <= h100) == (verdict == "fits") and f": {verdict}," in line
        # the largest of the parts the table's total adds up, read from the report's terms
        value = estimate.report.value
        parts = {
            "model states": value("total.states"),
            "activations": value("total.activations"),
            "framework buffers": value("total.framework_buffers"),
            "transient peaks": value("total.transient"),
        }
        largest = max(parts, key=parts.__getitem__)
        assert f"the largest part is {largest} ({parts[largest] / 1e9:,.1f} GB)" in line
        assert f"{estimate.total / 1e9:,.1f} GB of 85.0 GB per GPU" in line


def test_plan_headline_names_the_first_ranked_layout(capsys):
    code, out, _ = run("plan -m llama-3-8b --gpus 64xH100 --top 1 --json", capsys)
    doc = json.loads(out)
    assert code == 0 and doc["section_titles"]["rank1"][3:].split(" +")[0] in doc["headline"][0]  # " +N": ties
    fitting = int(doc["inputs"]["evaluated"]["origin"].split()[0])
    assert f"the best of {fitting:,} layouts" in doc["headline"][0]


def test_sweep_headline_lists_the_rows_that_fit(capsys):
    sweep = api.memory_sweep(sweep="seq=1k,4k,16k,64k", model="llama-2-7b", gpus="8xH100", zero=3)
    fit = [value for value, row in sweep.rows if row.fits]
    over = [value for value, row in sweep.rows if not row.fits]
    assert fit and over  # the case has both
    line = sweep.report.headline[0]
    assert f"fits at {', '.join('seq=' + v for v in fit)}; not at {', '.join('seq=' + v for v in over)}" in line


def test_serving_answers_for_the_gpus_given_and_names_the_fewest_it_fits():
    # Issue #32 item 2: 8 GPUs asked about, 8 answered for (TP=8), and the fewest said beside.
    # Llama 3.1 70B, 8 sequences of 32K in bf16 (70,553,706,496 weights; 80 layers, 8 KV heads of 128):
    #   TP=2: weights 141.11 GB / 2 = 70.55 GB, cache 8 · 32,768 · 80 · 2 · 4 · 128 · 2 B = 42.95 GB: over 80 GB
    #   TP=4: 35.28 GB + 21.47 GB + the 2 GiB allowance = 58.90 GB: the fewest it fits
    chosen = api.inference(model="llama-3.1-70b", gpus="8xH100", context="32K", batch=8)
    assert chosen.serving.tp == 8
    assert chosen.report.headline[0].startswith("Llama 3.1 70B on 8 × h100-sxm (TP=8): fits")
    assert chosen.report.headline[-1] == "it would fit on as few as 4 GPUs (TP=4), 58.90 GB per GPU"
    four = api.inference(model="llama-3.1-70b", gpus="8xH100", tp=4, context="32K", batch=8)
    assert four.memory.total_per_gpu == pytest.approx(141.107e9 / 4 + 21.475e9 + 2**31, rel=1e-4)
    two = api.inference(model="llama-3.1-70b", gpus="8xH100", tp=2, context="32K", batch=8)
    h100 = 85_028_896_768  # as CUDA gives it
    assert two.memory.total_per_gpu > h100 and two.memory.cache_budget > 0  # weights fit, the cache does not
    assert len(two.report.headline) == 2  # a TP the user gave: no line on the fewest


def test_serving_on_more_than_a_node_is_replicas_of_a_node():
    across = api.inference(model="llama-3.1-70b", gpus="2x8xH100", context="8K", batch=32)
    assert across.serving.tp == 8
    assert "on 16 × h100-sxm (2 replicas of TP=8)" in across.report.headline[0]
    assert any("2 replicas of TP=8: the batch and the memory are each replica's" in n for n in across.report.notes)


def test_layout_code_reads_as_the_issue_writes_it():
    split = PipelineSplit(schedule="interleaved", virtual_stages=4)
    layout = Layout(dp=64, tp=4, pp=16, cp=4, zero=2, sequence_parallel=True, split=split)
    assert layout.code == "DP64 TP4 PP16 CP4 Z2 SP v4"
    assert Layout(dp=8).code == "DP8"
    uneven = PipelineSplit(first_stage_layers=6, last_stage_layers=5, embedding_in_split=True)
    assert Layout(dp=2, pp=4, ep=2, split=uneven).code == "DP2 PP4 EP2 f6 l5 +emb"


@pytest.mark.parametrize(
    "unit,values,header,cells",
    [
        ("bytes", [56.92e9, 6.7e7], "GB", ["56.92", "0.07"]),
        ("bytes", [67.11e6], "MB", ["67.11"]),
        ("bytes", [7.5, 18], "bytes", ["7.5", "18"]),
        ("params", [4.444e9, 35.56e9], "B params", ["4.444", "35.56"]),
        ("tokens/s", [532_500.0, 507_000.0], "K tokens/s", ["532.5", "507"]),
        ("%", [50.64], "%", ["50.6"]),
        ("FLOP/s", [989.5e12], "TFLOP/s", ["989.5"]),
        ("days", [326.04, float("nan")], "days", ["326", "n/a"]),
    ],
)
def test_a_columns_unit_is_named_once_in_its_header(unit, values, header, cells):
    named, number = column_format(unit, values)
    assert named == header and [number(v) for v in values] == cells


@pytest.mark.parametrize(
    "command,headers",
    [
        ("plan -m llama-3.1-70b --gpus 64x8xH100 --top 5", ["tokens/s/GPU", "MFU", "memory/GPU", "days"]),
        ("max-params --gpus 8xH100", ["Largest N (whole memory)", "B params"]),
        ("memory -m llama-2-7b --gpus 8xH100 --sweep seq=1k,4k,16k,64k", ["Allocator fragmentation", "seq=64k"]),
        ("memory -m llama-2-7b --gpus 8xH100 --pp 4 --stages", ["Micro-batches in flight", "stage 4"]),
    ],
)
def test_tables_are_whole_at_80_columns(command, headers, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(command, capsys)
    table = [line for line in out.splitlines() if "│" in line or "┃" in line]
    assert code == 0 and table and not any("…" in line for line in table)  # no header or figure cut
    assert max(len(line) for line in out.splitlines()) <= 80
    words = re.findall(r"\S+", out)
    for header in headers:  # every word of each header whole, somewhere in the table
        assert all(word in words for word in header.split()), header


RATE = re.compile(
    r"achieved \(median\) (?P<number>[0-9][0-9,]*(?:\.[0-9]+)?(?:e[+-][0-9]+)?) (?P<prefix>[EPTG]?)FLOP/s"
)
RATE_SCALE = {"E": 1e18, "P": 1e15, "T": 1e12, "G": 1e9, "": 1.0}


def printed_rate(line: str) -> float:
    """FLOP/s: the achieved rate a bench headline prints, read with its unit. The unit is the largest of G, T, P
    and E FLOP/s the rate reaches (then 1 to 1,000 of it), or plain FLOP/s below 1 GFLOP/s."""
    found = RATE.search(line)
    assert found, f"no achieved rate in {line!r}"
    number, prefix = float(found["number"].replace(",", "")), found["prefix"]
    assert (1 <= number <= 1000) if prefix else number <= 1e9, f"{found[0]!r}: not the unit the rate calls for"
    return number * RATE_SCALE[prefix]


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (1.45e8, "1.45e+08 FLOP/s"),  # a slow or busy CPU's 128x128x128 matmul
        (3.0047e8, "3.005e+08 FLOP/s"),
        (1.45e9, "1.45 GFLOP/s"),
        (85_954_136_365.52, "85.95 GFLOP/s"),
        (999.9e9, "999.9 GFLOP/s"),
        (989.5e12, "989.5 TFLOP/s"),
        (1.2346e18, "1.235 EFLOP/s"),
    ],
)
def test_a_bench_rate_is_printed_in_the_unit_its_size_calls_for(rate, text):
    # what the bench headline prints for a rate, on fixed rates (the measured one depends on the machine)
    assert format_quantity(rate, "FLOP/s") == text
    line = f"Matmul 128x128x128 fp32: achieved (median) {text}, achieved / peak 1 %"
    assert printed_rate(line) == pytest.approx(rate, rel=5e-4)


@pytest.mark.torch
def test_bench_says_what_it_measured_first(capsys):
    # a measurement's headline: the rate (2·m·n·k / median time) and the share of the peak, both from its own terms
    code, out, _ = run("bench --device cpu --shape 128x128x128 --repeats 2 --json", capsys)
    doc = json.loads(out)
    achieved, ratio = doc["results"]["matmul"]["achieved"], doc["results"]["matmul"].get("ratio")
    (line,) = doc["headline"]
    assert code == 0 and line.startswith("Matmul 128x128x128 fp32: achieved (median) ")
    # the rate as printed, in whatever unit this machine's speed calls for (85.95 GFLOP/s here, 3.005e+08 FLOP/s
    # on a busy machine), is the measured one
    assert printed_rate(line) == pytest.approx(achieved["value"], rel=5e-4)  # to 4 significant figures
    assert f"achieved (median) {format_quantity(achieved['value'], 'FLOP/s')}, " in line
    assert ratio is None or f"achieved / peak {ratio['value']:.3g} %" in line
    code, out, _ = run("bench memory --device cpu --brief", capsys)
    assert code == 0 and out.startswith("Copy bandwidth (read + write): achieved (median) ") and out.count("\n") == 1
