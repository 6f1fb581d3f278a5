"""lmcalc report tells one story: the layout the search finds is the one whose memory and training time the page
shows, each checked against the command that computes it alone (memory, train-time, plan)."""

import json
import re
from html import escape

import pytest

import lmcalc.api as api
from lmcalc.cli import main
from lmcalc.estimates.plan import layout_fields

pytestmark = pytest.mark.cli

LLAMA_8B = {"model": "llama-3.1-8b", "gpus": "8xH100"}


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def command_json(args, capsys) -> dict:
    code, out, err = run([*args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def memory_flags(candidate) -> list[str]:
    """The flags that give ``lmcalc memory`` the layout, micro-batch and recomputation of a plan's candidate."""
    fields = dict(layout_fields(candidate))
    flags = [f"--{name}" for name in ("dp", "tp", "pp", "cp", "ep", "zero", "schedule", "virtual_stages")]
    args = [part for name in flags for part in (name.replace("_", "-"), str(fields[name[2:]]))]
    args += ["--grad-accum", str(fields["grad_accum"]), "--micro-batch", str(fields["micro_batch"])]
    args += ["--recompute", fields["recompute"]] + (["--sequence-parallel"] if fields["sequence_parallel"] else [])
    for name in ("first_stage_layers", "last_stage_layers"):
        if fields[name] is not None:
            args += [f"--{name.replace('_', '-')}", str(fields[name])]
    return args


def test_the_memory_is_that_of_the_plans_best_layout(capsys):
    # no layout flags: the memory section is the search's fastest layout, as `lmcalc memory` computes it from flags
    page = api.report(**LLAMA_8B)
    assert page.layout is page.plan.best
    framework = ["--framework", page.memory.workload.framework.name]  # the plan's, which its ZeRO-3 does not choose
    alone = command_json(["memory", "-m", "llama-3.1-8b", "--gpus", "8xH100", *memory_flags(page.layout), *framework],
                         capsys)  # fmt: skip
    assert page.memory.to_dict()["results"] == alone["results"]
    assert page.memory.total == page.plan.best.memory.total  # the plan's memory column, the same figure
    assert page.memory.to_dict()["inputs"]["layout"]["origin"].startswith("the plan's fastest of")


def test_layout_flags_pin_the_search_and_the_memory_follows(capsys):
    # --tp 2 --pp 2 pin the search (DP·CP = 8 / 4 = 2): every ranked layout has them, and the memory section is the
    # fastest of those, as `lmcalc plan --tp 2 --pp 2` ranks it and `lmcalc memory` computes it
    page = api.report(**LLAMA_8B, tp=2, pp=2)
    assert {(c.tp, c.pp, c.dp * c.cp) for c in page.plan.layouts} == {(2, 2, 2)}
    planned = command_json(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--tp", "2", "--pp", "2"], capsys)
    assert page.plan.report.sections[0].title == planned["section_titles"]["rank1"]
    framework = ["--framework", page.memory.workload.framework.name]  # the plan's, which its ZeRO-3 does not choose
    alone = command_json(["memory", "-m", "llama-3.1-8b", "--gpus", "8xH100", *memory_flags(page.layout), *framework],
                         capsys)  # fmt: skip
    assert page.memory.to_dict()["results"] == alone["results"]
    assert "pinned --tp 2 --pp 2" in page.memory.to_dict()["inputs"]["layout"]["origin"]
    assert page.memory.layout != api.report(**LLAMA_8B).memory.layout  # the pins changed it


def test_the_days_are_the_plans_prediction_and_train_time_agrees(capsys):
    # no --mfu: the time section runs at the best layout's predicted tokens/s, stated as the MFU of 6·N·D; so
    # `lmcalc train-time --mfu <that MFU>` gives the same days, and so does the plan's own days column
    page = api.report(**LLAMA_8B)
    mfu = page.train_time.report.inputs[[i.key for i in page.train_time.report.inputs].index("mfu")]
    assert mfu.origin.startswith("the plan's best layout")
    assert mfu.value < page.plan.best.mfu  # the plan's MFU counts attention's FLOPs too: 6·N·D is fewer
    timed = command_json(["train-time", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--mfu", repr(mfu.value)], capsys)
    assert page.train_time.days == pytest.approx(timed["results"]["time"]["days"]["value"], rel=1e-12)
    planned = command_json(["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100"], capsys)
    assert page.train_time.days == pytest.approx(planned["results"]["rank1"]["days"]["value"], rel=1e-12)
    # the assumed 0.4 is gone: the days differ from the default assumption's
    assumed = command_json(["train-time", "-m", "llama-3.1-8b", "--gpus", "8xH100"], capsys)
    assert page.train_time.days != pytest.approx(assumed["results"]["time"]["days"]["value"], rel=1e-3)


def test_mfu_given_times_the_run_and_the_prediction_is_shown_beside_it():
    page = api.report(**LLAMA_8B, mfu=0.3)
    assert page.train_time.run.mfu == 0.3
    predicted_days = page.plan.report.sections[0].term("days").value
    (note,) = [n for n in page.train_time.report.notes if n.startswith("--mfu")]
    assert f"--mfu 0.3 gives {page.train_time.days:,.1f} days" in note
    assert f"the plan predicts {page.plan.best.tokens_per_s:,.0f} tokens/s" in note
    assert f"{predicted_days:,.1f} days" in note
    assert note in page.summary.notes  # the summary says it too


def test_the_summary_repeats_the_sections_figures():
    page = api.report(**LLAMA_8B, price_per_gpu_hour=2.5)
    summary = page.summary
    for key in ("time.days", "time.gpu_hours", "time.cost", "energy.co2"):
        assert summary.term(key.rpartition(".")[2]) == page.train_time.report.term(key)
    assert summary.term("memory").value == page.memory.total
    assert summary.term("cost").value == pytest.approx(page.train_time.gpu_hours * 2.5)
    fits = {i.key: i for i in summary.inputs}
    assert fits["fits"].value.startswith("yes: ") and fits["layout"].value.startswith("DP")
    assert not any(n.startswith("cost:") for n in summary.notes)
    unpriced = api.report(**LLAMA_8B).summary
    assert any("--price-per-gpu-hour" in n for n in unpriced.notes)  # says how to get the cost


def test_when_nothing_fits_the_page_says_so_once_and_the_time_is_hypothetical(tmp_path, capsys):
    # 405B on 8 × 80 GB: no layout fits. The memory section is the closest layout's overflow, the time is titled
    # hypothetical at the assumed MFU, and the summary says "no"
    page = api.report(model="llama-3.1-405b", gpus="8xH100")
    assert not page.fits and page.layout is not None
    assert page.memory.total > page.memory.capacity
    assert any(n.startswith("does NOT fit") for n in page.memory.report.notes)
    assert page.train_time.report.title.endswith("hypothetical, no layout fits") and page.train_time.run.mfu == 0.4
    assert page.train_time.report.notes[0].startswith("hypothetical: no layout fits the memory of 8xh100-sxm")
    assert {i.key: i.value for i in page.summary.inputs}["fits"].startswith("no: ")
    path = tmp_path / "405b.html"
    code, _, err = run(["report", "-m", "llama-3.1-405b", "--gpus", "8xH100", "-o", str(path)], capsys)
    assert code == 0, err
    html = path.read_text()
    assert html.count("nothing fits on 8xh100-sxm") == 1
    assert f"{page.memory.total / 1e9:,.1f} GB of 85.0 GB" in html  # an H100 as CUDA gives it: 85.03 GB


def test_pins_no_layout_can_have_leave_no_memory_section(tmp_path, capsys):
    # TP = 3 cannot split Llama 3.1 8B's 32 heads: the page says why, once, and draws no memory for a layout
    page = api.report(**LLAMA_8B, tp=3)
    assert page.layout is None and page.memory is None and not page.fits
    # the hypothetical time says why there is no run: no layout can exist, not that none fits the memory
    assert page.train_time.report.title.endswith("hypothetical, no layout")
    assert "no layout can exist with these settings" in page.train_time.report.notes[0]
    assert "fits the memory" not in page.train_time.report.notes[0]
    path = tmp_path / "tp3.html"
    code, _, err = run(["report", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--tp", "3", "-o", str(path)], capsys)
    assert code == 0, err
    assert "Training memory per GPU" not in path.read_text()


def test_the_page_shows_the_memory_and_days_of_the_story(tmp_path, capsys):
    path = tmp_path / "8b.html"
    code, _, err = run(["report", "-m", "llama-3.1-8b", "--gpus", "8xH100", "-o", str(path)], capsys)
    assert code == 0, err
    html = path.read_text()
    page = api.report(**LLAMA_8B)
    assert all(escape(t.text) in html for s in page.memory.report.sections for t in s.terms)
    days = page.train_time.report.term("time.days").text
    assert len(re.findall(re.escape(escape(days)), html)) >= 2  # the summary and the time section
