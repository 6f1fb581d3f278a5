"""Models by Hugging Face Hub id, from a pre-populated cache and without a network: the cache is read first,
HF_HUB_OFFLINE is respected, and a missing, gated or unreadable repository, or a missing huggingface_hub, gets one
clear line."""

from __future__ import annotations

import json
import sys

import pytest

from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_model

pytest.importorskip("huggingface_hub")

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B's config.json, the fields lmcalc reads
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}


def cached(cache, repo_id: str, config: dict) -> None:
    """Lay ``config`` out as huggingface_hub's cache does: models--org--name/snapshots/<commit>/, refs/main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_a_hub_id_is_read_from_the_local_cache(hub_cache):
    cached(hub_cache, "meta-llama/Llama-3.1-8B", LLAMA_31_8B)
    found = resolve_model("meta-llama/Llama-3.1-8B")
    assert found.spec.name == "meta-llama/Llama-3.1-8B"
    # the published count (HF safetensors total), the same as the llama-3.1-8b preset's
    assert count_params(found.spec).total == 8_030_261_248


def test_offline_and_not_cached_is_one_clear_line(hub_cache):
    with pytest.raises(LmcalcError, match="not in the local Hugging Face cache.*HF_HUB_OFFLINE is set"):
        resolve_model("meta-llama/Llama-3.1-8B")


def test_without_huggingface_hub_the_extra_is_named(hub_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(LmcalcError, match=r"pip install 'lmcalc\[hub\]'"):
        resolve_model("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("GatedRepoError", "gated repository: accept its licence"),
        ("RepositoryNotFoundError", "no such model repository"),
        ("EntryNotFoundError", "has no config.json"),
    ],
)
def test_hub_errors_are_one_line_each(hub_cache, monkeypatch, error, message):
    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE")
    kind = getattr(errors, error, None) or getattr(huggingface_hub.utils, error)  # in .utils alone before 0.24

    def refuse(*args, **kwargs):
        raised = kind.__new__(kind)  # without an HTTP response: only the class matters
        Exception.__init__(raised, "401 Client Error")
        raise raised

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    with pytest.raises(LmcalcError, match=message) as info:
        resolve_model("meta-llama/Llama-3.1-8B")
    assert "\n" not in str(info.value) and "config.json file instead" in str(info.value)


def test_a_local_file_that_looks_like_an_id_is_the_file(tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model.json").write_text(json.dumps(LLAMA_31_8B))
    monkeypatch.chdir(tmp_path)
    assert count_params(resolve_model("org/model.json").spec).total == 8_030_261_248


def test_the_cli_takes_a_hub_id(hub_cache, capsys):
    from lmcalc.cli import main

    cached(hub_cache, "meta-llama/Llama-3.1-8B", LLAMA_31_8B)
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", "meta-llama/Llama-3.1-8B", "--json"])
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out)["results"]["params"]["total"]["value"] == 8_030_261_248


def test_a_downloaded_models_directory_is_read_through_its_config(tmp_path):
    (tmp_path / "Llama-3.1-8B").mkdir()
    (tmp_path / "Llama-3.1-8B" / "config.json").write_text(json.dumps(LLAMA_31_8B))
    found = resolve_model(str(tmp_path / "Llama-3.1-8B"))
    assert found.spec.name == "Llama-3.1-8B" and count_params(found.spec).total == 8_030_261_248
