"""The report says its answer (issue #32, item 8): the terminal prints the headline with the file it wrote, the page
states one MFU with its convention named, derives the best layout's memory once, and its summary gives the tokens
under a "Figure" heading (its rows are answers, not inputs)."""

import re

import pytest

from lmcalc import api

pytestmark = pytest.mark.fast

ARGS = ["--model", "llama-3.1-8b", "--gpus", "8xH100", "--seq", "4096", "--global-batch", "1M"]


@pytest.fixture(scope="module")
def found():
    return api.report(model="llama-3.1-8b", gpus="8xH100", seq=4096, global_batch="1M")


def test_the_terminal_prints_the_headline_then_the_file(lmcalc_run, tmp_path):
    page = tmp_path / "r.html"
    run = lmcalc_run(["report", *ARGS, "-o", str(page)])
    assert run.code == 0, run.err
    lines = run.out.strip().splitlines()
    assert lines[-1] == f"wrote {page}"
    assert lines[0].startswith("Llama 3.1 8B: DP") and " fits, " in lines[0]
    assert "for 15 T tokens at MFU " in lines[1]


def test_one_mfu_the_plans_with_its_convention(found):
    best = found.plan.best
    (mfu,) = [i for i in found.summary.inputs if i.key == "mfu"]
    # the plan's table says MFU = model FLOPs / (step time · GPUs · peak) in %, one decimal: the summary says the same
    assert mfu.value == round(100 * best.mfu, 1) and mfu.unit == "%"
    assert mfu.origin.startswith("the plan's: model FLOPs of a step, attention counted in full / (step time")
    assert found.summary.headline[1].endswith(f"at MFU {mfu.text}")
    # the time section keeps its own count, labelled as its own (6·N·D), and the days agree
    (own,) = [i for i in found.train_time.report.inputs if i.key == "mfu"]
    assert own.label == "MFU of these FLOPs"
    assert found.train_time.days == pytest.approx(15e12 / best.tokens_per_s / 86_400, rel=1e-9)


def test_the_summary_gives_the_tokens_under_figure(found):
    assert found.summary.inputs_header == "Figure"
    (tokens,) = [i for i in found.summary.inputs if i.key == "tokens"]
    assert tokens.value == 15e12


def test_the_page_derives_the_memory_once(lmcalc_run, tmp_path):
    page = tmp_path / "r.html"
    assert lmcalc_run(["report", *ARGS, "-o", str(page)]).code == 0
    text = page.read_text()
    headings = re.findall(r"<h3[^>]*>([^<]*)", text)
    assert sum(h.startswith("Model states per GPU") for h in headings) == 1
    assert "Step time of the best layout" in headings
    assert "<th>Figure</th><th>Value</th><th>From</th>" in text


def test_the_reports_estimates_have_a_short_repr(found):
    # the dataclass's repr printed every layout of the plan (issue #32 item 3)
    assert repr(found) == f"<ReportEstimates: {'; '.join(found.summary.headline)}>"
    assert len(repr(found)) < 300
