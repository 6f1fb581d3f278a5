"""lmcalc: what an LLM training run costs before you rent a GPU — parameters, FLOPs, memory, time.

The accounting engine is pure Python; torch is imported only by ``bench`` and the PyTorch cross-checks.
"""

__version__ = "0.1.0"


def estimate(command: str, **options: object):
    """Run an lmcalc command from Python and get its result object (the one tables, --json and --explain
    render). Options are the command's flags with underscores: ``estimate("train-time", model="llama-3-70b",
    gpus="1024xH100", tokens="15T", mfu=0.5)``; True turns a flag on. Raises ``lmcalc.errors.LmcalcError``."""
    from lmcalc.cli import run_captured

    argv = command.split()
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (None, False):
            argv += [flag, str(value)]
    return run_captured(argv)
