"""benchmarks/published_runs.yaml against its sources: every published run loads, its layout is the one published,
and its tokens/s per GPU (the figure the step-time model is judged on, docs/plan-accuracy.md) follows from what the
source prints.

The sources are read from tests/data/reference (published_runs.yaml, playbook_single_node.yaml, hardware_facts.yaml,
published_models.yaml: the project's reference facts, each figure with its source, copied byte for byte from
../shared/reference so that no test depends on a folder outside the repository), each run's `reference` naming its
entry and row; where ../shared/reference is present, a test checks the copy is still identical to it. Where a source
prints two figures that both follow from the speed, the second is checked against the tokens/s with the source's own
formula, restated here:

- Narayanan et al. 2021 (arXiv:2104.04473) eq. (3): F = 96·B·s·l·h²·(1 + s/6h + V/16lh) FLOPs per iteration,
  recomputation's forward included; Table 1 also prints the aggregate PFLOP/s and % of peak, Table 2 the days
  that 300B tokens take;
- Korthikanti et al. 2022 (arXiv:2205.05198) §6.3: model FLOPs 72·B·s·l·h²·(1 + s/6h + V/12lh) per iteration,
  MFU over 312 TFLOP/s;
- Dubey et al. 2024 (Llama 3) Table 4: MFU in the PaLM convention, 6N + 12·L·H·Q·T per token (Chowdhery et al.
  2022 Appendix B), and TFLOP/s per GPU;
- MosaicML llm-foundry scripts/train/benchmarking/README.md: total throughput, and MFU = (6·NumParams +
  12·L·d·s) per token × tokens/s over GPUs × peak;
- the Ultra-Scale Playbook: tokens/s per GPU only (its MFU does not follow from its tokens/s under one FLOP count,
  the reference's caveat).
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from accuracy import FAMILIES, PublishedRun, load_runs
from test_framework_nanotron import playbook_model

from lmcalc.engine.model.palm import napkin_params
from lmcalc.engine.model.params import count_params
from lmcalc.preset_files import TABLE_FILE_LIMIT
from lmcalc.presets import read_yaml

pytestmark = pytest.mark.data

ROOT = Path(__file__).resolve().parent.parent
RUNS_FILE = ROOT / "benchmarks" / "published_runs.yaml"
REFERENCE = ROOT / "tests" / "data" / "reference"  # a copy of SHARED_REFERENCE's files, README.md included
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"  # the project's reference facts, outside the repository
RUNS = load_runs(RUNS_FILE)
WRITTEN = {
    row["id"]: row for row in read_yaml(RUNS_FILE, TABLE_FILE_LIMIT)["runs"]
}  # each run as written, for its `reference`

# The entries of the reference's published_runs.yaml that publish a layout and a throughput: every row of each
# is a run here. (gpt3-175b-openai publishes no GPU count or time; megatron-2021-gpt3-time-estimate is an estimate.)
RUN_ENTRIES = (
    "korthikanti-2022-table5",
    "megatron-2021-table1",
    "megatron-2021-table2-zero3-vs-ptdp",
    "llama-3.1-405b-stage-configs",
    "llm-foundry-mpt-benchmarks",
)
PLAYBOOK = "playbook_single_node.yaml"

VOCAB, SEQ = 51200, 2048  # the Megatron GPTs of Narayanan et al. 2021 and Korthikanti et al. 2022


def of_family(family: str) -> list[PublishedRun]:
    return [run for run in RUNS if run.family == family]


def ids(runs: list[PublishedRun]) -> list[str]:
    return [run.id for run in runs]


@cache
def reference_file(name: str) -> Any:
    return read_yaml(REFERENCE / name)


def entry(entry_id: str) -> dict[str, Any]:
    return next(e for e in reference_file("published_runs.yaml")["runs"] if e["id"] == entry_id)


def source_row(run: PublishedRun) -> dict[str, Any]:
    """The row of the reference the run was read from, as a dict of its columns."""
    where = WRITTEN[run.id]["reference"]
    if where["file"] == PLAYBOOK:
        table = reference_file(PLAYBOOK)
        return {**table["fixed"], **dict(zip(table["columns"], table["rows"][where["row"]], strict=True))}
    table = entry(where["id"])
    if "columns" in table:
        return dict(zip(table["columns"], table["rows"][where["row"]], strict=True))
    if "configs" in table:  # Korthikanti et al. Table 5: the layout and the results are two lists, row by row
        return {**table["configs"][where["row"]], **table["results"][where["row"]]}
    return table["rows"][where["row"]]


def dense_bf16_peak(alias: str) -> float:
    """FLOP/s: the spec sheet's dense bf16 peak of the accelerator the reference names ``alias``."""
    accelerators = reference_file("hardware_facts.yaml")["accelerators"]
    found = next(a for a in accelerators if alias in a.get("aliases", []))
    return found["compute_tflops_dense"]["bf16"] * 1e12


def eq3_flops_per_token(layers: int, hidden: int) -> float:
    """Narayanan et al. 2021 eq. (3) over the B·s tokens of an iteration: 96·l·h²·(1 + s/6h + V/16lh)."""
    return 96 * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


# ---------------------------------------------------------------- every run


def test_every_run_loads_once_with_a_family_and_a_speed():
    assert len(RUNS) == len(WRITTEN)  # ids are unique
    assert {run.family for run in RUNS} == set(FAMILIES)
    assert all(run.tokens_per_s_per_gpu > 0 and run.source and run.derived for run in RUNS)


def test_every_published_row_with_a_layout_and_a_throughput_is_a_run():
    used = Counter((w["reference"]["file"], w["reference"].get("id"), w["reference"]["row"]) for w in WRITTEN.values())
    expected = Counter()
    for entry_id in RUN_ENTRIES:
        table = entry(entry_id)
        rows = len(table["configs"] if "configs" in table else table["rows"])
        expected.update(("published_runs.yaml", entry_id, row) for row in range(rows))
    expected.update((PLAYBOOK, None, row) for row in range(len(reference_file(PLAYBOOK)["rows"])))
    assert used == expected


@pytest.mark.skipif(
    not SHARED_REFERENCE.is_dir(), reason=f"{SHARED_REFERENCE} (outside the repository) is not here to compare with"
)
def test_the_reference_copy_is_identical_to_the_shared_reference():
    copied = sorted(path.name for path in REFERENCE.iterdir())
    assert {"published_runs.yaml", PLAYBOOK, "hardware_facts.yaml", "published_models.yaml"} <= set(copied)
    shared = {name: SHARED_REFERENCE / name for name in copied}
    differ = [
        name
        for name in copied
        if not shared[name].is_file() or shared[name].read_bytes() != (REFERENCE / name).read_bytes()
    ]
    assert not differ, f"tests/data/reference differs from {SHARED_REFERENCE} in {differ}: copy them again"


@pytest.mark.parametrize("run", RUNS, ids=ids(RUNS))
def test_layout_multiplies_out_to_the_gpus(run):
    layout = run.layout
    assert layout.dp * layout.tp * layout.pp * layout.cp == run.cluster.count
    assert run.cluster.count % run.cluster.gpus_per_node == 0


def published_gpus(run: PublishedRun, row: dict[str, Any]) -> int:
    return reference_file(PLAYBOOK)["hardware"]["count"] if run.family == "playbook" else row["gpus"]


def published_global_batch(run: PublishedRun, row: dict[str, Any]) -> int:
    """Sequences per step, as the source prints them."""
    if run.family == "korthikanti":
        return row["global_batch"]
    if run.family == "megatron-2021":
        return row["batch_size"]
    if run.family == "llama3":  # the batch each DP group takes, DP groups times
        return row["dp"] * row["batch_per_dp"]
    if run.family == "mpt":
        return row["global_batch_seqs"]
    return row["global_batch_sequences"]


@pytest.mark.parametrize("run", RUNS, ids=ids(RUNS))
def test_gpus_global_batch_and_degrees_are_the_published_ones(run):
    row = source_row(run)
    assert run.cluster.count == published_gpus(run, row)
    assert run.global_batch == published_global_batch(run, row)
    if run.family == "mpt":
        assert run.workload.seq_len * run.global_batch == row["global_batch_tokens"]
    if run.family == "llama3":  # 16M-token batches
        assert run.workload.seq_len * run.global_batch == 16 * 2**20
    layout, micro_batch = run.layout, run.workload.micro_batch
    written = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp, "zero": layout.zero}
    written |= {"grad_accum": layout.grad_accum, "micro_batch": micro_batch, "microbatch": micro_batch}
    for name, value in written.items():  # the columns the source prints, under its own names
        if name in row:
            assert value == row[name], name
    if "seq_len" in row:
        assert run.workload.seq_len == row["seq_len"]


# ---------------------------------------------------------------- Narayanan et al. 2021


@pytest.mark.parametrize("run", of_family("megatron-2021"), ids=ids(of_family("megatron-2021")))
def test_megatron_2021_tokens_per_s_from_tflops_per_gpu(run):
    # Table 1 and 2 print TFLOP/s per GPU counted with eq. (3): tokens/s per GPU = TFLOP/s / (F / (B·s)).
    # 1.7B: 137e12 / (96·24·2304²·(1 + 2048/13824 + 51200/884736)) = 137e12 / 1.4750e10 = 9,288 tokens/s.
    row = source_row(run)
    model = run.model
    tokens_per_s = row["tflops_per_gpu"] * 1e12 / eq3_flops_per_token(model.num_layers, model.hidden_size)
    assert run.tokens_per_s_per_gpu == pytest.approx(tokens_per_s, rel=1e-4)
    # the printed parameter count (0.1B) is the shape's: Table 1's 12·l·h²·(1 + 13/12h + (V+s)/12lh), counted
    assert count_params(model).total / 1e9 == pytest.approx(row["params_billion"], abs=0.05)


TABLE1 = [run for run in of_family("megatron-2021") if WRITTEN[run.id]["reference"]["id"] == "megatron-2021-table1"]
TABLE2 = [run for run in of_family("megatron-2021") if run not in TABLE1]


@pytest.mark.parametrize("run", TABLE1, ids=ids(TABLE1))
def test_megatron_2021_table1_aggregate_and_share_of_peak(run):
    # aggregate PFLOP/s = TFLOP/s per GPU · GPUs, and % of peak = TFLOP/s / 312, each printed rounded: TFLOP/s to
    # the unit, PFLOP/s to 0.1, the share to the per cent. 1T: 502.0 PFLOP/s / 3072 = 163.4 TFLOP/s, printed 163.
    row = source_row(run)
    gpus, tflops = row["gpus"], row["tflops_per_gpu"]
    assert abs(row["aggregate_pflops"] * 1e3 / gpus - tflops) <= 0.5 + 0.05e3 / gpus
    assert abs(tflops / 312 - row["pct_of_peak"]) <= 0.005 + 0.5 / 312
    # and the speed itself: eq. (3)'s FLOPs of the run's tokens over all GPUs give the aggregate
    per_token = eq3_flops_per_token(run.model.num_layers, run.model.hidden_size)
    aggregate = run.tokens_per_s_per_gpu * gpus * per_token / 1e15
    assert aggregate == pytest.approx(row["aggregate_pflops"], rel=0.005)


@pytest.mark.parametrize("run", TABLE2, ids=ids(TABLE2))
def test_megatron_2021_table2_days_for_300b_tokens(run):
    # Table 2's last column: days to train on 300B tokens at the row's speed. 175B PTD-P on 384 GPUs:
    # 153e12 / 1.434e12 FLOPs per token = 106.7 tokens/s per GPU; 300e9 / (106.7 · 384) / 86,400 = 84.7 days,
    # printed 84. The TFLOP/s are rounded to the unit (±0.5 in 88–171) and the days to the day: ±3 %.
    row = source_row(run)
    days = 300e9 / (run.tokens_per_s_per_gpu * row["gpus"]) / 86400
    assert days == pytest.approx(row["days_for_300B_tokens"], rel=0.03)
    if row["scheme"] == "ZeRO-3":  # no model parallelism: every GPU a data-parallel rank, one micro-batch a step
        assert (run.layout.tp, run.layout.pp, run.layout.zero, run.layout.grad_accum) == (1, 1, 3, 1)
        assert row["gpus"] * row["microbatch"] == row["batch_size"]  # the reconstructed cells agree
    else:  # model-parallel size 96 = TP 8 × PP 12 (175B), 280 = TP 8 × PP 35 (530B)
        assert run.layout.tp * run.layout.pp == row["model_parallel_size"] and run.layout.tp == 8


# ---------------------------------------------------------------- Korthikanti et al. 2022


@pytest.mark.parametrize("run", of_family("korthikanti"), ids=ids(of_family("korthikanti")))
def test_korthikanti_tokens_per_s_from_iteration_time_and_mfu(run):
    # tokens/s per GPU = global batch · s / iteration time / GPUs (Table 5, sequence parallelism + selective
    # recomputation). 22B: 4 · 2048 / 1.10 s / 8 = 930.9. The paper's MFU follows from the same time with its
    # model FLOPs 72·B·s·l·h²·(1 + s/6h + V/12lh): 22B: 1.1436e15 / 1.10 s / 8 / 312e12 = 41.65 %, printed 41.5 %.
    row = source_row(run)
    batch, gpus, seconds = row["global_batch"], row["gpus"], row["iter_s_present_work"]
    assert run.tokens_per_s_per_gpu == pytest.approx(batch * SEQ / seconds / gpus, rel=1e-4)
    layers, h = row["layers"], row["hidden"]
    model_flops = 72 * batch * SEQ * layers * h**2 * (1 + SEQ / (6 * h) + VOCAB / (12 * layers * h))
    assert model_flops / seconds / gpus / 312e12 == pytest.approx(row["mfu"], rel=0.01)
    assert run.published_mfu == row["mfu"]
    assert (run.model.hidden_size, run.model.num_layers, run.model.num_heads) == (h, layers, row["heads"])


# ---------------------------------------------------------------- Llama 3


@pytest.mark.parametrize("run", of_family("llama3"), ids=ids(of_family("llama3")))
def test_llama3_tokens_per_s_from_mfu_and_tflops(run):
    # PaLM's 6N + 12·L·H·Q·T per token, N = every parameter of Llama 3.1 405B (405,853,388,800: the reference's
    # safetensors count), L = 126, H = 128, Q = 128. At T = 8192: 2.6381e12 FLOPs per token; 43 % of 989.5 TFLOP/s
    # is 161.3 tokens/s per GPU. The table's 430 TFLOP/s give 163.0: MFU and TFLOP/s are both rounded (1–2 %).
    row = source_row(run)
    published = next(m for m in reference_file("published_models.yaml")["models"] if m["id"] == "llama-3.1-405b")
    params = published["params_exact_hf_safetensors"]
    assert napkin_params(run.model) == params  # the preset is the published model
    layers, heads, head_dim = published["num_layers"], published["num_attention_heads"], published["head_dim"]
    per_token = 6 * params + 12 * layers * heads * head_dim * row["seq_len"]
    peak = dense_bf16_peak("h100-sxm")
    assert run.tokens_per_s_per_gpu * per_token / peak == pytest.approx(row["bf16_mfu"], rel=1e-4)
    assert run.tokens_per_s_per_gpu * per_token / 1e12 == pytest.approx(row["tflops_per_gpu"], rel=0.02)
    assert run.published_mfu == row["bf16_mfu"]


# ---------------------------------------------------------------- MosaicML MPT

MPT_PEAK_ALIAS = {"h100_80gb": "h100-sxm", "a100_80gb": "a100", "a100_40gb": "a100"}  # Composer: h100-sxm, a100


@pytest.mark.parametrize("run", of_family("mpt"), ids=ids(of_family("mpt")))
def test_mpt_tokens_per_s_throughput_mfu_and_numparams(run):
    row = source_row(run)
    # the printed tokens/s per GPU is the total throughput over the GPUs, rounded down: 70B on 512 H100,
    # 515,636 / 512 = 1007.1, printed 1007
    assert run.tokens_per_s_per_gpu == row["tokens_per_s_per_gpu"]
    assert 0 <= row["throughput_tokens_per_s"] / row["gpus"] - run.tokens_per_s_per_gpu < 1
    # MFU = (3·2·NumParams + 3·L·2·2·d·s) per token × tokens/s / (GPUs · peak): 70B on 512 H100,
    # (6 · 64,862,437,376 + 12 · 80 · 8192 · 2048) · 515,636 / (512 · 989.5e12) = 41.25 %
    model = run.model
    per_token = 6 * row["num_params"] + 12 * model.num_layers * model.hidden_size * row["seq_len"]
    peak = dense_bf16_peak(MPT_PEAK_ALIAS[row["gpu"]])
    mfu = per_token * row["throughput_tokens_per_s"] / (row["gpus"] * peak)
    assert mfu == pytest.approx(row["mfu_pct"] / 100, rel=0.002)
    assert run.published_mfu == pytest.approx(row["mfu_pct"] / 100)
    # the shape's parameters are the benchmark's NumParams, exactly (learned positions of the run's sequence)
    assert count_params(model).total == row["num_params"]
    assert run.layout.zero == {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[row["sharding"]]
    assert run.workload.recompute == ("full" if row["act_ckpt"] else "none")
    assert (run.layout.tp, run.layout.pp, run.layout.dp) == (1, 1, row["gpus"])  # FSDP alone


# ---------------------------------------------------------------- the Ultra-Scale Playbook


@pytest.mark.parametrize("run", of_family("playbook"), ids=ids(of_family("playbook")))
def test_playbook_tokens_per_s_and_shapes(run):
    row = source_row(run)
    assert run.tokens_per_s_per_gpu == row["tokens_per_s_per_gpu"]
    unnamed = {"name": "the-same"}  # the shapes compared, whatever each is called
    assert run.model.model_copy(update=unnamed) == playbook_model(row["model"]).model_copy(update=unnamed)
    assert run.layout.sequence_parallel == (run.layout.tp > 1)  # tp_mode REDUCE_SCATTER
    assert run.workload.recompute == "none"
