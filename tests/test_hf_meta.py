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

SMALL = dict(num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1, intermediate_size=64)
BLT = dict(model_type="blt", vocab_size=260, encoder_hash_byte_group_vocab=1000, encoder_hash_byte_group_size=[3, 4],
           patch_in_forward=False, cross_attn_k=2, patcher_config=SMALL | dict(hidden_size=32, head_dim=16),
           encoder_config=SMALL | dict(hidden_size=32, hidden_size_global=64, cross_attn_k=2),
           decoder_config=SMALL | dict(hidden_size=32, hidden_size_global=64, cross_attn_k=2),
           global_config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                              intermediate_size=96))  # fmt: skip
"""The Byte Latent Transformer at tiny size: a type lmcalc does not read yet (byte-level local encoder and decoder
around a global transformer over patches, with hashed n-gram embeddings)."""


def blt_count() -> int:
    """PyTorch's own count of transformers' BLT built from ``BLT`` on the meta device: ``parameters()`` yields each
    Parameter once, whatever shares it."""
    config = {key: value for key, value in BLT.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.BltForCausalLM(transformers.BltConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BLT))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # lmcalc/hf_meta.py sums transformers' tensors module by module, each shared one once; PyTorch's parameters()
    # deduplicates by Parameter: the same count by another route
    assert counted.total == blt_count() == 185_632
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BLT))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'blt' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(BLT))
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
    path.write_text(json.dumps(BLT | {"vocab_size": 1.5}))  # BltConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
