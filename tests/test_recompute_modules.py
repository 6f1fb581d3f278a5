"""Megatron-Core's selective recomputation by module: ``--recompute selective --recompute-modules``.

Each count is derived here by hand from Megatron-LM d98e8a64 and the megatron profile's tensors (docs/formulas.md
§5.5): megatron/core/transformer/transformer_layer.py checkpoints a dense layer's MLP whole (``recompute_mlp``:
``tensor_parallel.checkpoint(self.mlp, ..., pre_mlp_layernorm_output)``; with the Transformer Engine spec the norm is
fused into linear_fc1 and ``pre_mlp_layernorm`` is an IdentityOp, so the checkpoint's input is the residual stream),
and wraps separate norms in ``CheckpointWithoutOutput`` (``recompute_input_layernorm``/``recompute_pre_mlp_layernorm``,
skipped for an IdentityOp); moe/moe_layer.py checkpoints the MoE layer after its norm (``moe``) and the shared experts
(``shared_experts``); moe/experts.py discards the grouped experts' activation output (``moe_act``);
multi_latent_attention.py the up-projected Q, K and V (``mla_up_proj``).
"""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.activations import layer_kept_tensors
from lmcalc.engine.memory.gpu_memory import stage_activations
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.op_policy import selective_redone
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

MEGATRON = framework_profile("megatron")
S = 8192


def workload(model: str, *modules: str) -> Workload:
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    return Workload(resolve_model(model).spec, bf16, adamw, S, 1, "flash", "selective", framework=MEGATRON,
                    recompute_modules=modules or ("core_attn",))  # fmt: skip


def per_token(model: str, moe_layer: bool, *modules: str) -> float:
    return sum(t.bytes for t in layer_kept_tensors(workload(model, *modules), moe_layer)) / S


# Llama 3.1 8B under the megatron profile, bytes a token of one layer, h 4096, H·d 4096, H_kv·d 1024, f 14336:
# attention half: norm input 2h + 1/rms 4 + QKV input 2h + Q twice 2·2·4096 + K twice 2·2·1024 + V 2·1024 + output
# 2·4096 = 47,108 (the log-sum-exp, 4·32, is the core's); MLP half: norm input 2h + 1/rms 4 + MLP input 2h + the
# fused SwiGLU's [gate ‖ up] 2·2f + the product 2f = 102,404
LLAMA_ATTENTION, LLAMA_MLP = 47_108, 102_404


def test_core_attention_is_the_default():
    assert per_token("llama-3.1-8b", False) == LLAMA_ATTENTION + LLAMA_MLP
    assert per_token("llama-3.1-8b", False, "core_attn") == LLAMA_ATTENTION + LLAMA_MLP


def test_mlp_keeps_only_its_checkpoint_input():
    # the MLP half becomes the residual stream, 2h; with core_attn off the log-sum-exp stays
    assert per_token("llama-3.1-8b", False, "core_attn", "mlp") == LLAMA_ATTENTION + 2 * 4096
    assert per_token("llama-3.1-8b", False, "mlp") == LLAMA_ATTENTION + 4 * 32 + 2 * 4096


def test_the_rebuilt_mlp_half_lives_in_its_backward():
    # the MLP's tensors less its input, which the rebuilt norm saves again as the same storage: 102,404 − 2h a token
    held = stage_activations(workload("llama-3.1-8b", "core_attn", "mlp"), Layout(), 0)
    assert held.rebuilt == (LLAMA_MLP - 2 * 4096) * S
    assert stage_activations(workload("llama-3.1-8b"), Layout(), 0).rebuilt == 0


def test_fused_norms_have_no_separate_output_to_drop():
    # Transformer Engine fuses a dense layer's norms into the next linear: layernorm changes nothing there
    assert per_token("llama-3.1-8b", False, "core_attn", "layernorm") == LLAMA_ATTENTION + LLAMA_MLP


# Mixtral 8x7B, an MoE layer's MLP half (k 2, E 8, f_e 14336): norm input 2h + 1/rms 4 + router input 2h + the fused
# router's and permutation's 17 bytes a score (a bool routing map, the top-k's and the aux loss's fp32 intermediates,
# TE's int32 row map of 2E + 1 columns) 17E + 4 + 10 bytes a routed row (its bf16 weight, two int32 chunk-sort rows)
# 10k + gathered tokens 2kh + gate, up, product 3·2k·f_e = 8,192 + 4 + 8,192 + 136 + 4 + 20 + 16,384 + 172,032 =
# 204,964; no expert output, weighted or not: Megatron-Core weighs them inside the fused SwiGLU (experts.py
# TEGroupedMLP, weighted_bias_swiglu_impl) and unpermutes them keeping only indices
MIXTRAL_MOE = 204_964


def test_moe_modules():
    base = per_token("mixtral-8x7b", True)
    attention = base - MIXTRAL_MOE
    # moe: the layer after its norm, checkpointed: the norm's input, 1/rms and output stay, 2h + 4 + 2h
    assert per_token("mixtral-8x7b", True, "core_attn", "moe") == attention + 8_192 + 4 + 8_192
    # moe_act: the routed product, 2·k·f_e, discarded
    assert per_token("mixtral-8x7b", True, "core_attn", "moe_act") == base - 2 * 2 * 14_336
    # layernorm: the MoE layer's norm is its own module: its output, 2h, discarded (the attention norm is fused)
    assert per_token("mixtral-8x7b", True, "core_attn", "layernorm") == base - 8_192


def test_moe_act_discards_a_squared_relus_square_too():
    # Nemotron 3 Super's routed experts (k 22, f_e 2688, squared ReLU): experts.py discards the activation's output
    # whatever activation_func is, so the square, FC2's input, 2·k·f_e a token, goes; the checkpoint keeps its input,
    # the first linear's output, which stands where the ReLU's own output did (the same k·f_e in bf16)
    base = per_token("nemotron-3-super-120b-a12b", True)
    assert per_token("nemotron-3-super-120b-a12b", True, "core_attn", "moe_act") == base - 2 * 22 * 2688


def test_shared_experts_and_mla():
    # DeepSeek-V3's MoE layer: the shared expert's gate, up and product (3 · 2 · 2048 a token) go with
    # shared_experts, and only those: the routed experts' tensors of the same names stay
    base = per_token("deepseek-v3", True)
    assert per_token("deepseek-v3", True, "core_attn", "shared_experts") == base - 3 * 2 * 2048
    # mla_up_proj: the up-projected Q and K (2·128·192 each) and V (2·128·128)
    assert per_token("deepseek-v3", True, "core_attn", "mla_up_proj") == base - 2 * 2 * 128 * 192 - 2 * 128 * 128
    # layernorm: MLA's input norm is its own module (no fused down projection): its output, 2h, goes too
    assert per_token("deepseek-v3", True, "core_attn", "layernorm") == base - 2 * 7168 - 2 * 7168


def test_recomputed_modules_redo_their_forward_matmuls():
    # Llama 3.1 8B: mlp redoes the MLP's three GEMMs, 2·3·h·f FLOPs a token a layer, beside the attention core
    spec = resolve_model("llama-3.1-8b").spec
    core = fl.step_flops(spec, S, "selective").recomputed
    redone = selective_redone(spec, MEGATRON.recompute, ("core_attn", "mlp"))
    assert fl.step_flops(spec, S, "selective", redone=redone).recomputed == pytest.approx(
        core + 32 * 2 * 3 * 4096 * 14336, rel=1e-12
    )
    without_core = selective_redone(spec, MEGATRON.recompute, ("mlp",))
    assert fl.step_flops(spec, S, "selective", redone=without_core).recomputed == pytest.approx(
        32 * 2 * 3 * 4096 * 14336, rel=1e-12
    )


def test_a_module_name_is_checked():
    with pytest.raises(LmcalcError, match="recompute_modules"):
        workload("llama-3.1-8b", "attention")


def test_the_flag(lmcalc_run):
    base = ["memory", "-m", "llama-3.1-8b", "--framework", "megatron", "--seq", "8192", "--json"]
    run = lmcalc_run([*base, "--recompute", "selective", "--recompute-modules", "core_attn,mlp"])
    assert run.code == 0
    assert run.json["results"]["activations"]["dense_layer"]["value"] == (LLAMA_ATTENTION + 2 * 4096) * S
    assert run.json["inputs"]["recompute"]["value"] == "selective: core_attn, mlp"
    run = lmcalc_run([*base, "--recompute-modules", "mlp"])
    assert run.code == 2 and "needs --recompute selective (got none)" in run.err
    run = lmcalc_run([*base, "--recompute", "selective", "--recompute-modules", "mpl"])
    assert run.code == 2 and "did you mean mlp?" in run.err
    titan = ["memory", "-m", "llama-3.1-8b", "--framework", "torchtitan", "--recompute", "selective"]
    run = lmcalc_run([*titan, "--recompute-modules", "mlp"])
    assert run.code == 2 and "every second matmul" in run.err and "Traceback" not in run.err
