"""The held-out published runs (benchmarks/heldout_runs.yaml) are well formed: every run loads as lmcalc objects,
its layout covers its GPUs and its global batch, and the Ultra-Scale Playbook's points are what the file says they
are. Nothing here compares a run with a figure lmcalc computes: these runs judge the step-time model, which is
never fitted to them (benchmarks/HELDOUT.md)."""

import math
from collections import defaultdict
from pathlib import Path

import pytest
from accuracy import gpt_model

from lmcalc.engine.layout import check_layout
from lmcalc.engine.workload import Workload
from lmcalc.estimates.training import build_layout
from lmcalc.presets import (
    read_yaml,
    resolve_framework,
    resolve_hardware,
    resolve_model,
    resolve_optimizer,
    resolve_precision,
)
from lmcalc.specs import Cluster, ModelSpec

pytestmark = pytest.mark.data

DATA = read_yaml(Path(__file__).resolve().parent.parent / "benchmarks" / "heldout_runs.yaml")
RUNS = DATA["runs"]
BY_ID = {run["id"]: run for run in RUNS}
CURATED = [run for run in RUNS if run["family"] != "playbook-multinode"]
PLAYBOOK = [run for run in RUNS if run["family"] == "playbook-multinode"]

REQUIRED = (
    "id",
    "family",
    "source",
    "model",
    "hardware",
    "gpus",
    "framework",
    "layout",
    "recompute",
    "seq",
    "global_batch",
    "tokens_per_s_per_gpu",
)
LAYOUT_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "zero",
    "micro_batch",
    "grad_accum",
    "sequence_parallel",
    "schedule",
    "virtual_stages",
)
SPLIT_KEYS = (
    "first_stage_layers",
    "last_stage_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)


def model_of(run: dict) -> ModelSpec:
    model = run["model"]
    (form,) = model  # exactly one of preset, gpt, shape
    if form == "preset":
        return resolve_model(model["preset"]).spec
    if form == "gpt":
        return gpt_model(run["id"], **model["gpt"])  # the `gpt:` form of benchmarks/published_runs.yaml
    assert form == "shape", f"{run['id']}: unknown model form {form!r}"
    return ModelSpec(**model["shape"])


def test_ids_are_unique():
    ids = [run["id"] for run in RUNS]
    assert len(ids) == len(set(ids))


def test_every_run_has_the_schema_fields():
    for run in RUNS:
        missing = [field for field in REQUIRED if field not in run]
        assert not missing, f"{run.get('id')}: missing {missing}"
        lacking = set(LAYOUT_KEYS) - set(run["layout"])
        assert not lacking, f"{run['id']}: layout lacks {lacking}"
        assert set(run["layout"]) <= set(LAYOUT_KEYS) | set(SPLIT_KEYS), run["id"]
        assert isinstance(run["source"], str) and len(run["source"]) > 40, run["id"]
        tokens = run["tokens_per_s_per_gpu"]
        assert isinstance(tokens, int | float) and math.isfinite(tokens) and tokens > 0, run["id"]
        if "mfu" in run:  # the playbook prints 0.0% for its slowest points
            assert 0 <= run["mfu"] < 1 and run.get("mfu_convention"), run["id"]


def test_curated_runs_say_how_a_figure_was_derived_and_what_was_assumed():
    """A figure that is not printed says how it was derived; every hand-curated run says what the source left out."""
    for run in CURATED:
        assert run.get("assumed"), run["id"]
        printed = str(run["tokens_per_s_per_gpu"]).replace(".0", "") in run["source"].replace(",", "")
        assert printed or run.get("derived"), f"{run['id']}: tokens/s not in the source text and no `derived`"


@pytest.mark.parametrize("run", RUNS, ids=[run["id"] for run in RUNS])
def test_run_loads_as_lmcalc_objects_and_its_layout_fits_its_gpus_and_batch(run):
    model = model_of(run)
    hardware = resolve_hardware(run["hardware"]).spec
    framework = resolve_framework(run["framework"]).spec
    precision = resolve_precision(run.get("precision", "bf16-mixed")).spec
    layout_settings = dict(run["layout"])
    micro_batch = layout_settings.pop("micro_batch")
    gpus_per_node = run.get("gpus_per_node", hardware.gpus_per_node)
    cluster = Cluster(hardware=hardware, count=run["gpus"], gpus_per_node=min(gpus_per_node, run["gpus"]))
    workload = Workload(
        model,
        precision,
        resolve_optimizer("adamw").spec,
        run["seq"],
        micro_batch,
        recompute=run["recompute"],
        framework=framework,
    )
    layout = build_layout(cluster, layout_settings)
    # The playbook ran TP up to 32 over InfiniBand; whether that is wise is the planner's business, not this file's.
    check_layout(workload, layout, cluster, tp_within_node=False)

    lay = run["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == run["gpus"]
    assert lay["dp"] * lay["micro_batch"] * lay["grad_accum"] == run["global_batch"]
    assert layout.gpus == run["gpus"] and layout.grad_accum == lay["grad_accum"]
    if lay["pp"] == 1:
        assert lay["schedule"] == "1f1b" and lay["virtual_stages"] == 1


# ------------------------------------------------------------------------------------------ the playbook's points

PLAYBOOK_MODELS = {"playbook-1b": "1B", "playbook-3b": "3B", "playbook-8b": "8B", "playbook-80b": "80B"}


def playbook_groups() -> dict[tuple[str, int], list[dict]]:
    groups = defaultdict(list)
    for run in PLAYBOOK:
        groups[(PLAYBOOK_MODELS[run["model"]["shape"]["name"]], run["gpus"] // 8)].append(run)
    return groups


def test_playbook_points_are_multi_node_only_with_the_benchmark_settings():
    """Single-node points are in ../shared/reference (the fitting set) and must stay out of the held-out set."""
    assert len(PLAYBOOK) > 1000
    for run in PLAYBOOK:
        nodes, rest = divmod(run["gpus"], 8)
        assert rest == 0 and nodes in (2, 4, 8, 16, 32, 64), run["id"]
        assert run["seq"] == 4096 and run["global_batch"] == 256 and run["framework"] == "nanotron", run["id"]
        assert run["recompute"] == "none" and run["layout"]["sequence_parallel"] == (run["layout"]["tp"] > 1), run["id"]


def test_playbook_best_flag_marks_the_fastest_configuration_of_each_model_and_node_count():
    groups = playbook_groups()
    assert set(groups) == {(m, n) for m in ("1B", "3B", "8B") for n in (2, 4, 8, 16, 32, 64)} | {
        ("80B", n)
        for n in (4, 8, 16, 32, 64)  # the 80B model ran out of memory on 1 and 2 nodes
    }
    for key, runs in groups.items():
        best = [run for run in runs if run.get("best")]
        assert len(best) == 1, key
        assert best[0]["tokens_per_s_per_gpu"] == max(run["tokens_per_s_per_gpu"] for run in runs), key


def test_playbook_repeats_are_counted():
    groups = defaultdict(list)
    for run in PLAYBOOK:
        groups[run["id"].split("-r")[0] if run["id"].rsplit("-", 1)[-1].startswith("r") else run["id"]].append(run)
    for base, runs in groups.items():
        if len(runs) > 1:
            assert all(run["repeats"] == len(runs) for run in runs), base
        else:
            assert "repeats" not in runs[0], base


def generator_params(shape: dict) -> int:
    """nanotron scripts/scaling_benchmarks.py estimate_num_params with MHA and untied embeddings: the count the
    playbook's MFU uses for its 8B and 80B points."""
    h, ffn, layers, vocab = shape["hidden_size"], shape["ffn_size"], shape["num_layers"], shape["vocab_size"]
    return 2 * vocab * h + layers * (3 * h * ffn + 4 * h * h)


@pytest.mark.parametrize("label", ["8B", "80B"])
def test_playbook_mfu_matches_the_model_shape(label):
    """Most of the 8B and 80B points' printed MFU is (6N + 12·L·h·s)·tokens/s over the H100's 989.5 TFLOP/s with the
    generator's parameter count: the evidence that the '80B' is the generator's 80-layer, 8192-wide model (with MHA
    and the 131,072 vocabulary), which the playbook does not state."""
    runs = [run for run in PLAYBOOK if PLAYBOOK_MODELS[run["model"]["shape"]["name"]] == label]
    shape = runs[0]["model"]["shape"]
    flops_per_token = 6 * generator_params(shape) + 12 * shape["num_layers"] * shape["hidden_size"] * 4096
    ratios = [run["mfu"] * 989.5e12 / (run["tokens_per_s_per_gpu"] * flops_per_token) for run in runs]
    agreeing = sum(abs(ratio - 1) < 0.05 for ratio in ratios)
    assert agreeing / len(ratios) > 0.7, f"{agreeing} of {len(ratios)}"
    if label == "80B":
        assert round(generator_params(shape) / 1e9) == 80


def test_excluded_playbook_points_are_not_runs():
    """Points whose DP·MBS·GradAcc is not their printed GBS cannot be pinned, and a split with more stages than
    layers cannot be expressed; the file lists them apart."""
    layers = {"1B": 16, "3B": 28, "8B": 32, "80B": 80}
    excluded = DATA["excluded_playbook_points"]
    assert excluded
    for point in excluded:
        unpinned = point["dp"] * point["mbs"] * point["grad_accum"] != point["gbs_printed"]
        assert unpinned or point["pp"] > layers[point["model"]], point
        rid = (
            f"playbook-{point['model'].lower()}-n{point['nodes']}-dp{point['dp']}-tp{point['tp']}-pp{point['pp']}"
            f"-z{point['zero']}-mbs{point['mbs']}-ga{point['grad_accum']}"
        )
        assert rid not in BY_ID


# ------------------------------------------------------------------------------------------------ hand-curated runs


@pytest.mark.parametrize(
    ("run_id", "tokens_per_s_per_gpu"),
    [
        ("bloom-176b-384gpus", 2048 * 2048 / 105 / 384),  # GBS x seq / 105 s per iteration / GPUs
        ("mt-nlg-530b-2800gpus", 1920 * 2048 / 50.2 / 2800),  # GBS x seq / iteration time / GPUs
        ("mt-nlg-530b-3360gpus", 1920 * 2048 / 44.4 / 3360),
        ("nemotron-4-340b-6144gpus", 2304 * 4096 / 8.0 / 6144),
        ("deepseek-v3-2048gpus", 1e12 / (180e3 * 3600)),  # 180K GPU-hours per trillion tokens
    ],
)
def test_derived_throughputs_follow_from_the_printed_figures(run_id, tokens_per_s_per_gpu):
    assert BY_ID[run_id]["tokens_per_s_per_gpu"] == pytest.approx(tokens_per_s_per_gpu, rel=5e-4)


def test_curated_families():
    families = defaultdict(int)
    for run in CURATED:
        families[run["family"]] += 1
    assert set(families) == {"bloom", "gpt-neox", "mt-nlg", "nemotron-4", "deepseek-v3", "torchtitan", "nemo"}
    assert 10 <= len(CURATED) <= 60
