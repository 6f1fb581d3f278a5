"""benchmarks/blackwell_runs.yaml, the NeMo 2.0 runs on B200 and GB200 that Blackwell's GEMM fraction is fitted on:
each row loads, its layout covers its GPUs and its global batch, it is no held-out run, and its printed speed is
consistent with itself.

NeMo prints 'Model TFLOP / sec / GPU' beside tokens/s per GPU, so their ratio is NeMo's FLOPs per token. NeMo counts
them by a closed formula per model family (nemo/utils/flops_formulas.py; for Llama, per token and with attention in
full, L·h²·(12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h)): the Q and O projections, the K and V ones, the three MLP
matrices, the scores and values, and the output layer, each ×6 for the forward and the backward). lmcalc counts the
model's GEMMs from its shape, so the two agreeing says the row's model is the one NeMo ran and the row was read right.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from accuracy import BLACKWELL_FAMILIES, load_runs

from lmcalc.engine.model.flops import step_flops
from lmcalc.preset_files import TABLE_FILE_LIMIT
from lmcalc.presets import read_yaml

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "benchmarks" / "blackwell_runs.yaml"
RUNS = load_runs(FILE, BLACKWELL_FAMILIES)
ROWS = {row["id"]: row for row in read_yaml(FILE, TABLE_FILE_LIMIT)["runs"]}


def test_every_row_is_a_blackwell_run_of_its_release():
    assert len(RUNS) == len(ROWS) == 12
    for run in RUNS:
        assert run.cluster.hardware.architecture == "blackwell", run.id
        assert run.id.startswith(run.family.rsplit("-", 1)[0]), run.id  # nemo-25.02-… in nemo-25.02-b200
        assert run.family.endswith(ROWS[run.id]["hardware"]), run.id


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.id)
def test_layout_covers_the_gpus_and_the_global_batch(run):
    layout, row = run.layout, ROWS[run.id]
    assert layout.tp * layout.pp * layout.cp * layout.dp == row["gpus"]
    assert layout.dp * run.workload.micro_batch * layout.grad_accum == row["global_batch"]


def test_no_row_is_held_out():
    """A run the Blackwell fraction is fitted on may never be one the model is judged on (benchmarks/HELDOUT.md):
    no id is shared, and no held-out row cites NeMo 25.02 or 25.04."""
    heldout = read_yaml(ROOT / "benchmarks" / "heldout_runs.yaml", TABLE_FILE_LIMIT)["runs"]
    assert not {row["id"] for row in heldout} & set(ROWS)
    for row in heldout:
        assert "NeMo 25.02" not in row["source"] and "NeMo 25.04" not in row["source"], row["id"]


def test_nemo_llama_formula_by_hand():
    """Llama 3 8B at 8,192 tokens, NeMo's formula written out: L = 32, h = 4096, g/a = 8/32, f = 14336,
    V = 128256. Per token 32 · 4096² · (12 + 3 + 63 + 24 + 5.871) = 5.791e10 FLOPs, and the row prints 1,506 TFLOP/s
    at 26,006 tokens/s: 5.791e10 too."""
    L, h, g, a, f, s, V = 32, 4096, 8, 32, 14336, 8192, 128256
    by_hand = L * h**2 * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * V / (L * h))
    row = ROWS["nemo-25.02-llama3-8b-8gpus-b200"]
    assert row["tflops_per_gpu"] * 1e12 / row["tokens_per_s_per_gpu"] == pytest.approx(by_hand, rel=2e-4)


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.id)
def test_nemo_flops_per_token_are_lmcalcs(run):
    """NeMo's FLOPs per token (printed TFLOP/s over tokens/s) against lmcalc's model FLOPs per token, attention in
    full: within 0.1 %, except Llama 3.1 405B, where NeMo's printed figures are 1.0 % above its own formula (by hand:
    126 · 16384² · (12 + 0.75 + 58.5 + 6 + 0.373) = 2.625e12; printed 2.653e12 and 2.651e12), which lmcalc matches."""
    row = ROWS[run.id]
    nemo = row["tflops_per_gpu"] * 1e12 / row["tokens_per_s_per_gpu"]
    ours = step_flops(run.model, run.workload.seq_len, "none", "full").model
    if "405b" in run.id:
        assert nemo / ours == pytest.approx(1.010, abs=0.001)
    else:
        assert nemo == pytest.approx(ours, rel=1e-3)
