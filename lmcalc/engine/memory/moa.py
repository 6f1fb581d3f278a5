"""What a mixture of attention heads keeps for backward (JetMoE's JetMoeMoA, ``MoESpec.attention_experts``).

Each token's query comes from k of E_a experts, H_kv heads each, and its attention output goes back through the same
k experts' output projections; the k weighted outputs are summed by an ``index_add``. Run as transformers runs it,
one expert at a time over the rows routed to it: the rows gathered for the query experts (k·h a token), their
outputs as the ``index_add`` that places them keeps them (k·H_kv·d), the attention's output gathered again for the
output experts (k·H_kv·d), those experts' outputs kept for the product with the routing weights and the weighted
ones the second ``index_add`` keeps (k·h each), and the routing: the top-k indices, each row's index and the
placing ``index_add``'s, the top-k softmax in fp32 and the weights. K and V are repeated to the k experts' heads
(``repeat``: copies), which the attention keeps at H = k·H_kv heads (``activations._attention_saved``).
"""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

MOA_ROUTING_BYTES = 30
"""Per token-expert assignment of the attention's routing, as JetMoeTopKGating and JetMoeMoA keep it: the top-k index,
the sorted order's index and the placing index_add's (int64 each), the top-k softmax (fp32) and the weight (bf16)."""


def attention_experts_saved(w: Workload) -> list[SavedTensor]:
    """The tensors a mixture of attention heads keeps beyond an attention of H heads (this module's docstring)."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    assert spec.moe is not None
    k, h, width = spec.moe.k, spec.hidden_size, spec.kv_heads * spec.qk_head_dim
    rows = k * sb
    return [
        SavedTensor("tokens gathered for the query experts", "k·s·b·h", rows * h, act, split="seq"),
        SavedTensor("query experts' outputs (the placing index_add keeps them)", "k·s·b·H_kv·d", rows * width, act),
        SavedTensor("attention output gathered for the output experts", "k·s·b·H_kv·d", rows * width, act),
        SavedTensor("output experts' outputs (for the routing-weight product)", "k·s·b·h", rows * h, act, split="seq"),
        SavedTensor(
            "weighted output experts' outputs (index_add keeps its source)", "k·s·b·h", rows * h, act, split="seq"
        ),  # fmt: skip
        SavedTensor(
            "attention routing: indices, top-k softmax and weights", "s·b·k", rows, MOA_ROUTING_BYTES, split="seq"
        ),  # fmt: skip
    ]
