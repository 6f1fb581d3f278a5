"""Issue #18 item 7: energy and emissions of a run, GPU-hours × TDP × power fraction × PUE × grid intensity, each
factor stated and overridable (``engine.run.energy``)."""

from __future__ import annotations

import pytest

from lmcalc import api
from lmcalc.cli import main
from lmcalc.engine.run.energy import Energy, energy_terms
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_hardware


def test_energy_by_hand():
    run = api.train_time(model="llama-3-8b", gpus="64xH100", mfu=0.4, power_fraction=0.8, pue=1.2,
                         grid_gco2_per_kwh=56)  # fmt: skip
    hours = run.gpu_hours
    gpu_wh = hours * 700 * 0.8  # H100 SXM: 700 W
    assert run.value("energy.gpu_energy") == pytest.approx(gpu_wh, rel=1e-12)
    assert run.value("energy.facility_energy") == pytest.approx(gpu_wh * 1.2, rel=1e-12)
    assert run.value("energy.co2") == pytest.approx(gpu_wh * 1.2 / 1000 * 56 / 1000, rel=1e-12)  # kg


def test_llama_2_model_card_rows_follow_one_factor():
    """Llama 2 (Touvron et al. 2023, Table 2, CO2 emissions during pretraining) gives GPU-hours, the power per GPU
    (400 W; 350 W for 34B) and tCO2eq per size; one factor (PUE × grid, 423.5 g/kWh, from the 7B row) gives the
    other rows and the 539.00 t total: emissions are GPU-hours × power × PUE × grid, as lmcalc counts them (34B's
    350 W as a power fraction of the A100's 400 W TDP)."""
    a100 = resolve_hardware("a100-80gb").spec
    assert a100.tdp_watts == 400
    factor = 31.22e3 / (184_320 * 0.4)  # kg per kWh, from the 7B row
    total = 31.22
    for hours, watts, tonnes in ((368_640, 400, 62.44), (1_038_336, 350, 153.90), (1_720_320, 400, 291.42)):
        terms = {t.key: t.value for t in energy_terms(hours, a100, Energy(watts / 400, 1.0, factor * 1000))}
        assert terms["co2"] / 1000 == pytest.approx(tonnes, rel=2e-4)  # the 7B row's 4 figures: ±0.016 %
        total += terms["co2"] / 1000
    assert total == pytest.approx(539.00, rel=2e-4)


def test_defaults_are_stated_and_overridden(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["train-time", "-m", "llama-3-8b", "--gpus", "64xH100", "--grid-gco2-per-kwh", "56", "--pue", "1.2",
             "--power-fraction", "0.8", "--explain"]
        )  # fmt: skip
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "× 0.8" in out and "× 1.2" in out and "× 56 gCO2e/kWh" in out
    default = api.train_time(model="llama-3-8b", gpus="64xH100")
    assert default.value("energy.facility_energy") == pytest.approx(default.value("energy.gpu_energy") * 1.1)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("power_fraction", 1.5, "power_fraction is a share of the GPU's TDP"),
        ("pue", 0.5, "pue is facility energy over IT energy"),
        ("grid_gco2_per_kwh", 5000, "grid_gco2_per_kwh must be from 0 to 2,000"),
        ("grid_gco2_per_kwh", -1, "grid_gco2_per_kwh must be zero or a positive number"),
    ],
)
def test_implausible_factors_are_refused(setting, value, message):
    with pytest.raises(LmcalcError, match=message):
        api.train_time(model="llama-3-8b", gpus="64xH100", **{setting: value})


@pytest.mark.cli
def test_the_report_carries_the_energy(tmp_path):
    page = tmp_path / "r.html"
    with pytest.raises(SystemExit):
        main(["report", "-m", "llama-3-8b", "--gpus", "64xH100", "-o", str(page), "--grid-gco2-per-kwh", "56"])
    text = page.read_text()
    assert "Emissions (location-based)" in text and "× 56 gCO2e/kWh" in text
