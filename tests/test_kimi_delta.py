"""Kimi Delta Attention hybrids (Kimi Linear, the Bailing hybrid: Kimi Team 2025, arXiv:2510.26692), against
transformers. The parameter count is exact (tests/test_hf_types.py, and by hand here), the FLOPs equal
FlopCounterMode's on transformers' PyTorch path with its implementation's differences stated (tests/test_deltanet.py,
and the forward by hand here), the state a sequence keeps is the cache transformers allocates, and what PyTorch keeps
around the kernels is measured; what fla's ``chunk_kda`` keeps is read from its source (no fla here)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import cached_state_bytes, tiny_config  # noqa: E402

from lmcalc.engine.inference.serving import state_bytes  # noqa: E402
from lmcalc.engine.memory.ssm import average_mixer  # noqa: E402
from lmcalc.engine.model.mixer_flops import ssm_flops  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch
KINDS = ["kimi_linear", "bailing_hybrid"]
KERNEL_KEEPS = ("L2-normalised", "1/‖·‖", "contiguous copy", "decay g", "intra-chunk")
"""The tensors fla's chunk_kda saves itself (its save_for_backward), beside what the module's PyTorch code keeps."""


def spec_of(kind: str) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))


def test_the_layers_that_attend_come_from_the_checkpoints_one_indexed_list():
    # the tiny Kimi config gives linear_attn_config's full_attn_layers [1, 4]: layers 0 and 3 attend, which no
    # period describes; Bailing attends in every layer_group_size-th (2) layer
    assert [i for i in range(4) if spec_of("kimi_linear").is_attention_layer(i)] == [0, 3]
    assert [i for i in range(4) if spec_of("bailing_hybrid").is_attention_layer(i)] == [1, 3]


def test_kimi_linears_layer_by_hand():
    # Kimi-Linear-48B-A3B's KDA layer (h = 2,304, 32 heads of 128, K = 4, gates of rank 128): q, k, v and o
    # 4 · 4096 · 2304; the convolution 12288 · 4; the forget gate 2304 · 128 + 128 · 4096, Δ's bias 4096 and A 32;
    # β 32 · 2304; the output gate 2304 · 128 + 128 · 4096; the norm's weight 128
    hd, h = 4096, 2304
    by_hand = 4 * hd * h + 3 * hd * 4 + 2 * (h * 128 + 128 * hd) + hd + 32 + 32 * h + 128
    spec = resolve_model("kimi-linear-48b-a3b").spec
    assert count_params(spec).by_group["ssm"] == by_hand * spec.other_mixer_layers
    assert spec.other_mixer_layers == 20  # 27 layers, MLA in 7


def test_the_chunked_rules_forward_flops_by_hand():
    # one KDA layer at s = 150 (three chunks of 64, the last padded: 192/150 of each token's share), 4 heads of 16:
    # the convolution over 3 · 64 channels, 2·192·4 a token; per head 4·64·16 + 2·64·16 + 6·16·16
    assert ssm_flops(spec_of("kimi_linear"), 150) == pytest.approx(
        2 * 192 * 4 + 192 / 150 * 4 * (4 * 64 * 16 + 2 * 64 * 16 + 6 * 16 * 16)
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_a_sequence_keeps_is_transformers_cache(kind: str):
    # per KDA layer, the convolution's last K inputs of q‖k‖v in the model's dtype and the H × d × d state in fp32
    spec = spec_of(kind)
    linear = [i for i in range(spec.num_layers) if not spec.is_attention_layer(i)]
    assert cached_state_bytes(kind, linear, batch=2) == 2 * state_bytes(spec, 2)


class _KernelKeepsNothing(torch.autograd.Function):
    """chunk_kda's stand-in: an output of v's shape, nothing saved (fla's own saves are counted from its source)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta):  # noqa: ARG004
        return torch.ones_like(v)

    @staticmethod
    def backward(ctx, grad):  # noqa: ARG004
        return None, None, None, None, None


class _ConvKeepsItsInput(torch.autograd.Function):
    """The causal-conv1d kernel's stand-in: SiLU of the causal convolution, keeping its input x alone, as the CUDA
    kernel's autograd does (it recomputes the rest)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x)
        width = weight.shape[-1]
        with torch.no_grad():
            out = torch.nn.functional.conv1d(x, weight.unsqueeze(1), padding=width - 1, groups=x.shape[1])
        return torch.nn.functional.silu(out[..., : x.shape[-1]])

    @staticmethod
    def backward(ctx, grad):  # noqa: ARG004
        return None, None


def _saved_around_the_kernels(kind: str, seq: int, batch: int, monkeypatch) -> int:
    """Bytes one KDA layer's mixer keeps for backward, bf16, with the kernels' stand-ins: by storage, its input and
    the weights left out."""
    module = __import__(f"transformers.models.{kind}.modeling_{kind}", fromlist=["x"])

    def chunk(query, key, value, g, beta, **_):
        return _KernelKeepsNothing.apply(query, key, value, g, beta), None

    def conv(x, weight, bias, activation, **_):
        return _ConvKeepsItsInput.apply(x, weight)

    monkeypatch.setattr(module, "chunk_kimi_delta_attention", chunk)
    monkeypatch.setattr(module, "causal_conv1d_fn", conv)
    config = transformers.AutoConfig.for_model(**tiny_config(kind))
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    layer = next(i for i in range(4) if config.layer_types[i] == "linear_attention")
    mixer = model.model.layers[layer].self_attn
    x = torch.randn(batch, seq, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    known = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x]}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in known:
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        mixer(x)
    return sum(storages.values())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("seq", "batch"), [(64, 1), (100, 2)])
def test_what_pytorch_keeps_around_the_kernels_is_measured(kind: str, seq: int, batch: int, monkeypatch):
    # lmcalc's KDA layer less what fla's kernel keeps itself: the convolution's input, the gates' element-wise terms,
    # β, the low-rank gates' first outputs, the fp32 gated norm and the output projection's input; within 1 % (A's
    # exp and the norm weight's fp32 copy, a few hundred bytes, are not counted)
    spec = spec_of(kind)
    bf16, adamw = resolve_precision("bf16").spec, resolve_optimizer("adamw").spec
    w = Workload(spec, bf16, adamw, seq, batch, "flash", "none", framework=framework_profile("transformers"))
    ours = sum(t.bytes for t in average_mixer(w, [], "other") if not any(k in t.label for k in KERNEL_KEEPS))
    measured = _saved_around_the_kernels(kind, seq, batch, monkeypatch)
    assert ours == pytest.approx(measured, rel=0.01)


def test_a_count_published_without_the_embeddings_is_compared_so(capsys):
    # Kimi Linear's card says 48B: 49,122,675,072 less the embedding and the untied head, 2 · 163,840 · 2,304 =
    # 754,974,720, is 48,367,700,352, 48B to two figures; the whole count would be 49B
    from lmcalc.cli import main
    from lmcalc.engine.model.published import as_published, matches_published

    spec = resolve_model("kimi-linear-48b-a3b").spec
    total = count_params(spec).total
    assert as_published(spec, total) == total - 754_974_720 == 48_367_700_352
    assert matches_published(spec, total)
    assert not matches_published(spec.model_copy(update={"published_params_scope": "total"}), total)
    path = Path(__file__).resolve().parent.parent / "presets" / "models" / "kimi-linear-48b-a3b.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["presets", "check", str(path)])
    assert exit_info.value.code == 0
    assert "48,367,700,352 without the embeddings" in " ".join(capsys.readouterr().out.split())
