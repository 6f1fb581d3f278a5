"""Every published layout fits under its framework profile with its recomputation, or its row says why not (issue
#29: the runs of benchmarks/published_runs.yaml and benchmarks/heldout_runs.yaml, the reference's published runs
among them). A run that does not fit carries a ``fit_note`` naming the published setting lmcalc cannot yet express
or the setting its source leaves out; a note beside a run that fits is stale. docs/published-fit.md is the report."""

from __future__ import annotations

from published_fit import DOC, FILES, fits, report

from lmcalc.preset_files import TABLE_FILE_LIMIT, read_yaml

ROWS = fits()


def test_every_run_is_judged_once():
    rows = [row["id"] for path in FILES for row in read_yaml(path, TABLE_FILE_LIMIT)["runs"]]
    assert sorted(r.run.id for r in ROWS) == sorted(rows) and len(set(rows)) == len(rows)


def test_a_layout_that_does_not_fit_says_why():
    unexplained = [(r.run.id, f"{r.total / 1e9:.1f} GB") for r in ROWS if not r.fits and not r.run.fit_note.strip()]
    assert not unexplained, f"published layouts that do not fit, without a fit_note: {unexplained}"


def test_no_note_beside_a_layout_that_fits():
    stale = [r.run.id for r in ROWS if r.fits and r.run.fit_note]
    assert not stale, f"fit_note beside a layout that fits: {stale}"


def test_the_lightest_recomputation_that_fits_is_lighter_than_none_where_the_run_does_not_fit():
    # a run that does not fit under its own recomputation fits, if at all, only under a heavier one
    order = ("none", "selective", "full")
    for r in ROWS:
        if not r.fits and r.lightest:
            assert order.index(r.lightest) > order.index(r.run.workload.recompute), r.run.id


def test_the_report_is_current():
    assert DOC.read_text() == report(ROWS), "run: python scripts/published_fit.py --write"


def test_the_answer_says_what_fp8_leaves_unexpressed(lmcalc_run):
    # fp8: a profile that follows Transformer Engine counts its storage and names what it leaves out; another profile
    # says its fp8 storage is not modelled; bf16 says neither
    def notes(precision: str, framework: str = "megatron") -> list[str]:
        argv = ["memory", "-m", "llama-3-8b", "--precision", precision, "--framework", framework, "--json"]
        return lmcalc_run(argv).json["notes"]

    assert any("fp8 as Transformer Engine keeps it" in n and "not modelled" in n for n in notes("fp8-mixed"))
    assert any("what an fp8 recipe keeps under this profile is not modelled" in n
               for n in notes("fp8-mixed", "transformers"))  # fmt: skip
    assert any("fp8 as torchao's float8 keeps it" in n for n in notes("fp8-mixed", "torchtitan"))
    assert not any("fp8" in n for n in notes("bf16-mixed"))
