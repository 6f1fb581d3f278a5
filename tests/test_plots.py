"""--plot: the memory picture and the ranked layouts as image files, written safely."""

import builtins
import json

import pytest

from lmcalc.cli import main

pytest.importorskip("matplotlib")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_memory_sweep_plot(tmp_path, capsys):
    target = tmp_path / "memory.png"
    code, out, err = run(
        [
            "memory",
            "--model",
            "llama-3-8b",
            "--gpus",
            "8xH100",
            "--zero",
            "3",
            "--sweep",
            "seq=1k,4k",
            "--plot",
            str(target),
        ],
        capsys,
    )
    assert code == 0, err
    assert target.read_bytes()[:8] == PNG_MAGIC and f"plot written to {target}" in " ".join(out.split())
    assert not list(tmp_path.glob("*.tmp*"))


def test_memory_stages_plot_draws_a_bar_per_stage(tmp_path, capsys):
    target = tmp_path / "stages.svg"
    args = ["memory", "--model", "llama-3-8b", "--gpus", "8xH100", "--pp", "4", "--grad-accum", "8", "--stages"]
    code, _, err = run([*args, "--plot", str(target)], capsys)
    assert code == 0, err
    svg = target.read_text()
    assert all(f"stage {i}" in svg for i in (1, 2, 3, 4)) and "Model states" in svg


def test_plot_never_replaces_a_file_unasked(tmp_path, capsys):
    target = tmp_path / "mine.svg"
    target.write_text("the user's own file")
    code, _, err = run(["memory", "--model", "gpt2", "--plot", str(target)], capsys)
    assert code == 2 and "exists; pass --force" in err and target.read_text() == "the user's own file"
    code, _, _ = run(["memory", "--model", "gpt2", "--plot", str(target), "--force"], capsys)
    assert code == 0 and target.read_text().lstrip().startswith("<?xml")


def test_plan_plot_and_bad_suffix(tmp_path, capsys):
    code, _, err = run(
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "8xH100",
            "--seq",
            "4096",
            "--global-batch",
            "256K",
            "--plot",
            str(tmp_path / "plan.png"),
        ],
        capsys,
    )
    assert code == 0, err
    assert (tmp_path / "plan.png").read_bytes()[:8] == PNG_MAGIC
    code, _, err = run(["memory", "--model", "gpt2", "--plot", str(tmp_path / "memory.jpg")], capsys)
    assert code == 2 and ".png, .svg or .pdf" in err


def test_plan_explain_says_where_its_plot_went(tmp_path, capsys):
    path = tmp_path / "plan.svg"
    args = ["plan", "-m", "gpt2", "--gpus", "8xH100", "--explain", "--plot", str(path), "--json"]
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert path.read_text().startswith("<?xml") and f"plot written to {path}" in json.loads(out)["notes"]


def test_without_matplotlib_the_command_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, _, err = run(["memory", "--model", "gpt2", "--plot", str(tmp_path / "m.png")], capsys)
    assert code == 2 and "pip install 'lmcalc[plot]'" in err
