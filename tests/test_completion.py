"""Shell completion (#18 item 4): model and hardware names complete from the presets, through the shell protocol
typer installs (`lmcalc --install-completion`), so what a user's shell receives is what is tested."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cli


def complete(words: str) -> list[str]:
    """What bash's completion function receives for the command line ``words`` (the cursor on its last word)."""
    env = dict(os.environ, _LMCALC_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - 1))
    code = "from lmcalc.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return done.stdout.split()


def test_model_names_and_families_complete():
    found = complete("lmcalc memory -m qwen3-3")
    assert found == ["qwen3-30b-a3b", "qwen3-32b"]  # the Qwen3 presets whose names start so
    assert complete("lmcalc plan --model llama-7") == ["llama-70b", "llama-7b"]  # family names too


@pytest.mark.parametrize(
    "typed,expected",
    [
        ("8xH20", {"8xH20", "8xH20-96gb", "8xH200", "8xH200-sxm"}),  # the counts kept, written on as typed
        ("64x8xa100-8", {"64x8xa100-80gb", "64x8xa100-80gb-sxm"}),
        ("h100-s", {"h100-sxm", "h100-sxm5"}),  # a bare GPU type, and its alias
    ],
)
def test_gpu_types_complete_after_the_counts(typed, expected):
    assert set(complete(f"lmcalc memory -m llama-2-7b --gpus {typed}")) == expected


def test_every_completed_cluster_resolves():
    from lmcalc.presets import parse_cluster

    for cluster in complete("lmcalc fit -m llama-2-7b --gpus 2x8x"):
        assert parse_cluster(cluster).count == 16, cluster
