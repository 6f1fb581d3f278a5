"""The ``lmcalc`` command line: parse flags, call the Python API, render. No arithmetic.

The commands live by family (``training``, ``checks``, ``report``, ``bench``, ``presets``) and are registered
here, in the order ``lmcalc --help`` lists them.
"""

from lmcalc.cli import (
    bench,  # noqa: F401  (its commands register themselves on bench_app)
    checks,
    presets,
    report,
    training,
)
from lmcalc.cli.app import app, bench_app, main, presets_app

for name, command in (
    ("train-time", training.train_time),
    ("max-params", training.max_params),
    ("flops", training.flops),
    ("memory", training.memory),
    ("fit", training.fit),
    ("plan", training.plan),
    ("optimal", training.optimal),
    ("report", report.report),
    ("params", checks.params),
    ("tensor", checks.tensor),
    ("dtypes", checks.dtypes),
    ("validate", checks.validate),
):
    app.command(name)(command)
for name, command in (
    ("list", presets.presets_list),
    ("show", presets.presets_show),
    ("schema", presets.presets_schema),
    ("check", presets.presets_check),
):
    presets_app.command(name)(command)
app.add_typer(presets_app, name="presets")
app.add_typer(bench_app, name="bench")

__all__ = ["app", "main"]
