"""RecurrentGemma (Griffin's recurrent blocks beside local MQA): its parameters, FLOPs and state by hand against the
shapes of transformers 5.24's modeling_recurrent_gemma.py (RecurrentGemmaRecurrentBlock, RecurrentGemmaRglru,
RecurrentGemmaAttention, RecurrentGemmaMlp), and its state and cache against what transformers keeps. transformers'
own counts and FLOPs are tests/test_hf_types.py's and test_validate_hf.py's (tests/hf_tiny.py). What a recurrent block
keeps for backward by hand here; against what transformers' PyTorch scan keeps, tests/test_framework_transformers.py
(recurrent-gemma-small: the bytes saved), tests/test_step_phases.py (its step's peak, and recurrent-gemma-wide's) and
tests/test_finetune_activations.py (under PEFT's LoRA)."""

from __future__ import annotations

import pytest

from lmcalc import api
from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.recurrent import rglru_saved
from lmcalc.engine.model.flops import forward_flops_per_token, local_keys
from lmcalc.engine.model.params import count_params
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

V, h, H, H_KV, f, L, w, K, W = 512, 64, 4, 1, 96, 4, 64, 4, 24
CONFIG = {"model_type": "recurrent_gemma", "vocab_size": V, "hidden_size": h, "num_attention_heads": H,
          "num_key_value_heads": H_KV, "intermediate_size": f, "num_hidden_layers": L, "lru_width": w,
          "conv1d_width": K, "attention_window_size": W}  # fmt: skip
"""Layers 0, 1 and 3 recurrent, layer 2 attending (block_types' default: recurrent, recurrent, attention)."""


def spec_of(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config({**CONFIG, **fields}, "recurrent_gemma", "config"))


def test_parameters_by_hand():
    # a recurrent block: linear_y and linear_x (h → w, biases), the depthwise convolution (w·K and a bias of w), the
    # RG-LRU's decay (w) and two block-diagonal gates (H blocks of (w/H)², biases of w), linear_out (w → h, a bias);
    # an attention block: q (h → H·d), k and v (h → H_kv·d), o (H·d → h) with a bias alone; every layer a GeGLU MLP
    # of f/2 with biases and two RMSNorms; the embedding tied, and a final norm
    d, m, bw = h // H, f // 2, w // H
    recurrent = 2 * (h * w + w) + (w * K + w) + w + 2 * (H * bw * bw + w) + (w * h + h)
    attention = h * H * d + 2 * h * H_KV * d + H * d * h + h
    layer = 3 * h * m + 2 * m + h + 2 * h
    assert count_params(spec_of()).total == V * h + 3 * recurrent + attention + L * layer + h


def test_flops_by_hand():
    # per token: the matmul weights (the gates as block-diagonal products), the recurrent blocks' convolution
    # (2·w·K each), the attention layer's window of keys (causal) at H heads of d, and the head
    s, d, m, bw = 64, h // H, f // 2, w // H
    matmuls = 3 * (3 * h * w + 2 * H * bw * bw) + (h * H * d + 2 * h * H_KV * d + H * d * h) + L * 3 * h * m
    k_w = local_keys(s, W, "sliding")
    expected = 2 * matmuls + 3 * 2 * w * K + 2 * 2 * H * k_w * d + 2 * h * V
    assert forward_flops_per_token(spec_of(), s).total == pytest.approx(expected, rel=1e-12)


def test_state_and_cache_by_hand():
    # a recurrent layer: the convolution's last K − 1 inputs (w, at the cache's bytes) and the RG-LRU's state (w, fp32);
    # the attention layer: K and V of one head of d for the last W tokens
    d = h // H
    memory = inference_memory(Serving(spec_of(), context=1000, batch=2), 80e9)
    assert memory.kv_cache == 2 * (3 * w * ((K - 1) * 2 + 4) + W * 2 * H_KV * d * 2)


@pytest.mark.torch
def test_state_and_cache_are_what_transformers_keeps():
    """The recurrent blocks keep their states on the modules, the attention layer its window in the cache (the last
    W − 1 tokens between steps: lmcalc counts the W the next token attends to)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    from hf_tiny import tiny_config

    config = tiny_config("recurrent_gemma")
    spec = ModelSpec.model_validate(model_from_hf_config(config, "recurrent_gemma", "tiny"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model.to(torch.bfloat16).eval()(torch.randint(3, V, (1, 50)), use_cache=True, cache=cache)
    blocks = [layer.temporal_block for layer in model.model.layers if hasattr(layer.temporal_block, "rg_lru")]
    kept = [t for b in blocks for t in (b.conv1d_state, b.rg_lru.recurrent_states)]
    kept += [
        t
        for layer in cache.layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if t is not None
    ]
    memory = inference_memory(Serving(spec, context=50), 80e9)
    one_token = 2 * spec.kv_heads * spec.head_size * 2
    assert memory.kv_cache == sum(t.numel() * t.element_size() for t in kept) + one_token


def workload(seq: int, batch: int) -> Workload:
    return Workload(spec_of(), resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, seq, batch,
                    "flash", "none", framework=framework_profile("transformers"))  # fmt: skip


@pytest.mark.parametrize(("seq", "batch"), [(128, 1), (128, 2)])
def test_a_recurrent_blocks_saved_tensors_by_hand(seq, batch):
    # RecurrentGemmaRecurrentBlock as PyTorch runs it, in bf16 (2 B), w = 64, K = 4: the y branch keeps linear_y's
    # output (GeLU's input) and GeLU's output; the x branch linear_x's output (the convolution's input) and the
    # convolution's output, s + K − 1 = 131 positions a sequence; the RG-LRU its two sigmoid gates, −8·r, a, a²,
    # 1 − a², the gated input and the multiplier (8 tensors); the scan's output and linear_out's input: 13 tensors of
    # s·b·w, and with two sequences a 14th, the gates' input regrouped into heads (a copy once b and s merge). The
    # scan, a loop over the 128 tokens, keeps each step's a_t in fp32 and the state before it: 2·s·b·w · 4 B.
    sbw = seq * batch * w
    tensors = 13 + (batch > 1)
    expected = tensors * sbw * 2 + batch * (seq + K - 1) * w * 2 + 2 * sbw * 4
    assert sum(t.bytes for t in rglru_saved(workload(seq, batch))) == expected
    assert expected == {1: 212_992 + 16_768 + 65_536, 2: 458_752 + 33_536 + 131_072}[batch]


def test_the_recurrent_layer_keeps_its_norms_block_and_mlp():
    # one recurrent layer (mixer kind "other"): the attention norm (an fp32 copy, 1/rms and the normalised value in
    # fp32, then the bf16 output both branches read), the block, and the GeGLU MLP of f/2 = 48 behind its own norm
    w_ = workload(128, 2)
    sb, m = 256, f // 2
    norm = sb * h * 4 + sb * 4 + sb * h * 4  # fp32 copy, 1/rms, normalised value (Gemma's 1 + w in fp32)
    mlp = norm + sb * h * 2 + 4 * sb * m * 2  # its input, gate output, up output, GeLU(gate), the product
    block = sum(t.bytes for t in rglru_saved(w_))
    assert sum(t.bytes for t in layer_saved_tensors(w_, False, "other")) == norm + sb * h * 2 + block + mlp


def test_training_memory_fine_tuning_and_the_planner_take_it(tmp_path):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    full = api.memory(model=str(path), gpus="1xh100", seq=128, micro_batch=2)
    lora = api.memory(model=str(path), gpus="1xh100", seq=128, micro_batch=2, method="lora")
    assert 0 < lora.gpu.kept.optimizer < full.gpu.kept.optimizer and lora.gpu.activations > 0  # the adapters alone
    assert api.plan(model=str(path), gpus="8xh100", seq=128, global_batch=8192, tokens=1e9).best is not None


@pytest.mark.parametrize(
    ("degree", "message"),
    [({"tp": 2}, "TP=2 would split .* recurrent blocks"), ({"cp": 2}, "CP=2 splits the sequence")],
)
def test_layouts_that_split_the_recurrence_are_refused_in_one_line(tmp_path, degree, message):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    with pytest.raises(LmcalcError, match=message) as refused:
        api.memory(model=str(path), gpus="2xh100", seq=128, **degree)
    assert "\n" not in str(refused.value)
