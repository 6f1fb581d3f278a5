"""Energy and emissions of a run: GPU-hours at the GPU's power, the data centre's overhead, the grid's carbon.

    GPU energy       = GPU-hours · TDP · power fraction
    facility energy  = GPU energy · PUE
    emissions        = facility energy · grid carbon intensity

This is how the Llama model cards count (Llama 3.1: "GPU hours of computation on hardware of type H100-80GB (TDP of
700W)", times a power usage effectiveness, times the location's grid intensity). Every factor is an assumption,
stated with its source, and can be given instead: the TDP is the spec sheet's ceiling (a GPU training flat out draws
near it; give a measured fraction if you have one); the CPUs, memory, network and storage of the nodes are not
counted beyond what the PUE covers.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcalc.errors import LmcalcError, setting
from lmcalc.result import Term
from lmcalc.specs import HardwareSpec
from lmcalc.units import sci

DEFAULT_POWER_FRACTION = 1.0
"""The GPUs draw their TDP for the whole run, as the Llama 2/3.1 model cards count (700 W per H100): an upper
bound, since a GPU rarely draws its TDP throughout; give a measured fraction when you have one."""
DEFAULT_PUE = 1.1
"""Power usage effectiveness of a hyperscale data centre: Google reports a fleet-wide 1.10 (2023 Environmental
Report); Uptime Institute's survey average across all data centres is 1.58 (2023)."""
DEFAULT_GRID_GCO2_PER_KWH = 481.0
"""The world's average carbon intensity of electricity generation in 2023, 481 gCO2e/kWh (Ember, Global Electricity
Review 2024, via Statista): give your grid's (Ember's 2023 figures: France 56, India 713)."""


PUE_SOURCE = "PUE 1.10: Google's fleet-wide figure, 2023 Environmental Report (the default)"
GRID_SOURCE = "481 gCO2e/kWh: the world's average for 2023, Ember Global Electricity Review 2024 (the default)"


@dataclass(frozen=True)
class Energy:
    """What turns GPU-hours into energy and emissions: the share of TDP drawn, the PUE, the grid intensity."""

    power_fraction: float = DEFAULT_POWER_FRACTION
    pue: float = DEFAULT_PUE
    grid_gco2_per_kwh: float = DEFAULT_GRID_GCO2_PER_KWH

    def check(self) -> Energy:
        if not 0 < self.power_fraction <= 1:
            raise LmcalcError(
                f"{setting('power_fraction')} is a share of the GPU's TDP: in (0, 1], got {self.power_fraction:g}"
            )
        if not 1 <= self.pue <= 5:
            raise LmcalcError(f"{setting('pue')} is facility energy over IT energy: from 1 to 5, got {self.pue:g}")
        if not 0 <= self.grid_gco2_per_kwh <= 2000:
            raise LmcalcError(
                f"{setting('grid_gco2_per_kwh')} must be from 0 to 2,000 gCO2e/kWh (coal is about 1,000), got "
                f"{self.grid_gco2_per_kwh:g}"
            )
        return self


def energy_terms(gpu_hours: float, hardware: HardwareSpec, energy: Energy) -> tuple[Term, ...]:
    """GPU energy, facility energy and emissions of ``gpu_hours`` on ``hardware``; none when its preset has no TDP."""
    if hardware.tdp_watts is None:
        return ()
    tdp, f, pue, grid = hardware.tdp_watts, energy.power_fraction, energy.pue, energy.grid_gco2_per_kwh
    gpu_wh = gpu_hours * tdp * f
    facility_wh = gpu_wh * pue
    return (
        Term(
            "gpu_energy",
            "GPU energy",
            gpu_wh,
            "Wh",
            "GPU-hours · TDP · power fraction",
            f"{sci(gpu_hours, 4)} × {tdp:g} W × {f:g}",
            hardware.sources.get("power", hardware.sources.get("memory", "")),
            note=f"{hardware.name} TDP {tdp:g} W, "
            + ("drawn throughout (the default)" if f == DEFAULT_POWER_FRACTION else f"of which {f:g} is drawn (given)"),
        ),
        Term(
            "facility_energy",
            "Facility energy (with PUE)",
            facility_wh,
            "Wh",
            "GPU energy · PUE",
            f"{sci(gpu_wh, 4)} Wh × {pue:g}",
            PUE_SOURCE if pue == DEFAULT_PUE else "the PUE given",
        ),
        Term(
            "co2",
            "Emissions (location-based)",
            facility_wh / 1000 * grid / 1000,
            "kg CO2e",
            "facility energy · grid intensity",
            f"{facility_wh / 1000:,.0f} kWh × {grid:g} gCO2e/kWh",
            GRID_SOURCE if grid == DEFAULT_GRID_GCO2_PER_KWH else "the grid intensity given",
        ),
    )
