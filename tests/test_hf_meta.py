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

ZAYA = dict(model_type="zaya", vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=1,
            router_hidden_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
"""ZAYA at tiny size: a type lmcalc does not read yet (its convolved queries and keys, delayed values, residual
scales and an MLP router)."""


def zaya_count() -> int:
    """transformers' ZAYA built from ``ZAYA`` on the meta device, its tensors summed."""
    config = {key: value for key, value in ZAYA.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.ZayaForCausalLM(transformers.ZayaConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ZAYA))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand, h 64, 4 heads and 2 KV heads of 16: q 64·64, k 64·32, the current and delayed values 64·16 each, the
    # q‖k convolutions over 96 channels (depthwise 96·2 and grouped 96·16·2, each with a bias of 96), a key scale a
    # KV head, o 64·64; two norms and two residual scalings of four vectors; the router: down 64 → 16 with a bias,
    # after layer 0 a scale of 16, its MLP (a norm of 16, two 16 × 16 with biases, out to the 4 experts and a skip);
    # 4 experts of 32; the embedding (tied head), the input scale and bias, the final norm
    attention = 64 * 64 + 64 * 32 + 2 * 64 * 16 + (96 * 2 + 96) + (96 * 16 * 2 + 96) + 2 + 64 * 64
    router = 64 * 16 + 16 + 16 + (16 * 16 + 16) * 2 + 16 * 5
    experts = 4 * 3 * 32 * 64
    layers = 2 * (attention + 2 * 64 + 2 * 4 * 64 + router + experts) + 16  # layer 1's router scale
    assert counted.total == layers + 512 * 64 + 2 * 64 + 64 == zaya_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ZAYA))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'zaya' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(ZAYA))
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
    path.write_text(json.dumps(ZAYA | {"router_hidden_size": 1.5}))  # ZayaConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
