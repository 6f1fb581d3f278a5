"""docs/reference/ is what scripts/cli_reference.py writes from the CLI: every command, every option, no drift."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperCommand, TyperGroup

from lmcalc.cli import app

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "cli_reference.py"
REFERENCE = ROOT / "docs" / "reference"

spec = importlib.util.spec_from_file_location("cli_reference", SCRIPT)
cli_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli_reference)

TREE = typer.main.get_command(app)


def plain(text: str) -> str:
    """A page or a help text as words: table escapes undone, line breaks and runs of spaces as one space."""
    return " ".join(text.replace(r"\|", "|").split())


def commands() -> dict[str, TyperCommand | TyperGroup]:
    return {name: command for name, command in TREE.commands.items() if not command.hidden}


def test_reference_is_up_to_date():
    result = subprocess.run([sys.executable, SCRIPT, "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"docs/reference/ is stale: run python scripts/cli_reference.py\n{result.stdout}"


def test_every_command_and_subcommand_has_a_page():
    index = (REFERENCE / "README.md").read_text()
    for name, command in commands().items():
        page = REFERENCE / f"{name}.md"
        assert page.exists(), f"no page for lmcalc {name}"
        assert f"({name}.md)" in index, f"README.md does not link {name}.md"
        if isinstance(command, TyperGroup):
            text = page.read_text()
            for sub_name, sub in command.commands.items():
                if not sub.hidden:
                    assert f"\n## lmcalc {name} {sub_name}\n" in text, f"{name}.md has no section for {sub_name}"


def test_memory_page_documents_every_option_with_its_help():
    page = plain((REFERENCE / "memory.md").read_text())
    options = [p for p in commands()["memory"].params if not p.hidden]
    assert {"--tp", "--zero", "--sweep"} <= {name for p in options for name in p.opts}
    for param in options:
        for name in param.opts:
            assert f"`{name}`" in page, f"memory.md does not show {name}"
        assert plain(param.help) in page, f"memory.md does not show the help of {param.opts[0]}"


def test_root_options_are_in_the_index():
    index = (REFERENCE / "README.md").read_text()
    for name in ("--version", "--help", "--install-completion", "--show-completion"):
        assert f"`{name}`" in index


def test_check_reports_stale_missing_and_extra_pages(tmp_path):
    pages = cli_reference.render_pages(tmp_path)
    cli_reference.write_pages(tmp_path, pages)
    assert cli_reference.differences(tmp_path, pages) == []
    memory = tmp_path / "memory.md"
    memory.write_text(memory.read_text().replace("--zero", "--zer0"))
    (tmp_path / "params.md").unlink()
    (tmp_path / "gone.md").write_text("# lmcalc gone\n")
    reported = set(cli_reference.differences(tmp_path, pages))
    assert reported == {"stale: memory.md", "missing: params.md", "extra: gone.md"}


def test_writing_deletes_only_pages_of_commands_that_are_gone(tmp_path):
    (tmp_path / "gone.md").write_text("# lmcalc gone\n")
    (tmp_path / "notes.txt").write_text("not a page\n")
    pages = cli_reference.render_pages(tmp_path)
    cli_reference.write_pages(tmp_path, pages)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*pages, "notes.txt"])
