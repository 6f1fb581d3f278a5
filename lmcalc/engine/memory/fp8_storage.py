"""What a framework keeps under an fp8 recipe, where its profile follows Transformer Engine (``fp8.saved:
transformer_engine``), read from NVIDIA/TransformerEngine d0067d0d (2.20.0.dev0) and Megatron-LM core_v0.16.1
(docs/formulas.md §5.12). Three things differ from the bf16 count:

* A linear layer saves its input quantised, in the one direction its weight gradient reads, not in bf16
  (transformer_engine/pytorch/module/linear.py ``_linear_forward_impl``, layernorm_linear.py, grouped_linear.py:
  ``update_usage(rowwise_usage=False)``): ``Fp8Storage.input_bytes`` per element, scales included. Megatron-Core
  makes attention's output projection save its bf16 input instead under every recipe but delayed scaling
  (``save_original_input``, megatron/core/transformer/attention.py): the attention kernel keeps that tensor
  anyway. Under delayed scaling the projection saves a quantised copy beside it. The MLA down-projections do the
  same. The router reads the MoE norm's output in bf16.
* Each of a layer's weights has a quantised copy for both uses. Megatron-Core passes ``is_first_microbatch``, so
  Transformer Engine caches the copy for the run (module/base.py, ``_fp8_workspaces``).
* A layer's backward quantises each output gradient for both uses (base.py ``grad_output_preprocess``), beside
  the bf16 one, for the time that layer's backward runs.

On GPUs whose fp8 GEMMs take only the TN layout (Hopper, Ada: ``utils.is_non_tn_fp8_gemm_supported``), per-tensor
scaling adds transposes of the weight copy and of the output gradient (``Fp8Storage.transposed_bytes``).
"""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.saved import ROUTED, SavedTensor
from lmcalc.engine.workload import Workload
from lmcalc.recipe_specs import Fp8Storage

LINEAR_READERS = frozenset({"q", "k", "v", "qkv", "q_a", "kv_a", "q_b", "kv_b", "o", "gate", "up", "gate_up", "fc",
                            "down", "proj", "attn_gate", "fc2"})  # fmt: skip
"""The leaves of Transformer Engine's linear layers (lmcalc's names; fc2, a latent MoE's projection back to h): a tensor
kept only for them is their input."""

ORIGINAL_KEPT = frozenset({"o", "q_a", "kv_a"})
"""Linear layers Megatron-Core makes save their bf16 input under every recipe but delayed scaling
(``set_save_original_input``: attention's output projection, the MLA down-projections)."""

SM100_GPUS = ("b200", "b300", "gb200", "gb300")
"""lmcalc's GPUs of compute capability 10.x, whose fp8 GEMMs take every operand layout and which run MXFP8
(transformer_engine/pytorch/utils.py ``is_non_tn_fp8_gemm_supported``, quantization.py
``_compute_mxfp8_support``)."""


def te_fp8(w: Workload) -> Fp8Storage | None:
    """The fp8 recipe's storage where the profile keeps it as Transformer Engine does, else None."""
    fp8 = w.precision.fp8
    return fp8 if fp8 is not None and w.framework.fp8.saved == "transformer_engine" else None


def fp8_saved(w: Workload, tensors: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
    """A layer's saved tensors with the linear layers' inputs quantised, and under delayed scaling the output
    projection's quantised copy of the attention output the kernel keeps."""
    fp8 = te_fp8(w)
    if fp8 is None:
        return tensors
    delayed = fp8.scaling == "tensor-delayed"
    out = []
    for tensor in tensors:
        readers = {leaf.removeprefix(ROUTED) for leaf in tensor.for_weights}  # a routed expert's as any
        if readers and readers <= LINEAR_READERS and (delayed or not readers <= ORIGINAL_KEPT):
            tensor = replace(tensor, label=f"{tensor.label}, quantised", bytes_per_element=fp8.input_bytes)
        out.append(tensor)
        if delayed and tensor.label == "attention output = output projection input":
            out.append(SavedTensor("output projection input, quantised (delayed scaling)", tensor.symbol,
                                   tensor.elements, fp8.input_bytes, block=tensor.block))  # fmt: skip
    return tuple(out)


def weight_copy_bytes(fp8: Fp8Storage) -> float:
    """Bytes per weight of its quantised copy, its transpose included where the GPU needs one."""
    return fp8.weight_copy_bytes + fp8.transposed_bytes


def grad_output_bytes(fp8: Fp8Storage) -> float:
    """Bytes per element of an output gradient's quantised copies in a layer's backward."""
    return fp8.grad_output_bytes + fp8.transposed_bytes


def on_gpu(fp8: Fp8Storage, hardware: str) -> Fp8Storage:
    """The recipe's storage on ``hardware`` (a preset's name): without transposes on the GPUs whose fp8 GEMMs take
    every layout (``SM100_GPUS``)."""
    return fp8.model_copy(update={"transposed_bytes": 0.0}) if hardware in SM100_GPUS else fp8
