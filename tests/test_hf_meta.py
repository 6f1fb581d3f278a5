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

QWEN4_EXP = dict(model_type="qwen4_exp_text", vocab_size=512, hidden_size=64, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, head_dim=16, indexer_n_heads=2,
                 indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
                 output_gate_type="sigmoid", layer_types=["linear_attention"] * 3 + ["indexed_attention"],
                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, linear_key_head_dim=16,
                 linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)  # fmt: skip
"""Qwen4-Exp's text model at tiny size: a type lmcalc does not read (its class defaults build nothing in
transformers 5.24: docs/hf-types.md's unbuilt cases), with the fields transformers needs to build it. Every type
transformers builds at its defaults is read since BLT (tests/test_blt.py); this one still reaches the meta count."""


def unread_count() -> int:
    """PyTorch's own count of transformers' model built from ``QWEN4_EXP`` on the meta device: ``parameters()`` yields
    each Parameter once, whatever shares it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**QWEN4_EXP))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN4_EXP))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # lmcalc/hf_meta.py sums transformers' tensors module by module, each shared one once; PyTorch's parameters()
    # deduplicates by Parameter: the same count by another route
    assert counted.total == unread_count() == 2_115_208
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN4_EXP))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'qwen4_exp_text' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN4_EXP))
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
    path.write_text(json.dumps(QWEN4_EXP | {"vocab_size": 1.5}))  # Qwen4ExpTextConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))


def test_a_type_lmcalc_reads_is_counted_without_transformers(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    # BLT, the last type transformers builds at its defaults that lmcalc did not read: its own count now, with or
    # without transformers (tests/test_blt.py derives it), and never the meta device's
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "blt"}))
    monkeypatch.setattr(counts, "transformers_installed", lambda: False)
    counted = api.params(model=str(path))
    assert not isinstance(counted, MetaParams)
    assert counted.value("params.total") == 4_633_127_680
