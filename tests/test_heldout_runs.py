"""The held-out published runs (benchmarks/heldout_runs.yaml) are well formed: every run loads as lmcalc objects,
its layout covers its GPUs and its global batch, and the Ultra-Scale Playbook's points are what the file says they
are. Nothing here compares a run with a figure lmcalc computes: these runs judge the step-time model, which is
never fitted to them (benchmarks/HELDOUT.md).

Each check of a run's row is one test over the whole file: it collects every row the check finds wrong and names them
all in one message (the row's id and what is wrong), rather than one test per row; ``test_a_broken_row_is_reported``
feeds broken copies of real rows to the same checks to show that each can fail."""

import copy
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from accuracy import gpt_model

from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.workload import Workload
from lmcalc.estimates.training import build_layout
from lmcalc.preset_files import TABLE_FILE_LIMIT
from lmcalc.presets import (
    read_yaml,
    resolve_framework,
    resolve_hardware,
    resolve_model,
    resolve_optimizer,
    resolve_precision,
)
from lmcalc.specs import Cluster, ModelSpec

# In the fast tier (no `data` mark): one test a check, not one a row, and the whole module runs in about a second.

DATA = read_yaml(Path(__file__).resolve().parent.parent / "benchmarks" / "heldout_runs.yaml", TABLE_FILE_LIMIT)
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
SPLIT_KEYS = (  # optional: the pipeline split's settings, the experts' TP where it is not TP, and HSDP's groups
    "etp",
    "hsdp",
    "hsdp_shard_optimizer",
    "first_stage_layers",
    "last_stage_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_layout",
    "mtp_layers",
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


Check = Callable[[dict[str, Any]], list[str]]


def bad_rows(runs: list[dict[str, Any]], check: Check) -> list[str]:
    """``id: what is wrong``, one line for each problem ``check`` finds in each of ``runs`` (a row without an id is
    named by its place in ``runs``). A check that raises on a row is that row's problem, not the end of the search."""
    bad = []
    for number, run in enumerate(runs):
        name = run.get("id", f"row {number}") if isinstance(run, dict) else f"row {number}"
        try:
            problems = check(run)
        except Exception as exc:  # a row too broken for the check: named with the rest
            problems = [f"{check.__name__} failed: {one_line(exc)}"]
        bad += [f"{name}: {problem}" for problem in problems]
    return bad


def one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"  # pydantic's errors run over several lines


def summary(bad: list[str], runs: list[dict[str, Any]]) -> str:
    return f"{len(bad)} problem(s) in {len(runs)} runs:\n" + "\n".join(bad)


def schema_problems(run: dict[str, Any]) -> list[str]:
    """The fields every run has, and the form of its layout, source, speed and MFU."""
    problems = []
    if missing := [field for field in REQUIRED if field not in run]:
        problems.append(f"missing {missing}")
    if "layout" in run:
        keys = set(run["layout"])
        if lacking := sorted(set(LAYOUT_KEYS) - keys):
            problems.append(f"layout lacks {lacking}")
        if unknown := sorted(keys - set(LAYOUT_KEYS) - set(SPLIT_KEYS)):
            problems.append(f"layout has unknown keys {unknown}")
    if "source" in run and not (isinstance(run["source"], str) and len(run["source"]) > 40):
        problems.append(f"source is not a text of more than 40 characters: {run['source']!r}")
    if "tokens_per_s_per_gpu" in run:
        tokens = run["tokens_per_s_per_gpu"]
        if not (isinstance(tokens, int | float) and math.isfinite(tokens) and tokens > 0):
            problems.append(f"tokens_per_s_per_gpu {tokens!r} is not a finite positive number")
    if "mfu" in run:  # the playbook prints 0.0% for its slowest points
        if not 0 <= run["mfu"] < 1:
            problems.append(f"mfu {run['mfu']!r} is not in [0, 1)")
        if not run.get("mfu_convention"):
            problems.append("an mfu but no mfu_convention")
    return problems


def curated_problems(run: dict[str, Any]) -> list[str]:
    """A figure that is not printed says how it was derived; every hand-curated run says what the source left out."""
    problems = []
    if not run.get("assumed"):
        problems.append("no `assumed` (what the source left out)")
    printed = str(run["tokens_per_s_per_gpu"]).replace(".0", "") in run["source"].replace(",", "")
    if not (printed or run.get("derived")):
        problems.append(f"tokens/s {run['tokens_per_s_per_gpu']} not in the source text and no `derived`")
    return problems


def load_layout(run: dict[str, Any]):
    """The run as lmcalc objects, its layout checked against its workload and cluster (raises where it fails)."""
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
        resolve_optimizer(run.get("optimizer", "adamw")).spec,
        run["seq"],
        micro_batch,
        recompute=run["recompute"],
        framework=framework,
    )
    layout = build_layout(cluster, layout_settings)
    # The playbook ran TP up to 32 over InfiniBand; whether that is wise is the planner's business, not this file's.
    check_layout(workload, layout, cluster, tp_within_node=False)
    return layout


def layout_problems(run: dict[str, Any]) -> list[str]:
    """The run loads as lmcalc objects, and its layout covers its GPUs and its global batch."""
    problems = []
    lay = run["layout"]
    gpus = lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"]
    if gpus != run["gpus"]:
        problems.append(f"TP·PP·DP·CP = {gpus}, not its {run['gpus']} GPUs")
    batch = lay["dp"] * lay["micro_batch"] * lay["grad_accum"]
    if batch != run["global_batch"]:
        problems.append(f"DP·micro_batch·grad_accum = {batch}, not its global batch {run['global_batch']}")
    if lay["pp"] == 1 and (lay["schedule"], lay["virtual_stages"]) != ("1f1b", 1):
        problems.append(f"PP=1 with schedule {lay['schedule']!r} and {lay['virtual_stages']} virtual stages")
    try:
        layout = load_layout(run)
    except Exception as exc:  # an unknown preset, a field of the wrong type, a layout lmcalc refuses
        problems.append(f"does not load as lmcalc objects: {one_line(exc)}")
    else:
        if layout.gpus != run["gpus"] or layout.grad_accum != lay["grad_accum"]:
            problems.append(f"lmcalc's layout has {layout.gpus} GPUs and grad_accum {layout.grad_accum}")
    return problems


def playbook_problems(run: dict[str, Any]) -> list[str]:
    """Single-node points are in ../shared/reference (the fitting set) and must stay out of the held-out set."""
    problems = []
    nodes, rest = divmod(run["gpus"], 8)
    if rest or nodes not in (2, 4, 8, 16, 32, 64):
        problems.append(f"{run['gpus']} GPUs: not 2, 4, 8, 16, 32 or 64 nodes of 8")
    settings = (run["seq"], run["global_batch"], run["framework"])
    if settings != (4096, 256, "nanotron"):
        problems.append(f"seq, global batch, framework {settings}, not the benchmark's (4096, 256, 'nanotron')")
    if run["recompute"] != "none":
        problems.append(f"recompute {run['recompute']!r}, not 'none'")
    if run["layout"]["sequence_parallel"] != (run["layout"]["tp"] > 1):
        problems.append(f"sequence_parallel {run['layout']['sequence_parallel']} with TP={run['layout']['tp']}")
    return problems


def test_ids_are_unique():
    ids = [run["id"] for run in RUNS]
    assert len(ids) == len(set(ids))


def test_every_run_has_the_schema_fields():
    bad = bad_rows(RUNS, schema_problems)
    assert not bad, summary(bad, RUNS)


def test_curated_runs_say_how_a_figure_was_derived_and_what_was_assumed():
    bad = bad_rows(CURATED, curated_problems)
    assert not bad, summary(bad, CURATED)


def test_every_run_loads_as_lmcalc_objects_and_its_layout_fits_its_gpus_and_batch():
    bad = bad_rows(RUNS, layout_problems)
    assert not bad, summary(bad, RUNS)


def break_layout(run: dict[str, Any]) -> None:
    run["layout"]["tp"] *= 2


def break_batch(run: dict[str, Any]) -> None:
    run["layout"]["grad_accum"] += 1


BROKEN: list[tuple[Check, str, Callable[[dict[str, Any]], object], str]] = [
    (schema_problems, "bloom-176b-384gpus", lambda run: run.pop("source"), "missing ['source']"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run["layout"].pop("cp"), "layout lacks ['cp']"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run["layout"].update(cpp=1), "unknown keys ['cpp']"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run.update(source="a paper"), "source is not a text"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run.update(tokens_per_s_per_gpu=math.nan), "finite"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run.update(mfu=1.5), "mfu 1.5 is not in [0, 1)"),
    (schema_problems, "bloom-176b-384gpus", lambda run: run.update(mfu=0.4, mfu_convention=""), "no mfu_convention"),
    (curated_problems, "bloom-176b-384gpus", lambda run: run.pop("assumed"), "no `assumed`"),
    (curated_problems, "bloom-176b-384gpus", lambda run: run.pop("derived"), "not in the source text"),
    (layout_problems, "bloom-176b-384gpus", break_layout, "= 768, not its 384 GPUs"),
    (layout_problems, "bloom-176b-384gpus", break_layout, "does not load as lmcalc objects: LmcalcError"),
    (layout_problems, "bloom-176b-384gpus", break_batch, "not its global batch 2048"),
    (layout_problems, "bloom-176b-384gpus", lambda run: run.update(hardware="h999"), "does not load"),
    (layout_problems, PLAYBOOK[0]["id"], lambda run: run["layout"].update(schedule="interleaved"), "PP=1"),
    (layout_problems, PLAYBOOK[0]["id"], lambda run: run["model"]["shape"].update(num_heads=7), "num_heads"),
    (playbook_problems, PLAYBOOK[0]["id"], lambda run: run.update(gpus=8), "8 GPUs: not 2, 4"),
    (playbook_problems, PLAYBOOK[0]["id"], lambda run: run.update(seq=2048), "not the benchmark's"),
    (playbook_problems, PLAYBOOK[0]["id"], lambda run: run.update(recompute="full"), "recompute 'full'"),
    (playbook_problems, PLAYBOOK[0]["id"], lambda run: run["layout"].update(tp=2), "sequence_parallel False"),
    (curated_problems, "bloom-176b-384gpus", lambda run: run.pop("source"), "curated_problems failed: KeyError"),
]
"""(check, the run copied, how the copy is broken, what the check must say of it)"""


@pytest.mark.parametrize(
    ("check", "run_id", "breakage", "reported"), BROKEN, ids=[f"{case[0].__name__}: {case[3]}" for case in BROKEN]
)
def test_a_broken_row_is_reported(check, run_id, breakage, reported):
    """A copy of a run, broken in memory, is named with what is wrong; the run itself, beside it, is not."""
    run = BY_ID[run_id]
    broken = copy.deepcopy(run)  # deep: the playbook's rows share their model through YAML anchors
    breakage(broken)
    broken["id"] = f"{run_id}-broken"
    bad = bad_rows([run, broken], check)
    assert bad and all(line.startswith(f"{run_id}-broken: ") for line in bad), bad
    assert reported in "\n".join(bad)
    assert run == BY_ID[run_id] and not check(run)  # the file's own row untouched and clean


def test_every_bad_row_is_reported_not_only_the_first():
    broken = [copy.deepcopy(run) for run in RUNS[:3]]
    for run in broken:
        run["tokens_per_s_per_gpu"] = -1
    del broken[1]["id"]
    bad = bad_rows(broken, schema_problems)
    assert [line.split(": ", 1)[0] for line in bad] == [broken[0]["id"], "row 1", "row 1", broken[2]["id"]]
    assert "missing ['id']" in bad[1] and all("tokens_per_s_per_gpu -1" in line for line in bad[::2] + bad[3:])


# ------------------------------------------------------------------------------------------ the playbook's points

PLAYBOOK_MODELS = {"playbook-1b": "1B", "playbook-3b": "3B", "playbook-8b": "8B", "playbook-80b": "80B"}


def playbook_groups() -> dict[tuple[str, int], list[dict]]:
    groups = defaultdict(list)
    for run in PLAYBOOK:
        groups[(PLAYBOOK_MODELS[run["model"]["shape"]["name"]], run["gpus"] // 8)].append(run)
    return groups


def test_playbook_points_are_multi_node_only_with_the_benchmark_settings():
    assert len(PLAYBOOK) > 1000
    bad = bad_rows(PLAYBOOK, playbook_problems)
    assert not bad, summary(bad, PLAYBOOK)


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
    assert 10 <= len(CURATED) <= 150
