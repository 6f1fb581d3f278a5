"""Clusters side by side (issue #32, item 9: "support comparing a few GPU types ... in one table"): ``--gpus A --vs
B`` answers for each cluster in one table, a row each, and every cell is the figure the command gives for that
cluster alone."""

import pytest

pytestmark = pytest.mark.fast


def doc(lmcalc_run, argv):
    run = lmcalc_run([*argv, "--json"])
    assert run.code == 0, run.err
    return run.json


def test_train_time_rows_are_each_clusters_own_answer(lmcalc_run):
    base = ["train-time", "-m", "llama-3-70b", "--price-per-gpu-hour", "2.5"]
    both = doc(lmcalc_run, [*base, "--gpus", "1024xH100", "--vs", "1024xB200", "--vs", "512xB200"])
    assert [both["details"][f"option{n}"]["gpus"] for n in (1, 2, 3)] == ["1024xH100", "1024xB200", "512xB200"]
    for n, gpus in enumerate(("1024xH100", "1024xB200", "512xB200"), 1):
        alone = doc(lmcalc_run, [*base, "--gpus", gpus])
        row = both["results"][f"option{n}"]
        for key in ("days", "gpu_hours", "cost", "peak_per_gpu"):
            assert row[key]["value"] == alone["results"]["time"][key]["value"]
        assert both["headline"][n - 1] == alone["headline"][0]
    # the napkin rule: twice the GPUs, half the days (MFU and peak the same)
    rows = both["results"]
    assert rows["option3"]["days"]["value"] == pytest.approx(2 * rows["option2"]["days"]["value"])


def test_memory_rows_are_each_clusters_own_answer(lmcalc_run):
    base = ["memory", "-m", "llama-3-70b", "--zero", "3", "--recompute", "full"]
    both = doc(lmcalc_run, [*base, "--gpus", "8xH100", "--vs", "8xB200"])
    for n, gpus in enumerate(("8xH100", "8xB200"), 1):
        alone = doc(lmcalc_run, [*base, "--gpus", gpus])
        for key in ("total", "capacity", "headroom"):
            assert both["results"][f"option{n}"][key]["value"] == alone["results"]["total"][key]["value"]


def test_plan_rows_name_each_clusters_best_layout(lmcalc_run):
    base = ["plan", "-m", "llama-3.1-8b", "--global-batch", "1M"]
    both = doc(lmcalc_run, [*base, "--gpus", "8xH100", "--vs", "8xH200"])
    for n, gpus in enumerate(("8xH100", "8xH200"), 1):
        alone = doc(lmcalc_run, [*base, "--gpus", gpus, "--top", "1"])
        assert both["section_titles"][f"option{n}"] == f"{gpus}: {alone['section_titles']['rank1'][3:]}"
        mine = both["results"][f"option{n}"]["tokens_per_s_per_gpu"]["value"]
        assert mine == alone["results"]["rank1"]["tokens_per_s_per_gpu"]["value"]


MEMORY = ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--vs", "8xB200"]


@pytest.mark.parametrize(
    "argv,says",
    [
        (["train-time", "-m", "llama-3-8b", "--gpu", "H100", "--days", "30", "--vs", "B200"], "give --gpus too"),
        ([*MEMORY, "--sweep", "zero=1,3"], "without --sweep"),
        ([*MEMORY, "--inference"], "--vs describes training"),
        ([*MEMORY, "--explain"], "without --vs"),
        (["train-time", "-m", "llama-3-8b", "--gpus", "8xH100", "--vs", "8xH1000"], "unknown hardware 'H1000'"),
    ],
)  # fmt: skip
def test_what_vs_cannot_compare_is_one_line(lmcalc_run, argv, says):
    run = lmcalc_run(argv)
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1 and says in run.err, run.err
