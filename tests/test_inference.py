"""Serving memory: weights at the serving dtype, the KV cache per token, and what fits on a GPU, derived by hand."""

import pytest

import lmcalc
from lmcalc.engine.inference import serving as inf
from lmcalc.engine.inference import terms as inf_terms
from lmcalc.engine.memory.terms import Capacity
from lmcalc.engine.workload import OVERHEAD_ALLOWANCE_BYTES
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_model
from lmcalc.result import Result

GiB = 2**30
H100_80GB = 80 * 10**9  # the spec sheet's 80 GB, decimal


def model(name: str):
    return resolve_model(name).spec


def serve(spec, batch, context, weights_dtype, kv_dtype, capacity, tp=1, quant_group_size=None):
    """``inference_memory`` of serving ``batch`` sequences of ``context`` tokens on GPUs of ``capacity`` bytes."""
    serving = inf.Serving(spec, context, batch, weights_dtype, kv_dtype, tp, quant_group_size)
    return inf.inference_memory(serving, capacity)


def kv_per_token(spec, kv_dtype: str, tp: int = 1) -> float:
    """Cache bytes per token over all layers on one GPU of ``tp``, as ``inference_memory`` counts them."""
    return serve(spec, 1, 1, "bf16", kv_dtype, 10**15, tp).kv_per_token_per_gpu


def test_llama31_8b_kv_cache_is_128_kib_per_token():
    # GQA: 2 (K and V) × 32 layers × 8 KV heads × 128 head size × 2 bytes (bf16) = 131,072 B = 128 KiB per token.
    assert kv_per_token(model("llama-3.1-8b"), "bf16") == 2 * 32 * 8 * 128 * 2 == 131_072


def test_llama2_7b_mha_cache_is_4x_llama3_8b_gqa():
    # Llama 2 7B has no GQA: 32 KV heads instead of Llama 3's 8, same 32 layers and head size 128:
    # 2 × 32 × 32 × 128 × 2 = 524,288 B per token, 4× the 131,072 above.
    llama2 = kv_per_token(model("llama-2-7b"), "bf16")
    llama3 = kv_per_token(model("llama-3-8b"), "bf16")
    assert llama2 == 524_288
    assert llama2 == 4 * llama3


def test_deepseek_v3_mla_caches_the_latent_and_the_rope_key():
    # DeepSeek-V2 §2.1, Table 1: MLA caches (d_c + d_h^R) elements per token per layer. DeepSeek-V3:
    # d_c = kv_lora_rank = 512, d_h^R = qk_rope_head_dim = 64, 61 layers, bf16:
    # 61 × (512 + 64) × 2 = 70,272 B per token — less than Llama 3.1 8B's 131,072 for a 671B model.
    v3 = model("deepseek-v3")
    assert inf.kv_elements_per_token_per_layer(v3) == 512 + 64
    assert kv_per_token(v3, "bf16") == 61 * (512 + 64) * 2 == 70_272


def test_deepseek_v3_mla_versus_mha_of_the_same_heads():
    # Table 1's comparison for V3's shapes: MHA would cache K (128 heads × d_qk 192) and V (128 × d_v 128)
    # = 128 × 320 = 40,960 elements per layer, against MLA's 576: 71.1× more.
    v3 = model("deepseek-v3")
    mha = v3.num_heads * (v3.qk_head_dim + v3.v_head_dim)
    assert mha == 40_960
    assert mha / inf.kv_elements_per_token_per_layer(v3) == pytest.approx(71.1, abs=0.05)


def test_llama31_70b_int4_weights():
    # 70,553,706,496 parameters (the HF safetensors total) × 0.5 byte (int4) = 35,276,853,248 B ≈ 35.3 GB.
    assert inf.weights_bytes(model("llama-3.1-70b"), "int4") == 70_553_706_496 * 0.5 == 35_276_853_248


def test_int4_group_scales_are_opt_in():
    # Not counted unless asked; with one fp16 scale per 128 weights: 70,553,706,496 / 128 = 551,200,832
    # groups × 2 B = 1,102,401,664 B (3.1% on top of the 4-bit weights).
    m = model("llama-3.1-70b")
    assert inf.quant_scale_bytes(m, "int4", None) == 0
    assert inf.quant_scale_bytes(m, "int4", 128) == 551_200_832 * 2 == 1_102_401_664
    assert inf.quant_scale_bytes(m, "bf16", 128) == 0  # 16-bit weights carry no scales
    mem = serve(m, 1, 1024, "int4", "bf16", H100_80GB, quant_group_size=128)
    assert mem.weights_per_gpu == 35_276_853_248 + 1_102_401_664


def test_fp8_kv_cache_halves_bf16():
    m = model("llama-3.1-8b")
    assert kv_per_token(m, "fp8") == kv_per_token(m, "bf16") / 2 == 65_536


def test_moe_holds_every_expert_and_caches_every_layer():
    # Mixtral 8x7B: all 8 experts are held (46,702,792,704 params × 2 B), though each token uses 2;
    # its 32 layers all have GQA attention with 8 KV heads of 128: 2 × 32 × 8 × 128 × 2 = 131,072 B per token.
    m = model("mixtral-8x7b")
    mem = serve(m, 1, 1024, "bf16", "bf16", 141 * 10**9)
    assert mem.weights == 46_702_792_704 * 2
    assert mem.kv_per_token == 131_072


def test_worked_example_llama31_8b_on_h100():
    # Llama 3.1 8B in bf16 on one 80 GB H100 with the 2 GiB allowance, at 8,192 tokens per sequence:
    #   weights      8,030,261,248 × 2 = 16,060,522,496 B
    #   cache budget 80,000,000,000 − 16,060,522,496 − 2,147,483,648 = 61,791,993,856 B
    #   per sequence 8,192 × 131,072 = 1,073,741,824 B (1 GiB)
    #   largest batch ⌊61,791,993,856 / 1,073,741,824⌋ = ⌊57.55⌋ = 57 sequences
    #   longest context at batch 1: ⌊61,791,993,856 / 131,072⌋ = 471,435 tokens (more than the 131,072 it knows)
    mem = serve(model("llama-3.1-8b"), 1, 8192, "bf16", "bf16", H100_80GB)
    assert mem.weights_per_gpu == 16_060_522_496
    assert mem.cache_budget == 61_791_993_856
    assert mem.max_batch == 57
    assert mem.max_context == 471_435


@pytest.mark.parametrize(
    "name,context,weights_dtype,kv_dtype,capacity,tp",
    [
        ("llama-3.1-8b", 8192, "bf16", "bf16", H100_80GB, 1),
        ("llama-3.1-8b", 4096, "int4", "fp8", 24 * 10**9, 1),
        ("llama-2-7b", 4096, "bf16", "bf16", 40 * 10**9, 1),
        ("llama-3.1-70b", 32768, "fp8", "fp8", H100_80GB, 8),
        ("deepseek-v3", 16384, "fp8", "bf16", 141 * 10**9, 8),
        ("gpt2-124m", 1024, "fp32", "fp32", 4 * 10**9, 1),
    ],
)
def test_largest_batch_closed_form_matches_brute_force(name, context, weights_dtype, kv_dtype, capacity, tp):
    # Count sequences up one at a time until the next would not fit; the closed form must land on the same one.
    mem = serve(model(name), 1, context, weights_dtype, kv_dtype, capacity, tp)
    per_sequence = context * mem.kv_per_token_per_gpu
    batch = 0
    while mem.weights_per_gpu + (batch + 1) * per_sequence + mem.overhead <= capacity:
        batch += 1
    assert mem.max_batch == batch


def test_longest_context_closed_form_matches_brute_force():
    # GPT-2 124M in fp32 on a 1 GiB budget above weights and overhead, 4 sequences: count tokens up one by one.
    m = model("gpt2-124m")
    weights = 124_439_808 * 4
    capacity = weights + OVERHEAD_ALLOWANCE_BYTES + 2**27
    mem = serve(m, 4, 1024, "fp32", "fp32", capacity)
    per_token = 2 * 12 * 12 * 64 * 4  # K and V, 12 layers, 12 heads of 64, fp32: 73,728 B
    assert mem.kv_per_token == per_token
    tokens = 0
    while weights + 4 * (tokens + 1) * per_token + OVERHEAD_ALLOWANCE_BYTES <= capacity:
        tokens += 1
    assert mem.max_context == tokens == 455  # ⌊134,217,728 / (4 × 73,728)⌋


def test_a_cache_that_fills_the_gpu_to_the_byte_fits():
    # Capacity = weights + overhead + exactly 10 sequences of 8,192 tokens: the answer is 10, not 9.
    exact = 16_060_522_496 + OVERHEAD_ALLOWANCE_BYTES + 10 * 8192 * 131_072
    mem = serve(model("llama-3.1-8b"), 10, 8192, "bf16", "bf16", exact)
    assert mem.max_batch == 10
    assert mem.total_per_gpu == exact


def test_tp_splits_kv_heads_then_replicates_them():
    # Llama 3.1 70B has 8 KV heads. TP=4: 2 heads per GPU; TP=8: 1; TP=16: still 1 (replicated, vLLM's
    # QKVParallelLinear). Per token on one GPU at TP=8: 80 layers × 2 × 1 × 128 × 2 B = 40,960 B.
    m = model("llama-3.1-70b")
    assert [inf.kv_heads_per_gpu(m, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert kv_per_token(m, "bf16", tp=8) == 80 * 2 * 1 * 128 * 2 == 40_960
    assert kv_per_token(m, "bf16", tp=16) == 40_960


def test_tp_divides_the_weights():
    # 70,553,706,496 × 2 B / 8 = 17,638,426,624 B per GPU (approximate: norms are replicated).
    mem = serve(model("llama-3.1-70b"), 1, 1024, "bf16", "bf16", H100_80GB, tp=8)
    assert mem.weights_per_gpu == 70_553_706_496 * 2 / 8 == 17_638_426_624


def test_mla_latent_is_replicated_over_tp():
    # The latent serves all 128 heads, so each TP rank keeps all of it (vLLM: MLA has 1 KV head).
    v3 = model("deepseek-v3")
    assert kv_per_token(v3, "bf16", tp=8) == kv_per_token(v3, "bf16") == 70_272


@pytest.mark.parametrize("tp,message", [(3, "does not divide the 32 attention heads"), (0, "positive whole number")])
def test_tp_must_fit_the_heads(tp, message):
    with pytest.raises(LmcalcError, match=message):
        inf.kv_heads_per_gpu(model("llama-3.1-8b"), tp)


@pytest.mark.parametrize(
    "heads,kv_heads,tp,message",
    [
        (24, 6, 4, "TP=4 does not divide the 6 KV heads"),  # 6 heads cannot be split 4 ways
        (24, 8, 12, "TP=12 is not a multiple of the 8 KV heads"),  # nor 8 heads replicated over 12 GPUs
    ],
)
def test_tp_must_split_or_replicate_kv_heads_evenly(heads, kv_heads, tp, message):
    spec = model("llama-3.1-8b").model_copy(update={"num_heads": heads, "num_kv_heads": kv_heads})
    with pytest.raises(LmcalcError, match=message):
        inf.kv_heads_per_gpu(spec, tp)


@pytest.mark.parametrize(
    "batch,context,message",
    [
        (0, 1024, "batch must be a positive whole number of sequences, got 0"),
        (-1, 1024, "batch must be a positive"),
        (1, 0, "context must be a positive whole number of tokens, got 0"),
        (1, -8, "context must be a positive"),
    ],
)
def test_batch_and_context_must_be_positive(batch, context, message):
    with pytest.raises(LmcalcError, match=message):
        serve(model("llama-3.1-8b"), batch, context, "bf16", "bf16", H100_80GB)


@pytest.mark.parametrize("weights_dtype,kv_dtype,what", [("fp7", "bf16", "weights dtype"), ("bf16", "q3", "KV-cache")])
def test_unknown_dtype_is_one_line(weights_dtype, kv_dtype, what):
    with pytest.raises(LmcalcError, match=f"unknown {what}") as error:
        serve(model("llama-3.1-8b"), 1, 1024, weights_dtype, kv_dtype, H100_80GB)
    message = str(error.value)
    assert "\n" not in message
    # every dtype the message offers is taken, the fp8 it names as an alias too
    offered = message.split("accepted: ")[1].split(" (")[0].split(", ")
    assert {"fp16", "bf16", "int4"} <= set(offered)
    for dtype in [*offered, "fp8"]:
        serve(model("llama-3.1-8b"), 1, 1024, dtype, dtype, H100_80GB)


def test_weights_that_do_not_fit_say_by_how_much():
    # Llama 3.1 70B in bf16 on one 80 GB GPU: 141,107,412,992 + 2,147,483,648 − 80,000,000,000
    # = 63,254,896,640 B short.
    with pytest.raises(LmcalcError, match="short by 63.25 GB") as error:
        serve(model("llama-3.1-70b"), 1, 1024, "bf16", "bf16", H100_80GB)
    assert "\n" not in str(error.value)
    assert "141.11 GB per GPU" in str(error.value)


def test_sections_carry_formulas_with_numbers():
    serving = inf.Serving(model("llama-3.1-8b"), 8192, 4, "bf16", "fp8", 1, None, OVERHEAD_ALLOWANCE_BYTES)
    capacity = Capacity(H100_80GB, "80 GB")
    sections = inf_terms.inference_sections(serving, inf.inference_memory(serving, capacity.bytes), capacity)
    result = Result("memory", "test", (), sections)
    per_layer = result.term("kv_cache.per_token_per_layer")
    # fp8 cache: 2 × 8 × 128 × 1 B = 2,048 B per layer; × 32 layers = 65,536 per token.
    assert per_layer.value == 2048
    assert per_layer.substituted == "2 × 8 × 128 × 1 B"
    assert per_layer.source.startswith("DeepSeek-V2")
    assert result.value("kv_cache.per_token") == 65_536
    assert result.value("kv_cache.total") == 4 * 8192 * 65_536
    assert result.term("weights.weights").substituted == "8,030,261,248 × 2 B"
    assert result.term("per_gpu.max_batch").unit == "sequences"
    assert result.term("per_gpu.max_context").unit == "tokens"
    stacked = sum(result.value(key) for key in inf_terms.INFERENCE_STACK)
    assert stacked == result.value("per_gpu.total")
    assert result.value(inf_terms.INFERENCE_CAPACITY) - stacked == result.value("per_gpu.headroom")


def test_sections_for_mla_under_tp():
    serving = inf.Serving(model("deepseek-v3"), 4096, 1, "fp8", "bf16", 8)
    capacity = Capacity(141 * 10**9, "141 GB")
    sections = inf_terms.inference_sections(serving, inf.inference_memory(serving, capacity.bytes), capacity)
    result = Result("memory", "test", (), sections)
    assert result.term("kv_cache.per_token_per_layer").substituted == "(512 + 64) × 2 B"
    assert result.value("kv_cache.per_token_per_gpu") == 70_272
    assert "routed experts" in result.term("weights.params").note


def test_a_context_beyond_the_models_window_is_said_beside_the_table():
    # Llama 3.1 8B on one H100: the KV cache budget holds 471,435 tokens at batch 1 (see above), more than
    # the 131,072 the model was trained for; at batch 8 it holds 58,929, within it
    long = lmcalc.inference(model="llama-3.1-8b", batch=1, context="8K").report
    assert any("beyond llama-3.1-8b's trained context of 131,072 tokens" in n for n in long.notes)
    short = lmcalc.inference(model="llama-3.1-8b", batch=8, context="8K").report
    assert not any("trained context" in n for n in short.notes)
