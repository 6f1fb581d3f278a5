"""``--help`` at 80 columns (issue #32, item 1): every flag name whole, no line wider than the terminal, the help
printed as written (not as rich markup), and the long commands' options grouped into panels."""

import re

import pytest
import typer
from rich.cells import cell_len

from lmcalc.cli import app

pytestmark = pytest.mark.fast

ESTIMATING = ("train-time", "max-params", "flops", "memory", "fit", "plan", "optimal", "report")
COMMANDS = (*ESTIMATING, "params", "tensor", "dtypes", "validate")


def help_at(lmcalc_run, monkeypatch, command: str, columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    run = lmcalc_run([command, "--help"])
    assert run.code == 0, run.err
    return run.out


def words(text: str) -> str:
    """The help's words in order, the panels' borders and the line breaks gone."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def flags_of(command: str) -> list[str]:
    tree = typer.main.get_command(app)
    built = tree.commands[command]
    return [name for param in built.params for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("columns", [80, 60])
def test_every_flag_is_whole_and_no_line_is_wider_than_the_terminal(lmcalc_run, monkeypatch, command, columns):
    text = help_at(lmcalc_run, monkeypatch, command, columns)
    wide = [line for line in text.splitlines() if cell_len(line) > columns]
    assert not wide, f"lines wider than {columns}: {wide[:3]}"
    assert "…" not in text  # rich's ellipsis: something was cut
    words = set(re.findall(r"--[a-z0-9][a-z0-9-]*", text))
    missing = [name for name in flags_of(command) if name not in words]
    assert not missing, f"flags not shown whole: {missing}"


def test_the_help_is_not_read_as_markup(lmcalc_run, monkeypatch):
    # rich markup read "[hub]" as a style tag and dropped it: "needs lmcalc)."
    text = words(help_at(lmcalc_run, monkeypatch, "memory"))
    assert "needs lmcalc[hub])" in text
    assert "needs lmcalc)" not in text


def test_plan_groups_its_options_into_panels(lmcalc_run, monkeypatch):
    text = help_at(lmcalc_run, monkeypatch, "plan")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels[0] == "Options" and panels[-1] == "Output"
    for wanted in ("Training", "Layout pins", "Search and time model", "Fine-tuning and offload", "Run"):
        assert any(p.startswith(wanted) for p in panels), (wanted, panels)
    pins = text.split("Layout pins")[1].split("╰")[0]
    assert "--tp <int>" in pins and "--max-pp" not in pins  # a pin, not the search's bound
    assert len(text.splitlines()) < 300  # 482 lines at 80 columns before the panels


def test_an_option_in_two_groups_takes_the_panel_of_the_command(lmcalc_run, monkeypatch):
    # --tp is a layout for memory and a pin for plan: one declaration each, shown where the command takes it
    memory = help_at(lmcalc_run, monkeypatch, "memory")
    layout = memory.split("╭─ Layout ")[1].split("╰")[0]
    assert "--tp <int>" in layout and "--first-stage-layers" not in layout


def test_a_required_option_is_marked_and_a_default_is_written_as_given(lmcalc_run, monkeypatch):
    text = words(help_at(lmcalc_run, monkeypatch, "plan"))
    assert "* --gpus <str>" in text  # --model may come from --from: not marked required
    assert "[default: bf16-mixed]" in text
    assert "--sequence-parallel / --no-sequence-parallel" in text
    assert "[default: --sequence-parallel]" in text
    assert "--tp-across-nodes Allow TP groups larger than a node. --efficiency" in text  # a lone flag: no default
