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

JAPANESE = dict(model_type="gpt_neox_japanese", vocab_size=512, hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, intermediate_multiple_size=4, max_position_embeddings=128)  # fmt: skip
"""GPT-NeoX Japanese at tiny size: a type lmcalc does not read yet (its last layer alone has an attention bias)."""


def japanese_count() -> int:
    """transformers' GPT-NeoX Japanese built from ``JAPANESE`` on the meta device, its tensors summed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.GPTNeoXJapaneseForCausalLM(transformers.GPTNeoXJapaneseConfig(**JAPANESE))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(JAPANESE))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand: embedding 512·64 (the head tied to it); per layer two LayerNorms 2·2·64, query_key_value 3·64² and
    # dense 64² without biases, the MLP 64·256 and 256·64 (intermediate_multiple_size 4); the last layer's attention
    # bias alone, 64 (GPTNeoXJapaneseAttention's use_bias); the final LayerNorm 2·64
    layer = 2 * 2 * 64 + 4 * 64 * 64 + 2 * 64 * 256
    assert counted.total == 512 * 64 + 3 * layer + 64 + 2 * 64 == japanese_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(JAPANESE))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'gpt_neox_japanese' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(JAPANESE))
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
    path.write_text(json.dumps(JAPANESE | {"intermediate_multiple_size": 1.5}))  # GPTNeoXJapaneseConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
