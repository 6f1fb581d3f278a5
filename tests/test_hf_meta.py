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

OPT = dict(model_type="opt", vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=256,
           max_position_embeddings=128)  # fmt: skip
"""OPT at tiny size: a type lmcalc does not read yet (a ReLU MLP, and two position rows more than its positions)."""


def opt_count() -> int:
    """transformers' OPT built from ``OPT`` on the meta device, its tensors summed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.OPTForCausalLM(transformers.OPTConfig(**OPT))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OPT))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand: embedding 512·64 (the head tied to it); positions (128 + 2)·64 (OPTLearnedPositionalEmbedding's offset
    # of 2); per layer two LayerNorms 2·2·64, q/k/v/out 4·(64² + 64), fc1 256·64 + 256, fc2 64·256 + 64; final norm 2·64
    layer = 2 * 2 * 64 + 4 * (64 * 64 + 64) + (256 * 64 + 256) + (64 * 256 + 64)
    assert counted.total == 512 * 64 + 130 * 64 + 3 * layer + 2 * 64 == opt_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OPT))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'opt' is a transformers type lmcalc does not read yet" in err and "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(OPT))
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
    path.write_text(json.dumps(OPT | {"num_attention_heads": 5}))  # 64 is not a multiple of 5 heads
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
