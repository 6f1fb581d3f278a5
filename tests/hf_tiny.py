"""Tiny Hugging Face configs, one per ``model_type`` lmcalc reads, as ``config.json`` would hold them: four layers
(so that alternating patterns show: sliding and global layers, MoE every other layer, one leading dense layer),
widths of 64 to 128, a vocabulary of 512. transformers builds each on the meta device in milliseconds; the tests
compare lmcalc's count and FLOPs with that model (tests/test_hf_types.py, the ``validate --against transformers``
tests)."""

from __future__ import annotations

import warnings
from typing import Any

BASE: dict[str, Any] = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                            num_hidden_layers=4, intermediate_size=96, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2)  # fmt: skip
MOE: dict[str, Any] = dict(moe_intermediate_size=32, num_experts_per_tok=2)
DEEPSEEK: dict[str, Any] = dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=48,
                                kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                num_key_value_heads=4)  # fmt: skip
"""DeepSeek-V2/V3's MLA and MoE at tiny size (V3 adds group-limited routing)."""
DSA: dict[str, Any] = dict(index_n_heads=4, index_head_dim=16, index_topk=8)
"""DeepSeek sparse attention's lightning indexer at tiny size (DeepSeek-V3.2, GLM-5)."""
MLA: dict[str, Any] = dict(q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
"""MLA alone, on a dense model (MiniCPM3, Youtu)."""
LINEAR: dict[str, Any] = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                              linear_value_head_dim=16, linear_conv_kernel_dim=4)  # fmt: skip
"""Gated DeltaNet layers at tiny size (Qwen3-Next, Qwen3.5): every fourth layer attends."""
MAMBA2: dict[str, Any] = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
                              mamba_expand=2, mamba_chunk_size=16)  # fmt: skip
"""Mamba-2 layers at tiny size (Bamba, Granite 4): 8 heads of 16 over the 128-wide inner, chunks of 16 tokens."""
TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", dict(sliding_window=24)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2Config", {}),
    "qwen2_moe": ("Qwen2MoeConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=80,
                                         decoder_sparse_step=2, mlp_only_layers=[2])),
    "qwen3": ("Qwen3Config", dict(head_dim=48)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(MOE, num_experts=4, head_dim=48, decoder_sparse_step=1, mlp_only_layers=[0])),
    "gemma": ("GemmaConfig", dict(head_dim=48)),
    "gemma2": ("Gemma2Config", dict(head_dim=48, sliding_window=24)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=48, sliding_window=24, sliding_window_pattern=3)),
    "phi3": ("Phi3Config", {}),
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=32, sliding_window=24)),
    "deepseek_v2": ("DeepseekV2Config", DEEPSEEK),
    "deepseek_v3": ("DeepseekV3Config", dict(DEEPSEEK, n_group=2, topk_group=1)),
    "glm4": ("Glm4Config", {}),
    "glm4_moe": ("Glm4MoeConfig", dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1,
                                       n_group=1, topk_group=1, use_qk_norm=True, head_dim=24)),
    "smollm3": ("SmolLM3Config", {}),
    "olmo2": ("Olmo2Config", {}),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=4, n_head=4, n_positions=128)),
    "openai-gpt": ("OpenAIGPTConfig", dict(n_embd=64, n_layer=4, n_head=4, n_positions=128)),
    "ctrl": ("CTRLConfig", dict(n_embd=64, n_layer=4, n_head=4, dff=96, n_positions=128)),
    "xglm": ("XGLMConfig", dict(d_model=64, num_layers=4, attention_heads=4, ffn_dim=96, max_position_embeddings=128)),
    "diffllama": ("DiffLlamaConfig", dict(num_key_value_heads=2)),
    # its text model builds only under the wrapper (Emu3ForCausalLM from Emu3Config): the wrapper, a tiny text_config
    "emu3_text_model": ("Emu3Config", dict(text_config=BASE)),
    "gpt_neox_japanese": ("GPTNeoXJapaneseConfig", dict(intermediate_multiple_size=2)),
    "gpt_neox": ("GPTNeoXConfig", {}),
    "falcon": ("FalconConfig", dict(num_kv_heads=2, new_decoder_architecture=True)),
    "bloom": ("BloomConfig", dict(n_layer=4, n_head=4)),
    "starcoder2": ("Starcoder2Config", dict(sliding_window=24)),
    "cohere": ("CohereConfig", dict(use_qk_norm=True)),
    "cohere2": ("Cohere2Config", dict(sliding_window=24, sliding_window_pattern=2)),
    "granite": ("GraniteConfig", {}),
    "ernie4_5": ("Ernie4_5Config", dict(use_bias=True)),
    "jamba": ("JambaConfig", dict(num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                                  attn_layer_period=4, attn_layer_offset=2, mamba_d_state=8, mamba_dt_rank=8)),
    "llama4_text": ("Llama4TextConfig", dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128,
                                             interleave_moe_layer_step=2, head_dim=32, attention_chunk_size=24,
                                             no_rope_layer_interval=2)),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=64, n_layer=4, n_head=4, n_positions=128)),
    "granitemoe": ("GraniteMoeConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "granitemoeshared": ("GraniteMoeSharedConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                                        shared_intermediate_size=48)),
    "flex_olmo": ("FlexOlmoConfig", dict(num_experts=4, num_experts_per_tok=2)),
    "minimax_m2": ("MiniMaxM2Config", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=32)),
    "dots1": ("Dots1Config", dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1)),
    "phimoe": ("PhimoeConfig", dict(num_local_experts=4, num_experts_per_tok=2, lm_head_bias=True)),
    "ministral3": ("Ministral3Config", dict(sliding_window=24)),
    "helium": ("HeliumConfig", dict(attention_bias=True, head_dim=16)),  # its o_proj is h × h: H·d = h
    "olmo3": ("Olmo3Config", dict(sliding_window=24)),
    "vaultgemma": ("VaultGemmaConfig", dict(head_dim=48, sliding_window=24)),
    "glm": ("GlmConfig", {}),
    "hyperclovax": ("HyperCLOVAXConfig", {}),
    "minicpm3": ("MiniCPM3Config", dict(MLA, attention_bias=True)),
    "youtu": ("YoutuConfig", dict(MLA, q_lora_rank=None)),
    "gptj": ("GPTJConfig", dict(n_embd=64, n_layer=4, n_head=4, rotary_dim=8, n_positions=128)),
    "codegen": ("CodeGenConfig", dict(n_embd=64, n_layer=4, n_head=4, rotary_dim=8, n_positions=128, n_ctx=128)),
    "phi": ("PhiConfig", dict(qk_layernorm=True)),
    "stablelm": ("StableLmConfig", dict(use_qkv_bias=True, use_parallel_residual=True)),
    "cwm": ("CwmConfig", dict(sliding_window=24, head_dim=16)),  # global at layers 0 and 4k (global_from_first)
    "exaone4": ("Exaone4Config", dict(sliding_window=24, sliding_window_pattern=2)),
    "seed_oss": ("SeedOssConfig", dict(head_dim=16, attention_out_bias=True)),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32,
                                                moe_num_shared_experts=1, moe_layer_start_index=1,
                                                moe_layer_end_index=2)),  # layers 0 and 3 dense
    "mellum": ("MellumConfig", dict(MOE, num_local_experts=4, head_dim=16, sliding_window=24,
                                    mlp_layer_types=["dense", "sparse", "sparse", "dense"],
                                    layer_types=["sliding_attention", "full_attention"] * 2)),
    "arcee": ("ArceeConfig", {}),
    "bitnet": ("BitNetConfig", {}),
    "nemotron": ("NemotronConfig", dict(head_dim=16)),
    "persimmon": ("PersimmonConfig", dict(num_key_value_heads=4)),  # its fused query_key_value: H key-value heads
    "qwen3_next": ("Qwen3NextConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=48, head_dim=16,
                                           **LINEAR)),
    "qwen3_5_text": ("Qwen3_5TextConfig", dict(head_dim=16, **LINEAR)),
    # Gated DeltaNet in layers 0 and 2, attention within a window in 1 and fully in 3, 4 experts and an ungated shared
    # expert (the class's own pattern, period 5, attends by index: tests/test_hf_types.py)
    "lara_mini": ("LaraMiniConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=48, head_dim=16,
                                         sliding_window=24, **LINEAR, layer_types=["linear_attention",
                                         "sliding_attention", "linear_attention", "full_attention"])),
    # Gated DeltaNet in three layers by six projections of its own, OLMo 3's attention (no gate) in the fourth
    "olmo_hybrid": ("OlmoHybridConfig", dict(num_key_value_heads=4, **LINEAR,
                                             layer_types=["linear_attention"] * 3 + ["full_attention"])),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=48,
                                                       head_dim=16, **LINEAR)),
    "bamba": ("BambaConfig", dict(attn_layer_indices=[1], **MAMBA2)),
    # Mamba models: every layer a Mamba (or Mamba-2) block alone, no attention, no FFN
    "mamba": ("MambaConfig", dict(state_size=8, expand=2, conv_kernel=4, time_step_rank="auto")),
    "falcon_mamba": ("FalconMambaConfig", dict(state_size=8, expand=2, conv_kernel=4, tie_word_embeddings=False)),
    "mamba2": ("Mamba2Config", dict(num_heads=8, head_dim=16, n_groups=2, state_size=16, expand=2, conv_kernel=4,
                                    chunk_size=16)),
    # attention and Mamba-2 side by side in every layer, Mamba-2's width its own (mamba_d_ssm), with its gated norm
    "falcon_h1": ("FalconH1Config", dict(head_dim=16, mamba_d_ssm=128, mamba_rms_norm=True, **MAMBA2)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                                        shared_intermediate_size=48, **MAMBA2,
                                                        layer_types=["mamba", "attention"] * 2)),
    # single blocks: Mamba-2, MoE, attention, MoE, Mamba-2, MLP (NemotronHBlock: one norm and one mixer each)
    "nemotron_h": ("NemotronHConfig", dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                           moe_shared_expert_intermediate_size=48, head_dim=16, mamba_num_heads=8,
                                           mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4,
                                           chunk_size=16, hybrid_override_pattern="ME*EM-")),
    "solar_open": ("SolarOpenConfig", dict(MOE, n_routed_experts=4, n_shared_experts=1, head_dim=16,
                                           attention_bias=True)),
    "ministral": ("MinistralConfig", dict(head_dim=16, sliding_window=24,
                                          layer_types=["sliding_attention", "full_attention"] * 2)),
    "granite_swa": ("GraniteSWAConfig", dict(sliding_window=24)),  # sinks on every layer, one global in four
    "granitemoe_swa": ("GraniteMoeSWAConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=24)),
    "jais2": ("Jais2Config", dict(head_dim=16)),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", dict(head_dim=16)),
    "exaone_moe": ("ExaoneMoeConfig", dict(MOE, num_experts=4, num_shared_experts=1, head_dim=16, sliding_window=24,
                                           sliding_window_pattern=2)),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", dict(DEEPSEEK, n_group=1, topk_group=1)),
    # DeepSeek-V3's layer with a norm on the MoE block's output (A.X K1)
    "axk1": ("AXK1Config", dict(DEEPSEEK, n_group=2, topk_group=1)),
    # sinks, QK-norm per head, a shared expert without a gate, global layers 0, 1 and 3 (Flint's pattern)
    "flint": ("FlintConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=80, mlp_only_layers=[0],
                                  sliding_window=24, head_dim=16,
                                  layer_types=["full_attention", "full_attention", "sliding_attention",
                                               "full_attention"])),
    # lightning attention in every second layer, blocks of 16 tokens (MiniMax-01)
    "minimax": ("MiniMaxConfig", dict(num_local_experts=4, num_experts_per_tok=2, block_size=16)),
    # DeepSeek sparse attention: each query attends to its top 8 keys; GLM-5's "shared" layers reuse the last selection
    "deepseek_v32": ("DeepseekV32Config", dict(DEEPSEEK, n_group=2, topk_group=1, **DSA)),
    "glm_moe_dsa": ("GlmMoeDsaConfig", dict(DEEPSEEK, n_group=1, topk_group=1, **DSA,
                                           indexer_types=["full", "shared", "full", "shared"])),
    # Kimi Delta Attention beside MLA: Kimi Linear's checkpoint field (1-indexed, layers 0 and 3 attend) and low-rank
    # gates; Bailing's full-rank gates, every second layer MLA with a head-wise gate
    "kimi_linear": ("KimiLinearConfig", dict(DEEPSEEK, num_experts=4, q_lora_rank=None, linear_attn_config=dict(
        full_attn_layers=[1, 4], kda_layers=[2, 3], head_dim=16, num_heads=4, short_conv_kernel_size=4))),
    "bailing_hybrid": ("BailingHybridConfig", dict(DEEPSEEK, num_experts=4, n_group=2, topk_group=1, head_dim=16,
                                                   layer_group_size=2)),
    # ModernBERT's decoder: the embedding's LayerNorm for layer 0's, a fused GeGLU, a head transform before the tied
    # decoder and its bias, full attention in layers 0 and 3 and a window of 12 in the others
    "modernbert-decoder": ("ModernBertDecoderConfig", dict(local_attention=24, global_attn_every_n_layers=3,
                                                           max_position_embeddings=128)),
    "olmo": ("OlmoConfig", dict(clip_qkv=8.0)),
    "nanochat": ("NanoChatConfig", {}),
    "opt": ("OPTConfig", dict(ffn_dim=96, max_position_embeddings=128)),
    "biogpt": ("BioGptConfig", dict(max_position_embeddings=128)),
    "gpt_neo": ("GPTNeoConfig", dict(num_layers=4, num_heads=4, window_size=24, max_position_embeddings=128,
                                     attention_types=[[["global", "local"], 2]])),
    "mpt": ("MptConfig", dict(d_model=64, n_heads=4, n_layers=4, max_seq_len=128,
                              attn_config=dict(clip_qkv=8.0))),
    "dbrx": ("DbrxConfig", dict(d_model=64, n_heads=4, n_layers=4, max_seq_len=128,
                                attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=500000.0),
                                ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2))),
    "apertus": ("ApertusConfig", dict(head_dim=16)),
    "apertus1p5_text": ("Apertus1p5TextConfig", dict(head_dim=16)),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", dict(head_dim=16, num_experts=4, moe_topk=2)),
    "cohere2_moe": ("Cohere2MoeConfig", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                                             sliding_window=24, first_k_dense_replace=1,
                                             prefix_dense_intermediate_size=80)),
    "aria_text": ("AriaTextConfig", dict(head_dim=16, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=1)),
    "kolibri1": ("Kolibri1Config", dict(MOE, num_local_experts=4, head_dim=16, shared_expert_intermediate_size=48,
                                        sliding_window=24)),
    # a softplus gate a head on the attention's output, sliding and full layers, one dense layer, an ungated shared
    # expert and a frozen correction bias counted as a parameter
    "laguna": ("LagunaConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=48, head_dim=16,
                                    sliding_window=24, layer_types=["sliding_attention", "full_attention"] * 2)),
    # AFMoE's gate with a bias a head; the first layer dense, full attention (NoPE) in the last, sandwich norms
    "beam": ("BeamConfig", dict(MOE, num_experts=4, n_group=2, topk_group=1, head_dim=16, sliding_window=24,
                                mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
    "afmoe": ("AfmoeConfig", dict(MOE, num_experts=4, num_shared_experts=1, head_dim=16, num_dense_layers=1,
                                  sliding_window=24, global_attn_every_n_layers=2)),
    "lfm2": ("Lfm2Config", dict(full_attn_idxs=[1], conv_bias=True, block_multiple_of=32,
                                block_ffn_dim_multiplier=1.3)),
    # LFM3: a convolution, attention within a window, a convolution, full attention; a sigmoid gate a head, sandwich
    # norms
    "lfm3": ("Lfm3Config", dict(head_dim=16, sliding_window=24,
                                layer_types=["conv", "sliding_attention", "conv", "full_attention"])),
    "lfm2_moe": ("Lfm2MoeConfig", dict(MOE, num_experts=4, num_dense_layers=1,
                                       layer_types=["conv", "full_attention", "conv", "conv"])),
    "hy_v3": ("HYV3Config", dict(MOE, num_experts=4, num_shared_experts=1, head_dim=16,
                                 mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
    # MiMo-V2-Flash: keys of 32 and values of 16, the sliding layers (1 and 2) at twice the KV heads with sinks, the
    # first layer dense
    "mimo_v2_flash": ("MiMoV2FlashConfig", dict(MOE, n_routed_experts=4, head_dim=32, v_head_dim=16,
                                                sliding_window=24, num_key_value_heads=1)),
    # MiniMax-M3's text model: a dense first layer of its own width, then 4 experts top-2 with an ungated shared
    # expert, clamped SwiGLUs (the dense and shared ones with a fused gate_up_proj), QK-norm per head
    "minimax_m3_vl_text": ("MiniMaxM3VLTextConfig", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                                         intermediate_size=32, dense_intermediate_size=80,
                                                         shared_intermediate_size=48,
                                                         mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
    # LongCat-Flash: two layers of two sub-layers each (MLA and a dense MLP), the first of each pair feeding a
    # shortcut MoE of 4 experts and 2 zero-computation ones, top-3; head_dim, which sizes its rotary tables, is the
    # RoPE part of the keys
    "longcat_flash": ("LongcatFlashConfig", dict(num_layers=2, n_routed_experts=4, zero_expert_num=2, moe_topk=3,
                                                 expert_ffn_hidden_size=32, q_lora_rank=48, kv_lora_rank=32,
                                                 qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8,
                                                 v_head_dim=16, num_key_value_heads=4)),
    # A.X K2: MLA without q_b, its query up-projection reading the normed latent beside the latent and gating the
    # output; DeepSeek-V3.2's indexer; gated input norms (and MLP norms in MoE layers); the first layer dense
    "axk2": ("AXK2Config", dict(DEEPSEEK, n_group=None, topk_group=None, head_dim=8, index_n_heads=4,
                                index_head_dim=16, index_topk=8, gated_norm_rank=8,
                                mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
    # JetMoE: attention of 4 experts top-2 (2 KV heads of 16 each: 4 query heads a token) over one shared K and V,
    # and 4 MLP experts top-2, each with a bias on its summed output
    "jetmoe": ("JetMoeConfig", dict(num_key_value_heads=2, kv_channels=16, num_local_experts=4, num_experts_per_tok=2,
                                    intermediate_size=32)),
    # Gemma 4: global layers (1 and 3) at heads of 32 with one KV head and K = V, local ones at 16; the last two layers
    # sharing layers 0's and 1's K and V, with MLPs twice as wide; per-layer inputs of 8 from a table of 128 rows;
    # an MoE block of 4 experts, top-2, beside each dense MLP
    "gemma4_text": ("Gemma4TextConfig", dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                                             attention_k_eq_v=True, sliding_window=24, num_kv_shared_layers=2,
                                             use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                                             vocab_size_per_layer_input=128, enable_moe_block=True, num_experts=4,
                                             top_k_experts=2, moe_intermediate_size=32,
                                             layer_types=["sliding_attention", "full_attention"] * 2)),
    # Gemma 3n: four AltUp streams, LAuReL of rank 8, the last two of five layers sharing layers 1's and 2's K and V
    # (layers 1 and 4 global, a window of 24), per-layer inputs of 8 from 128 rows
    "gemma3n_text": ("Gemma3nTextConfig", dict(num_hidden_layers=5, head_dim=16, sliding_window=24, laurel_rank=8,
                                               num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                                               vocab_size_per_layer_input=128, altup_num_inputs=4,
                                               layer_types=["sliding_attention", "full_attention",
                                                            "sliding_attention", "sliding_attention",
                                                            "full_attention"])),
    # Gemma 4's unified text model: no per-layer inputs or MoE; global heads of 32, biases, the last two layers
    # sharing K and V
    "gemma4_unified_text": ("Gemma4UnifiedTextConfig", dict(head_dim=16, global_head_dim=32, sliding_window=24,
                                                            num_kv_shared_layers=2, attention_bias=True,
                                                            layer_types=["sliding_attention", "full_attention"] * 2)),
    # Llama 3.2 Vision's text model, built under MllamaConfig: layer 1 of four a cross-attention layer, which text skips
    "mllama_text_model": ("MllamaConfig", dict(text_config=dict(BASE, cross_attention_layers=[1]))),
    # RWKV-4: a time mix of 48 and a channel mix of 96 in each of four layers
    "rwkv": ("RwkvConfig", dict(attention_hidden_size=48, context_length=128)),
    # RecurrentGemma: recurrent, recurrent, attention, recurrent (Griffin's blocks of 64 in 4 gate blocks, 4 taps; MQA
    # within a window of 24 in layer 2), a GeGLU MLP of 96 // 2
    "recurrent_gemma": ("RecurrentGemmaConfig", dict(attention_window_size=24, num_key_value_heads=1)),
    # DeepSeek-V4: a window of 8 in every layer; layers 1 and 3 compressed sparse attention (an entry per 4 tokens,
    # the indexer's top 4 of 2 heads of 16), layer 2 heavily compressed (an entry per 8); one KV head of 32 whatever
    # num_key_value_heads says; queries of rank 16; 2 output groups of 16; 2 hyper-connection streams
    "deepseek_v4": ("DeepseekV4Config", dict(MOE, head_dim=32, q_lora_rank=16, o_groups=2, o_lora_rank=16,
                                             n_routed_experts=4, index_n_heads=2, index_head_dim=16, index_topk=4,
                                             sliding_window=8, hc_mult=2, partial_rotary_factor=0.25,
                                             compress_rates={"compressed_sparse_attention": 4,
                                                             "heavily_compressed_attention": 8},
                                             layer_types=["sliding_attention", "compressed_sparse_attention",
                                                          "heavily_compressed_attention",
                                                          "compressed_sparse_attention"])),
    # HY V4: DeepSeek-V3.2's MLA and indexer (its own in layers 0 and 1, shared in 2 and 3), an output gate from its
    # own projection, sinks, layer 0 dense, 2 iHC streams
    "hy_v4": ("HYV4Config", dict(MOE | DSA, n_routed_experts=4, n_shared_experts=1, q_lora_rank=48, kv_lora_rank=32,
                                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, hc_mult=2)),
    # Zamba 2: Mamba-2 in each of four layers (8 heads of 16, 2 groups, a state of 16), a shared block first in layers
    # 1 and 3 (two blocks in turn, attention over 2·h with 4 heads of 32, adapters of rank 8 on the MLP and Q, K, V)
    "zamba2": ("Zamba2Config", dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=8,
                                    mamba_ngroups=2, mamba_d_state=16, chunk_size=16, num_mem_blocks=2,
                                    adapter_rank=8, use_shared_attention_adapter=True, num_key_value_heads=4)),
    # Zamba: Mamba in each of four layers (two heads of 64 channels, a state of 16), the one shared block first in
    # layers 1 and 3 (attention over 2·h with 4 heads of 32, no adapters)
    "zamba": ("ZambaConfig", dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=2,
                                  mamba_d_state=16, num_key_value_heads=4)),
    # Doge: its dynamic mask keeps each query's top 16 keys (fewer than the tests' 32 tokens), biases on attention
    "doge": ("DogeConfig", dict(keep_window_size=16, attention_bias=True)),
    # Phi-4-multimodal: Phi-3's layers, and inside the causal LM a tiny SigLIP image encoder and Conformer audio
    # encoder, counted apart (a text step runs neither)
    "phi4_multimodal": ("Phi4MultimodalConfig", dict(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                           image_size=28, patch_size=14),
        audio_config=dict(hidden_size=32, intermediate_size=48, num_blocks=2, num_attention_heads=2,
                          nemo_conv_channels=16, ext_pw_out_channel=32, depthwise_separable_out_channel=32,
                          bias_max_distance=16))),
    # Inkling: layer 0 local (a window of 16, one KV head), layer 1 global (two), each with its four branch
    # convolutions and relative logits (d_rel 16 over 16 and 32 distances); layer 0 dense, the rest MoE of 4
    # experts, top 2, and a shared expert the router scores too
    "inkling_text": ("InklingTextConfig", dict(head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=1,
                                               swa_head_dim=16, sliding_window_size=16, rel_extent=32,
                                               moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                               n_shared_experts=1, local_layer_ids=[0, 2],
                                               mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
    # Inkling 2: layers 0 and 2 local (a window of 16), 1 and 3 global (dynamic K and V convolutions), blocks of two
    # layers for the attention residuals, an MoE of 4 experts, top 2, in every layer; a head of 500 of the 512 rows
    "inkling2_text": ("Inkling2TextConfig", dict(unpadded_vocab_size=500, head_dim=16, swa_num_attention_heads=4,
                                                 swa_num_key_value_heads=2, swa_head_dim=16, sliding_window_size=16,
                                                 rel_extent=32, moe_intermediate_size=32, n_routed_experts=4,
                                                 num_experts_per_tok=2, n_layers_per_attn_res_block=2,
                                                 layer_types=["hybrid_sliding", "hybrid"] * 2)),
    # Inkling 2's looped text model: Inkling 2's tiny layers, six of them, blocks of two; layers 2 (local) and 3
    # (global) run in three passes, the later two reading the previous pass's messages through gates of rank 8
    "inkling2_loop_text": ("Inkling2LoopTextConfig", dict(
        unpadded_vocab_size=500, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
        sliding_window_size=16, rel_extent=32, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        n_layers_per_attn_res_block=2, num_hidden_layers=6, layer_types=["hybrid_sliding", "hybrid"] * 3,
        loop_layer_index_start=2, loop_layer_index_end=4, loop_num_passes=3, loop_gate_rank=8)),
    # dots.3 Note: layers 0 and 1 MLA of 4 heads with an indexer (top 8 of its 4 heads of 16), 2 and 3 sliding (a
    # window of 16) at MLA of their own widths (2 heads, ranks 32 and 24, d_nope 24); one dense layer, then an MoE of 4
    # experts, top 2, beside one shared MLP of 2 × 24
    "dots3_note_text": ("Dots3NoteTextConfig", dict(DEEPSEEK | DSA, head_dim=24, sliding_window=16, n_shared_experts=2,
                                                    shared_experts_intermediate_size=24, swa_num_attention_heads=2,
                                                    swa_num_key_value_heads=2, swa_q_lora_rank=32, swa_kv_lora_rank=24,
                                                    swa_head_dim=32, swa_qk_nope_head_dim=24, swa_v_head_dim=16)),
    # BLT: bytes (260) through a local encoder of two layers (a cross-attention after each: each patch's k = 2 queries
    # over its bytes), a global transformer of two layers at 96 over the patches (their 2 × 64 projected to 96), a
    # local decoder of two layers (a cross-attention before the first alone); windows of 16; two hash tables of 64 rows;
    # a frozen entropy model of one layer at 32 cutting the patches in the forward
    "blt": ("BltConfig", dict(vocab_size=260, encoder_hash_byte_group_vocab=64, encoder_hash_byte_group_size=[3, 4],
                              local_attention_window_len=16,
                              patcher_config=dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1,
                                                  intermediate_size=48, sliding_window=16),
                              encoder_config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                  num_hidden_layers=2, intermediate_size=96,
                                                  cross_attn_all_layers=True),
                              decoder_config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                  num_hidden_layers=2, intermediate_size=96, hidden_size_global=96,
                                                  cross_attn_all_layers=False),
                              global_config=dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=2,
                                                 num_hidden_layers=2, intermediate_size=128))),
    # ZAYA: CCA attention (4 heads and 2 KV heads of 16, convolutions of 2 taps each), every layer an MoE of 4
    # experts and a skip class behind an MLP router of 16, top 1
    "zaya": ("ZayaConfig", dict(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=1,
                                router_hidden_size=16)),
    # CPM-Ant: 8 prompt tokens before every sequence (4 prompts' rows), 4 segments, 32 position buckets
    "cpmant": ("CpmAntConfig", dict(dim_head=16, dim_ff=96, prompt_length=8, prompt_types=4, segment_types=4,
                                    position_bias_num_buckets=32)),
    # GIT: the text decoder (post-norm BERT layers, dropout 0.1 by default) and a tiny CLIP image encoder, apart
    "git": ("GitConfig", dict(vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                 num_attention_heads=2, image_size=32, patch_size=8))),
    # xLSTM: mLSTM in every layer, 4 heads (queries and keys 64 wide, values 128), chunks of 16 over the 32 tokens
    "xlstm": ("xLSTMConfig", dict(hidden_size=128, num_heads=4, chunk_size=16)),
    # Dory: layer 0 in, layers 1 and 2 looped three times, layer 3 out (the one full layer); windows of 16
    "dory": ("DoryConfig", dict(head_dim=16, sliding_window=16, n_input_layers=1, n_output_layers=1,
                                n_recurrent_loops=3)),
    # HRM: stacks of two layers; two high-level cycles, each running the low stack twice, the first run without
    # gradients (L_bp_cycles [1], padded to [1, 1]); every head its own K and V
    "hrm_text": ("HrmTextConfig", dict(head_dim=16, num_hidden_layers=2, H_cycles=2, L_cycles=2, L_bp_cycles=[1])),
    # types whose causal-LM class is another type's (lmcalc.hf_defaults.BUILDS_AS)
    "exaone": ("ExaoneConfig", {}),
    "internlm3": ("InternLM3Config", dict(qkv_bias=True, bias=True)),
    "iquestcoder": ("IQuestCoderConfig", {}),
    "sarvam_mla": ("SarvamMLAConfig", dict(DEEPSEEK, n_group=2, topk_group=1)),
    "sarvam_moe": ("SarvamMoEConfig", dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1,
                                           head_dim=24)),
}  # fmt: skip
"""model_type: (transformers config class, the fields that differ from ``BASE``)."""
VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=32,
              patch_size=8)  # fmt: skip
SAM = dict(hidden_size=32, output_channels=16, num_hidden_layers=4, num_attention_heads=4, image_size=64, patch_size=16,
           window_size=2, global_attn_indexes=[1, 3], mlp_dim=48)  # fmt: skip
"""A tiny GOT-OCR 2.0 image encoder: a 4 × 4 patch grid, windows of 2 in layers 0 and 2, global attention in 1 and 3."""

MULTIMODAL: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gemma3": ("Gemma3Config", "gemma3_text", dict(mm_tokens_per_image=4, vision_config=VISION)),
    "gemma3-no-head": ("Gemma3Config", "gemma3_text",
                       dict(mm_tokens_per_image=4, vision_config=VISION | dict(vision_use_head=False))),
    "fuyu": ("FuyuConfig", "persimmon", dict(patch_size=6, num_channels=3)),  # one linear layer of 6·6·3 pixels
    "got_ocr2": ("GotOcr2Config", "qwen2", dict(vision_config=SAM)),  # SAM's encoder and GOT's projector
    "got_ocr2-plain": ("GotOcr2Config", "qwen2", dict(vision_config=SAM | dict(qkv_bias=False, use_abs_pos=False,
                                                                                use_rel_pos=False))),
}  # fmt: skip
"""Multimodal configs: (config class, the text model's type in TINY, the wrapper's fields besides text_config)."""


def multimodal_config(kind: str) -> dict[str, Any]:
    """``kind``'s tiny multimodal config as config.json holds it: a TINY text model under ``text_config``."""
    import transformers

    class_name, text_kind, extra = MULTIMODAL[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, class_name)(text_config=tiny_config(text_kind), **extra).to_dict()


def multimodal_model(config: dict[str, Any]):  # noqa: ANN201 (a transformers model)
    """The image-text model transformers builds from a multimodal ``config`` on the meta device."""
    return transformers_model(config, "AutoModelForImageTextToText")


def tiny_config(kind: str) -> dict[str, Any]:
    """``kind``'s tiny config as config.json holds it (transformers' ``to_dict``)."""
    import transformers

    class_name, extra = TINY[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, class_name)(**{**BASE, **extra}).to_dict()


def transformers_model(config: dict[str, Any], auto: str = "AutoModelForCausalLM"):  # noqa: ANN201 (a model)
    """The model transformers builds from ``config`` on the meta device (a causal LM unless ``auto`` names another
    Auto class): no weights are allocated."""
    import torch
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = transformers.AutoConfig.for_model(**config)
        with torch.device("meta"):
            return getattr(transformers, auto).from_config(built)


def cached_state_bytes(kind: str, layers: list[int], batch: int = 2, tokens: int = 7) -> int:
    """The bytes transformers' cache holds for ``layers`` of ``kind``'s tiny model (bf16) after a prefill of ``batch``
    sequences of ``tokens``: each layer's convolution state and recurrent (or SSM) state (LFM2's convolutions keep
    none)."""
    import torch
    import transformers

    config = tiny_config(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.zeros(batch, tokens, dtype=torch.long), use_cache=True).past_key_values
    states = [t for i in layers for t in (cache.get_conv_state(i), cache.get_recurrent_state(i))]
    return sum(t.numel() * t.element_size() for t in states if t is not None)


def kv_cache_bytes(kind: str, seq: int) -> int:
    """The bytes transformers' cache holds after a prompt of ``seq`` tokens to ``kind``'s tiny model (fp32), its token
    ids within a per-layer embedding table of 128 rows (Gemma 3n's and 4's)."""
    import torch
    import transformers

    config = tiny_config(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
        with torch.no_grad():
            cache = model(torch.randint(3, 120, (1, seq)), use_cache=True).past_key_values
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def prefill_cache_bytes(config: dict[str, Any], batch: int = 2, tokens: int = 7, **inputs: Any) -> int:
    """Every floating-point byte transformers' cache holds after a bf16 prefill of ``batch`` sequences of ``tokens``
    (ids from 1) to the model ``config`` builds on the CPU, ``inputs`` beside them (GIT's image): K and V, and the
    convolution, recurrent or matrix-memory states its layers keep, each tensor once."""
    import torch
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    with torch.no_grad():
        ids = torch.randint(1, config["vocab_size"], (batch, tokens))
        cache = model.bfloat16().eval()(input_ids=ids, use_cache=True, **inputs).cache
    found: dict[int, Any] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found[id(value)] = value
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    for layer in getattr(cache, "layers", None) or [cache.rnn_state]:  # xLSTMCache keeps one dict of states
        walk(layer if isinstance(layer, dict) else vars(layer))
    return sum(t.numel() * t.element_size() for t in found.values())


def check_counted_alone(directory: Any, config: dict[str, Any], total: int, refusal: str) -> None:
    """``config`` written to ``directory``: lmcalc params counts ``total``, flops and the serving memory run, and
    training memory, fine-tuning (LoRA) and the planner are refused in one line matching ``refusal`` (a type counted
    for those alone)."""
    import json

    import pytest

    from lmcalc import api
    from lmcalc.errors import LmcalcError

    path = directory / "config.json"
    path.write_text(json.dumps(config))
    assert api.params(model=str(path)).total == total
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
    for estimate, more in ((api.memory, {}), (api.memory, {"method": "lora"}), (api.plan, {"gpus": "8xH100"})):
        with pytest.raises(LmcalcError, match=refusal):
            estimate(model=str(path), **more)
