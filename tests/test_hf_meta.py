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

CPMANT = dict(model_type="cpmant", vocab_size=512, hidden_size=64, num_attention_heads=4, dim_head=16, dim_ff=96,
              num_hidden_layers=3, prompt_types=2, prompt_length=4, segment_types=4,
              position_bias_num_buckets=32)  # fmt: skip
"""CPM-Ant at tiny size: a type lmcalc does not read yet (its prompt and segment embeddings and a bucketed relative
position bias in its own block layout)."""


def cpmant_count() -> int:
    """transformers' CPM-Ant built from ``CPMANT`` on the meta device, its tensors summed."""
    config = {key: value for key, value in CPMANT.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.CpmAntForCausalLM(transformers.CpmAntConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_params_counts_an_unread_type_with_transformers_and_says_so(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CPMANT))
    counted = api.params(model=str(path))
    assert isinstance(counted, MetaParams)
    # by hand: the embedding's 512 rows and 2·4 prompt rows of 64, 4 segment rows of 64, the position bias's 32
    # buckets and 4² segment pairs a head; per layer two norms 2·64, q, k, v and o 4·64·(4·16), the gated FFN
    # 3·64·96; the output norm 64; the head 512·64
    layer = 2 * 64 + 4 * 64 * 64 + 3 * 64 * 96
    embeddings = (512 + 2 * 4) * 64 + 4 * 64 + (32 + 4 * 4) * 4
    assert counted.total == embeddings + 3 * layer + 64 + 512 * 64 == cpmant_count()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "--model", str(path), "--json"])
    assert exit_info.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["results"]["params"]["total"]["value"] == counted.total
    assert "not lmcalc's" in document["notes"][0] and "feeds no other estimate" in document["notes"][1]


def test_other_commands_refuse_an_unread_type_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CPMANT))
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'cpmant' is a transformers type lmcalc does not read yet" in err
    assert "lmcalc params counts it" in err


def test_without_transformers_params_refuses_in_one_line(tmp_path, monkeypatch):
    import lmcalc.estimates.counts as counts

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CPMANT))
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
    path.write_text(json.dumps(CPMANT | {"dim_ff": 1.5}))  # CpmAntConfig: an int
    with pytest.raises(LmcalcError, match="transformers could not build it either"):
        api.params(model=str(path))
