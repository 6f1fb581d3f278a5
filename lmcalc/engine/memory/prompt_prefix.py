"""What CPM-Ant keeps for backward (Han et al. 2022, CPM-Ant; transformers 5.24's CpmAntModel, ``specs.PromptSpec``):
every layer computes the prompt's P tokens before each sequence's s, so a layer keeps what ``engine.memory.activations``
counts for a layer of s + P tokens, and what CPM-Ant's own code keeps beyond it: CpmAntAttention's two
``masked_fill``\\ s, each keeping the booleans of ``attention_mask == False`` (b·(s+P)² bytes), the second's output,
which the product with V keeps beside the softmax's; and CpmAntLayerNorm's product of its input (not of the fp32 copy)
with 1/rms, which keeps the input too. Outside the layers: the token and segment ids (int32, s + P a sequence), the
score bias's bucket indices (int32, b·(s+P)²), which its embedding into the shared table keeps, the final norm over
s + P tokens, the head's input (the text's s rows, a copy where the batch makes the slice strided) and the logits'
log-softmax in the activation dtype (CpmAntForCausalLM's own CrossEntropyLoss, no fp32 upcast, no shift)."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.widths import renamed
from lmcalc.engine.model.params import Dim
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload

INT32_BYTES = 4  # CpmAntModel casts the ids to int32; the buckets are int32 too
TARGET_BYTES = 8  # the labels, int64
BOOL_BYTES = 1  # masked_fill keeps its mask, a bool a score
NORM_READERS = {"attention norm": "attention", "MLP norm": "mlp"}  # CpmAntLayerNorm's in each layer, by half


def prompt_length(w: Workload) -> int:
    """P, the prompt's tokens before each sequence (0 for a model without a prompt)."""
    return w.model.prompt.length if w.model.prompt else 0


def without_prompt(w: Workload) -> Workload:
    """The workload of CPM-Ant's layers: its model as one without a prompt, over sequences of s + P tokens."""
    spec = w.model.model_copy(update={"prompt": None})
    return replace(w, model=spec, seq_len=w.seq_len + prompt_length(w))


def _norm_input(w: Workload, label: str, rows: float, symbol: str, block: str) -> list[SavedTensor]:
    """CpmAntLayerNorm multiplies its input, not the fp32 copy its variance read, by 1/rms: the product keeps the
    input beside the copy, where the activations are not fp32 already (there the copy is the input) and the norm is
    the model's own code (a kernel keeps its input alone)."""
    if norm_keeps(w) != "fp32_input" or w.precision.activation_bytes == 4:
        return []
    h = w.model.hidden_size
    return [SavedTensor(f"{label} input (its product with 1/rms keeps it)", f"{symbol}·h", rows * h,
                        w.precision.activation_bytes, split="seq", block=block)]  # fmt: skip


def prompt_layer_saved(w: Workload, inner: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
    """A CPM-Ant layer: ``inner``, what ``layer_saved_tensors`` counts for the layer over s + P tokens
    (``without_prompt``), and what CpmAntAttention and CpmAntLayerNorm keep beyond it. Eager (its own code, which
    transformers runs), each ``masked_fill`` keeps b·(s+P)² booleans and the product with V the second one's output,
    b·H·(s+P)²; a fused kernel, given the bias with the mask folded in, keeps that bias once for every layer
    (``prompt_model_saved``)."""
    S, b, act, H = w.seq_len + prompt_length(w), w.micro_batch, w.precision.activation_bytes, w.model.num_heads
    tensors = renamed(list(inner), {"s": "(s+P)", "s²": "(s+P)²"})
    for label, block in NORM_READERS.items():
        tensors += _norm_input(w, label, S * b, "(s+P)·b", block)
    if w.attention == "eager":
        tensors += [
            SavedTensor("the probabilities, masked again (the product with V keeps them)", "b·H·(s+P)²",
                        b * H * S * S, act, attention_core=True),
            SavedTensor("the two masked_fills' booleans (attention_mask == False)", "2·b·(s+P)²", 2 * b * S * S,
                        BOOL_BYTES, attention_core=True, split="none"),
        ]  # fmt: skip
    return tuple(tensors)


def prompt_checkpoint(w: Workload) -> SavedTensor:
    """What full recomputation keeps of a CPM-Ant layer: its input, over s + P tokens."""
    return SavedTensor("layer input", "(s+P)·b·h", (w.seq_len + prompt_length(w)) * w.micro_batch * w.model.hidden_size,
                       w.precision.activation_bytes, split="seq")  # fmt: skip


def prompt_model_saved(w: Workload) -> tuple[SavedTensor, ...]:
    """What a CPM-Ant step keeps outside its layers: the ids, the bias's buckets, the final norm, the head's input
    and the loss's log-probabilities, as the module docstring says; what the layers' arguments keep alive under full
    recomputation (the mask and the bias, which every layer reads); and under a fused kernel the bias it keeps."""
    spec, act, s, b = w.model, w.precision.activation_bytes, w.seq_len, w.micro_batch
    S, h, H = s + prompt_length(w), spec.hidden_size, spec.num_heads
    full = w.method.kind == "full"  # under LoRA the embeddings and the bias table are frozen: their ids unkept
    embedding = [SavedTensor("targets (int64)", "s·b", s * b, TARGET_BYTES, split="none")]
    if full:
        embedding += [
            SavedTensor("token and segment ids with the prompt's (int32)", "2·(s+P)·b", 2 * S * b, INT32_BYTES,
                        split="none"),
            SavedTensor("the score bias's bucket indices (int32; its embedding keeps them)", "b·(s+P)²", b * S * S,
                        INT32_BYTES, split="none"),
        ]  # fmt: skip
    tables = []
    if w.attention != "eager":
        tables.append(SavedTensor("the score bias with the mask folded in (the fused kernels' bias, one for every "
                                  "layer)", "b·H·(s+P)²", b * H * S * S, act, split="none"))  # fmt: skip
    if w.recompute == "full":  # the layers' positional arguments, alive until the rebuilt layers have run
        tables += [SavedTensor("attention mask (int32: CpmAntModel ors int32 ids into it; kept for the rebuilt "
                               "layers)", "b·(s+P)²", b * S * S, INT32_BYTES, split="none")]  # fmt: skip
        if w.attention == "eager":
            tables.append(SavedTensor("score bias (kept for the rebuilt layers)", "b·H·(s+P)²", b * H * S * S, act,
                                      split="none"))  # fmt: skip
    rows = Dim(S * b, "(s+P)·b")
    final = norm_saved(w, "final norm", rows, Dim(h, "h")) + _norm_input(w, "final norm", S * b, "(s+P)·b", "head")
    if not full:  # a frozen final norm keeps no normalised value
        final = [t for t in final if not t.for_weights]
    # lm_head reads the text's rows, hidden_states[:, P:]: a strided slice copied where b > 1, else a view that keeps
    # the final norm's whole output
    head_rows, head_symbol = (s * b, "s·b") if b > 1 else (S, "(s+P)")
    head = [*final]
    if full:
        head.append(SavedTensor("output head input", f"{head_symbol}·h", head_rows * h, act, split="seq",
                                for_weights=("lm_head",)))  # fmt: skip
    head.append(SavedTensor("log-probabilities (CrossEntropyLoss on the logits in the activation dtype)", "s·b·V",
                            s * b * spec.vocab_size, act))  # fmt: skip
    return tuple(
        [replace(t, block="embedding") for t in embedding]
        + [replace(t, block="tables") for t in tables]
        + [replace(t, block="head") for t in head]
    )


def prompt_loss_transient(w: Workload) -> float:
    """What CPM-Ant's loss holds in its backward beyond the log-probabilities it keeps: nll_loss's gradient and
    log_softmax's, s·b·V each in the activation dtype (its own CrossEntropyLoss, no fp32 copy)."""
    return 2 * w.seq_len * w.micro_batch * w.model.vocab_size * w.precision.activation_bytes


def bias_gradient(w: Workload) -> float:
    """The score bias's gradient, b·H·(s+P)² in the activation dtype: every layer's backward adds its scores'
    gradient into the one tensor the layers share, alive from the top layer's attention backward to the bias
    table's embedding backward."""
    S = w.seq_len + prompt_length(w)
    return w.micro_batch * w.model.num_heads * S * S * w.precision.activation_bytes


def forward_frame(w: Workload) -> float:
    """What CpmAntModel's forward holds through its layers without keeping it for backward, where the layers are not
    checkpointed (a checkpoint keeps the mask and the bias itself, ``prompt_model_saved``): the score bias
    (b·H·(s+P)², activation dtype), the int32 mask (b·(s+P)²) and the segment embedding's output ((s+P)·b·h), beside
    the last layer's output and the final norm's fp32 copy of it as the forward ends (``Transients.forward``)."""
    S, b, act, h = w.seq_len + prompt_length(w), w.micro_batch, w.precision.activation_bytes, w.model.hidden_size
    frame = b * w.model.num_heads * S * S * act + b * S * S * INT32_BYTES + S * b * h * act
    return frame + S * b * h * 4
