"""What a model's own code decides about its activation memory, read from its config.json and checked against the
code transformers (5.24) runs: which GELU its MLP calls (ModelSpec.activation, from hidden_act, hidden_activation,
activation_function or Falcon's activation) and whether its norm multiplies by the weight in fp32
(ModelSpec.norm_weight_fp32).

Each type's tiny config (tests/hf_tiny.py) is read by lmcalc and built by transformers on the meta device; the
model's own activation and final norm are run on the CPU in bf16 under saved-tensor hooks, and the distinct
full-size tensors they keep must be the ones lmcalc counts for the spec it read, under the transformers profile
(whose rules ``mlp.gelu`` and ``norm.rmsnorm`` say ``model``).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import TINY, tiny_config, transformers_model  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402
from transformers.models.bloom.modeling_bloom import BloomGelu  # noqa: E402

from lmcalc.engine.memory.norms import norm_saved  # noqa: E402
from lmcalc.engine.model.params import Dim  # noqa: E402
from lmcalc.engine.model_code import OPS_KEPT, gelu_ops_kept  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.hf_gpt import ACTIVATION, GELUS  # noqa: E402
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

GELU_TYPES = ("gpt2", "gpt_neox", "falcon", "bloom", "starcoder2", "gemma", "gemma2", "gemma3_text")
ROWS, WIDTH = 16, 64  # the tensors run through an activation or a norm: 16 tokens of 64


def lmcalc_spec(config: dict, kind: str) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, kind, f"{kind} config"))


def workload(spec: ModelSpec) -> Workload:
    precision, adamw = resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec
    return Workload(spec, precision, adamw, 128, 1, "flash", "none", framework=framework_profile("transformers"))


def full_size_kept(module: torch.nn.Module, width: int) -> dict[torch.dtype, int]:
    """The distinct storages of ROWS × ``width`` elements ``module`` keeps for backward on a bf16 input, by dtype."""
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == ROWS * width:
            kept[t.untyped_storage().data_ptr()] = t
        return t

    x = torch.randn(ROWS, width, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    counts: dict[torch.dtype, int] = {}
    for t in kept.values():
        counts[t.dtype] = counts.get(t.dtype, 0) + 1
    return counts


def the_models_activation(config: dict) -> torch.nn.Module:
    """The activation module the model's MLP calls (ACT2FN's, or BLOOM's own)."""
    model = transformers_model(config)
    return next(
        m for m in model.modules() if type(m).__module__ == "transformers.activations" or isinstance(m, BloomGelu)
    )


def lmcalc_gelu_kept(spec: ModelSpec) -> int:
    """The f-wide tensors lmcalc counts for the spec's GELU, its output aside: a kernel keeps its input."""
    return len(gelu_ops_kept(workload(spec))) or 1


@pytest.mark.parametrize("kind", list(OPS_KEPT))
def test_each_gelu_keeps_what_lmcalc_counts(kind: str):
    # e.g. gelu_new, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): pow keeps x, tanh its output, the last multiply
    # 0.5·x and (1 + tanh): four; torch's GELU kernel and BLOOM's GeLUFunction keep their input only: one
    # xIELU's where keeps its x > 0 mask too, one byte an element (memory.ffn counts it apart)
    module = BloomGelu() if kind == "bloom_gelu" else ACT2FN[kind]
    mask = {torch.bool: 1} if kind == "xielu" else {}
    assert full_size_kept(module, WIDTH) == {torch.bfloat16: len(OPS_KEPT[kind]) or 1} | mask


@pytest.mark.parametrize("kind", GELU_TYPES)
def test_a_types_config_names_the_gelu_its_code_calls(kind: str):
    config = tiny_config(kind)
    spec = lmcalc_spec(config, kind)
    assert spec.ffn_kind != "swiglu"
    assert full_size_kept(the_models_activation(config), WIDTH) == {torch.bfloat16: lmcalc_gelu_kept(spec)}


@pytest.mark.parametrize("act", GELUS)
@pytest.mark.parametrize("kind", [k for k in GELU_TYPES if k != "bloom"])
def test_the_config_field_the_code_reads_sets_the_gelu(kind: str, act: str):
    # GPT-2 reads activation_function, Falcon activation, Gemma 2 and 3 hidden_activation, the others hidden_act;
    # Gemma's config class takes its released configs' "gelu" for the tanh approximation
    key = ACTIVATION[kind][0]
    config = tiny_config(kind) | {key: act}
    spec = lmcalc_spec(config, kind)
    assert spec.activation == ("gelu_pytorch_tanh" if (kind, act) == ("gemma", "gelu") else act)
    assert full_size_kept(the_models_activation(config), WIDTH) == {torch.bfloat16: lmcalc_gelu_kept(spec)}


def test_bloom_calls_its_own_gelu_whatever_the_config_says():
    assert lmcalc_spec(tiny_config("bloom") | {"hidden_act": "gelu_new"}, "bloom").activation == "bloom_gelu"


def test_a_gelu_mlp_with_another_activation_is_refused():
    from lmcalc.errors import LmcalcError

    with pytest.raises(LmcalcError, match="hidden_act 'relu' is not an activation lmcalc knows for gpt_neox's MLP"):
        lmcalc_spec(tiny_config("gpt_neox") | {"hidden_act": "relu"}, "gpt_neox")


UNMODELLED_NORMS = {
    "cpmant": "CpmAntLayerNorm multiplies its bf16 input by an fp32 1/rms, keeping both; lmcalc refuses CPM-Ant's "
    "training memory (its prompt)",
    "inkling2_text": "Inkling2RMSNorm multiplies by its weight in fp32 after normalising its fp32 copy: "
    "engine.memory.inkling2 counts it (fp32_norm_saved), not the profile's norm rule",
    "inkling2_loop_text": "Inkling 2's RMSNorm (Inkling2LoopRMSNorm), as inkling2_text's: engine.memory.inkling2 "
    "counts it",
}
"""model_type: why its norm's saved tensors are not modelled (a type whose training memory lmcalc refuses)."""


@pytest.mark.parametrize("kind", list(TINY))
def test_a_types_norm_keeps_what_lmcalc_counts(kind: str):
    if kind in UNMODELLED_NORMS:
        pytest.skip(UNMODELLED_NORMS[kind])
    # the final norm in bf16: Llama's RMSNorm keeps one fp32 copy of its input (fp32_input), Gemma's, OLMo 2's and
    # gpt-oss's also the fp32 normalised value (norm_weight_fp32: fp32_normalised), Cohere's LayerNorm the centred
    # input twice and the normalised value (fp32_centred), torch.nn.LayerNorm its bf16 input (input)
    # (the last norm of h: Gemma 4 builds its per-layer inputs' norm, of d_p, after the final one; HY V4 its
    # hyper-connections' last collapse, whose weightless norm reads the n streams, after it)
    config = tiny_config(kind)
    spec = lmcalc_spec(config, kind)
    width = spec.hidden_size
    norms = [
        m
        for name, m in transformers_model(config).named_modules()
        if "Norm" in type(m).__name__
        and all(p.shape == (width,) for p in m.parameters(recurse=False))
        and "hc_head" not in name
        and "embed_tokens_extend" not in name  # Phi-4-multimodal's encoders: the audio's weightless input norm
    ]
    norm = copy.deepcopy(norms[-1]).to_empty(device="cpu")
    for p in norm.parameters():
        torch.nn.init.normal_(p)
    lmcalc = norm_saved(workload(spec), "final norm", Dim(ROWS, "s·b"), Dim(width, "h"))
    counts: dict[torch.dtype, int] = {}
    for t in lmcalc:
        if t.elements == ROWS * width:
            dtype = torch.float32 if t.bytes_per_element == 4 else torch.bfloat16
            counts[dtype] = counts.get(dtype, 0) + 1
    assert full_size_kept(norm.to(torch.bfloat16), width) == counts
