"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): MLA with a lightning indexer that picks each query's top k_I keys
(DeepSeek-AI 2025, DeepSeek-V3.2 §2.1). Against hand derivations written here and against transformers: the
parameters are exact (tests/test_hf_types.py), the FLOPs equal FlopCounterMode's (tests/test_validate_hf.py; here at
real width), the cache is transformers' own, and the saved bytes and step peak under ``--framework transformers`` are
the harness's (tests/test_framework_transformers.py, tests/test_step_phases.py)."""

from __future__ import annotations

import warnings

import pytest

from lmcalc.engine.finetune.method import FULL
from lmcalc.engine.inference.serving import kv_elements_per_token_per_layer
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.phases import indexer_peak
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params, weight_tensors
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import stage_layers
from lmcalc.engine.parallel.sharding import tp_divisor
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

# DeepSeek-V3.2's shapes (its config.json; transformers' DeepseekV32Config defaults): V3's model with an indexer of
# 64 heads of 128 over the 1,536-wide query latent, picking 2,048 keys
V32 = {
    "name": "v32", "vocab_size": 129280, "hidden_size": 7168, "num_layers": 61, "num_heads": 128, "ffn_size": 18432,
    "norm_kind": "rmsnorm", "ffn_kind": "swiglu", "tied_embeddings": False, "position_embedding": "rope",
    "max_seq_len": 163840,
    "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "indexer": {"heads": 64, "head_dim": 128, "top_k": 2048}},
    "moe": {"num_experts": 256, "experts_per_token": 8, "shared_experts": 1, "expert_ffn_size": 2048,
            "dense_layers": 3},
}  # fmt: skip
PER_LAYER = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64  # wq_b, wk, k_norm's weight and bias, weights_proj


def spec(**indexer: int | None) -> ModelSpec:
    fields = {**V32, "mla": {**V32["mla"], "indexer": {**V32["mla"]["indexer"], **indexer}}}
    return ModelSpec.model_validate(fields)


def without_indexer() -> ModelSpec:
    return ModelSpec.model_validate({**V32, "mla": {**V32["mla"], "indexer": None}})


def test_the_indexer_adds_its_four_tensors_in_every_layer_that_runs_one():
    # 13,959,424 a layer: 61 layers in DeepSeek-V3.2; GLM-5's "shared" layers build none
    assert PER_LAYER == 13_959_424
    assert count_params(spec()).total - count_params(without_indexer()).total == 61 * PER_LAYER
    assert count_params(spec(own_layers=20)).total - count_params(without_indexer()).total == 20 * PER_LAYER
    assert count_params(spec()).by_group["indexer"] == 61 * PER_LAYER


def test_the_attention_reads_the_top_k_keys_and_the_indexer_scores_every_causal_key():
    # s = 8,192, k_I = 2,048: query i reads min(i, 2048) keys, (2048·2049/2 + 6144·2048)/8192 on average; the
    # indexer scores (s+1)/2 keys a query under the causal convention, 2·H_I·(d_I + 1) FLOPs a key, forward only
    s, model = 8192, spec()
    keys = (2048 * 2049 / 2 + 6144 * 2048) / 8192
    fwd = fl.forward_flops_per_token(model, s, "causal")
    assert fwd.attention_scores == pytest.approx(2 * 61 * keys * 128 * 192)
    assert fwd.attention_values == pytest.approx(2 * 61 * keys * 128 * 128)
    assert fwd.indexer == pytest.approx(61 * (2 * PER_LAYER - 2 * 2 * 128) + 61 * 4096.5 * 2 * 64 * 129)
    # full convention, as transformers runs it: every key scored and attended (masked, not skipped)
    full = fl.forward_flops_per_token(model, s, "full")
    assert full.attention_scores == pytest.approx(2 * 61 * s * 128 * 192)
    assert full.indexer == pytest.approx(61 * (2 * PER_LAYER - 2 * 2 * 128) + 61 * s * 2 * 64 * 129)


def test_the_indexer_runs_forward_only_in_the_training_step():
    # no gradient flows into it (DeepseekV32Indexer runs under no_grad): 3 · (forward − indexer) + indexer
    step = fl.step_flops(spec(), 4096, convention="causal")
    assert step.model == pytest.approx(3 * (step.forward.total - step.forward.indexer) + step.forward.indexer)
    assert step.forward.indexer > 0


def test_short_sequences_attend_as_a_causal_kernel():
    # s ≤ k_I: the indexer picks every key a query may see, (s+1)/2 on average
    assert fl.attended_keys(spec(), 1024, "causal") == (1024 + 1) / 2


def workload(framework: str, attention: str = "flash", seq: int = 4096, model: ModelSpec | None = None) -> Workload:
    bf16 = resolve_precision("bf16-mixed").spec
    return Workload(model or spec(), bf16, resolve_optimizer("adamw").spec, seq, 2, attention, "none",
                    framework=framework_profile(framework), method=FULL)  # fmt: skip


def saved(w: Workload, label: str) -> float:
    return sum(t.bytes for t in layer_saved_tensors(w, True) if t.label == label)


def test_a_sparse_kernel_keeps_the_top_k_indices_and_transformers_keeps_a_mask():
    # Megatron-Core's sparse MLA kernel takes the int32 indices, b·s·k_I of them; transformers masks SDPA with a
    # [b, 1, s, s] mask per layer in the activation dtype, which the kernel keeps
    b, s = 2, 4096
    assert saved(workload("megatron"), "the indexer's top-k key indices (int32)") == b * s * 2048 * 4
    assert saved(workload("megatron", seq=1024), "the indexer's top-k key indices (int32)") == b * 1024 * 1024 * 4
    assert saved(workload("transformers"), "the indexer's mask (kept by the kernel)") == b * s * s * 2
    assert saved(workload("transformers"), "the indexer's top-k key indices (int32)") == 0
    assert saved(workload("transformers", "eager"), "the indexer's mask (kept by the kernel)") == 0
    # 20 layers of 61 select, the others reuse their storage
    w = workload("megatron", model=spec(own_layers=20))
    assert saved(w, "the indexer's top-k key indices (int32)") == pytest.approx(20 / 61 * b * s * 2048 * 4)


def test_transformers_indexer_copies_its_key_for_every_query():
    # torch.matmul([b, s, H_I, d_I] fp32, [b, 1, d_I, s] fp32) expands the key to [b, s, d_I, s] and copies it, beside
    # the [b, s, H_I, s] fp32 scores; the queries and the key as projected, concatenated after RoPE and in fp32
    b, s = 2, 4096
    copies = 4 * b * s * s * (128 + 64) + b * s * 65 * 128 * (2 * 2 + 4)
    assert indexer_peak(workload("transformers"), 1) == copies
    assert indexer_peak(workload("megatron"), 1) == 0


def test_the_step_times_the_indexer_forward_only():
    # the stage's GEMMs gain the indexer's forward FLOPs, one pass each (no input or weight gradient)
    with_ix, without = workload("megatron", seq=4096), workload("megatron", seq=4096, model=without_indexer())
    tokens = 2 * 4096

    def gemm_flops(w: Workload) -> float:
        return stage_work(w, Grid(), stage_layers(w.model, Layout(), 0)).gemm_flops

    expected = tokens * fl.forward_flops_per_token(spec(), 4096, "causal").indexer
    assert gemm_flops(with_ix) - gemm_flops(without) == pytest.approx(expected)


def test_the_indexer_is_whole_on_every_tensor_parallel_rank():
    # its one key serves every head: no TP split, as Megatron-Core's column- and row-parallel modules would make
    indexer = [t for t in weight_tensors(spec()) if t.group == "indexer"]
    assert [t.name for t in indexer] == [
        "indexer.wq_b.weight", "indexer.wk.weight", "indexer.k_norm.weight", "indexer.k_norm.bias",
        "indexer.weights_proj.weight",
    ]  # fmt: skip
    assert all(tp_divisor(t, spec(), 8) == 1 for t in indexer)


def test_the_cache_holds_the_indexer_key_beside_the_latent():
    # per token and layer: d_c + d_rope of MLA's latent, and d_I in the layers that run an indexer
    assert kv_elements_per_token_per_layer(spec()) == 512 + 64 + 128
    assert kv_elements_per_token_per_layer(spec(own_layers=20)) == pytest.approx(512 + 64 + 128 * 20 / 61)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_the_cache_is_what_transformers_allocates(kind: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_tiny import tiny_config

    from lmcalc.hf_config import model_from_hf_config

    config = tiny_config(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model = model.to(torch.bfloat16).eval()
    batch, tokens = 2, 7
    with torch.no_grad():
        cache = model(input_ids=torch.zeros(batch, tokens, dtype=torch.long), use_cache=True).past_key_values
    held = {id(t): t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)}
    cached = sum(t.numel() * t.element_size() for t in held.values())
    model_spec = ModelSpec.model_validate(model_from_hf_config(config, kind, kind))
    per_token = kv_elements_per_token_per_layer(model_spec) * model_spec.num_layers * 2  # bf16
    assert cached == pytest.approx(batch * tokens * per_token)


V32_SMALL = {"model_type": "deepseek_v32", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384,
             "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32, "num_hidden_layers": 2,
             "max_position_embeddings": 2048, "attention_dropout": 0.0, "tie_word_embeddings": False,
             "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 32,
             "index_n_heads": 4, "index_head_dim": 32, "index_topk": 64, "first_k_dense_replace": 1,
             "n_routed_experts": 4, "n_shared_experts": 1, "moe_intermediate_size": 64, "num_experts_per_tok": 2,
             "n_group": 1, "topk_group": 1}  # fmt: skip
"""scripts/hf_saved.py's deepseek-v32-small, written out: h 128, H 4, d_nope 16, d_rope 16, d_v 32, r_q 64, r_kv 32,
an indexer of 4 heads of 32, a dense layer and an MoE one, V 2,048."""


def test_a_checkpointed_v32_step_peaks_at_a_rebuilt_indexer_by_hand():
    # deepseek-v32-small checkpointed at s = 256, b = 2 (t = 512 tokens, bf16, eager): the step peaks while the top
    # layer is rebuilt in the backward, at its indexer's scores. Live then:
    from dataclasses import replace

    from lmcalc.engine.memory.gpu_memory import gpu_memory
    from lmcalc.engine.memory.phases import step_phases
    from lmcalc.hf_config import model_from_hf_config

    t, s, h = 512, 256, 128
    checkpointed = 2 * t * h * 2  # each layer's input
    outside = s * s * 4 + 2 * s * 16 * 2 + s * 8 + 2 * t * 8  # the mask, RoPE's cos and sin, positions, ids and labels
    # the attention up to its core: three norms (the input's of h, the query latent's of 64, the KV latent's of 32:
    # an fp32 copy, 1/rms, the normalised value and the output each) and Q, K and V (4 heads of 32)
    norms = sum(t * width * (4 + 2 + 2) + t * 4 for width in (128, 64, 32))
    qkv = 3 * t * 4 * 32 * 2
    # DeepseekV32Attention.forward's locals: q_b's output (H·(16 + 16)), Q's RoPE output (H·16), the key half of
    # kv_b's output beside V's view (H·16; eager attention's matmul copies V at b = 2, so V's storage is not kept),
    # kv_a's output (32 + 16), K's RoPE output (16) and the indexer's Q's and K's RoPE outputs (5·16)
    attention_locals = t * (4 * (32 + 16 + 16) + 32 + 16 + 16 + 5 * 16) * 2
    # the indexer (§2.5): its key copied for every query and the scores, b·s·s·(d_I + H_I) in fp32, its Q and K as
    # projected, after RoPE and in fp32
    indexer = 4 * t * s * (32 + 4) + t * 5 * 32 * (2 + 2 + 4)
    output_gradient = t * h * 2  # the layer output's gradient, which the residual branch holds
    by_hand = checkpointed + outside + norms + qkv + attention_locals + indexer + output_gradient
    assert (norms + qkv, attention_locals, indexer) == (1_316_864, 409_600, 19_529_728)
    assert by_hand == 21_938_176  # transformers' step peaks at 21,929,992 B (+0.04 %): tests/test_step_phases.py
    spec = ModelSpec.model_validate(model_from_hf_config(V32_SMALL, "v32-small", "test"))
    w = Workload(spec, resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, s, 2, "eager", "none",
                 framework=framework_profile("transformers"))  # fmt: skip
    gpu = gpu_memory(replace(w, recompute="full"), Layout(), 0)
    phases = step_phases(gpu.held, gpu.transients, gpu.kept.step_transient)
    assert phases.busiest == by_hand and phases.binding.startswith("a layer's forward")


GLM5_SMALL = V32_SMALL | {"model_type": "glm_moe_dsa", "indexer_types": ["full", "shared"]}
"""scripts/hf_saved.py's glm-moe-dsa-small, written out: V32_SMALL's widths, the first (dense) layer running an
indexer, the second (MoE) reusing its selection (GlmMoeDsaAttention's indexer_types "shared": no indexer built)."""


def glm5_phases(attention: str, recompute: str) -> object:
    from dataclasses import replace

    from lmcalc.engine.memory.gpu_memory import gpu_memory
    from lmcalc.engine.memory.phases import step_phases
    from lmcalc.hf_config import model_from_hf_config

    spec = ModelSpec.model_validate(model_from_hf_config(GLM5_SMALL, "glm5-small", "test"))
    assert spec.indexer is not None and spec.indexer.above_last == 1 and spec.indexer_layers == 1
    w = Workload(spec, resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, 256, 2, attention,
                 "none", framework=framework_profile("transformers"))  # fmt: skip
    gpu = gpu_memory(replace(w, recompute=recompute), Layout(), 0)
    return step_phases(gpu.held, gpu.transients, gpu.kept.step_transient)


def test_glm5_peaks_at_its_first_layers_indexer_by_hand():
    # glm-moe-dsa-small at s = 256, b = 2 (t = 512 tokens, bf16, SDPA), not checkpointed: the step peaks in the
    # forward at layer 0's indexer's scores, the one indexer it runs; layer 1, which reuses the selection, has not run
    # (lmcalc put the moment at the top layer's indexer, every tensor of layer 0 and the embedding side saved:
    # 25,458,349 B, +18.6 %). Live then, as lmcalc counts it:
    t, s, h = 512, 256, 128
    embedding_side = 2 * s * 16 * 2 + 2 * t * 8  # RoPE's cos and sin, ids and labels
    layer_input = t * h * 2  # the embedding's output, which the residual branch holds
    # layer 0's attention up to its core: three norms (the input's of h, the query latent's of 64, the KV latent's
    # of 32: an fp32 copy, 1/rms, the normalised value and the output each), Q and K (4 heads of 32) and kv_b's
    # output whole (4 heads of 16 + 32), whose value half SDPA reads as V
    norms = sum(t * width * (4 + 2 + 2) + t * 4 for width in (128, 64, 32))
    qkv = 2 * t * 4 * 32 * 2 + t * 4 * (16 + 32) * 2
    # its forward's locals (§3.7): q_b's output and Q's RoPE output (H·(32 + 16)), kv_a's output (32 + 16), K's RoPE
    # output (16) and the indexer's Q's and K's (5·16)
    attention_locals = t * (4 * (32 + 16) + 32 + 16 + 16 + 5 * 16) * 2
    indexer = 4 * t * s * (32 + 4) + t * 5 * 32 * (2 + 2 + 4)  # the key's copy, the scores, its Q and K (§2.5)
    by_hand = embedding_side + layer_input + norms + qkv + attention_locals + indexer
    assert (norms + qkv, attention_locals) == (1_382_400, 344_064)
    assert by_hand == 21_411_840  # transformers' step peaks in the forward at 21,471,232 B (-0.28 %)
    phases = glm5_phases("flash", "none")  # SDPA's kernel, as the harness runs it
    assert phases.busiest == by_hand and phases.binding.startswith("a layer's forward")


def test_a_checkpointed_glm5_step_peaks_at_its_first_layers_rebuild_by_hand():
    # checkpointed (eager): the step peaks while layer 0 is rebuilt in the backward, at its indexer's scores; layer 1's
    # backward has run and freed its checkpointed input. Live then what deepseek-v32-small holds at its top layer's
    # rebuild (test_a_checkpointed_v32_step_peaks_at_a_rebuilt_indexer_by_hand: 21,938,176 B, the attention the same)
    # but the second layer's input (t·h·2)
    by_hand = 21_938_176 - 512 * 128 * 2
    assert by_hand == 21_807_104  # transformers' step peaks at 21,798,920 B (+0.04 %); SDPA, tests/test_step_phases.py
    phases = glm5_phases("eager", "full")
    assert phases.busiest == by_hand and phases.binding.startswith("a layer's forward")
