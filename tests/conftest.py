"""The harnesses that check lmcalc against published figures (``accuracy``, ``golden``) live in scripts/, outside
the package: the tests import them from there.

Tiers. A test is in the ``fast`` tier unless it, its class or its module is marked with one of the slower tiers:

- ``cli``: runs lmcalc or another program as a process (the command line end to end, a built wheel, a browser);
- ``torch``: compares with PyTorch, transformers, PEFT or bitsandbytes (imports torch);
- ``data``: checks a data file row by row against its sources (published runs);
- ``slow``: fuzzing, the docs replay, the time model's re-fits, the linters and mypy.

``python -m pytest -m fast`` runs the fast tier (under a minute on 2 cores): no torch, no subprocess, no network.
A module marked as a whole with a slower tier (``pytestmark = pytest.mark.torch``) is not even imported then, so
torch and transformers are never loaded; a fast test that starts a process or imports torch fails.
"""

import compileall
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

SLOWER_TIERS = ("cli", "torch", "data", "slow")
_MODULE_TIER = re.compile(r"^pytestmark = pytest\.mark\.(\w+)$", re.M)


def module_tier(path: Path) -> str | None:
    """The tier a test module declares for all its tests (``pytestmark = pytest.mark.cli``), read from its text."""
    match = _MODULE_TIER.search(path.read_text(encoding="utf-8"))
    return match.group(1) if match and match.group(1) in SLOWER_TIERS else None


class _Marks(dict):
    """The names of a ``-m`` expression, evaluated for a test that carries exactly ``marks``."""

    def __init__(self, marks: set[str]) -> None:
        super().__init__()
        self.marks = marks

    def __missing__(self, name: str) -> bool:
        return name in self.marks


def selects(markexpr: str, marks: set[str]) -> bool:
    """Whether ``-m markexpr`` selects a test with ``marks`` (the expression's and, or, not and brackets are
    Python's; each name is true when the test carries that mark)."""
    return bool(eval(markexpr, {"__builtins__": {}}, _Marks(marks)))  # noqa: S307 (names and and/or/not only)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module of a slower tier that ``-m`` deselects as a whole is not imported (its imports are the slow part:
    with ``-m fast`` torch and transformers are never loaded, and a machine without them collects no error)."""
    markexpr = config.getoption("markexpr", "")
    if markexpr and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        tier = module_tier(collection_path)
        if tier and not selects(markexpr, {tier}):
            return True
    return None


ROOT = Path(__file__).resolve().parent.parent
_PYCACHES = pytest.StashKey[list[Path]]()  # the bytecode folders pytest_configure made


def pytest_configure(config: pytest.Config) -> None:
    """Where this Python writes no bytecode (``PYTHONDONTWRITEBYTECODE``), every ``lmcalc`` process the tests start
    would compile lmcalc's 200 modules again: about 0.1 s of CPU each, a minute over the documented commands and the
    command-line tests. Compiled once here, into the ``__pycache__`` folders Python would have written (ignored by
    git), removed again at the end where this run made them; not where ``-m`` selects no tier that starts
    processes. (A ``PYTHONPYCACHEPREFIX`` would not do: it moves every module's cache, the libraries' too, and the
    processes would compile those.)"""
    markexpr = config.getoption("markexpr", "")
    starts_processes = not markexpr or selects(markexpr, {"cli"}) or selects(markexpr, {"slow"})
    if not sys.flags.dont_write_bytecode or sys.pycache_prefix or not starts_processes:
        return
    packages = [ROOT / "lmcalc", ROOT / "scripts"]
    before = {cache for package in packages for cache in package.rglob("__pycache__")}
    for package in packages:
        compileall.compile_dir(package, quiet=1)
    config.stash[_PYCACHES] = [c for p in packages for c in p.rglob("__pycache__") if c not in before]


def pytest_unconfigure(config: pytest.Config) -> None:
    for cache in config.stash.get(_PYCACHES, []):
        shutil.rmtree(cache, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in SLOWER_TIERS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session", autouse=True)
def _matplotlib_font_cache():
    """matplotlib builds its font cache the first time it is used on a machine, by running ``fc-list``: built here,
    once, before a fast test that renders a report (``lmcalc report``'s plots) could be refused the process."""
    try:
        import matplotlib
    except ImportError:
        yield
        return
    if not any(Path(matplotlib.get_cachedir()).glob("fontlist-*.json")):
        import matplotlib.font_manager  # noqa: F401  (builds the cache)
    yield


@pytest.fixture(scope="module", autouse=True)
def _free_transformers_models():
    """``scripts/hf_saved.py`` keeps the last model it built (up to 3.5 GB at real width): freed after each test module
    that built one, for the modules that follow."""
    yield
    hf_saved = sys.modules.get("hf_saved")
    if hf_saved is not None:
        hf_saved.release_models()


@pytest.fixture(autouse=True)
def _fast_tests_stay_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A fast test starts no process and loads no torch (where torch was not loaded before it)."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a fast test starts no process: mark it cli (or slow)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    torch_before = "torch" in sys.modules
    yield
    assert torch_before or "torch" not in sys.modules, "a fast test imports no torch: mark it torch"


class CliRun:
    """One in-process run of ``lmcalc``: its exit code, what it printed, and that as JSON."""

    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def json(self):
        import json

        return json.loads(self.out)


@pytest.fixture
def lmcalc_run(capsys: pytest.CaptureFixture[str]):
    """``lmcalc_run(argv)``: the command line's ``main`` run in this process (no subprocess: fast tier)."""

    def run(argv: list[str]) -> CliRun:
        from lmcalc.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        out, err = capsys.readouterr()
        return CliRun(exit_info.value.code, out, err)

    return run


@pytest.fixture
def user_presets(tmp_path, monkeypatch):
    """An empty directory on LMCALC_PRESET_PATH, laid out like presets/; the registry is read afresh around it."""
    from lmcalc import presets

    (tmp_path / "models").mkdir()
    monkeypatch.setenv(presets.PRESET_PATH_ENV, str(tmp_path))
    presets.registry.cache_clear()
    yield tmp_path
    presets.registry.cache_clear()


@pytest.fixture(scope="module")
def served():
    """``lmcalc serve``'s server on a free loopback port, answering on its own thread, for a test module."""
    from lmcalc.serve import server as page_server

    server = page_server.start()
    yield server
    server.shutdown()
    server.server_close()
