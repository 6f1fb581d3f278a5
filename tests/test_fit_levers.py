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
    fits = api.fit(model="llama-3.1-8b", gpus="8xH100", zero=3, framework="megatron")
    assert not any(s.key == "levers" for s in fits.report.sections)
    found = levers(api.fit(model="llama-3-70b", gpus="8xH100", seq=8192))
    fitting = [label for label, value in found.items() if value <= 85_028_896_768]  # an H100, as CUDA gives it
    assert fitting and list(found)[: len(fitting)] == fitting  # the fitting ones first
    # of them, those that keep the job (not a fine-tuning method) and the GPUs first, the fewest flags first
    kept = [label for label in fitting if "--method" not in label and "GPUs with" not in label]
    assert fitting[: len(kept)] == kept
    assert [label.count("--") for label in kept] == sorted(label.count("--") for label in kept)


def test_more_gpus_is_offered_only_when_the_gpus_at_hand_cannot_hold_it():
    # 8 H100s hold Llama 2 7B under ZeRO-3 (39 GB): doubling the GPUs is not a lever there
    assert not any("GPUs with" in label for label in levers(api.fit(model="llama-2-7b", gpus="8xH100")))
    assert api.memory(model="llama-2-7b", gpus="8xH100", zero=3).fits
