"""docs/architecture.md names real code (issue #28): every path it gives exists, and every dotted name it gives
resolves to a module of lmcalc whose source defines or imports that name. The source is read with ``ast``; nothing
is imported."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LMCALC = ROOT / "lmcalc"
ENGINE = LMCALC / "engine"
PAGE = ROOT / "docs" / "architecture.md"

FENCED = re.compile(r"```\w*\n(.*?)```", re.S)
BACKTICKED = re.compile(r"`([^`\n]+)`")
LMCALC_PATH = re.compile(r"(?<![\w/.])lmcalc/[\w/]+\.py\b")
ENGINE_PATH = re.compile(r"(?<![\w/.])engine/[\w/]+\.py\b")
ENGINE_FOLDER = re.compile(r"(?<![\w.])(?:lmcalc/)?engine/(\w+)/")
PY_FILE = re.compile(r"(?<![\w/.*-])([\w/*.-]+\.py)\b")
FILE_AND_NAME = re.compile(r"([\w/*.-]+\.py)(?::\s*([\w.]+)(?:\(.*\))?)?")
DOTTED = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+)(?:\(.*?\))?")
FOLDER = re.compile(r"[\w.-]+(?:/[\w.-]+)*/")


def module_file(parts: list[str], bases: tuple[Path, ...] = (LMCALC, ENGINE)) -> Path | None:
    """The source of the module ``parts`` names, from lmcalc/ (``estimates.memory``) or from the engine
    (``memory.terms``); None where there is none."""
    for base in bases:
        path = base.joinpath(*parts)
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py")
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
    return None


def _names_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """What a module's or a class's body defines or imports, under ``if``, ``try`` and ``with`` included."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id: node for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0]: node for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            nested += [statement for handler in getattr(node, "handlers", []) for statement in handler.body]
            names |= _names_in(nested)
    return names


@cache
def defined(path: Path) -> dict[str, ast.AST]:
    return _names_in(ast.parse(path.read_text(encoding="utf-8")).body)


@cache
def api_exports() -> set[str]:
    """``lmcalc/__init__.py`` hands out ``lmcalc.api.__all__`` on first use (``lmcalc.plan``)."""
    node = defined(LMCALC / "api.py")["__all__"]
    assert isinstance(node, ast.Assign)
    return set(ast.literal_eval(node.value))


def dotted_problem(name: str) -> str | None:
    """Why ``name`` (``engine.memory.gpu_memory.GpuMemory.verdict``) does not resolve; None where it does, or where
    it does not start with a module of lmcalc (``Layout.label`` is not checked)."""
    parts = name.split(".")
    bases = (LMCALC,) if parts[0] == "lmcalc" else (LMCALC, ENGINE)  # lmcalc.memory is the API's, not the engine's
    if parts[0] == "lmcalc":
        parts = parts[1:]
    elif module_file(parts[:1]) is None:
        return None
    for end in range(len(parts), -1, -1):
        path = module_file(parts[:end], bases) if end else LMCALC / "__init__.py"
        if path is not None:
            break
    rest = parts[end:]
    if not rest:
        return None
    names = defined(path)
    if rest[0] not in names and not (path == LMCALC / "__init__.py" and rest[0] in api_exports()):
        return f"{name}: {path.relative_to(ROOT)} neither defines nor imports {rest[0]}"
    owner = names.get(rest[0])
    if len(rest) > 1 and isinstance(owner, ast.ClassDef) and rest[1] not in _names_in(owner.body):
        return f"{name}: class {rest[0]} of {path.relative_to(ROOT)} has no {rest[1]}"
    return None


def path_problem(path: str) -> str | None:
    """Why the file ``path`` (``cli/options.py``, ``tests/test_framework_*.py``, ``specs.py``) is not in the
    repository, read from its root, from lmcalc/ or from the engine; a bare file name anywhere under lmcalc/."""
    bases = (ROOT, LMCALC, ENGINE) if "/" in path else (LMCALC,)
    found = any(next(base.glob(path if "/" in path else f"**/{path}"), None) for base in bases)
    return None if found else f"{path}: no such file"


def problems(text: str) -> tuple[int, list[str]]:
    """How many paths and dotted names ``text`` gives, and what is wrong with them: paths anywhere, dotted names
    in backticks and in fenced blocks (a diagram)."""
    found: list[str | None] = []
    prose = FENCED.sub("", text)
    for path in {*LMCALC_PATH.findall(text), *ENGINE_PATH.findall(text)}:
        found.append(path_problem(path if path.startswith("lmcalc/") else f"lmcalc/{path}"))
    for folder in set(ENGINE_FOLDER.findall(text)):
        found.append(None if (ENGINE / folder).is_dir() else f"engine/{folder}/: no such folder")
    for span in BACKTICKED.findall(prose):
        span = span.strip()
        if file := FILE_AND_NAME.fullmatch(span):
            path, name = file.groups()
            found.append(path_problem(path))
            if name and found[-1] is None and "*" not in path:
                module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                found.append(dotted_problem(f"{module}.{name}"))
        elif FOLDER.fullmatch(span):
            exists = any((base / span).is_dir() for base in (ROOT, LMCALC, ENGINE))
            found.append(None if exists else f"{span}: no such folder")
        elif dotted := DOTTED.fullmatch(span):
            found.append(dotted_problem(dotted.group(1)))
    for block in FENCED.findall(text):
        found += [path_problem(path) for path in PY_FILE.findall(block)]
        found += [dotted_problem(name) for name in DOTTED.findall(block) if not name.endswith(".py")]
    return len(found), sorted({problem for problem in found if problem})


def test_every_path_and_name_on_the_page_is_real():
    checked, wrong = problems(PAGE.read_text(encoding="utf-8"))
    assert checked > 100, f"only {checked} paths and names found: is the checker reading the page?"
    assert not wrong, "\n".join(wrong)


def test_the_page_describes_every_engine_package_and_top_module():
    text = PAGE.read_text(encoding="utf-8")
    units = [f"engine/{p.parent.name}/" for p in ENGINE.glob("*/__init__.py")]
    units += [f"engine/{p.name}" for p in ENGINE.glob("*.py") if p.name != "__init__.py"]
    assert [unit for unit in units if f"`{unit}`" not in text] == []


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("`engine.memory.gpu_memory.gpu_memory` in `engine/memory/gpu_memory.py`", None),
        ("`lmcalc.api.plan`, `lmcalc.plan`, `Capacity.of`, `memory/terms.py: Capacity.of`", None),
        ("`engine.memory.gpu_memory.no_such_figure`", "neither defines nor imports no_such_figure"),
        ("`engine.memory.gpu_memory.GpuMemory.no_such_part`", "class GpuMemory"),
        ("`estimates.training.build_workload`", "neither defines nor imports build_workload"),
        ("the old flat `engine/memory_terms.py`", "engine/memory_terms.py: no such file"),
        ("`gelu.py`", "gelu.py: no such file"),
        ("`memory/terms.py: no_such_term`", "neither defines nor imports no_such_term"),
        ("see engine/flat/ for that", "engine/flat/: no such folder"),
        ("```text\n  estimates.memory.memory -> engine.time.terms.no_such_section\n```", "no_such_section"),
    ],
)
def test_the_checker_can_fail(text, wrong):
    checked, found = problems(text)
    assert checked
    if wrong is None:
        assert found == []
    else:
        assert found and all(wrong in problem for problem in found), found
