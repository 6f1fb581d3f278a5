"""``lmcalc params`` on a config.json of a transformers type lmcalc does not read yet (issue #31): with transformers
installed, transformers' own count on the meta device, said to be transformers' and to feed nothing else; without
it, and for every other command, one line naming the type."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lmcalc import api  # noqa: E402
from lmcalc.cli import main  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_meta import MetaParams  # noqa: E402

pytestmark = pytest.mark.torch

DOGE = dict(model_type="doge", vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=96, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)  # fmt: skip
"""Doge at tiny size: a type lmcalc does not read yet (its attention's dynamic mask, A and dt_proj, and a learned
scale on each residual)."""


def doge_count() -> int:
    """transformers' Doge built from ``DOGE`` on the meta device, its tensors summed."""
    config = {key: value for key, value in DOGE.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.DogeForCausalLM(transformers.DogeConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DOGE))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand: embedding 512·64; per layer the two residual scales and the two RMSNorms 4·64, A 4, q, k, v and o
    # 4·64², dt_proj 4·64, the per-head q and k norms 2·16, the SwiGLU 3·64·96; the final norm 64; the untied head
    # 512·64
    layer = 4 * 64 + 4 + 4 * 64 * 64 + 4 * 64 + 2 * 16 + 3 * 64 * 96
    assert counted.total == 512 * 64 + 3 * layer + 64 + 512 * 64 == doge_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DOGE))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'doge' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DOGE))
    monkeypatch.setattr(counts, "transformers_installed", lambda: False)
    with pytest.raises(LmcalcError, match="does not read yet"):
        api.params(model=str(path))


def test_a_misspelt_type_is_told_the_close_one(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "lama"}))
    with pytest.raises(LmcalcError, match=r"'lama' is not a decoder-only type .* \(did you mean llama\?\)"):
        api.params(model=str(path))


def test_a_config_transformers_cannot_build_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DOGE | {"intermediate_size": 1.5}))  # DogeConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
