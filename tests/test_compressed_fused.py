"""DeepSeek-V4's attention and mHC as Megatron-Core's fused kernels keep them (engine.memory.compressed_fused,
docs/formulas.md §2.24.1), against a count by hand from Megatron-LM cae55c1f09 (the dev commit Megatron-Bridge 4ab94dfad
pins): DeepSeek-V4 Flash, one sequence of 4,096 tokens, bf16.

The shapes: h = 4,096, H = 64 heads of d = 512, the query latent r_q = 1,024, g = 8 output groups of r_o = 1,024, a
window of w = 128, CSA entries every m = 4 tokens and the indexer's k_I = 512 of them, HCA entries every m′ = 128, the
indexer's H_I = 64 heads of d_I = 128, n = 4 streams."""

import pytest

from lmcalc import api
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.compressed import compressed_attention_saved, streams_saved
from lmcalc.engine.memory.module_recompute import module_kept
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.fast

T, H, HD, D, RQ, W, DI, HI = 4096, 4096, 64 * 512, 512, 1024, 128, 128, 64
MiB = 2**20


def _flash(profile: str = "megatron", **settings: object) -> Workload:
    spec = resolve_model("deepseek-v4-flash").spec
    args = (spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 4096, 1)
    return Workload(*args, framework=framework_profile(profile), **settings)  # type: ignore[arg-type]


def _csa(w: Workload) -> int:
    assert w.model.compressed_attention is not None
    return w.model.compressed_attention.csa_layer_ids[0]


def test_a_csa_layer_keeps_what_the_fused_kernels_keep():
    kept = {
        "the norm output (the projections' and compressors' input, deepseek_v4_hybrid_attention.py)": T * H * 2,
        "q_layernorm: its input and 1/rms (fp32)": T * RQ * 2 + T * 4,
        "q_up's input": T * RQ * 2,
        "pre-norm Q, kept by the compiled per-head norm": T * HD * 2,
        "Q after RoPE, kept by the kernel (fused_sparse_attention.py:364)": T * HD * 2,
        "K = V, and the key norm's input": 2 * T * D * 2,
        "the int32 indices: 512 entries and the 128-token window a query": T * (512 + W) * 4,
        "the kernel's output and log-sum-exp (fp32)": T * HD * 2 + T * 64 * 4,
        "the inverse RoPE's output, the grouped einsum's input": T * HD * 2,
        "linear_proj's input": T * 8 * 1024 * 2,
        "the keys with s/4 entries appended (csa.py:1807-1830)": (T + T // 4) * D * 2,
        "the compressor: fp32 softmax, gate weights and values over 2·d, the entries' norm input":
            2 * T * D * (4 + 2 + 2) + T // 4 * D * 2,
        "the indexer's compressor at d_I": 2 * T * DI * (4 + 2 + 2) + T // 4 * DI * 2,
        "the indexer's loss gradients, computed in the forward (fused_sparse_attention.py:1273-1334)":
            T * HI * DI * 2 + T // 4 * DI * 2 + T * HI * 2,
    }  # fmt: skip
    w = _flash()
    assert sum(t.bytes for t in compressed_attention_saved(w, _csa(w))) == sum(kept.values())
    assert sum(kept.values()) == pytest.approx(1266.0 * MiB, rel=1e-4)  # no s × s tensor: 11 GB a layer eager


def test_mla_up_proj_drops_the_up_projected_query_and_key():
    # deepseek_v4_hybrid_attention.py:866-888: the pre-norm Q, Q, K = V and the key norm's input, about 0.5 GiB
    w = _flash(recompute="selective", recompute_modules=("mla_up_proj",))
    csa = _csa(w)
    layer = compressed_attention_saved(w, csa)
    kept = module_kept(w, tuple(layer), True)
    assert sum(t.bytes for t in layer) - sum(t.bytes for t in kept) == 2 * T * HD * 2 + 2 * T * D * 2


def test_hca_and_window_layers_gather_fewer_keys():
    w = _flash()
    c = w.model.compressed_attention
    assert c is not None
    hca = {t.label: t.bytes for t in compressed_attention_saved(w, c.hca_layer_ids[0])}
    assert hca["key indices a query gathers (int32)"] == T * (T // 128 + W) * 4  # every entry closed, and the window
    window = next(i for i in range(w.model.num_layers) if c.rate(i) == 0)
    indices = {t.label: t.bytes for t in compressed_attention_saved(w, window)}["key indices a query gathers (int32)"]
    assert indices == T * W * 4


def test_the_fused_mhc_keeps_the_streams_once():
    # per sub-layer: the n streams in bf16, the fp32 factors (1/rms, (2+n)·n projections, 2n weights, the n × n
    # mixing: 49 a token) and the sub-layer's output, which the spread keeps; the eager path keeps fp32 copies too
    fused = sum(t.bytes for t in streams_saved(_flash()))
    assert fused == 2 * (T * 4 * H * 2 + T * 49 * 4 + T * H * 2)
    assert sum(t.bytes for t in streams_saved(_flash("transformers"))) > 4 * fused


def test_transformers_keeps_its_eager_path():
    w = _flash("transformers")
    labels = {t.label for t in compressed_attention_saved(w, _csa(w))}
    assert "softmax with the sink column (fp32)" in labels and "log-sum-exp (fp32)" not in labels


def test_the_eager_softmax_alone_outweighs_the_fused_layer():
    # transformers' path keeps the fp32 softmax over the s keys, s/4 entries and the sink: 64·4096·5121·4 B
    eager = {t.label: t.bytes for t in compressed_attention_saved(_flash("transformers"), _csa(_flash()))}
    assert eager["softmax with the sink column (fp32)"] == 64 * T * (T + T // 4 + 1) * 4
    w = _flash()
    assert eager["softmax with the sink column (fp32)"] > 2 * sum(t.bytes for t in layer_saved_tensors(w, True))


def test_mla_up_proj_is_taken_on_deepseek_v4_under_megatron_alone():
    api.memory(model="deepseek-v4-flash", gpus="128xgb300", seq=4096, ep=64, recompute="selective",
               recompute_modules="mla_up_proj")  # fmt: skip
    with pytest.raises(LmcalcError, match="mla_up_proj needs multi-head latent attention"):
        api.memory(model="llama-3.1-8b", gpus="8xh100", recompute="selective", recompute_modules="mla_up_proj")
