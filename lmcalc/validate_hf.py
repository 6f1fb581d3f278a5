"""``lmcalc validate --against transformers``: lmcalc's figures beside the model Hugging Face transformers builds
from the same config.json.

1. Parameters: ``sum(p.numel() for p in model.parameters())`` of the ``AutoModelForCausalLM`` that transformers
   builds on the meta device vs ``count_params(spec).total`` (and a vision tower's, counted apart, where the causal
   LM builds one: GIT's). Tolerance: none, the count is exact.
2. FLOPs of one training step, forward and backward of the causal-LM loss on micro-batch × seq tokens, counted by
   ``torch.utils.flop_counter.FlopCounterMode`` vs ``step_flops(spec, seq, convention="full").model`` × tokens.
   The counter counts matmuls only (mm, addmm, bmm, grouped mm, attention), every query against every key
   whatever the causal mask or sliding window, hence lmcalc's full convention. Tolerance: 0.1 %.

The spec is what lmcalc reads from the same dict (``hf_config.model_from_hf_config``). On the meta device tensors
have shapes but no values, and four things in transformers need values; each is worked around for the count:

- **Tied weights.** Every meta storage has ``data_ptr`` 0, so deduplicating by storage would merge all
  parameters into one. They are counted by identity: ``parameters()`` yields a tied weight, one Parameter
  object, once.
- **Attention.** On meta, ``scaled_dot_product_attention`` runs its math path (``bmm`` and element-wise
  operators); on a GPU it runs a fused kernel, which torch's own formula counts with the backward's
  recomputation of QKᵀ. So that the count does not depend on the path, the call is routed during the count to
  one custom operator, ``lmcalc::attention``, counted as one fused kernel: 2·b·H·s_q·s_k·(d_qk + d_v) forward
  (QKᵀ and P·V) and twice that backward (each product's gradient with respect to both operands). The
  recomputation is hardware FLOPs, not model FLOPs, as lmcalc's recomputation is.
- **MoE experts.** The eager expert loop calls ``nonzero()``, which needs values. The model runs transformers'
  ``grouped_mm`` experts (one ``aten._grouped_mm`` per projection, routing by offsets that stay on the device),
  whose meta kernel takes bf16 only: the model is cast to bf16, which changes no count. torch 2.13 has no FLOP
  formula for ``_grouped_mm``; ``grouped_mm_flops`` is registered for it: 2·M·K·N summed over the groups,
  where on meta the groups' sizes are unknown but their total is the input's row count.
- **Masks.** With an explicit 2-D ``attention_mask`` the SDPA mask code asks whether it is all ones
  (``Tensor.item()``, impossible on meta). Without one, masks are built from shapes alone, but two probes read
  values: the mask code looks for packed sequences in the position ids (in a step without a KV cache, i.e.
  training), and GPT-2 and others look for padding in the token ids (to warn). No mask is passed, and during
  the count both probes answer "none": one unpadded, unpacked sequence per row, which is what is counted.

GIT's step reads an image (its loss skips the image's positions): a blank one of its vision config's size is
passed. A model whose step cannot run in bf16 (xLSTM's kernels) is counted again in fp32.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmcalc import hub
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params, weight_tensors
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import positive_int, seq_given
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import load_spec_file
from lmcalc.presets import validate as validate_spec
from lmcalc.result import Input, Result
from lmcalc.specs import ModelSpec
from lmcalc.validate import FLOP_TOLERANCE, PARAM_TOLERANCE, _compare, check_meta_sizes

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

NEEDS_TRANSFORMERS = "validate --against transformers needs transformers: pip install transformers"
NEEDS_CONFIG = (
    "--against transformers needs a config.json model (a file, a model directory or a Hub id), not {model!r}: a "
    "preset has no config.json behind it"
)
LEFT_OUT = ("quantization_config",)
"""config.json fields left out when transformers builds the model: a quantised checkpoint's layout (FP8 blocks and
their scales) is not the architecture lmcalc counts."""


def attention_flops(query: Sequence[int], key: Sequence[int], value: Sequence[int]) -> int:
    """Forward FLOPs of one fused attention call, every query against every key: QKᵀ, 2·b·H·s_q·s_k·d_qk, and
    P·V, 2·b·H·s_q·s_k·d_v. H is the query's heads: GQA's fewer K/V heads are broadcast, not computed."""
    batch, heads, s_q, d_qk = query
    return 2 * batch * heads * s_q * key[-2] * (d_qk + value[-1])


def grouped_mm_flops(a: Sequence[int], b: Sequence[int], out: Sequence[int]) -> int:
    """FLOPs of ``torch._grouped_mm``: 2·M·K·N summed over the groups. The output holds every group's M·N (2-D by
    3-D: the routed rows by each expert's weight; 3-D operands: one group each), times the contraction K; when
    both operands are 2-D (a weight's gradient) K is split over the G groups of the (G, M, N) output."""
    groups = out[0] if len(a) == len(b) == 2 else 1
    return 2 * math.prod(out) * a[-1] // groups


def convolution_backward_flops(
    grad_out_shape: Sequence[int],
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *args: Any,
    out_shape: Any = None,
    **_: Any,
) -> int:
    """A convolution's backward: the input's and the weight's gradients, each as many FLOPs as the forward. torch's
    own formula recasts the weight's gradient as a convolution over the batch and loses the groups, so a depthwise
    convolution (Mamba's, groups = channels) is over-counted by its channel count (129× the forward for 128)."""
    from torch.utils.flop_counter import conv_flop_count

    transposed, output_mask = args[4], args[7]
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


@functools.cache
def _register_counting_ops() -> None:
    """Once per process: the fused-attention operator that stands in for SDPA on meta, and the FLOP formulas."""
    import torch
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    def forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return query.new_empty(*query.shape[:-1], value.shape[-1])

    def backward_op(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple:
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

    attention = torch.library.custom_op(
        "lmcalc::attention",
        forward,
        mutates_args=(),
        device_types="meta",
        schema="(Tensor q, Tensor k, Tensor v) -> Tensor",
    )
    torch.library.custom_op(
        "lmcalc::attention_backward",
        backward_op,
        mutates_args=(),
        device_types="meta",
        schema="(Tensor grad, Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor, Tensor)",
    )
    attention.register_autograd(
        lambda ctx, grad: torch.ops.lmcalc.attention_backward(grad, *ctx.saved_tensors),
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs),
    )
    register_flop_formula(torch.ops.lmcalc.attention)(lambda q, k, v, out_shape=None, **_: attention_flops(q, k, v))
    register_flop_formula(torch.ops.lmcalc.attention_backward)(
        lambda grad, q, k, v, out_shape=None, **_: fl.BACKWARD_TO_FORWARD * attention_flops(q, k, v)
    )
    grouped_mm = getattr(torch.ops.aten, "_grouped_mm", None)  # torch 2.8 and later: transformers' grouped experts
    if grouped_mm is not None and grouped_mm not in flop_registry:  # a later torch may count it itself
        register_flop_formula(grouped_mm)(lambda a, b, *args, out_shape=None, **_: grouped_mm_flops(a, b, out_shape))


def _fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """``scaled_dot_product_attention``'s stand-in during the count: the mask, dropout, causality, scale and GQA
    flag change no matmul of a fused kernel."""
    import torch

    return torch.ops.lmcalc.attention(query, key, value)


@contextlib.contextmanager
def _on_meta() -> Iterator[None]:
    """transformers quiet; SDPA counted as one fused kernel; the two probes of the token ids and positions that a
    step without an attention mask runs (for padding, for packed sequences) answered "none" without values, and the
    probe of a padding mask a model makes itself of ones (BioGPT, for its positions) answered "no padding"."""
    from unittest import mock

    import torch
    import transformers
    from transformers import masking_utils

    _register_counting_ops()
    stand_ins = (
        (torch.nn.functional, "scaled_dot_product_attention", _fused_attention),
        (transformers.PreTrainedModel, "warn_if_padding_and_no_attention_mask", lambda *_: None),
        (masking_utils, "find_packed_sequence_indices", lambda *_: None),
        (masking_utils, "fast_all", lambda t, _all=masking_utils.fast_all: True if t.is_meta else _all(t)),
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.callback(transformers.logging.set_verbosity, transformers.logging.get_verbosity())
        transformers.logging.set_verbosity_error()
        for owner, name, stand_in in stand_ins:
            stack.enter_context(mock.patch.object(owner, name, stand_in))
        yield


def build_model(config: dict[str, Any]) -> PreTrainedModel:
    """The causal LM transformers builds from ``config`` on the meta device."""
    import torch
    import transformers

    fields = {key: value for key, value in config.items() if key not in LEFT_OUT}
    with _on_meta(), torch.device("meta"):
        try:
            built = transformers.AutoConfig.for_model(**fields)
            return transformers.AutoModelForCausalLM.from_config(built)
        except (ValueError, KeyError, TypeError) as error:
            raise LmcalcError(
                f"transformers {transformers.__version__} cannot build a causal LM from this config.json: "
                + _first_line(error)
            ) from None


def training_step_flops(model: PreTrainedModel, seq_len: int, micro_batch: int) -> int:
    """FlopCounterMode's count of one forward and backward pass of the causal-LM loss on the meta device. The
    model is cast to bf16 in place, and its experts (where transformers lets them be chosen) set to grouped_mm; a
    model whose step cannot run in bf16 (xLSTM's native kernels mix fp32 gates with bf16 values) is counted in fp32,
    the same matmuls."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if type(model)._can_set_experts_implementation() and model.config._experts_implementation != "grouped_mm":
        model.set_experts_implementation("grouped_mm")
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    corrected = {torch.ops.aten.convolution_backward: convolution_backward_flops}
    errors: list[Exception] = []
    for cast in (model.bfloat16, model.float):
        cast().train()
        with _on_meta(), FlopCounterMode(display=False, custom_mapping=corrected) as counter:
            try:
                model(input_ids=tokens, labels=tokens, use_cache=False, **_images(model, micro_batch)).loss.backward()
            except (RuntimeError, NotImplementedError) as error:
                errors.append(error)
                continue
        return counter.get_total_flops()
    name = type(model).__name__
    raise LmcalcError(f"transformers' {name} did not run on the meta device: {_first_line(errors[0])}") from None


def torch_path_flops(spec: ModelSpec, seq_len: int, micro_batch: int) -> float:
    """What transformers' PyTorch paths for a hybrid's mixers (run where fla or mamba_ssm is not installed) count in
    one step beyond three times the forward lmcalc counts, per such layer. Both convolve s + K − 1 positions (forward,
    input and weight gradients: 3 · 2·b·c_d·K·(K − 1) more). Gated DeltaNet's ``torch_chunk_gated_delta_rule``
    (chunks of C = 64) also runs ``solve_triangular``'s backward, two matmuls against the C × C system,
    2·b·H_v·s'·C·(d_k + d_v), and saves the state the first chunk reads as zeros and the last chunk's update, which
    nothing reads, 8·b·H_v·C·d_k·d_v. Kimi Delta Attention's ``chunk_kimi_delta_attention`` saves the same and
    runs no solve; with d_k = d_v its matmuls count what lmcalc's forward counts (its K·βKᵀ and QKᵀ are
    element-wise products the counter does not see, its two products by the solved system matmuls it does).
    Mamba's scan (c_d = d_in), Mamba-2's chunked scan and LFM2's short convolution (c_d = h) do nothing more.
    MiniMax's blockwise lightning attention does less: the first block's product with the zero initial state
    computes one gradient, not two (2·b·H·n₁·d² fewer), and the last block's update of the state, which nothing
    reads, none (4·b·H·n_last·d² fewer)."""
    channels_kernel = None
    if spec.mamba:  # Mamba's slow path (Jamba, Mamba, Falcon Mamba): nn.Conv1d padded by K − 1, then cut to s
        channels_kernel = spec.mamba.d_inner, spec.mamba.d_conv
    if spec.mamba2:  # Mamba-2's PyTorch scan: its convolution's padding alone (Dao & Gu's chunked form otherwise)
        channels_kernel = spec.mamba2.conv_channels, spec.mamba2.conv_kernel
    if spec.short_conv:  # Lfm2ShortConv's causal_conv1d_fn: F.conv1d padded by K − 1, then cut to s
        channels_kernel = spec.hidden_size, spec.short_conv.conv_kernel
    if spec.rglru:  # RecurrentGemmaRecurrentBlock's nn.Conv1d, padded by K − 1, then cut to s
        channels_kernel = spec.rglru.width, spec.rglru.conv_kernel
    if channels_kernel:
        channels, kernel = channels_kernel
        conv = 3 * 2 * micro_batch * channels * kernel * (kernel - 1)
        return spec.other_mixer_layers * conv
    if spec.lightning:  # the first block reads the zero state, which needs no gradient; the last block's update
        # of the state feeds nothing the loss reads, so its backward never runs
        m = spec.lightning
        first, last = min(m.block, seq_len), seq_len - m.block * ((seq_len - 1) // m.block)
        unrun = 2 * micro_batch * m.heads * m.head_dim**2 * (first + 2 * last)
        return -spec.other_mixer_layers * unrun
    g = spec.deltanet
    if g is None:
        return 0.0
    padded = g.chunk * -(-seq_len // g.chunk)
    conv = 3 * 2 * micro_batch * g.conv_channels * g.conv_kernel * (g.conv_kernel - 1)
    solve = 2 * micro_batch * g.value_heads * padded * g.chunk * (g.key_head_dim + g.value_head_dim)
    if g.channel_decay:  # KDA's chunk_kimi_delta_attention: its K·βKᵀ and QKᵀ as element-wise products, which the
        solve = 0  # counter does not see, and matmuls for the solved system's products: 3× the forward as counted
    ends = 8 * micro_batch * g.value_heads * g.chunk * g.key_head_dim * g.value_head_dim
    return spec.other_mixer_layers * (conv + solve - ends)


def dispatch_flops(spec: ModelSpec, tokens: int) -> float:
    """What transformers' step computes beyond lmcalc's model FLOPs where its MoE sends every token to every expert,
    the input scaled by the router's score (``MoESpec.dense_dispatch``: Llama4TextMoe): E − k more rows a token
    through each MoE layer's experts, forward and backward, 3 · 2·(E − k)·p_e per token with p_e an expert's
    weights."""
    moe = spec.moe
    if moe is None or not moe.dense_dispatch:
        return 0.0
    expert = sum(t.total for t in weight_tensors(spec) if t.group == "experts") / (spec.moe_layers * moe.num_experts)
    return 3 * 2 * (moe.num_experts - moe.k) * expert * spec.moe_layers * tokens


def mask_gradient_flops(spec: ModelSpec, tokens: int, through_sdpa: bool = True) -> float:
    """What the count's stand-in for SDPA leaves out where a learned mask is added to the scores: it gives the mask no
    gradient, so what makes the mask runs forward only on transformers' side (a kernel that trains the mask, as the
    models' own do, runs its backward too): Doge's dt_proj (H_kv·d_v → H_kv, ``dynamic_mask_window``), −2 ·
    2·H_kv·d_v·H_kv a token in each layer; Inkling's relative logits, r_proj (h → H·d_rel) and the bias table (d_rel ×
    the layer's extent), −2 · (2·h·H·d_rel + 2·H·d_rel·extent) a token in each layer. A model whose attention runs
    eagerly (``through_sdpa`` false: Inkling 2's, for its sinks) trains the mask there: no gap."""
    if not through_sdpa:
        return 0.0
    if spec.dynamic_mask_window:
        return -2 * 2 * spec.kv_heads * spec.v_head_dim * spec.kv_heads * spec.num_layers * tokens
    b = spec.branch_convs
    if b is None:
        return 0.0
    tables = b.extent * (spec.attention_layers - spec.local_layers) + (spec.sliding_window or 0) * spec.local_layers
    relative = 2 * spec.num_layers * spec.hidden_size * spec.num_heads * b.relative_width
    return -2 * (relative + 2 * spec.num_heads * b.relative_width * tables) * tokens


def _images(model: PreTrainedModel, batch: int) -> dict[str, Any]:
    """What a step reads beside the tokens: GIT's blank image (or video frames) on the meta device, for its loss
    skips the image's positions and runs with none; nothing for any other model."""
    import torch

    config = model.config
    if config.model_type != "git":
        return {}
    vision, frames = config.vision_config, config.num_image_with_embedding
    image = (vision.num_channels, vision.image_size, vision.image_size)
    shape = (batch, frames, *image) if frames else (batch, *image)
    return {"pixel_values": torch.zeros(shape, device="meta", dtype=next(model.parameters()).dtype)}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def transformers_check(
    config: dict[str, Any],
    seq_len: int,
    micro_batch: int = 1,
    *,
    spec: ModelSpec | None = None,
    model: PreTrainedModel | None = None,
    origin: str = "config.json",
) -> Result:
    """lmcalc against transformers for one config.json's ``config``: ``spec`` is what lmcalc reads from it (read
    here when not given), ``model`` what transformers builds from it (built here on meta when not given)."""
    import torch
    import transformers

    from lmcalc.measure import parameter_count

    if spec is None:
        spec = validate_spec(ModelSpec, model_from_hf_config(config, str(config.get("model_type")), origin), origin)
    if spec.drafter:
        raise LmcalcError(f"{origin}: a drafter's step reads its backbone's hidden state and K and V, not token ids: "
                          "validate --against transformers runs models from token ids (tests/test_gemma4_drafter.py "
                          "checks a drafter's FLOPs on the CPU)")  # fmt: skip
    model = build_model(config) if model is None else model
    built = f"{type(model).__name__}: {model.config._attn_implementation} attention"
    if spec.moe:
        built += ", grouped_mm experts"
    tokens = seq_len * micro_batch
    fallback = torch_path_flops(spec, seq_len, micro_batch) + dispatch_flops(spec, tokens)
    fallback += mask_gradient_flops(spec, tokens, model.config._attn_implementation == "sdpa")
    flops_note = f"causal convention: {fl.step_flops(spec, seq_len, convention='causal').model * tokens:.4e} FLOPs"
    if fallback:
        flops_note += (
            f"; lmcalc's count {'plus' if fallback > 0 else 'less'} {abs(fallback):,.0f} FLOPs transformers' own "
            f"code spends {'beyond' if fallback > 0 else 'short of'} the model's (its PyTorch mixers: the "
            "convolution's padding, Gated DeltaNet's solve_triangular backward and first and last chunks, lightning "
            "attention's first and last blocks, validate_hf.torch_path_flops; an MoE that runs every expert on every "
            "token, validate_hf.dispatch_flops; a learned mask the count's SDPA gives no gradient, "
            "validate_hf.mask_gradient_flops)"
        )
    sections = (
        _compare(
            "params",
            "Parameters (meta device)",
            count_params(spec).total + (spec.vision_params or 0),  # GIT's image encoder, counted apart
            parameter_count(model),
            "params",
            PARAM_TOLERANCE,
            source=f"transformers' {type(model).__name__}: sum(p.numel() for p in model.parameters())",
        ),
        _compare(
            "flops",
            f"FLOPs of one step, full attention (b={micro_batch}, s={seq_len})",
            fl.step_flops(spec, seq_len, convention="full").model * tokens + fallback,
            training_step_flops(model, seq_len, micro_batch),
            "FLOPs",
            FLOP_TOLERANCE,
            note=flops_note,
            source="torch.utils.flop_counter.FlopCounterMode, SDPA as one fused kernel (lmcalc::attention)",
        ),
    )
    inputs = (
        Input("model", "Model", spec.name, origin=origin),
        Input("seq_len", "Sequence length", seq_len, "tokens", "--seq"),
        Input("micro_batch", "Micro-batch", micro_batch, "sequences", "--micro-batch"),
        Input("transformers_model", "Built by transformers", built, origin="meta device, bf16"),
    )
    failed = [section.title for section in sections if section.term("error").ok is False]
    verdict = "FAILED: " + "; ".join(failed) if failed else "both checks passed"
    notes = (verdict, f"transformers {transformers.__version__}, torch {torch.__version__}")
    title = f"{spec.label}: lmcalc vs transformers"
    return Result("validate", title, inputs, sections, notes, layout="grid", headline=(f"{title}: {verdict}",))


def config_json(model: str) -> tuple[Path, str | None]:
    """The config.json that ``model`` names (a file, a model directory or a Hub id), and the Hub id if any."""
    if hub.is_hub_id(model):
        return hub.config_path(model), model
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix != ".json":
        raise LmcalcError(NEEDS_CONFIG.format(model=model))
    if not path.is_file():
        raise LmcalcError(f"no such file: {path}")
    return path, None


def validate_against_transformers(*, model: str, seq: str | int = 1024, micro_batch: int = 1) -> Result:
    """``lmcalc validate --against transformers``: the model a config.json describes, as lmcalc counts it and as
    transformers builds it."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise LmcalcError(NEEDS_TRANSFORMERS) from None
    path, hub_id = config_json(model)
    spec = load_spec_file(path, ModelSpec, hub_id)  # its errors: unreadable JSON, an unsupported model_type
    config = json.loads(path.read_text(encoding="utf-8"))
    if "model_type" not in config:  # an lmcalc preset written as JSON
        raise LmcalcError(NEEDS_CONFIG.format(model=model))
    origin = f"Hugging Face Hub: {hub_id}" if hub_id else str(path)
    seq_len, micro_batch = int(seq_given(seq).value), positive_int(micro_batch, "micro_batch")
    check_meta_sizes(spec, seq_len, micro_batch)
    return transformers_check(config, seq_len, micro_batch, spec=spec, origin=origin)
