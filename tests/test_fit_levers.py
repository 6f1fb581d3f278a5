"""Issue #18 item 4: ``fit`` with nothing fitting says which lever would make it fit, with the memory each gives;
each lever's figure is ``memory``'s for the same change (fed back through the API), and a lever said to fit fits."""

from __future__ import annotations

import re

from lmcalc import api


def levers(estimate) -> dict[str, float]:
    section = next(s for s in estimate.report.sections if s.key == "levers")
    return {t.label: t.value for t in section.terms}


def test_each_lever_is_memorys_figure_for_that_change():
    found = levers(api.fit(model="llama-3.1-8b", gpus="1xRTX4090", seq=2048))
    common = dict(model="llama-3.1-8b", seq=2048, micro_batch=1)
    assert found["--method qlora"] == api.memory(gpus="1xRTX4090", method="qlora", **common).total
    assert found["--recompute full"] == api.memory(gpus="1xRTX4090", recompute="full", **common).total
    more = next(label for label in found if "GPUs with" in label)
    gpus = int(re.match(r"(\d+) GPUs", more).group(1))
    fed_back = api.memory(gpus=f"{gpus}xRTX4090", zero=3, recompute="full", **common)
    assert fed_back.fits and fed_back.total == found[more]
    half = api.memory(gpus=f"{gpus // 2}xRTX4090", zero=3, recompute="full", **common)
    assert not half.fits  # the fewest: half as many do not fit


def test_levers_only_when_nothing_fits():
    fits = api.fit(model="llama-3.1-8b", gpus="8xH100", zero=3)
    assert not any(s.key == "levers" for s in fits.report.sections)
    found = levers(api.fit(model="llama-3-70b", gpus="8xH100", seq=8192))
    assert list(found.values()) == sorted(found.values(), key=lambda v: (v > 80e9, v))  # fitting ones first
    assert any(value <= 80e9 for value in found.values())
