"""The b·H·s² tensors eager attention keeps for backward: the soft-capped and clamped scores, and the softmax as the
framework's profile and the model's own code keep it (in fp32 with its cast copy, in the activation dtype, with an
attention sink's column). ``engine.memory.activations`` lists them with the rest of a layer."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model_code import eager_softmax
from lmcalc.engine.workload import Workload

INDEX_BYTES = 8  # indices autograd keeps (a max's, a gather's) are int64


def eager_scores_saved(w: Workload, sink_column: bool) -> list[SavedTensor]:
    """The b·H·s² tensors eager attention keeps: tanh's output where the logits are soft-capped (Gemma 2:
    c·tanh(x/c), Team et al. 2024 §2), the masked scores where a clamp keeps them (XGLM), and the softmax, in the
    activation dtype or in fp32 with its cast copy (the profile's ``eager_softmax``). With sinks (gpt-oss) the
    softmax spans one more column, the sink's, and the profile says how it is kept (``eager_sink_softmax``,
    ``sink_max_indices``). A model whose sinks are in its local layers alone (MiMo-V2-Flash) runs that softmax in every
    layer, the sink's column (``sink_column``) in the local ones. Granite SWA's sinks scale the output instead
    (``sink_scale``): a plain softmax, and the logsumexp that scale reads keeps the scores."""
    spec, act, b, s, H = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len, w.model.num_heads
    rule = w.framework.attention
    tensors = []
    if spec.attention_softcap:
        tensors.append(SavedTensor("soft-capped scores (tanh output)", "b·H·s²", b * H * s * s, act, True))
    if spec.eager_score_clamp:  # XGLM: torch.max(scores + mask, dtype's minimum) keeps its input
        tensors.append(SavedTensor("masked scores (kept by the clamp's max)", "b·H·s²", b * H * s * s, act, True))
    sink_softmax = spec.attention_sinks and not spec.sink_scale  # gpt-oss's: the sink a softmax column
    if spec.attention_sinks and spec.sink_scale:  # Granite SWA: logsumexp over the scores keeps them and its result
        tensors += [SavedTensor("scores (kept by the sinks' logsumexp)", "b·H·s²", b * H * s * s, act, True),
                    SavedTensor("the sinks' log-sum-exp per row", "b·H·s", b * H * s, act, True)]  # fmt: skip
    sink_column = sink_column and sink_softmax
    symbol, n = ("b·H·s·(s+1)", b * H * s * (s + 1)) if sink_column else ("b·H·s²", b * H * s * s)
    softmax = rule.eager_sink_softmax if sink_softmax and rule.eager_sink_softmax else None
    if sink_column and spec.sinks_fp32:  # fp32 sinks promote the concatenated logits (DeepSeek-V4, HY V4)
        return [*tensors, SavedTensor("softmax output with the sink column (fp32 sinks)", symbol, n, 4, True),
                SavedTensor("softmax output, cast (without the sink column)", "b·H·s²", b * H * s * s, act, True),
                *([SavedTensor("row maxima's indices (int64)", "b·H·s", b * H * s, INDEX_BYTES, True)]
                  if rule.sink_max_indices else [])]  # fmt: skip
    if spec.eager_fp32_scores:  # Flint, GPT-J: the softmax over fp32 scores (and Flint's sinks) kept, its cast meets V
        label = "softmax output with the sink column (fp32)" if sink_column else "softmax output (fp32)"
        return [*tensors, SavedTensor(label, symbol, n, 4, attention_core=True),
                SavedTensor("softmax output, cast", "b·H·s²", b * H * s * s, act, attention_core=True)]  # fmt: skip
    if softmax:  # kept once: the matmul with V reads a view of it, without the sink's column
        column = " with the sink column" if sink_column else ""
        tensors.append(SavedTensor(f"softmax output{column} ({softmax})", symbol, n, 4 if softmax == "fp32" else act,
                                   attention_core=True))  # fmt: skip
    elif eager_softmax(w) == "fp32":  # softmax in fp32, kept; its cast copy meets V, unless dropout comes between
        tensors.append(SavedTensor("softmax output (fp32)", symbol, n, 4, attention_core=True))
        # dropout keeps its mask, not its input: V meets the dropout's output; fp32 activations: the cast is a no-op
        if not spec.drops("attention") and act != 4:
            tensors.append(SavedTensor("softmax output, cast", symbol, n, act, attention_core=True))
    else:
        tensors.append(SavedTensor("softmax output", symbol, n, act, attention_core=True))
    if sink_softmax and rule.sink_max_indices:
        tensors.append(SavedTensor("row maxima's indices (int64)", "b·H·s", b * H * s, INDEX_BYTES, True))
    return tensors
