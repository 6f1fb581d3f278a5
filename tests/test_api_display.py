"""Issue #32 item 3: an estimate shows itself as the command does. ``repr`` is the headline in a line (a plan's was
178 million characters and took 7 s, one of its layouts' 11,618); ``str`` and ``show()`` print the command's tables,
``show(explain=True)`` its derivation; a notebook shows the tables (``_repr_html_``)."""

from __future__ import annotations

import time
from html import unescape

import pytest

import lmcalc

MEMORY = ["memory", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--zero", "3"]


@pytest.fixture(scope="module")
def found() -> lmcalc.PlanEstimate:
    return lmcalc.plan(model="llama-3.1-8b", gpus="8xH100")


def test_a_plans_repr_is_its_headline(found):
    start = time.perf_counter()
    text = repr(found)
    assert time.perf_counter() - start < 0.1
    assert text == f"<PlanEstimate: {found.report.headline[0]}>"
    assert len(text) < 300
    assert len(repr(found.report)) < 300  # the Result: its command, headline and how many sections


def test_a_layout_and_its_workload_repr_in_a_few_lines(found):
    # the workload by name (its model, recipe, optimizer, profile), not their every field
    assert len(repr(found.best)) < 1_000
    assert repr(found.best.workload).startswith(
        "Workload(model='llama-3.1-8b', precision='bf16-mixed', optimizer='adamw', framework='megatron', "
    )
    assert len(repr(found.best.time)) < 3_000


def test_str_is_what_the_command_prints(lmcalc_run):
    estimate = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3)
    printed = lmcalc_run(MEMORY)
    assert printed.code == 0
    assert str(estimate) == printed.out
    assert estimate.text(explain=True) == lmcalc_run([*MEMORY, "--explain"]).out


def test_show_prints_it(capsys):
    estimate = lmcalc.max_params(gpus="8xH100", framework="idealised")
    estimate.show()
    assert capsys.readouterr().out == str(estimate)
    estimate.show(explain=True)
    assert "16. Largest N (whole memory)" in capsys.readouterr().out


def test_a_plan_shows_the_fastest_ten_as_the_command_does(found, lmcalc_run):
    text = str(found)
    assert "10. " in text and "\n11. " not in text
    assert f"{len(found.report.sections) - 10:,} more ranked in .report" in text
    ten = lmcalc.plan(model="llama-3.1-8b", gpus="8xH100", top=10)
    command = ["plan", "-m", "llama-3.1-8b", "--gpus", "8xH100"]
    assert str(ten) == lmcalc_run(command).out
    assert ten.text(explain=True) == lmcalc_run([*command, "--explain"]).out  # the best layout's derivation


def test_a_notebook_shows_the_tables(found):
    estimate = lmcalc.max_params(gpus="8xH100")
    html = estimate._repr_html_()
    assert html.startswith("<pre") and html.endswith("</pre>")
    assert unescape(html[html.index(">") + 1 : -len("</pre>")]) == str(estimate)
    assert len(found._repr_html_()) < 20_000  # the fastest ten, not every layout


def test_every_estimate_keeps_the_short_repr():
    """Each command's estimate is a dataclass, whose decorator writes a field-by-field repr unless one is kept."""
    for estimate in (
        lmcalc.params(model="llama-3.1-8b"),
        lmcalc.flops(model="llama-3.1-8b", tokens="1T"),
        lmcalc.train_time(model="llama-3.1-8b", gpus="8xH100", tokens="1T", mfu=0.4),
        lmcalc.fit(model="llama-3.1-8b", gpus="8xH100", zero=3),
        lmcalc.memory_sweep(sweep="seq=2K,8K", model="llama-3.1-8b", gpus="8xH100"),
        lmcalc.dtypes(),
    ):
        assert repr(estimate).startswith(f"<{type(estimate).__name__}: ") and len(repr(estimate)) < 400
    row = lmcalc.max_params(gpus="8xH100").rows[3]
    assert repr(row).startswith("MaxParamsRow(zero_stage=3, ") and len(repr(row)) < 300
