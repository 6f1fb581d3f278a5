"""A quick start (issue #28, item 5): a command parses only the preset files it uses, and ``lmcalc --help`` imports
no command.

The registry of a kind reads every built-in file for its names alone (``declared_names``: the ``name``, ``aliases``
and ``family_aliases`` lines) and parses a file when its preset is used; the user's files are read whole, as before.
Here the registry is held against the one it replaced, which parsed every file (``read_every_file``), for built-ins
alone, for a user directory that shadows a built-in, holds a broken file, or gains a file. The command line builds a
command when it runs; ``--help`` lists them from their docstrings. The spec classes cost little to define and to build
from a built-in preset: their annotations are types, not text, and their default factories Python functions. All of
it is checked in this process: ``benchmarks/cli_startup.py`` times the commands as processes.
"""

import importlib
import inspect
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from lmcalc import (
    framework_specs,
    hardware_specs,
    layer_specs,
    mixer_specs,
    pass_specs,
    presets,
    recipe_specs,
    specs,
)
from lmcalc.cli.app import SUBCOMMANDS, LazyCommands, app, docstring
from lmcalc.errors import LmcalcError
from lmcalc.preset_files import read_text, read_yaml

BUILTIN = presets.builtin_dir()
BUILTIN_FILES = [path for kind in presets.FILE_PER_SPEC_KINDS for path in presets.preset_files(BUILTIN, kind)]
LLAMA = BUILTIN / "models" / "llama-3.1-8b.yaml"


def read_every_file(kind: str) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, dict]]:
    """The registry as it was read before the index: every file on the path parsed, the first preset of a name kept,
    then its names and family names, the first to claim one keeping it. Returns (name or alias → canonical, family
    → canonical, canonical → origin, canonical → fields)."""
    kept: dict[str, tuple[dict, str]] = {}
    for directory in presets.search_dirs():
        for path in presets.preset_files(directory, kind):
            try:
                data = read_yaml(path)
            except LmcalcError:
                continue  # a broken user file is left out (a broken built-in one would fail the test below)
            items = [(data, str(path))] if kind in presets.FILE_PER_SPEC_KINDS else None
            if items is None:
                items = [(item, f"{path} [{kind}[{i}]]") for i, item in enumerate(data[kind])]
            for item, origin in items:
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    kept.setdefault(item["name"], (item, origin))
    names: dict[str, str] = {}
    families: dict[str, str] = {}
    for canonical, (data, _) in kept.items():
        for alias in [canonical, *[a for a in data.get("aliases", []) if isinstance(a, str)]]:
            names.setdefault(presets.normalise(alias), canonical)
        for family in [f for f in data.get("family_aliases", []) if isinstance(f, str)]:
            families.setdefault(presets.normalise(family), canonical)
    return names, families, {c: origin for c, (_, origin) in kept.items()}, {c: data for c, (data, _) in kept.items()}


def assert_registry_reads_as_every_file(kind: str) -> None:
    """The registry of ``kind`` finds what parsing every file finds: the same names, family names, origins and, for
    every name, the same preset with the same fields."""
    names, families, origins, fields = read_every_file(kind)
    reg = presets.registry(kind)
    assert (reg.names, reg.families, reg.origins) == (names, families, origins)
    for key in [*names, *families]:
        spec, _ = reg.resolve(key)
        expected = names.get(key) or families[key]
        assert spec.name == expected, key
        assert reg.entries[expected].data == fields[expected], key


@pytest.fixture
def fresh_registry():
    presets.registry.cache_clear()
    yield
    presets.registry.cache_clear()


@pytest.fixture
def user_dir(tmp_path, monkeypatch, fresh_registry):
    """A directory on LMCALC_PRESET_PATH, laid out like presets/."""
    for kind in presets.FILE_PER_SPEC_KINDS:
        (tmp_path / kind).mkdir()
    monkeypatch.setenv(presets.PRESET_PATH_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def builtin_copy(tmp_path, monkeypatch, fresh_registry):
    """A copy of the built-in presets, read as the built-in ones."""
    copy = tmp_path / "builtin"
    shutil.copytree(BUILTIN, copy)
    monkeypatch.setattr(presets, "builtin_dir", lambda: copy)
    return copy


@pytest.fixture
def no_user_dir(monkeypatch, fresh_registry):
    """No directory of the user's on the path: the built-in presets alone."""
    monkeypatch.delenv(presets.PRESET_PATH_ENV, raising=False)


@pytest.fixture
def parsed(monkeypatch) -> list[Path]:
    """The preset files parsed from now on (YAML read, not only its text)."""
    seen: list[Path] = []

    def counting(path: Path):
        seen.append(Path(path))
        return read_yaml(path)

    monkeypatch.setattr(presets, "read_yaml", counting)
    return seen


# --------------------------------------------------------------------------------------------- the names' index


@pytest.mark.parametrize("path", BUILTIN_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_built_in_file_declares_the_names_its_yaml_gives(path):
    assert presets.declared_names(read_text(path)) == presets.Names.of(read_yaml(path))


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("name: a\n", presets.Names("a")),
        (
            "# a comment\nname: a  # and another\naliases: [b, \"C 1\", 'd']\nsize: 2\n",
            presets.Names("a", ("b", "C 1", "d")),
        ),
        ("name: a\nfamily_aliases: []\nnested:\n  name: b\n  aliases: [c]\n", presets.Names("a")),
    ],
)
def test_names_declared_plainly_are_read_from_the_text(text, names):
    assert presets.declared_names(text) == names


@pytest.mark.parametrize(
    "text",
    [
        "vocab_size: 1\n",  # no name
        "name: a\nname: b\n",  # a field twice
        "name: 1e5\n",  # a number to YAML
        "name: true\n",
        "name: null\n",
        "name: 2024-01-01\n",  # a date
        "name: a#b\n",  # a plain scalar with a hash in it
        "name: 'it''s'\n",  # an escape
        'name: "a\\tb"\n',
        "name: a\naliases:\n  - b\n",  # a block list
        "name: a\naliases: [b,\n  c]\n",  # a flow list over lines
        "name: a\naliases: [b, [c]]\n",
        'name: a\n"aliases": [b]\n',  # a quoted key
        "name: a\n? aliases\n: [b]\n",  # a complex key
        "name: a\n---\nname: b\n",  # two documents
        "{name: a}\n",  # a flow mapping
        "name: a\r\n",  # line breaks YAML reads otherwise
    ],
)
def test_names_declared_any_other_way_are_left_to_the_yaml(text):
    assert presets.declared_names(text) is None


# --------------------------------------------------------------------------- the index against reading every file


@pytest.mark.parametrize("kind", presets.KINDS)
def test_the_built_in_registry_reads_as_every_file(kind, no_user_dir):
    assert_registry_reads_as_every_file(kind)


def test_a_name_an_alias_and_a_family_name_each_parse_one_file(no_user_dir, builtin_copy, parsed):
    models = presets.registry("models")
    member = models.families["llama-70b"]
    assert presets.resolve_model("llama-3.1-8b").spec.name == "llama-3.1-8b"
    assert presets.resolve_hardware("H100").spec.name == "h100-sxm"  # an alias in h100-sxm.yaml
    assert presets.resolve_model("llama-70b").spec.name == member  # a family name: its default member
    assert presets.resolve_precision("bf16-mixed").spec.name == "bf16-mixed"  # one file holds them all
    assert [path.relative_to(builtin_copy).as_posix() for path in parsed] == [
        "models/llama-3.1-8b.yaml",
        "hardware/h100-sxm.yaml",
        Path(models.entries[member].origin).relative_to(builtin_copy).as_posix(),
        "precisions.yaml",
    ]


def test_a_user_directory_shadows_a_built_in_and_warns_of_a_taken_alias(user_dir, capsys):
    models = user_dir / "models"
    (models / "mine.yaml").write_text(LLAMA.read_text().replace("num_layers: 32", "num_layers: 2"))  # same name
    (models / "alias.yaml").write_text(
        LLAMA.read_text().replace("name: llama-3.1-8b", "name: x").replace("aliases: [", "aliases: [llama-3-70b, ")
    )
    assert_registry_reads_as_every_file("models")
    assert presets.resolve_model("llama-3.1-8b").spec.num_layers == 2
    assert presets.resolve_model("llama-3.1-8b").origin == str(models / "mine.yaml")
    assert presets.resolve_model("llama-3-70b").spec.name == "x"
    assert capsys.readouterr().err == (
        f"lmcalc: warning: {models}/alias.yaml: 'llama-3-70b' of x shadows the built-in model llama-3-70b (to "
        "replace a built-in, give your preset its name)\n"
    )


def test_a_broken_user_file_is_left_out_with_its_warning(user_dir, capsys):
    models = user_dir / "models"
    (models / "bad.yaml").write_text("name: [unclosed\n")
    (models / "nameless.yaml").write_text("vocab_size: 1\n")
    assert_registry_reads_as_every_file("models")
    assert presets.resolve_model("llama-3-70b").spec.name == "llama-3-70b"
    bad, nameless = capsys.readouterr().err.splitlines()
    assert bad.startswith(f"lmcalc: warning: {models}/bad.yaml:2: YAML syntax error: ") and bad.endswith("; left out")
    assert nameless == f"lmcalc: warning: {models}/nameless.yaml: a preset needs a 'name' field; left out"


def test_a_new_file_is_found_when_the_registry_is_read_again(user_dir, builtin_copy):
    with pytest.raises(LmcalcError, match="unknown model 'tiny'"):
        presets.resolve_model("tiny")
    (user_dir / "models" / "tiny.yaml").write_text(LLAMA.read_text().replace("name: llama-3.1-8b", "name: tiny"))
    new_builtin = builtin_copy / "models" / "llama-9.yaml"  # a built-in whose aliases YAML reads as a block list
    text = LLAMA.read_text().replace("name: llama-3.1-8b", "name: llama-9")
    new_builtin.write_text(text.replace("aliases: [", "aliases:\n  - llama9\n  - ").replace("]\nvocab", "\nvocab", 1))
    assert presets.declared_names(new_builtin.read_text()) is None
    presets.registry.cache_clear()
    assert_registry_reads_as_every_file("models")
    assert presets.resolve_model("tiny").origin == str(user_dir / "models" / "tiny.yaml")
    assert presets.resolve_model("llama9").spec.name == "llama-9"


def test_a_built_in_file_whose_yaml_gives_other_names_than_its_text_is_refused():
    entry = presets.Entry(presets.Names("not-its-name"), str(LLAMA), builtin=True)
    with pytest.raises(LmcalcError, match=f"{LLAMA}: its YAML does not give the names its text declares"):
        entry.data  # noqa: B018


# ------------------------------------------------------------------------------------------- the command line


def help_text(group: typer.core.TyperGroup, capsys) -> str:
    group.main(["--help"], prog_name="lmcalc", standalone_mode=False)
    return capsys.readouterr().out


def test_help_lists_every_command_as_if_each_were_built(capsys):
    lazy = typer.main.get_command(app)
    listed = help_text(lazy, capsys)
    assert isinstance(lazy.commands, LazyCommands)
    assert [name for name in SUBCOMMANDS if lazy.commands.built(name)] == []  # none was built to list it
    built = typer.main.get_command(app)
    for name in built.commands:
        built.commands[name]  # noqa: B018  (builds it)
    assert listed == help_text(built, capsys)
    assert all(f" {name} " in listed for name in SUBCOMMANDS)


@pytest.mark.parametrize("name", [name for name, sub in SUBCOMMANDS.items() if sub.group is None])
def test_a_docstring_read_from_the_source_is_the_functions_own(name):
    subcommand = SUBCOMMANDS[name]
    function = getattr(importlib.import_module(subcommand.module), subcommand.function)
    assert docstring(subcommand.module, subcommand.function) == inspect.getdoc(function)


@contextmanager
def fresh_lmcalc() -> Iterator[set[str]]:
    """lmcalc imported afresh in this process, as a new process would import it: yields the set of lmcalc modules
    loaded so far, which fills as they load. The modules imported before are put back after."""
    ours = [name for name in sys.modules if name == "lmcalc" or name.startswith("lmcalc.")]
    before = {name: sys.modules.pop(name) for name in ours}
    loaded: set[str] = set()
    try:
        yield loaded
    finally:
        loaded.update(name for name in sys.modules if name == "lmcalc" or name.startswith("lmcalc."))
        for name in loaded:
            del sys.modules[name]
        sys.modules.update(before)


def run_main(argv: list[str]) -> None:
    cli = importlib.import_module("lmcalc.cli")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0


def test_help_imports_no_command_no_preset_and_no_engine(capsys):
    with fresh_lmcalc() as loaded:
        run_main(["--help"])
    assert "train-time" in capsys.readouterr().out
    assert loaded == {"lmcalc", "lmcalc.cli", "lmcalc.cli.app", "lmcalc.errors"}


def test_an_accounting_command_imports_no_other_family(no_user_dir, capsys):
    with fresh_lmcalc() as loaded:
        run_main(["train-time", "--model", "llama-3-70b", "--gpus", "1024xH100", "--tokens", "15T", "--mfu", "0.5"])
    assert "145.1 days" in capsys.readouterr().out
    assert "lmcalc.cli.training" in loaded
    others = {"lmcalc.cli.bench", "lmcalc.cli.checks", "lmcalc.cli.presets", "lmcalc.cli.report"}
    unused = {"lmcalc.preset_views", "lmcalc.hub", "lmcalc.hf_config", "lmcalc.engine.search.plan"}
    bench_files = {"lmcalc.bench", "lmcalc.bench.results", "lmcalc.atomic"}  # read only for a measured figure
    assert loaded & (others | unused | bench_files) == set()


# ------------------------------------------------------------------------------------------------- the specs


def spec_classes() -> list[type[BaseModel]]:
    return [
        cls
        for module in (specs, layer_specs, mixer_specs, pass_specs, hardware_specs, recipe_specs, framework_specs)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == module.__name__
    ]


@pytest.mark.parametrize("spec_type", spec_classes(), ids=lambda cls: cls.__name__)
def test_a_spec_is_annotated_with_types_not_text(spec_type):
    """Text (``from __future__ import annotations``) would have pydantic compile and evaluate every annotation."""
    assert [name for name, annotation in spec_type.__annotations__.items() if isinstance(annotation, str)] == []


@pytest.mark.parametrize("spec_type", spec_classes(), ids=lambda cls: cls.__name__)
def test_every_default_factory_of_a_spec_is_a_python_function(spec_type):
    """``model_construct`` reads a factory's signature whenever it fills a default (every built-in preset that leaves
    out a list): of a builtin such as ``tuple``, ``inspect.signature`` parses the text signature with ``tokenize``,
    whose pattern costs a fresh process some 3 ms to compile; of a Python function it reads the code object."""
    factories = {name: info.default_factory for name, info in spec_type.model_fields.items() if info.default_factory}
    assert {name: factory for name, factory in factories.items() if not inspect.isfunction(factory)} == {}


def test_a_built_in_preset_is_built_without_tokenize(no_user_dir, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("inspect.signature parsed a text signature")

    monkeypatch.setattr(inspect, "_signature_fromstr", refuse)
    for kind in presets.KINDS:
        reg = presets.registry(kind)
        for name in reg.entries:
            reg.spec(name)
