"""Fit the step-time model's few constants on the published runs of ../shared/reference (and Blackwell's GEMM
fraction on benchmarks/blackwell_runs.yaml, which the reference lacks), and measure how it generalises: each run
predicted by a model fitted without it (leave one out), each family by a model fitted on the others, and the held-out
runs (benchmarks/heldout_runs.yaml), which no fit ever sees.

    python scripts/fit_time.py            # the fit, its errors, leave-one-family-out and the held-out summary
    python scripts/fit_time.py --loo      # also leave-one-run-out (a few minutes)

The constants: ``Calibration``'s four (engine.time.rates) and the host time per operation of each framework profile
that has runs to fit it on (only nanotron's runs are host-bound). Everything else comes from spec sheets, measured
matmul and collective figures, and the frameworks' source. The objective is the mean absolute log error of
predicted tokens/s per GPU, which treats 20 % too fast and 20 % too slow alike and does not let one run dominate.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from accuracy import BLACKWELL_FAMILIES, PublishedRun, load_runs

from lmcalc.engine.time.rates import CALIBRATION, Calibration
from lmcalc.engine.time.steptime import step_time
from lmcalc.framework_specs import FrameworkProfile

ROOT = Path(__file__).resolve().parent.parent
FITTED = ROOT / "benchmarks" / "published_runs.yaml"
BLACKWELL = ROOT / "benchmarks" / "blackwell_runs.yaml"
HELDOUT = ROOT / "benchmarks" / "heldout_runs.yaml"

BOUNDS: dict[str, tuple[float, float]] = {
    "gemm:ampere": (0.5, 1.0),
    "gemm:hopper": (0.5, 1.0),
    "gemm:blackwell": (0.5, 1.0),
    "hbm_efficiency": (0.5, 0.95),
    "kernel_overhead_s": (0.0, 20e-6),
    "attention_fraction": (0.5, 1.3),
    "host:nanotron": (0.0, 2e-4),
}
"""Each constant's range: physical limits (a fraction of a measured maximum is at most 1) and generous spans."""


@dataclass(frozen=True)
class Constants:
    calibration: Calibration
    host: tuple[tuple[str, float], ...]  # (framework, host seconds per operation)

    def get(self, name: str) -> float:
        if name.startswith("host:"):
            return dict(self.host)[name[5:]]
        if name.startswith("gemm:"):
            return dict(self.calibration.gemm_fractions)[name[5:]]
        return float(getattr(self.calibration, name))

    def set(self, name: str, value: float) -> Constants:
        if name.startswith("host:"):
            host = dict(self.host)
            host[name[5:]] = value
            return replace(self, host=tuple(sorted(host.items())))
        if name.startswith("gemm:"):
            fractions = dict(self.calibration.gemm_fractions)
            fractions[name[5:]] = value
            mean = statistics.fmean(fractions.values())  # what a chip no run measured gets
            calibration = replace(self.calibration, gemm_fractions=tuple(sorted(fractions.items())), gemm_fraction=mean)
            return replace(self, calibration=calibration)
        return replace(self, calibration=replace(self.calibration, **{name: value}))


def fitting_runs() -> list[PublishedRun]:
    """The fitting set: every run of ../shared/reference with a layout and a speed (published_runs.yaml), and the
    NeMo 2.0 runs on B200 and GB200 that Blackwell's GEMM fraction is fitted on (blackwell_runs.yaml), since the
    reference holds no Blackwell run."""
    return load_runs(FITTED) + load_runs(BLACKWELL, BLACKWELL_FAMILIES)


def current(runs: Sequence[PublishedRun]) -> Constants:
    """The constants lmcalc ships: ``CALIBRATION`` and each fitted profile's host time."""
    host = {name[5:]: 0.0 for name in BOUNDS if name.startswith("host:")}
    for run in runs:
        if run.workload.framework.name in host:
            host[run.workload.framework.name] = run.workload.framework.speed.host_seconds_per_op
    return Constants(CALIBRATION, tuple(sorted(host.items())))


def _profile(profile: FrameworkProfile, constants: Constants) -> FrameworkProfile:
    host = dict(constants.host)
    if profile.name not in host:
        return profile
    speed = profile.speed.model_copy(update={"host_seconds_per_op": host[profile.name]})
    return profile.model_copy(update={"speed": speed})


def predict(run: PublishedRun, constants: Constants) -> float:
    """Predicted tokens/s per GPU for the run's published layout."""
    w = replace(run.workload, framework=_profile(run.workload.framework, constants))
    t = step_time(w, run.layout, run.cluster, calibration=constants.calibration)
    return t.tokens_per_s / run.layout.gpus


def log_error(run: PublishedRun, constants: Constants) -> float:
    return math.log(predict(run, constants) / run.tokens_per_s_per_gpu)


def loss(runs: Sequence[PublishedRun], constants: Constants) -> float:
    return statistics.fmean(abs(log_error(run, constants)) for run in runs)


def _golden(f: Callable[[float], float], low: float, high: float, steps: int = 18) -> float:
    """The minimum of ``f`` on [low, high] by golden-section search (f is close to unimodal in each constant)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def _determined(name: str, runs: Sequence[PublishedRun]) -> bool:
    """Whether some run depends on the constant: a framework's host time needs its runs, a chip generation's GEMM
    fraction runs on that generation."""
    if name.startswith("host:"):
        return any(run.workload.framework.name == name[5:] for run in runs)
    if name.startswith("gemm:"):
        return any(run.cluster.hardware.architecture == name[5:] for run in runs)
    return True


OWN_RUNS_ONLY = ("blackwell",)
"""Chip generations that no run of ../shared/reference measured: their GEMM fraction alone is fitted, on their own runs
(benchmarks/blackwell_runs.yaml), with every shared constant held at the reference runs' fit, so that adding them
leaves the constants the older families were fitted with as they were."""


def _descend(runs: Sequence[PublishedRun], start: Constants, names: Sequence[str], sweeps: int) -> Constants:
    """Coordinate descent over ``names``: each constant in turn to its best value with the others held."""
    constants = start
    for _ in range(sweeps):
        for name in names:
            low, high = BOUNDS[name]
            best = _golden(lambda v, n=name, c=constants: loss(runs, c.set(n, v)), low, high)
            if loss(runs, constants.set(name, best)) < loss(runs, constants):
                constants = constants.set(name, best)
    return constants


def fit(runs: Sequence[PublishedRun], start: Constants, sweeps: int = 3) -> Constants:
    """Coordinate descent, a few sweeps: first every constant on the runs of the generations the reference measured,
    then each generation of ``OWN_RUNS_ONLY`` its GEMM fraction on its own runs. A constant no run can tell apart (a
    framework with no runs here) keeps its starting value."""
    shared = [run for run in runs if run.cluster.hardware.architecture not in OWN_RUNS_ONLY]
    own = [run for run in runs if run.cluster.hardware.architecture in OWN_RUNS_ONLY]
    names = [name for name in BOUNDS if name.removeprefix("gemm:") not in OWN_RUNS_ONLY and _determined(name, shared)]
    constants = _descend(shared, start, names, sweeps)
    generations = [f"gemm:{arch}" for arch in OWN_RUNS_ONLY if _determined(f"gemm:{arch}", own)]
    return _descend(own, constants, generations, sweeps)


def summary(errors: Sequence[float]) -> str:
    """Median and largest absolute error, and how many runs are within ±20 %, from log errors."""
    relative = [abs(math.exp(e) - 1) for e in errors]
    within = sum(r <= 0.20 for r in relative)
    return (
        f"median {statistics.median(relative):.1%}, largest {max(relative):.1%}, within ±20 %: "
        f"{within} of {len(relative)}"
    )


def leave_one_family_out(runs: Sequence[PublishedRun], start: Constants) -> dict[str, float]:
    """Each run's log error under constants fitted on the other families only."""
    errors: dict[str, float] = {}
    for family in sorted({run.family for run in runs}):
        rest = [run for run in runs if run.family != family]
        constants = fit(rest, start, sweeps=2)
        errors.update({run.id: log_error(run, constants) for run in runs if run.family == family})
    return errors


def leave_one_out(runs: Sequence[PublishedRun], start: Constants) -> dict[str, float]:
    """Each run's log error under constants fitted on every other run (warm-started from the full fit)."""
    return {run.id: log_error(run, fit([r for r in runs if r is not run], start, sweeps=1)) for run in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loo", action="store_true", help="also leave each run out in turn (a few minutes)")
    args = parser.parse_args()
    runs = fitting_runs()
    shipped = current(runs)
    print(f"shipped constants: {shipped}")
    print(f"  fitting set ({len(runs)} runs): {summary([log_error(r, shipped) for r in runs])}")
    fitted = fit(runs, shipped)
    print(f"fitted constants: {fitted}")
    for f in fields(Calibration):
        if f.name == "gemm_fractions":
            for arch, value in fitted.calibration.gemm_fractions:
                print(f"  gemm_fraction[{arch}] = {value:.4g}")
        else:
            print(f"  {f.name} = {fitted.get(f.name):.4g}")
    for name, value in fitted.host:
        print(f"  host {name} = {value:.3g} s/op")
    print(f"  fitting set: {summary([log_error(r, fitted) for r in runs])}")
    for family in sorted({r.family for r in runs}):
        print(f"    {family}: {summary([log_error(r, fitted) for r in runs if r.family == family])}")
    by_family = leave_one_family_out(runs, fitted)
    print(f"  leave one family out: {summary(list(by_family.values()))}")
    if args.loo:
        print(f"  leave one run out: {summary(list(leave_one_out(runs, fitted).values()))}")
    heldout = load_runs(HELDOUT, None)
    print(f"held-out ({len(heldout)} runs), shipped constants:")
    for family in sorted({r.family for r in heldout}):
        group = [r for r in heldout if r.family == family]
        print(f"    {family}: {summary([log_error(r, shipped) for r in group])}")


if __name__ == "__main__":
    main()
