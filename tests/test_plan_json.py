"""Issue #18 item 1: ``plan --json`` respects ``--top`` (10 by default, ``all`` when asked), and every layout is
an object with its fields, not only a display string; ``plan --top 1 --json`` wrote 13 MB before."""

from __future__ import annotations

import json
import re

import pytest

from lmcalc.cli import main

FIELDS = {
    "dp": int, "tp": int, "pp": int, "cp": int, "ep": int, "zero": int, "sequence_parallel": bool, "schedule": str,
    "virtual_stages": int, "micro_batch": int, "grad_accum": int, "recompute": str,
}  # fmt: skip


def plan_json(args: str, capsys) -> tuple[dict, int]:
    with pytest.raises(SystemExit) as exit_info:
        main(f"plan -m llama-3-8b --gpus 64xH100 {args} --json".split())
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    return json.loads(out), len(out.encode())


def test_top_one_is_one_small_object(capsys):
    doc, size = plan_json("--top 1", capsys)
    assert list(doc["results"]) == ["rank1"] and size < 20_000
    layout = doc["details"]["rank1"]
    assert {k: type(layout[k]) for k in FIELDS} == FIELDS
    # the fields say what the title's code says (a degree of 1 and ZeRO-0 left out), and multiply to the 64 GPUs
    words = doc["section_titles"]["rank1"].split()[1:]
    for key in ("DP", "TP", "PP", "CP", "EP"):
        n = layout[key.lower()]
        assert (f"{key}{n}" in words) == (n > 1 or key == "DP")
    assert (f"Z{layout['zero']}" in words) == (layout["zero"] > 0)
    assert f"GA{layout['grad_accum']}" in words and f"mb{layout['micro_batch']}" in words
    assert layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 64


@pytest.mark.cli
def test_top_defaults_to_ten_and_all_is_asked_for(capsys):
    default, _ = plan_json("", capsys)
    assert len(default["results"]) == 10 and len(default["details"]) == 10
    every, _ = plan_json("--top all", capsys)
    fitting = int(re.match(r"(\d+) fit", every["inputs"]["evaluated"]["origin"]).group(1))
    # every layout that fits is ranked: a row each, or among the ties of a row (issue #32)
    assert sum(1 + len(d["tied"]) for d in every["details"].values()) == fitting > len(every["results"]) > 10


@pytest.mark.parametrize("top", ["0", "x", "-3", "2.5"])
def test_a_bad_top_is_one_line(top, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "-m", "llama-3-8b", "--gpus", "64xH100", "--top", top])
    err = capsys.readouterr().err
    assert exit_info.value.code != 0 and "--top takes a positive whole number of layouts, or all" in err
