"""The Python API and the command line have one shape: keyword-only functions whose keywords are the command's
flags, with the same defaults; and ``import lmcalc`` stays light, loading the API, the engine and each command's
estimates only when they are used."""

import inspect
import json
import subprocess
import sys
import textwrap
import typing

import pytest
import typer
from typer.core import TyperArgument

import lmcalc.api as api
from lmcalc.cli import app
from lmcalc.estimates import setting_groups, settings
from lmcalc.estimates.inputs import TRAINING_DEFAULTS
from lmcalc.estimates.layout_settings import LayoutSettings
from lmcalc.estimates.settings import DEFAULT_PRECISION, TrainingSettings
from lmcalc.estimates.training import build_layout

CLI = typer.main.get_command(app)
LLAMA_8B = 8_030_261_248  # meta-llama/Llama-3.1-8B safetensors total

COMMANDS = {
    # command -> the API functions it calls (docs/api.md: "Every accounting command is a Python function named like
    # the command");
    # memory calls memory_sweep with --sweep and inference with --inference
    "train-time": ("train_time",),
    "max-params": ("max_params",),
    "flops": ("flops",),
    "memory": ("memory", "memory_sweep", "inference"),
    "fit": ("fit",),
    "plan": ("plan",),
    "optimal": ("optimal",),
    "report": ("report",),
    "params": ("params",),
    "tensor": ("tensor",),
    "dtypes": ("dtypes",),
}
NOT_IN_THE_API = {"validate", "presets", "bench", "serve"}  # torch checks, preset/bench groups, the page: no function

REQUIRED = inspect.Parameter.empty
LAYOUT_SETTING = object()  # marks a LayoutSettings key: its default is what build_layout makes of its absence

DIFFERENT_ON_PURPOSE = {
    # optimal passes --precision on only when it is given (precision alone, with --compute, is refused): the API's
    # None means bf16-mixed for a cluster, and an error with a FLOP budget
    ("optimal", "precision"): "bf16-mixed",
    # --sweep chooses memory_sweep (which requires it) over memory: left out, the command calls memory
    ("memory", "sweep"): None,
    # plan shows the top 10 (--top), in its table and its JSON alike; the API, like --plot, ranks every layout
    ("plan", "top"): "10",
    # --from may name the model (a launch config's model, or its shape): --model is then optional, and a command
    # given neither says so (tests/test_launch_cli.py)
    **{(command, "model"): None for command in ("train-time", "memory", "fit", "plan", "report")},
}


def keyword_of(param) -> str:
    """The API keyword a command-line parameter stands for: its long flag underscored (``--price-per-gpu-hour`` is
    ``price_per_gpu_hour``, whatever the command's own variable is called), or an argument's name."""
    if isinstance(param, TyperArgument):
        return param.name
    return param.opts[0].removeprefix("--").replace("-", "_")


def settings_type(function) -> type | None:
    """The TypedDict a function takes as ``**settings: Unpack[...]``, if any."""
    signature = inspect.signature(function, eval_str=True)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            (typed_dict,) = typing.get_args(parameter.annotation)
            return typed_dict
    return None


def api_defaults(function) -> dict[str, object]:
    """Each keyword ``function`` takes and its default: ``REQUIRED`` for none; for a settings key, the default its
    declaration holds (``estimates.settings``), but ``LAYOUT_SETTING`` for a ``LayoutSettings`` key of ``memory`` and
    ``fit``, whose meaning is what ``build_layout`` makes of it."""
    defaults: dict[str, object] = {}
    typed_dict = settings_type(function)
    if typed_dict is not None:
        declared = setting_groups.defaults(typed_dict)
        for key in typed_dict.__required_keys__ | typed_dict.__optional_keys__:
            layout_key = key in LayoutSettings.__optional_keys__ and issubclass_typed(typed_dict, LayoutSettings)
            defaults[key] = LAYOUT_SETTING if layout_key else declared[key]
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
            defaults[parameter.name] = parameter.default
    return defaults


def issubclass_typed(typed_dict, base) -> bool:
    """Whether the TypedDict ``typed_dict`` holds every key of ``base`` (TypedDicts are not classes to issubclass)."""
    return base.__optional_keys__ <= typed_dict.__optional_keys__


def test_a_layout_setting_declared_default_is_the_layouts_own():
    """Each ``LayoutSettings`` default, given, makes the layout that giving nothing makes (``build_layout``)."""
    cluster = api.cluster_of("64x8xH100")
    for key, default in setting_groups.defaults(LayoutSettings).items():
        assert build_layout(cluster, {key: default}) == build_layout(cluster, {}), key


# -------------------------------------------------------------------------------------------------- keywords


def test_every_api_function_takes_keywords_only():
    # docs/api.md: the arguments are keyword-only, so a call reads like the command line and a new keyword can be
    # added anywhere without shifting a caller's positional arguments
    functions = {name: getattr(api, name) for name in api.__all__ if inspect.isfunction(getattr(api, name))}
    helpers = {"cluster_of", "resolve_model"}  # resolve one value: positional by design
    assert helpers <= set(functions) and set(COMMANDS["memory"]) <= set(functions)
    for name in sorted(set(functions) - helpers):
        kinds = {p.name: p.kind for p in inspect.signature(functions[name]).parameters.values()}
        positional = [p for p, kind in kinds.items() if kind not in (kind.KEYWORD_ONLY, kind.VAR_KEYWORD)]
        assert not positional, f"lmcalc.{name} takes {positional} positionally"


def test_every_command_of_the_api_is_mapped():
    # a new command must be added to COMMANDS, so that its defaults are compared below
    assert set(CLI.commands) == set(COMMANDS) | NOT_IN_THE_API


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_keyword_of_the_api_is_a_flag_of_its_command(command):
    # docs/api.md: "the arguments are keyword-only: the command's flags": no API setting the command line cannot reach
    flags = {keyword_of(p) for p in CLI.commands[command].params}
    for function in COMMANDS[command]:
        missing = set(api_defaults(getattr(api, function))) - flags
        assert not missing, f"lmcalc.{function} takes {sorted(missing)}, which lmcalc {command} has no flag for"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_defaults_are_the_apis(command):
    """Each flag's default is the default of the API keyword it sets (docs/api.md: "with the same defaults"), and a
    flag is required exactly when the keyword is. A layout setting's default is what ``build_layout`` makes of its
    absence, so giving the flag's default must make the same layout as giving nothing."""
    cluster = api.cluster_of("64x8xH100")
    functions = [getattr(api, name) for name in COMMANDS[command]]
    compared, wrong = set(), []
    for param in CLI.commands[command].params:
        keyword = keyword_of(param)
        having = [api_defaults(f) for f in functions if keyword in api_defaults(f)]
        if not having or (command, keyword) in DIFFERENT_ON_PURPOSE:
            continue  # a front-end option (--json, --plot, --top) or an exception tested below
        api_default, cli_default = having[0][keyword], param.default
        compared.add(keyword)
        if api_default is REQUIRED or param.required:
            if not (api_default is REQUIRED and param.required):
                wrong.append(f"{keyword}: required by the API: {api_default is REQUIRED}, by the CLI: {param.required}")
        elif api_default is LAYOUT_SETTING:
            if build_layout(cluster, {keyword: cli_default}) != build_layout(cluster, {}):
                wrong.append(f"{keyword}: the CLI's {cli_default!r} is not the layout's default")
        elif cli_default != api_default:
            wrong.append(f"{keyword}: CLI {cli_default!r}, API {api_default!r}")
    excepted = {keyword for c, keyword in DIFFERENT_ON_PURPOSE if c == command}
    assert compared | excepted == {keyword for f in functions for keyword in api_defaults(f)}  # none left out
    assert not wrong, f"lmcalc {command}: " + "; ".join(wrong)


def test_the_defaults_that_differ_do_so_for_their_reason():
    """Each entry of DIFFERENT_ON_PURPOSE still differs, for the reason its comment gives."""

    def cli_default(command: str, keyword: str):
        (param,) = [p for p in CLI.commands[command].params if keyword_of(p) == keyword]
        return param.default

    for (command, keyword), expected in DIFFERENT_ON_PURPOSE.items():
        assert cli_default(command, keyword) == expected, (command, keyword)
    # optimal: the API leaves the precision out (None) unless given; the command's shown default is the recipe
    assert inspect.signature(api.optimal).parameters["precision"].default is None
    assert cli_default("optimal", "precision") == DEFAULT_PRECISION
    # memory --sweep: memory_sweep needs it
    assert inspect.signature(api.memory_sweep).parameters["sweep"].default is REQUIRED
    # plan: the API ranks every layout that fits
    assert setting_groups.defaults(settings.PlanSettings)["top"] is None


WORKLOAD_DEFAULTS_OF_THEIR_OWN = {
    # the search varies the micro-batch and the recomputation: None leaves them to it
    ("plan", "micro_batch"): None,
    ("plan", "recompute"): None,
    # a report searches its layout as plan does (docs/commands/report.md): None leaves the recomputation to it
    ("report", "recompute"): None,
    # max-params scales a template model and states its activation column at 4096 tokens
    ("max_params", "seq"): "4096",
    # optimal takes a precision only with a cluster (see DIFFERENT_ON_PURPOSE)
    ("optimal", "precision"): None,
}


@pytest.mark.parametrize("function", [f for f in api.__all__ if inspect.isfunction(getattr(api, f))])
def test_workload_keywords_default_to_the_one_table(function):
    """A function that takes a workload setting as its own keyword (``plan(attention=...)``) defaults it to the
    value ``TRAINING_DEFAULTS`` holds, the table ``memory`` and ``fit`` read, unless it has a reason of its own."""
    parameters = inspect.signature(getattr(api, function)).parameters
    for key in TrainingSettings.__optional_keys__ & parameters.keys():
        default = parameters[key].default
        expected = WORKLOAD_DEFAULTS_OF_THEIR_OWN.get((function, key), TRAINING_DEFAULTS[key])
        assert default == expected, f"{function}({key}=...) defaults to {default!r}"


# -------------------------------------------------------------------------------------------------- lazy loading


def python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; its last line of output is a JSON document."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.cli
def test_import_lmcalc_loads_neither_the_api_nor_the_engine_nor_torch():
    found = python("""
        import json, sys
        import lmcalc
        heavy = ("lmcalc.api", "lmcalc.engine", "torch")
        before = [m for m in heavy if m in sys.modules]
        lmcalc.params  # the first use of the API loads it, and the engine with it
        print(json.dumps({"before": before, "after": [m for m in heavy if m in sys.modules]}))
    """)
    assert found["before"] == []
    assert found["after"] == ["lmcalc.api", "lmcalc.engine"]  # the check sees a loaded module


@pytest.mark.cli
def test_an_api_name_loads_the_api_and_a_submodule_stays_a_submodule():
    found = python("""
        import json, sys, types
        import lmcalc
        from lmcalc import presets  # through lmcalc.__getattr__ before the API is loaded
        submodule = isinstance(presets, types.ModuleType) and presets is sys.modules["lmcalc.presets"]
        api_after_presets = "lmcalc.api" in sys.modules
        memory = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3, framework="idealised")
        import lmcalc.api as api
        same = [name for name in api.__all__ if getattr(lmcalc, name) is getattr(api, name)]
        print(json.dumps({"submodule": submodule, "api_after_presets": api_after_presets,
                          "states": memory.gpu.states, "same": same, "all": api.__all__}))
    """)
    assert found["submodule"] and not found["api_after_presets"]
    # ZeRO-3 over 8 GPUs, mixed-precision AdamW: 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, 8 ways (ZeRO §5.1)
    assert found["states"] == pytest.approx(16 * LLAMA_8B / 8, rel=1e-12)
    # every API name is reachable as lmcalc.<name>: none is shadowed by a submodule of the same name
    assert found["same"] == found["all"]


@pytest.mark.cli
def test_a_command_loads_only_the_engine_it_needs():
    # (torch and matplotlib: tests/test_cli.py, test_accounting_commands_never_import_torch_or_matplotlib)
    found = python("""
        import json, sys
        from lmcalc.cli import main
        watched = ("lmcalc.engine.search.plan", "lmcalc.engine.memory.gpu_memory")
        seen = {}
        for argv in (["train-time", "--model", "llama-3-70b", "--gpus", "1024xH100"],
                     ["memory", "--model", "llama-3.1-8b", "--gpus", "8xH100"]):
            try:
                main(argv)
            except SystemExit as exit:
                assert exit.code == 0, argv
            seen[argv[0]] = [m for m in watched if m in sys.modules]
        print(json.dumps(seen))
    """)
    assert found["train-time"] == []  # the time of a run needs no memory model and no layout search
    assert found["memory"] == ["lmcalc.engine.memory.gpu_memory"]  # memory needs its model, and the check sees it
