"""The ``lmcalc`` command line: parse flags, call the Python API, render. No arithmetic.

The commands live by family (``training``, ``checks``, ``report``, ``bench``, ``presets``) and are registered in
``lmcalc.cli.app.SUBCOMMANDS`` by where they live, in the order ``lmcalc --help`` lists them; a family's module is
imported when one of its commands runs.
"""

from lmcalc.cli.app import app, main

__all__ = ["app", "main"]
