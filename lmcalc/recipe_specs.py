"""What training stores and how it updates it, as presets/precisions.yaml and presets/optimizers.yaml describe them:
the precision recipe (bytes per weight, gradient, master copy, optimizer state and saved activation, the peak the
matmuls run at, and what an fp8 or fp4 recipe stores quantised) and the optimizer's per-parameter states."""

from typing import Literal

from pydantic import Field

from lmcalc.specs import (
    ComputeDtype,
    NamedSpec,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Spec,
    StrictBool,
    no_items,
)

Fp8Scaling = Literal["tensor-delayed", "tensor-current", "block", "mxfp8", "nvfp4"]


class Fp8Storage(Spec):
    """What an fp8 recipe stores, as Transformer Engine runs it (transformer_engine/pytorch/tensor/): bytes per
    element with the scales included, for the GPUs whose fp8 GEMMs take every layout (Blackwell) and, where it
    differs, for those that take only the TN layout and need transposed copies (Hopper, Ada)."""

    scaling: Fp8Scaling = Field(
        description="tensor-delayed or tensor-current: one scale per tensor; block: 1×128 blocks of inputs and "
        "gradients, 128×128 of weights (DeepSeek-V3's); mxfp8: 1×32 blocks with E8M0 scales (Blackwell)"
    )
    input_bytes: PositiveFloat = Field(description="a linear layer's input, saved quantised in one direction")
    weight_copy_bytes: PositiveFloat = Field(description="per weight, the quantised copy kept beside it (both uses)")
    grad_output_bytes: PositiveFloat = Field(
        description="per element of a linear layer's output gradient, its quantised copies in that layer's backward"
    )
    transposed_bytes: NonNegativeFloat = Field(
        0,
        description="on GPUs whose fp8 GEMMs take only the TN layout, added to the weight copy and the output "
        "gradient: their transposes (per-tensor scaling)",
    )
    sm100_only: StrictBool = Field(
        False, description="runs only on GPUs of compute capability 10.x (B200, B300, GB200), as MXFP8 does"
    )
    source: str = Field(min_length=1)


class PrecisionRecipe(NamedSpec):
    """How many bytes each piece of training state takes, and which peak the matmuls run at."""

    aliases: tuple[str, ...] = Field(default_factory=no_items)
    description: str
    compute_dtype: ComputeDtype
    param_bytes: NonNegativeFloat = Field(description="bytes per parameter of the weights used in forward/backward")
    grad_bytes: NonNegativeFloat
    master_bytes: NonNegativeFloat = Field(description="bytes per parameter of a separate fp32 master copy (0: none)")
    optimizer_state_bytes: PositiveFloat = Field(description="bytes of one optimizer state element")
    activation_bytes: PositiveFloat = Field(description="bytes of one saved activation element")
    fp8: Fp8Storage | None = Field(None, description="with fp8 GEMMs: what the recipe stores quantised")
    sources: tuple[str, ...] = Field(default_factory=no_items)


OptimizerParams = Literal["all", "matrices", "others"]


class OptimizerState(Spec):
    """One tensor an optimizer keeps per parameter tensor (momentum, second moment, ...)."""

    name: str
    params: OptimizerParams = Field(
        "all",
        description="the weights that keep this state: all; matrices, the 2-D weights other than the embedding and "
        "the output head (those Muon orthogonalises); others, every other weight (Muon's AdamW)",
    )
    factored: StrictBool = Field(False, description="stored as row + column statistics for matrices (Adafactor)")
    bytes: PositiveFloat | None = Field(None, description="fixed bytes per element; None: the recipe's")
    quantization_block: PositiveInt | None = Field(
        None, description="one fp32 scale per block of this many elements (block-wise 8-bit states)"
    )
    min_quantized_elements: PositiveInt | None = Field(
        None,
        description="a quantised state of a tensor with fewer elements is kept in fp32 instead, without scales "
        "(bitsandbytes' min_8bit_size)",
    )
    map_bytes: NonNegativeFloat = Field(
        0, description="bytes each quantised tensor's state keeps beside its elements: the quantisation map"
    )


class OptimizerSpec(NamedSpec):
    aliases: tuple[str, ...] = Field(default_factory=no_items)
    description: str
    states: tuple[OptimizerState, ...]
    newton_schulz_steps: NonNegativeInt = Field(
        0,
        description="Newton-Schulz iterations that orthogonalise each matrix's update every step (Muon's 5: each "
        "4·m²·n + 2·m³ FLOPs for an m × n matrix, m ≤ n); 0: none",
    )
    sources: tuple[str, ...] = Field(default_factory=no_items)
