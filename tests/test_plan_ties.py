"""plan's ranked layouts, one row per throughput (issue #32, item 6): layouts that tie are one row, the one with
the most headroom shown, the others counted beside it and listed in ``--json``; the layout of each rank is in
``details.rankN``, as the README says."""

import pytest

from lmcalc import api
from lmcalc.estimates.plan import TIES_NOTE, layout_code

pytestmark = pytest.mark.fast


def rank(found, n):
    return next(section for section in found.report.sections if section.key == f"rank{n}")


@pytest.fixture(scope="module")
def found():
    # Llama 3.1 8B on 64 H100s: before, the top 10 were 10 layouts at one throughput (566.4 K tokens/s), DP64 and
    # DP32 CP2 and DP16 CP4, at ZeRO-2 and -3, with and without selective recomputation
    return api.plan(model="llama-3.1-8b", gpus="64xH100", top=5)


def test_each_row_is_one_throughput_and_its_ties(found):
    rows = [rank(found, n) for n in range(1, 6)]
    speeds = [row.term("tokens_per_s").value for row in rows]
    assert speeds == sorted(speeds, reverse=True) and len(set(speeds)) == 5  # no two rows tie
    # the rows and their ties are the search's order, read in turn: every layout once
    flat = [code for row in rows for code in (row.title.split(". ", 1)[1].split(" +")[0], *dict(row.details)["tied"])]
    assert flat == [layout_code(c) for c in found.layouts[: len(flat)]]
    first = dict(rows[0].details)
    assert len(first["tied"]) >= 5 and rows[0].title.endswith(f" +{len(first['tied'])}")
    tied = found.layouts[: 1 + len(first["tied"])]
    assert {round(c.tokens_per_s, 6) for c in tied} == {round(speeds[0], 6)}
    assert min(c.memory_total for c in tied) == tied[0].memory_total  # the row shows the one with most headroom
    assert TIES_NOTE in found.report.notes


def test_json_holds_each_rank_with_its_layout_and_ties(found):
    details = found.to_dict()["details"]
    assert list(details) == [f"rank{n}" for n in range(1, 6)]
    best = found.best
    assert details["rank1"]["dp"] == best.layout.dp and details["rank1"]["recompute"] == best.recompute
    assert isinstance(details["rank1"]["tied"], list) and all(
        isinstance(code, str) for code in details["rank1"]["tied"]
    )


def test_a_search_without_ties_shows_no_note():
    one = api.plan(model="llama-3.1-8b", gpus="8xH100", tp=8, pp=1, cp=1, zero=1, micro_batch=1, recompute="none")
    assert dict(rank(one, 1).details)["tied"] == ()
    assert TIES_NOTE not in one.report.notes
