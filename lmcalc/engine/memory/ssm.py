"""What a hybrid's state-space (Mamba), Gated DeltaNet, short-convolution or lightning-attention layers keep for
backward, and the average layer of a hybrid: attention in some layers, a state-space, linear-attention or convolution
mixer in the others (``engine.memory.activations`` counts the rest of a layer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.recurrent import mlstm_saved, rglru_saved, rwkv_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload


def share(tensor: SavedTensor, layers: int, of: int) -> SavedTensor:
    """``tensor`` as kept by ``layers`` of every ``of`` layers, on average."""
    return replace(tensor, elements=tensor.elements * layers / of, symbol=f"({layers}/{of})·{tensor.symbol}")


SCAN_CHUNK = 2048  # mamba_ssm's selective scan keeps its fp32 state once per chunk of this many tokens


def _ssm_saved(w: Workload) -> list[SavedTensor]:
    """What a state-space layer keeps for backward, as mamba_ssm's fused path keeps it (``mamba_inner_fn``, its
    default checkpoint level, which rebuilds the convolution's output and Δ in backward): the input projection's
    output x‖z, the x_proj output (Δ's low rank, B, C), contiguous B and C, the scan's output y, and the scan's
    fp32 state (d_in × 2N) once per chunk of 2,048 tokens. An estimate of a fused kernel's choices, not checked
    against a measurement here (no mamba_ssm on the CPU); transformers' PyTorch scan keeps far more: a state per
    token."""
    m, act, sb = w.model.mamba, w.precision.activation_bytes, w.tokens
    assert m is not None
    chunks = -(-w.seq_len // SCAN_CHUNK) * w.micro_batch
    return [
        SavedTensor("x and z (input projection output)", "s·b·2·d_in", sb * 2 * m.d_inner, act),
        SavedTensor("Δ, B, C (x_proj output)", "s·b·(r+2N)", sb * (m.dt_rank + 2 * m.d_state), act),
        SavedTensor("B and C (contiguous copies)", "s·b·2N", sb * 2 * m.d_state, act),
        SavedTensor("scan output y", "s·b·d_in", sb * m.d_inner, act),
        SavedTensor(
            "scan state per chunk of 2,048 tokens (fp32)", "⌈s/2048⌉·b·d_in·2N", chunks * m.d_inner * 2 * m.d_state, 4
        ),
    ]


def _deltanet_saved(w: Workload) -> list[SavedTensor]:
    """What a Gated DeltaNet layer keeps for backward with flash-linear-attention's kernels, which Qwen3-Next's
    transformers module calls where fla is installed (its training path): the convolution's input q‖k‖v; its output
    (v, a view of it, keeps it alive); q and k repeated to the H_v value heads; their L2 norms' 1/‖·‖ (fp32); the
    decay g (fp32) and what made it (softplus's input, its output); β's sigmoid output; the chunked rule's solved
    intra-chunk matrix A (s·b·H_v·C, fp32); the output gate z, the kernel's output and its RMSNorm's 1/rms and output,
    the output projection's input. An estimate of fla's choices, from its source (chunk_gated_delta_rule saves q, k,
    v, g, β and A), not checked against a measurement here (no fla on the CPU)."""
    g, act, sb = w.model.deltanet, w.precision.activation_bytes, w.tokens
    assert g is not None
    hv, cd = g.value_heads, g.conv_channels
    vd, kd = hv * g.value_head_dim, hv * g.key_head_dim
    return [
        SavedTensor("q‖k‖v (the convolution's input)", "s·b·c_d", sb * cd, act),
        SavedTensor("q‖k‖v (the convolution's output, SiLU)", "s·b·c_d", sb * cd, act),
        SavedTensor("q and k repeated to the value heads", "s·b·2·H_v·d_k", sb * 2 * kd, act),
        SavedTensor("q and k L2 norms' 1/‖·‖ (fp32)", "s·b·2·H_v", sb * 2 * hv, 4),
        SavedTensor("decay g and softplus's input and output (fp32)", "s·b·3·H_v", sb * 3 * hv, 4),
        SavedTensor("β (sigmoid output)", "s·b·H_v", sb * hv, act),
        SavedTensor("solved intra-chunk matrix A (fp32)", f"s·b·H_v·{g.chunk}", sb * hv * g.chunk, 4),
        SavedTensor("output gate z", "s·b·H_v·d_v", sb * vd, act),
        SavedTensor("delta rule output (gated norm input)", "s·b·H_v·d_v", sb * vd, act),
        SavedTensor("gated norm 1/rms (fp32)", "s·b·H_v", sb * hv, 4),
        SavedTensor("output projection input (gated norm output)", "s·b·H_v·d_v", sb * vd, act),
    ]


def _kda_saved(w: Workload) -> list[SavedTensor]:
    """What a Kimi Delta Attention layer keeps for backward, as transformers' Kimi Linear and Bailing modules run it
    where the kernels are installed: the causal-conv1d kernel keeps its input q‖k‖v; fla's ``chunk_kda`` (its
    ``save_for_backward``, read in fla's source, not measured here) keeps q and k L2-normalised and their 1/‖·‖,
    a contiguous copy of v, the decay g as given and its chunk-wise cumulative sum (fp32), β, and the intra-chunk
    matrices Aqk and Akk (s·b·H·C each). Around the kernel, PyTorch keeps what the gates' and the norm's element-wise
    code needs: Kimi's softplus written as exp, log and where (exp's output, log's input, the mask and softplus's
    output, fp32), or Bailing's sigmoid gate (its fp32 input and output); the low-rank gates' first projections'
    outputs; the fp32 gated RMSNorm's input, 1/rms, normalised and weighted values and the gate's sigmoid; the output
    projection's input (tests/test_kimi_delta.py measures the part around the kernel)."""
    g, act, sb = w.model.deltanet, w.precision.activation_bytes, w.tokens
    assert g is not None
    heads, width, chunk = g.value_heads, g.value_heads * g.key_head_dim, g.chunk
    rank = g.gate_rank  # Kimi's low-rank gates: its forget gate stays fp32; Bailing's returns the model's dtype
    kimi = rank is not None
    tensors = [
        SavedTensor("q‖k‖v (the convolution's input)", "s·b·3·H·d", sb * 3 * width, act),
        SavedTensor("q and k L2-normalised", "s·b·2·H·d", sb * 2 * width, act),
        SavedTensor("q and k 1/‖·‖ (fp32)", "s·b·2·H", sb * 2 * heads, 4),
        SavedTensor("v (the kernel's contiguous copy)", "s·b·H·d", sb * width, act),
        SavedTensor("decay g as given", "s·b·H·d", sb * width, 4 if kimi else act),
        SavedTensor("decay g summed within each chunk (fp32)", "s·b·H·d", sb * width, 4),
        SavedTensor("β (sigmoid output)", "s·b·H", sb * heads, act),
        SavedTensor("intra-chunk matrices Aqk and Akk", f"2·s·b·H·{chunk}", sb * 2 * heads * chunk, act),
    ]
    if rank is not None:  # softplus as where(g > 20, g, log(1 + exp(g))), then times −exp(A)
        tensors += [
            SavedTensor("forget gate's exp, log input and softplus (fp32)", "3·s·b·H·d", sb * 3 * width, 4),
            SavedTensor("forget gate's where mask (bool)", "s·b·H·d", sb * width, 1),
            SavedTensor("the gates' low-rank projections' outputs", "2·s·b·r", sb * 2 * rank, act),
        ]
    else:  # lower_bound · sigmoid(exp(A) · (f_proj(x) + dt_bias)) in fp32
        tensors.append(SavedTensor("forget gate's input and sigmoid (fp32)", "2·s·b·H·d", sb * 2 * width, 4))
    return tensors + [
        SavedTensor("gated norm input, normalised and weighted values (fp32)", "3·s·b·H·d", sb * 3 * width, 4),
        SavedTensor("gated norm 1/rms (fp32)", "s·b·H", sb * heads, 4),
        SavedTensor("output gate, sigmoid output (fp32)", "s·b·H·d", sb * width, 4),
        SavedTensor("output projection input (gated norm output)", "s·b·H·d", sb * width, act, for_weights=("o",)),
    ]


def _mamba2_saved(w: Workload) -> list[SavedTensor]:
    """What a Mamba-2 layer keeps for backward with mamba_ssm's fused path (``mamba_split_conv1d_scan_combined``,
    which transformers' Bamba and Granite 4 call where the kernels are installed): the input projection's output
    z‖x‖B‖C‖Δ, the scan's output before the gated norm, and the norm's 1/rms per group (fp32); the convolution's
    output, the states and the norm's output are recomputed in backward. An estimate from the kernel's source
    (``MambaSplitConv1dScanCombinedFn`` saves these), not checked against a measurement here (no CUDA)."""
    m, act, sb = w.model.mamba2, w.precision.activation_bytes, w.tokens
    assert m is not None
    width = 2 * m.inner + 2 * m.groups * m.state + m.heads
    tensors = [
        SavedTensor("z‖x‖B‖C‖Δ (input projection output)", "s·b·(2·I+2·G·N+H)", sb * width, act),
        SavedTensor("scan output (gated norm input)", "s·b·I", sb * m.inner, act),
    ]
    if m.gated_norm:  # Falcon-H1 without mamba_rms_norm gates the scan's output by SiLU(z) alone
        tensors.append(SavedTensor("gated norm 1/rms per group (fp32)", "s·b·G", sb * m.groups, 4))
    return tensors


def _short_conv_saved(w: Workload) -> list[SavedTensor]:
    """What an LFM2 short-convolution layer keeps for backward on transformers' PyTorch path (``Lfm2ShortConv`` with
    ``causal_conv1d_fn``'s fallback, which the CPU and a GPU without the causal-conv1d kernel run): the input
    projection's output B‖C‖x (B·x keeps B and x, C·y keeps C: views of it), the convolution's input B·x, its output
    over s + K − 1 positions a sequence (F.conv1d padded by K − 1 on both sides, cut to the first s, which C·y keeps
    whole), and the output projection's input."""
    m, act, sb, b, h = w.model.short_conv, w.precision.activation_bytes, w.tokens, w.micro_batch, w.model.hidden_size
    assert m is not None
    return [
        SavedTensor("B‖C‖x (input projection output)", "s·b·3h", sb * 3 * h, act),
        SavedTensor("B·x (the convolution's input)", "s·b·h", sb * h, act),
        SavedTensor(
            "convolution output, s + K − 1 a sequence", "b·(s+K−1)·h", b * (w.seq_len + m.conv_kernel - 1) * h, act
        ),  # fmt: skip
        SavedTensor("output projection input (C·y)", "s·b·h", sb * h, act, for_weights=("out_proj",)),
    ]


def _lightning_saved(w: Workload) -> list[SavedTensor]:
    """What a lightning-attention layer keeps for backward on transformers' PyTorch path (MiniMaxLightningAttention's
    block loop): the projection's output (SiLU's input); per block of n tokens, the copies its batched products make
    of the strided q, k and v slices of SiLU's output (q and kᵀ for the scores, v for the scores' product and again
    for the state's update: folding the batch into the heads copies them), or SiLU's output itself, whose slices
    they keep, where the micro-batch is one sequence; the decayed n × n scores each head multiplies v by, the decayed
    queries that read the state and the decayed keys that update it, and the H × d × d state each block reads (the
    first one's zeros too); the RMSNorm over H·d; the sigmoid gate, kept by the product; the output projection's
    input (the gated product). Measured on the CPU (minimax-small); an estimate for MiniMax's own kernels, which are
    not here."""
    m, act, sb, b, s = w.model.lightning, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    assert m is not None
    inner = m.heads * m.head_dim
    whole, rest = divmod(s, m.block)
    squares, blocks = whole * m.block**2 + rest**2, whole + (rest > 0)
    return [
        SavedTensor("q‖k‖v before SiLU (projection output)", "s·b·3·H·d", sb * 3 * inner, act),
        SavedTensor("each block's copies of q, kᵀ and v (v twice)", "4·s·b·H·d", 4 * sb * inner, act)
        if b > 1
        else SavedTensor("q‖k‖v (SiLU output, whose slices the products keep)", "s·b·3·H·d", sb * 3 * inner, act),
        SavedTensor("decayed scores within each block", "b·H·Σn²", b * m.heads * squares, act),
        SavedTensor("decayed queries and keys", "2·s·b·H·d", 2 * sb * inner, act),
        SavedTensor("the state each block reads", "⌈s/B⌉·b·H·d²", blocks * b * m.heads * m.head_dim**2, act),
        *norm_saved(w, "output norm", Dim(sb, "s·b"), Dim(inner, "H·d")),
        SavedTensor("output gate (sigmoid output)", "s·b·H·d", sb * inner, act),
        SavedTensor("output projection input (gated product)", "s·b·H·d", sb * inner, act, for_weights=("out_proj",)),
    ]


MixerKind = Literal[
    "average", "attention", "other", "none", "global", "local", "global_shared", "local_shared", "shared"
]
"""A hybrid's layer: the average of its L layers, one that attends, one of its other mixer, one that runs a shared
block's use before its other mixer (Zamba's), or (where some layers are an FFN alone, Nemotron-H) one without a
mixer; or where a model's local layers attend with heads or sinks of their own (MiMo-V2-Flash), one global or one
local layer, and where the last layers reuse earlier layers' K and V (Gemma 4), one
of those (``_shared``)."""
KINDS = ("global", "local", "global_shared", "local_shared")
"""The layers of a model whose attention layers differ by kind: global or local, making their own K and V or not."""
AttentionKind = Literal["global", "local"] | None
"""An attention layer of a model whose local layers differ from its global ones: one global, one local; None for a
model whose attention layers are all alike."""


def average_mixer(w: Workload, attention: list[SavedTensor], kind: MixerKind = "average") -> list[SavedTensor]:
    """A hybrid's token mixer as the average of its M layers with a mixer keeps it (M = L but where some layers are
    an FFN alone): the attention's tensors in A of them, the state-space, linear-attention or convolution layer's in
    the other M − A; or as one layer of either ``kind``."""
    spec = w.model
    if kind == "attention":
        return attention
    if spec.short_conv:
        mixer = _short_conv_saved(w)
    elif spec.lightning:
        mixer = _lightning_saved(w)
    elif spec.rglru:
        mixer = rglru_saved(w)
    elif spec.rwkv:
        mixer = rwkv_saved(w)
    elif spec.mlstm:
        mixer = mlstm_saved(w)
    elif spec.deltanet:
        mixer = _kda_saved(w) if spec.deltanet.channel_decay else _deltanet_saved(w)
    else:
        mixer = _mamba2_saved(w) if spec.mamba2 else _ssm_saved(w)
    if kind in ("other", "shared"):  # a shared block's use comes beside (engine.memory.shared_block)
        return mixer
    mixing = spec.mixer_layers
    return [share(t, spec.attention_layers, mixing) for t in attention] + [
        share(t, spec.other_mixer_layers, mixing) for t in mixer
    ]
