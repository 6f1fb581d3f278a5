"""Below the command line, errors name settings, never flags (lmcalc/errors.py): the library writes
``setting("virtual_stages")``, the Python API says ``virtual_stages`` and the command line ``--virtual-stages``. The
source is scanned for flags written by hand and for settings no command has a flag for; then one mistake of each
kind is made from Python and from the command line."""

import ast
import inspect
import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.core import TyperOption

import lmcalc
import lmcalc.api as api
from lmcalc.api import Workload
from lmcalc.cli import app, main
from lmcalc.cli.app import error_message
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.errors import KEYWORDS, LmcalcError, flag
from lmcalc.estimates import inputs
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

PACKAGE = Path(lmcalc.__file__).resolve().parent
LIBRARY = sorted(
    [
        *(PACKAGE / "engine").rglob("*.py"),
        *(PACKAGE / "estimates").rglob("*.py"),
        *(PACKAGE / "bench").rglob("*.py"),
        PACKAGE / "validate.py",
        PACKAGE / "measure.py",
        PACKAGE / "reference_model.py",
    ]
)
FLAG = re.compile(r"--[a-z][a-z-]+")
SHELL_COMMAND = re.compile(r"(['\"`])lmcalc [^'\"`]*\1")  # "run 'lmcalc bench --dtype bf16'": a command to type


def cli_options(command) -> set[str]:
    """Every option of a command and of its subcommands, as typed (``--virtual-stages``)."""
    found = {name for p in command.params if isinstance(p, TyperOption) for name in p.opts}
    for sub in getattr(command, "commands", {}).values():
        found |= cli_options(sub)
    return found


CLI_FLAGS = cli_options(typer.main.get_command(app))


def called(node: ast.AST) -> str | None:
    """The name a call calls: ``f`` for ``f(...)`` and ``m.f(...)``."""
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return node.func.id
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
    return None


def strings(node: ast.AST) -> Iterator[tuple[int, str]]:
    """Each string written in ``node``, with its line: an f-string as one text, its replacement fields as ``{}``
    (and the strings inside them on their own)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.lineno, node.value
    elif isinstance(node, ast.JoinedStr):
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += part.value
            else:
                assert isinstance(part, ast.FormattedValue)
                text += "{}"
                yield from strings(part.value)
        yield node.lineno, text
    else:
        for child in ast.iter_child_nodes(node):
            yield from strings(child)


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef)


def scopes(tree: ast.Module) -> Iterator[list[ast.AST]]:
    """The nodes of the module's own code, then of each function's, a nested function's in its own scope."""
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, SCOPES))]:
        nodes, todo = [], list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            nodes.append(node)
            if not isinstance(node, SCOPES):
                todo.extend(ast.iter_child_nodes(node))
        yield nodes


def error_texts(source: str) -> Iterator[tuple[int, str]]:
    """The texts of every ``LmcalcError(...)`` message in ``source``: the strings in its arguments, and the
    strings assigned, in the same function, to a name the message uses (``run = f"..."; LmcalcError(f"...{run}")``)."""
    for body in scopes(ast.parse(source)):
        assigned: dict[str, list[ast.AST]] = {}
        for node in body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        for node in body:
            if called(node) == "LmcalcError":
                assert isinstance(node, ast.Call)
                for argument in [*node.args, *(k.value for k in node.keywords)]:
                    yield from strings(argument)
                    for name in {n.id for n in ast.walk(argument) if isinstance(n, ast.Name)}:
                        for value in assigned.get(name, []):
                            yield from strings(value)


def written_flags(source: str) -> list[tuple[int, str]]:
    """(line, text) of each error text that spells a flag outside a suggested ``lmcalc ...`` command."""
    return sorted({(line, text) for line, text in error_texts(source) if FLAG.search(SHELL_COMMAND.sub("", text))})


def test_the_scan_finds_a_flag_and_lets_a_shell_command_be():
    # the scanner itself, on code written here: it must be able to find what the next test looks for
    source = """
def check(tp, flag):
    run = f"run 'lmcalc bench --dtype {tp}'"
    hint = f"try --zero 3 instead of {tp}"
    if tp:
        raise LmcalcError(f"{setting('tp')} {tp} is too large; {run}")
    raise errors.LmcalcError(f"{tp} is wrong: " + hint, "see 'lmcalc presets list --all'")
"""
    assert written_flags(source) == [(4, "try --zero 3 instead of {}")]
    # every message of a real module is seen, the documented one included (docs/api.md, Errors)
    texts = {text for _, text in error_texts((PACKAGE / "engine" / "parallel" / "pipeline.py").read_text())}
    assert "the interleaved schedule needs {} 2 or more (1 is plain 1F1B)" in texts


def test_library_error_messages_name_settings_not_flags():
    """A flag written by hand in a library error would reach a Python caller as ``--tp``: the library says
    ``setting("tp")`` and each front end names it (errors.py). A flag inside a suggested ``lmcalc ...`` command is
    a command to type, and stays."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}"
        for path in LIBRARY
        for line, text in written_flags(path.read_text())
    ]
    assert not offenders, "error messages that spell a flag:\n" + "\n".join(offenders)


# -------------------------------------------------------------------------------------------------- settings

NAME_ARGUMENT = {
    # the helpers of estimates/inputs.py that name the setting at fault: helper -> (position of ``name``, default)
    function.__name__: (list(signature.parameters).index("name"), signature.parameters["name"].default)
    for function in vars(inputs).values()
    if inspect.isfunction(function)
    and function.__module__ == inputs.__name__
    and "name" in (signature := inspect.signature(function)).parameters
}

ENGINE_ONLY = {
    # fields checked in the engine that neither the Python API nor the command line can set (so no flag is ever
    # printed for them): Workload.mask_bytes comes from dropout_mask_bytes(), Pins.max_tp is always left at None
    "mask_bytes": "lmcalc/engine/workload.py",
    "max_tp": "lmcalc/engine/search/space.py",
}


def literal_names(node: ast.AST) -> Iterator[str]:
    """The strings of a literal tuple or list, or the first string of each of its tuples
    (``(("attention", KERNELS), ("recompute", MODES))``)."""
    if isinstance(node, ast.Tuple | ast.List):
        for item in node.elts:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                yield item.value
            elif isinstance(item, ast.Tuple) and isinstance(item.elts[0], ast.Constant):
                yield item.elts[0].value


def binds(target: ast.AST, name: str) -> bool:
    """Whether a loop target binds ``name`` (``name`` or ``name, value``)."""
    if isinstance(target, ast.Name):
        return target.id == name
    return isinstance(target, ast.Tuple) and isinstance(target.elts[0], ast.Name) and target.elts[0].id == name


def setting_names(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of each setting the source names: ``setting("tp")``; ``setting(name)`` in a function that loops
    ``name`` over a literal tuple; and the ``name`` given to a helper of estimates/inputs.py (``choice(v, opts,
    "schedule")``, its default when left out)."""
    for body in scopes(ast.parse(source)):
        loops = [n for n in body if isinstance(n, ast.For | ast.comprehension)]
        for node in body:
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if called(node) == "setting":
                argument = node.args[0]
                if isinstance(argument, ast.Constant):
                    yield node.lineno, argument.value
                elif isinstance(argument, ast.Name):
                    for loop in loops:
                        if binds(loop.target, argument.id):
                            yield from ((node.lineno, n) for n in literal_names(loop.iter))
            elif called(node) in NAME_ARGUMENT:
                position, default = NAME_ARGUMENT[called(node)]
                given = [k.value for k in node.keywords if k.arg == "name"]
                given += node.args[position : position + 1]
                if not given and isinstance(default, str):
                    yield node.lineno, default
                for value in given:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        yield node.lineno, value.value


def library_settings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in LIBRARY:
        for line, name in setting_names(path.read_text()):
            found.setdefault(name, []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return found


def api_keywords() -> set[str]:
    """Every keyword of every function of lmcalc.api, the settings its ``**settings`` take included."""
    keywords = set()
    for name in api.__all__:
        function = getattr(api, name)
        if inspect.isfunction(function):
            for parameter in inspect.signature(function, eval_str=True).parameters.values():
                if parameter.kind is inspect.Parameter.VAR_KEYWORD:  # **settings: Unpack[a settings group]
                    (group,) = typing.get_args(parameter.annotation)
                    keywords |= group.__optional_keys__
                else:
                    keywords.add(parameter.name)
    return keywords


def test_every_setting_an_error_names_has_a_flag():
    """The command line prints ``flag(name)`` for ``setting(name)``: that flag must exist, or the user is told to
    use an option no command has (a field whose keyword differs from its name is mapped by errors.KEYWORDS)."""
    found = library_settings()
    # the scan sees a constant, a loop over field names and a helper's argument
    assert {"virtual_stages", "seq_len", "grad_accum", "attention", "flops_basis", "global_batch"} <= set(found)
    missing = {name: sites for name, sites in found.items() if flag(name) not in CLI_FLAGS and name not in ENGINE_ONLY}
    assert not missing, "settings named in errors with no such command-line flag: " + repr(missing)
    # the engine-only ones are still named somewhere, in their file, and are out of every caller's reach
    for name, path in ENGINE_ONLY.items():
        assert any(site.startswith(path) for site in found.get(name, [])), name
        assert name not in api_keywords() and flag(name) not in CLI_FLAGS, name


def test_names_chosen_at_run_time_have_flags_too():
    # the scan cannot read names built at run time: the uneven stages' settings come from PipelineSplit itself
    given = PipelineSplit(first_stage_layers=1, last_stage_layers=1).stage_layers_given
    assert set(given) == {"first_stage_layers", "last_stage_layers"}
    assert {flag(name) for name in given} <= CLI_FLAGS


def test_every_renamed_field_is_an_api_keyword_and_a_flag():
    # errors.KEYWORDS: the field's public name is a keyword of the API, and its flag is an option of the CLI
    for field, keyword in KEYWORDS.items():
        assert keyword in api_keywords(), field
        assert flag(field) == "--" + keyword.replace("_", "-") and flag(field) in CLI_FLAGS, field


# -------------------------------------------------------------------------------------------------- in use

SAME_MISTAKE = [
    # the mistake made from Python, what Python says, the same mistake on the command line, what it says
    (
        lambda: lmcalc.inference(model="llama-3.1-8b", gpus="8xH100", tp=16),
        "tp 16 needs more GPUs than the 8 of 8xh100-sxm",
        "memory --model llama-3.1-8b --gpus 8xH100 --inference --tp 16",
        "--tp 16 needs more GPUs than the 8 of 8xh100-sxm",
    ),
    (
        lambda: lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", account_for_embedding_in_pipeline_split=True),
        "account_for_embedding_in_pipeline_split needs pipeline stages: pp 2 or more",
        "memory --model llama-3.1-8b --gpus 8xH100 --account-for-embedding-in-pipeline-split",
        "--account-for-embedding-in-pipeline-split needs pipeline stages: --pp 2 or more",
    ),
    (
        lambda: lmcalc.train_time(model="llama-3-70b", days=30),
        "days needs the GPU type to count (e.g. gpu H100, or gpus H100)",
        "train-time --model llama-3-70b --days 30",
        "--days needs the GPU type to count (e.g. --gpu H100, or --gpus H100)",
    ),
    (
        lambda: lmcalc.optimal(compute="1e24", mfu=0.5),
        "mfu applies to a cluster: add gpus and days",
        "optimal --compute 1e24 --mfu 0.5",
        "--mfu applies to a cluster: add --gpus and --days",
    ),
    (
        lambda: lmcalc.plan(model="llama-3.1-8b", gpus="8xH100", efficiency=1.5),
        "efficiency must be in (0, 1], got 1.5",
        "plan --model llama-3.1-8b --gpus 8xH100 --efficiency 1.5",
        "--efficiency must be in (0, 1], got 1.5",
    ),
]


@pytest.mark.parametrize(("call", "said", "argv", "printed"), SAME_MISTAKE, ids=[m[2].split()[0] for m in SAME_MISTAKE])
def test_python_names_the_keyword_and_the_command_line_the_flag(call, said, argv, printed, capsys):
    with pytest.raises(LmcalcError) as raised:
        call()
    assert str(raised.value) == said
    with pytest.raises(SystemExit) as exit_info:
        main(argv.split())
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"lmcalc: error: {printed}\n"


def test_a_renamed_field_is_named_by_its_keyword_and_its_flag():
    # Workload's seq_len and overhead_bytes are the API's seq and overhead (errors.KEYWORDS), even when the engine
    # value is built by hand
    model, recipe, adamw = (resolve_model("llama-3.1-8b").spec, resolve_precision("bf16-mixed").spec,
                            resolve_optimizer("adamw").spec)  # fmt: skip
    with pytest.raises(LmcalcError) as raised:
        Workload(model, recipe, adamw, seq_len=0, framework=framework_profile())
    assert str(raised.value) == "seq must be a positive integer, got 0"
    assert error_message(raised.value) == "--seq must be a positive integer, got 0"
    with pytest.raises(LmcalcError) as raised:
        Workload(model, recipe, adamw, seq_len=8, overhead_bytes=-1, framework=framework_profile())
    assert str(raised.value) == "overhead must be zero or a positive number of bytes, got -1"
    assert error_message(raised.value) == "--overhead must be zero or a positive number of bytes, got -1"


# -------------------------------------------------------------------------------------------------- no crash
# Inputs that once ended in an internal error (issue #18, item 15): each is one line, or a sound answer.


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_an_absurd_sequence_length_is_refused_not_overflowed(capsys):
    # s = 1e308: s·b·h bytes per layer is beyond a float (OverflowError); 2^40 tokens is lmcalc's limit
    code, out, err = run(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--seq", "1e308"], capsys)
    assert (code, out) == (2, "")
    assert err == "lmcalc: error: --seq 1e308 is beyond lmcalc's range: at most 2^40 (about 10^12) tokens\n"
    code, _, err = run(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--seq", str(2**40), "--json"], capsys)
    assert code == 0, err


def test_a_deadline_met_by_a_fraction_of_a_gpu_rents_one(capsys):
    # 6·N·D with D = 1 token is 4.8e10 FLOPs: 1.4e-15 of an H100 over a million days; ⌈that⌉ is 1 GPU (it was 0, and
    # the time divided by the cluster's 0 FLOP/s)
    code, out, err = run(["train-time", "-m", "llama-3-8b", "--days", "1e6", "--tokens", "1", "--gpu", "H100",
                          "--json"], capsys)  # fmt: skip
    assert code == 0, err
    deadline = json.loads(out)["results"]["deadline"]
    assert deadline["gpus"]["value"] == 1 and deadline["nodes"]["value"] == 1
    assert 0 < deadline["gpus_exact"]["value"] < 1e-14


@pytest.mark.cli
def test_a_plot_of_a_model_named_with_dollars(tmp_path, capsys):
    # two $ in a title opened matplotlib's mathtext, which failed on "$x^{ $": the text is drawn as written
    pytest.importorskip("matplotlib")
    model = tmp_path / "dollar.yaml"
    preset = (PACKAGE.parent / "presets" / "models" / "llama-3.1-8b.yaml").read_text()
    model.write_text(preset.replace("display_name: Llama 3.1 8B", 'display_name: "My $x^{ $ model"'))
    for argv in (["memory", "--gpus", "8xH100", "--plot", str(tmp_path / "m.png")],
                 ["plan", "--gpus", "64xH100", "--plot", str(tmp_path / "p.svg")],
                 ["report", "--gpus", "64xH100", "-o", str(tmp_path / "r.html")]):  # fmt: skip
        code, _, err = run([*argv[:1], "-m", str(model), *argv[1:]], capsys)
        assert code == 0, err
    assert "My $x^{ $ model" in (tmp_path / "r.html").read_text()


def test_a_plot_onto_a_directory_is_refused(tmp_path, capsys):
    target = tmp_path / "plot.png"
    target.mkdir()
    for force in ([], ["--force"]):  # even --force does not replace a directory
        code, _, err = run(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--plot", str(target), *force], capsys)
        assert (code, err) == (2, f"lmcalc: error: {target} is a directory; give a file name\n")
    assert target.is_dir() and list(tmp_path.iterdir()) == [target]


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from lmcalc import atomic

    target = tmp_path / "report.html"
    written = []

    def interrupted(self, data, *args, **kwargs):
        written.append(self)
        self.write_bytes(b"half")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    monkeypatch.setattr(atomic.Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_atomic(target, "<html>")
    assert written and list(tmp_path.iterdir()) == []  # neither the temporary nor a half file
    with pytest.raises(KeyboardInterrupt), atomic.atomic_target(target, ".png"):
        raise KeyboardInterrupt  # a plot being drawn
    assert list(tmp_path.iterdir()) == []
