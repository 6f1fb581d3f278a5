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

MODERNBERT = dict(model_type="modernbert-decoder", vocab_size=512, hidden_size=64, num_hidden_layers=3,
                  num_attention_heads=4, intermediate_size=96, max_position_embeddings=128, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)  # fmt: skip
"""ModernBERT's decoder at tiny size: a type lmcalc does not read yet (its first layer has no attention norm, and a
dense, a GELU and a norm come before its head)."""


def modernbert_count() -> int:
    """transformers' ModernBERT decoder built from ``MODERNBERT`` on the meta device, its tensors summed."""
    config = {key: value for key, value in MODERNBERT.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.ModernBertDecoderForCausalLM(transformers.ModernBertDecoderConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MODERNBERT))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand: embedding 512·64 (the decoder tied to it) and its bias-free LayerNorm 64; per layer q, k, v and Wo 4·64²
    # without biases, the MLP norm 64, Wi 64·2·96 (input and gate) and Wo 96·64; the attention norm 64 in layers 1
    # and 2 only (layer 0's is an Identity); the final norm 64; the prediction head's dense 64² and norm 64; the
    # decoder's bias 512
    layer = 4 * 64 * 64 + 64 + 3 * 96 * 64
    assert counted.total == 512 * 64 + 64 + 3 * layer + 2 * 64 + 64 + 64 * 64 + 64 + 512 == modernbert_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MODERNBERT))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'modernbert-decoder' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(MODERNBERT))
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
    path.write_text(json.dumps(MODERNBERT | {"intermediate_size": 1.5}))  # ModernBertDecoderConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
