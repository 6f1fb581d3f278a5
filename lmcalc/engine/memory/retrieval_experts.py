"""What Doge's CDMoE keeps for backward (``specs.RetrievalExpertsSpec``; transformers 5.24's DogeCDMoE), beside its
SwiGLU, the shared expert, which ``engine.memory.ffn`` counts: the router's two top-k, the k routing weights, the
rows of down_embed and up_embed a token retrieves, and its k single-neuron activations (docs/formulas.md §2.27.1)."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.finetune.method import adapted_modules, weight_trained
from lmcalc.engine.memory.ffn import ffn_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload

INDEX_BYTES = 8  # int64: topk's indices, the experts' ids the embeddings' backward reads
ROUTER_READERS = ("router", "down_embed")  # what besides the SwiGLU's gate and up reads x: router_gate, x·down_embed


def retrieval_experts_saved(w: Workload, mlp: list[SavedTensor]) -> list[SavedTensor]:
    """A CDMoE layer's MLP half: ``mlp`` (the SwiGLU's, its input x also read by router_gate and by x·down_embed for
    their weights' gradients) and, with N = s·b tokens, k experts a token and √E keys a half:
    router_gate's logits, viewed as two halves of √E, each sorted whole by topk, which keeps its int64 indices
    (2·N·√E); the top k of the √E² sums, whose int64 positions topk keeps (N·k); softmax keeps its output, the routing
    weights, which the product with the activations keeps too (N·k); each embedding's backward the experts' int64 ids
    (N·k, one tensor for both tables); the first product, (k × h)·x, its down_embed rows (N·k·h) beside x; SiLU its
    input (N·k); the product with the weights SiLU's output (N·k); the second product, (1 × k)·(k × h), its up_embed
    rows (N·k·h) and the weighted activations (N·k, for up_embed's gradient). A frozen table (LoRA: PEFT adapts no
    nn.Embedding) keeps neither x for the first product, the ids, nor the weighted activations."""
    r = w.model.retrieval_experts
    if r is None:
        return mlp
    act, n, h, k = w.precision.activation_bytes, w.tokens, w.model.hidden_size, r.top_k
    mlp = [replace(t, for_weights=(*t.for_weights, *ROUTER_READERS)) if t.label.startswith("MLP input") else t
           for t in mlp]  # fmt: skip
    return mlp + [
        SavedTensor("CDMoE: topk's indices over each half's √E keys (int64)", "2·s·b·√E", 2 * n * r.keys, INDEX_BYTES,
                    split="seq", block="mlp"),
        SavedTensor("CDMoE: topk's positions among the √E² sums (int64)", "s·b·k", n * k, INDEX_BYTES, split="seq",
                    block="mlp"),
        SavedTensor("CDMoE: the routing weights (softmax output, kept by the product too)", "s·b·k", n * k, act,
                    split="seq", block="mlp"),
        SavedTensor("CDMoE: the experts' ids (int64, the embeddings' backward)", "s·b·k", n * k, INDEX_BYTES,
                    split="seq", block="mlp", for_weights=("down_embed", "up_embed")),
        SavedTensor("CDMoE: the retrieved down_embed rows (x·down_embed keeps them)", "s·b·k·h", n * k * h, act,
                    split="seq", block="mlp"),
        SavedTensor("CDMoE: SiLU input (x·down_embed)", "s·b·k", n * k, act, split="seq", block="mlp"),
        SavedTensor("CDMoE: SiLU output (the product with the weights keeps it)", "s·b·k", n * k, act, split="seq",
                    block="mlp"),
        SavedTensor("CDMoE: the retrieved up_embed rows (the second product keeps them)", "s·b·k·h", n * k * h, act,
                    split="seq", block="mlp"),
        SavedTensor("CDMoE: the weighted activations (the second product keeps them)", "s·b·k", n * k, act,
                    split="seq", block="mlp", for_weights=("up_embed",)),
    ]  # fmt: skip


def retrieval_backward_peak(w: Workload) -> float:
    """What a CDMoE layer's backward holds beyond its saved tensors at its busiest, the second product's backward, in
    bytes (0 without one, or where up_embed is frozen, whose rows then get no gradient): the up_embed rows' gradient
    (N·k·h) and the weighted activations' (N·k), and x's gradient from the SwiGLU (N·h), whose saved tensors but its
    input are freed by then (it was built later, and autograd runs it first); the layer output's gradient beside them
    is the caller's, as for every layer.
    Read from the storages live at the step's peak with scripts/hf_step_peak.py on the CPU (doge-moe-wide,
    checkpointed)."""
    r = w.model.retrieval_experts
    if r is None or not weight_trained(w.model, w.method, "up_embed"):
        return 0.0
    act, n, h, k = w.precision.activation_bytes, w.tokens, w.model.hidden_size, r.top_k
    swiglu = sum(t.bytes for t in ffn_saved(w, Dim(n, "s·b"), Dim(w.model.ffn_size, "f"), with_input=False))
    return n * k * h * act + n * k * act + n * h * act - swiglu


def retrieval_forward_peak(w: Workload) -> float:
    """What a CDMoE layer's forward holds beyond its saved tensors at its last add, in bytes (0 without one): the √E²
    sums of the key scores and their int64 expert ids (N·√E² each), the router's logits and each half's top √E
    values (2·N·√E each), the top k's values (N·k), and three of h a token: the experts' output, the SwiGLU's and
    their sum; where up_embed is frozen (LoRA), the experts' ids and the weighted activations, which it then does not
    keep (N·k each), where the residual scale is frozen the layer's residual (N·h), which DogeDecoderLayer holds for
    the add after the MLP, and where the SwiGLU's down projection is adapted, its moment is before the sum, beside W·x,
    B·A·x and its scaled copy (four of h a token). Under full recomputation the rebuilt layer holds them beside all it
    keeps (scripts/hf_step_peak.py on the CPU: doge-moe and doge-moe-wide, checkpointed, fully trained and LoRA)."""
    r = w.model.retrieval_experts
    if r is None:
        return 0.0
    act, n, h, k = w.precision.activation_bytes, w.tokens, w.model.hidden_size, r.top_k
    unkept = 0 if weight_trained(w.model, w.method, "up_embed") else n * k * (INDEX_BYTES + act)
    if not weight_trained(w.model, w.method, "residual_scale"):  # the layer's residual, which it then does not keep
        unkept += n * h * act
    outputs = 4 if any(m.leaf == "down" for m in adapted_modules(w.model, w.method)) else 3
    return n * r.keys**2 * (act + INDEX_BYTES) + 4 * n * r.keys * act + n * k * act + unkept + outputs * n * h * act
