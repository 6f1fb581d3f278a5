"""``lmcalc validate --against transformers``: for every model type in tests/hf_tiny.py that lmcalc reads, lmcalc's
count equals the parameters of the model transformers builds from the same config.json on the meta device, and its
full-attention step FLOPs are within 0.1 % of what FlopCounterMode counts for that model's forward and backward."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, put on sys.path by conftest.py)
from hf_tiny import TINY, tiny_config, transformers_model  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcalc import validate_hf  # noqa: E402
from lmcalc.cli import main  # noqa: E402
from lmcalc.engine.model import flops as fl  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import SUPPORTED, model_from_hf_config  # noqa: E402
from lmcalc.hf_layers import transformers_unused  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402
from lmcalc.validate import passed  # noqa: E402

pytestmark = pytest.mark.torch

SEQ, MICRO_BATCH = 32, 1
CLI_KIND = "llama"  # the one type checked through the command line; the others through the Python function
KNOWN_GAPS: dict[str, str] = {}
"""model_type: why lmcalc's figures differ from transformers' today (xfail, strict: a fix shows as a pass)."""
OFF_META = {
    "dbrx": "DbrxExperts routes each expert's tokens with torch.nonzero, which the meta device cannot run",
    "diffllama": "DiffLlamaAttention's backward copies a value out of a tensor, which the meta device has none of",
    "longcat_flash": "LongcatFlashExperts routes each expert's tokens with torch.where, which the meta device cannot "
    "run",
    "jetmoe": "JetMoeTopKGating sizes each expert's rows with tolist(), which the meta device has no values for",
    "blt": "BltPatcher cuts the bytes into patches by its entropies, whose count (.item()) the meta device has no "
    "values for",
}
"""model_type: why transformers cannot count it on the meta device; test_what_meta_cannot_run_is_counted_on_the_cpu
counts its tiny model's real step instead."""


def _case(kind: str):  # noqa: ANN202 (a pytest param)
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[kind])] if kind in KNOWN_GAPS else []
    return pytest.param(kind, marks=marks, id=kind)


def write_config(tmp_path, kind: str) -> str:
    path = tmp_path / kind / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(tiny_config(kind)))
    return str(path)


@pytest.mark.parametrize("kind", [_case(kind) for kind in TINY])
def test_every_type_matches_transformers(kind, tmp_path, capsys):
    if kind not in SUPPORTED:
        pytest.skip(f"lmcalc does not read {kind} yet")
    if kind in OFF_META:
        pytest.skip(OFF_META[kind] + ": counted on the CPU below")
    if kind == CLI_KIND:  # the real path: a model directory on the command line, read as the user's would be
        model = str(Path(write_config(tmp_path, kind)).parent)
        with pytest.raises(SystemExit) as exit_info:
            main(["validate", "--against", "transformers", "--model", model, "--seq", str(SEQ), "--json"])
        rows = json.loads(capsys.readouterr().out)["results"]
        params, flops = rows["params"], rows["flops"]
        assert exit_info.value.code == 0
        assert params["lmcalc"]["value"] == params["pytorch"]["value"]
        assert flops["error"]["pass"] and abs(flops["error"]["value"]) <= 100 * validate_hf.FLOP_TOLERANCE
        return
    config = tiny_config(kind)
    result = validate_hf.transformers_check(config, SEQ, MICRO_BATCH, model=transformers_model(config))
    assert result.value("params.lmcalc") == result.value("params.pytorch")  # exact: 0 parameters off
    assert abs(result.value("flops.error")) <= 100 * validate_hf.FLOP_TOLERANCE
    assert passed(result)


@pytest.mark.parametrize("kind", sorted(OFF_META))
def test_what_meta_cannot_run_is_counted_on_the_cpu(kind):
    # the tiny model's real step on the CPU (eager attention: its two matmuls are the fused kernel's FLOPs), under
    # FlopCounterMode: the routed experts' GEMMs count the tokens each expert really got, k of E per token
    config = tiny_config(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = transformers.AutoConfig.for_model(**config)
        model = transformers.AutoModelForCausalLM.from_config(built, attn_implementation="eager").bfloat16().train()
    tokens = torch.randint(0, config["vocab_size"], (MICRO_BATCH, SEQ))
    spec = ModelSpec.model_validate(model_from_hf_config(config, kind, kind))
    if spec.moe and spec.moe.zero_experts:  # two of each token's three picks real, as lmcalc counts them
        hf_saved.pin_zero_expert_picks(model)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens, use_cache=False).loss.backward()
    assert count_params(spec).total + transformers_unused(spec) == sum(p.numel() for p in model.parameters())
    assert fl.step_flops(spec, SEQ, convention="full").model * SEQ * MICRO_BATCH == counter.get_total_flops()


def test_the_counting_formulas_on_meta():
    # grouped mm, 16 routed rows of K=16 over 3 experts' (16 × 8) weights: forward 2·16·16·8 = 4,096 FLOPs; backward
    # the input's gradient (2-D × 3-D, 4,096) and the weights' (2-D × 2-D, the 16 rows split over the groups, 4,096)
    x = torch.empty(16, 16, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(3, 16, 8, dtype=torch.bfloat16, device="meta", requires_grad=True)
    offsets = torch.empty(3, dtype=torch.int32, device="meta")
    with validate_hf._on_meta(), FlopCounterMode(display=False) as forward:
        y = torch.nn.functional.grouped_mm(x, w, offs=offsets)
    with validate_hf._on_meta(), FlopCounterMode(display=False) as backward:
        y.backward(torch.empty_like(y))
    assert (forward.get_total_flops(), backward.get_total_flops()) == (4_096, 2 * 4_096)
    # attention, b=1, H=4 query heads over 2 K/V heads, s=32, d=16: QKᵀ and P·V, 2·1·4·32·32·(16 + 16) = 262,144,
    # twice that backward, whatever mask, causality or GQA flag SDPA is given
    q = torch.empty(1, 4, 32, 16, device="meta", requires_grad=True)
    kv = torch.empty(1, 2, 32, 16, device="meta", requires_grad=True)
    with validate_hf._on_meta(), FlopCounterMode(display=False) as counter:
        mask = torch.ones(32, 32, dtype=torch.bool, device="meta")
        out = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=True)
        out.sum().backward()
    assert counter.get_total_flops() == 262_144 * 3
    assert torch.nn.functional.scaled_dot_product_attention is not validate_hf._fused_attention  # restored


def test_a_mismatch_exits_one(tmp_path, capsys, monkeypatch):
    original = validate_hf.count_params
    monkeypatch.setattr(validate_hf, "count_params", lambda spec: SimpleNamespace(total=original(spec).total + 1))
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--against", "transformers", "--model", write_config(tmp_path, "qwen2"), "--seq", "16"])
    assert exit_info.value.code == 1
    assert "FAILED: Parameters (meta device)" in capsys.readouterr().out


def test_a_hub_id_reads_its_config_json(tmp_path, monkeypatch):
    path = write_config(tmp_path, "mistral")
    monkeypatch.setattr(validate_hf.hub, "config_path", lambda repo_id: Path(path))
    result = validate_hf.validate_against_transformers(model="example-org/tiny-mistral", seq=16)
    assert result.inputs[0].value == "example-org/tiny-mistral"
    assert result.inputs[0].origin == "Hugging Face Hub: example-org/tiny-mistral"
    assert passed(result)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--model", "llama-3.1-8b"], "--against transformers needs a config.json model (a file, a model directory "),
        (["--model", "missing/config.json"], "no such file: missing/config.json"),
        (["--model", "llama-3.1-8b", "--recompute", "full"], "--recompute applies to --against pytorch"),
    ],
)
def test_what_cannot_be_checked_is_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--against", "transformers", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("lmcalc: error: ") and line in err and len(err.strip().splitlines()) == 1


def test_without_transformers_one_line(tmp_path, capsys, monkeypatch):
    path = write_config(tmp_path, "llama")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--against", "transformers", "--model", path])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"lmcalc: error: {validate_hf.NEEDS_TRANSFORMERS}\n"
    with pytest.raises(LmcalcError, match="needs transformers: pip install transformers"):
        validate_hf.validate_against_transformers(model="llama-3.1-8b")


def test_the_accounting_commands_still_import_no_torch(tmp_path):
    # the validate command's module and the transformers check are imported by the CLI; torch only when it runs
    code = textwrap.dedent(f"""
        import sys
        import lmcalc.validate_hf
        from lmcalc.cli import main
        try:
            main(["params", "--model", {write_config(tmp_path, "gpt2")!r}])
        except SystemExit as e:
            assert e.code == 0
        print("torch" in sys.modules, "transformers" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False"


def test_an_moe_that_runs_every_expert_is_counted_by_hand():
    # Llama4TextMoe runs all E = 4 experts on every token (k = 1 picked, the others' inputs scaled to zero): in its 2
    # MoE layers of 4 (every other one) each token costs E − k = 3 more experts' SwiGLU, 3·h·f_e weights each (h 64,
    # f_e 96: the tiny config's intermediate_size), forward and backward
    spec = ModelSpec.model_validate(model_from_hf_config(tiny_config("llama4_text"), "llama4_text", "tiny"))
    assert spec.moe and spec.moe.dense_dispatch and (spec.moe_layers, spec.moe.expert_ffn_size) == (2, 96)
    assert validate_hf.dispatch_flops(spec, SEQ) == 3 * 2 * 3 * (3 * 64 * 96) * 2 * SEQ
    dense = spec.model_copy(update={"moe": spec.moe.model_copy(update={"dense_dispatch": False})})
    assert validate_hf.dispatch_flops(dense, SEQ) == 0
