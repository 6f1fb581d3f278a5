"""What a training framework does beyond the textbook count, as validated specs: what it keeps for backward and
allocates (the memory rules of ``presets/frameworks/*.yaml``) and how fast it runs a step's kernels (its speed
rules), each rule with the framework file or paper it was read from. As in ``specs``, the annotations are types, not
text."""

from typing import Literal

from pydantic import Field

from lmcalc.specs import NamedSpec, NonNegativeInt, PositiveInt, Spec, StrictBool, no_items

MAX_COPIES = 16
"""The most copies of Q, K or V a framework's attention keeps (the profiles keep 1 or 2): the count drives a loop
over the copies, so a profile cannot ask for billions."""


class Rule(Spec):
    """One thing a training framework does that decides its memory, and where that is stated: the framework's
    file and version, or a paper."""

    source: str = Field(min_length=1)


NormKeeps = Literal["input", "fp32_input", "fp32_normalised", "fp32_centred"]


class NormRule(Rule):
    """What a norm keeps for backward, for each kind of norm. ``input``: its input in the activation dtype and fp32
    statistics (a fused kernel: apex, Transformer Engine, Triton, ``torch.nn.LayerNorm``); ``fp32_input``: an
    fp32 copy of its input, the fp32 statistics and the normalised value in the activation dtype before the
    weight's multiply (the unfused PyTorch form that upcasts, as Hugging Face's RMSNorm classes are written);
    ``fp32_normalised``: the same, but the weight's multiply is done in fp32 before the cast back, so the
    normalised value it keeps is fp32 (Hugging Face's Gemma, OLMo 2 and gpt-oss RMSNorms); ``fp32_centred``: a
    LayerNorm written in PyTorch with an upcast that subtracts the mean twice, once for the variance and once
    for the product with 1/std, and keeps both fp32 differences, 1/std and the fp32 normalised value (Hugging
    Face's CohereLayerNorm); for an RMSNorm, ``model``: the unfused form that upcasts, the weight's multiply where
    the model's code does it (``fp32_normalised`` where the model spec's ``norm_weight_fp32`` says so, else
    ``fp32_input``)."""

    rmsnorm: NormKeeps | Literal["model"]
    layernorm: NormKeeps
    layernorm_nobias: NormKeeps | Literal["model"] | None = Field(
        None,
        description="a LayerNorm without a bias, where it is written apart; model: as the model's code is written, "
        "fp32_centred where it multiplies by its weight in fp32 (the model's norm_weight_fp32: Cohere's "
        "CohereLayerNorm), else torch's kernel (input: MPT, DBRX); None: as layernorm",
    )


class MlpRule(Rule):
    gated: Literal["unfused", "fused"] = Field(
        description="a gated MLP (SwiGLU, GeGLU): unfused keeps the gate and up outputs, act(gate) and the "
        "product; fused keeps the gate and up outputs and the product"
    )
    gelu: Literal["fused", "model"] = Field(
        description="a GELU: fused is one kernel, which keeps its input (and the next operation its output); model: "
        "the GELU the model's code calls (the model spec's gelu), a kernel or written op by op, each operation "
        "keeping its own inputs"
    )


class RotaryRule(Rule):
    tables: StrictBool = Field(
        description="cos and sin tables of s·d_rope elements each, in the activation dtype, made once per forward "
        "pass and kept for backward (shared by the layers)"
    )


class MoeRule(Rule):
    routing_bytes: float = Field(
        ge=0, description="bytes kept per (token, expert) assignment for the routing: index tensors and weights"
    )
    weighted_outputs: StrictBool = Field(
        description="the experts' outputs are kept twice: before and after the multiply by the routing weights "
        "(an index_add that keeps its source)"
    )
    routing_token_bytes: float = Field(
        0.0,
        ge=0,
        description="bytes kept per token beyond the per-assignment ones: the fp32 sum a token's k weights are "
        "divided by, where the router normalises them; a row map's column per token",
    )
    score_bytes: float = Field(
        4.0,
        ge=0,
        description="bytes kept per router score (a token's score for each expert): its fp32 probability, or what "
        "the framework's fused router and permutation keep per token and expert",
    )
    score_label: str = Field("router probabilities (fp32)", description="what the kept scores are, in a line")
    router: Literal["activation", "model", "fp32"] = Field(
        "activation",
        description="the router's matmul: on the norm output in the activation dtype (kept once, with the experts' "
        "input); as the model's code runs it: where the model spec's moe.router_fp32 says, on an fp32 copy of "
        "its input, which is kept too; or fp32, under an fp32 autocast whatever the model: fp32 copies of its input "
        "and of its weight are kept, and the norm output only where shared experts read it",
    )
    probs_in_activation: StrictBool = Field(
        default=False,
        description="the routing weights multiply inside the experts' fused activation, so the experts' outputs come "
        "out weighted and neither they nor a weighted copy are kept (the combine only scatters them back)",
    )
    outputs_fp32: StrictBool = Field(
        default=False,
        description="the combine casts the experts' outputs to fp32 and multiplies them by the routing weights "
        "there: the fp32 copy is kept for the product (4 bytes an element), the weighted product is not",
    )


class AttentionRule(Rule):
    eager_softmax: Literal["activation", "fp32", "model"] = Field(
        description="eager attention's softmax: in the activation dtype (kept once), or in fp32, kept, and its "
        "cast copy kept by the matmul with V; model: as the model's code runs it (the model spec's eager_softmax)"
    )
    q_copies: PositiveInt = Field(
        1, le=MAX_COPIES, description="Q-sized tensors kept (a fused QKV output kept alive adds one)"
    )
    k_copies: PositiveInt = Field(1, le=MAX_COPIES, description="K-sized tensors kept")
    v_copies: PositiveInt = Field(1, le=MAX_COPIES, description="V-sized tensors kept")
    checkpoint_keeps_mask: StrictBool = Field(
        False,
        description="under full recomputation, the layers' keyword arguments stay alive for the rebuilt layers "
        "(held by the checkpointed layers' arguments): the int64 position ids, eager attention's additive "
        "[b, 1, s, s] mask (activation dtype) of each kind of layer, global and sliding, and with fused attention "
        "the sliding layers' boolean mask where window_mask makes one",
    )
    fused_qkv_view: StrictBool = Field(
        False,
        description="a model whose Q, K and V come out of one fused linear (fused_linears: qkv) slices them as "
        "views of its output: where RoPE or a QK-norm makes Q and K anew and V reaches the kernel uncopied, the "
        "whole fused output stays alive with V (one more Q and one more K); and the new Q, made from a strided "
        "slice, is laid out (b, H, s, d), so a fused kernel's output is too, and the output projection reads a "
        "copy of it (one more s·b·H·d_v)",
    )
    partial_rotary_cat: StrictBool = Field(
        False,
        description="where RoPE rotates part of each head (rotary_fraction below 1, and MLA's d_rope of d_qk), Q is "
        "the concatenation of its rotated and passed parts, made after the heads are transposed, so laid out (b, H, "
        "s, d): a fused kernel's output is too, and the output projection reads a copy of it (one more s·b·H·d_v), "
        "as with fused_qkv_view",
    )
    mla_value_view: StrictBool = Field(
        False,
        description="MLA's V is a slice of the key-value up-projection's output, which holds K's no-RoPE part too "
        "(DeepseekV3Attention's split): the fused kernel keeping V keeps that output whole, one more s·b·H·d_nope",
    )
    indexer_key_copy: StrictBool = Field(
        False,
        description="a sparse-attention indexer's scores are torch.matmul of its fp32 queries [b, s, H_I, d_I] by "
        "its one key [b, 1, d_I, s], which broadcasts the key over every query and copies it: b·s·d_I·s fp32 "
        "beside the b·s·H_I·s fp32 scores in each layer's forward, and in its rebuild (DeepseekV32Indexer)",
    )
    window_mask: StrictBool = Field(
        False,
        description="fused attention in a sliding-window layer whose window is shorter than the sequence is "
        "given an explicit mask: the kernel keeps it, [b, 1, s, s] in the activation dtype, and K and V reach "
        "it repeated to all H heads (the kernel's own grouped-query path takes no mask)",
    )
    eager_sink_softmax: Literal["activation", "fp32"] | None = Field(
        None,
        description="eager attention with sinks (gpt-oss): the softmax over the s scores and the sink column is "
        "computed and kept once in this dtype, the matmul with V reading a view of it; None: as eager_softmax",
    )
    sink_max_indices: StrictBool = Field(
        False,
        description="eager attention with sinks subtracts each row's maximum through autograd, which keeps the "
        "max's int64 indices (b·H·s)",
    )
    broadcast_kv_math: StrictBool = Field(
        False,
        description="fused attention given K and V at fewer heads than Q and no enable_gqa (the model spec's "
        "sdpa_broadcast_kv: Falcon-7B's own SDPA call) runs PyTorch's math path, which no fused kernel of torch 2.13 "
        "replaces on any device: fp32 copies of Q, K and V and the fp32 softmax kept (engine.memory.sdpa_math)",
    )
    compressed_kernels: Literal["eager", "fused"] = Field(
        "eager",
        description="DeepSeek-V4's compressed attention and hyper-connections: eager (transformers' PyTorch path: "
        "every key scored, the fp32 softmax kept) or fused (Megatron-Core's sparse kernels, each query gathering its "
        "window and its entries, keeping the log-sum-exp; its fused mHC keeping the streams once)",
    )
    dropout_math: StrictBool = Field(
        False,
        description="attention dropout sends SDPA to PyTorch's math path, as on the CPU, whose fused kernel takes "
        "no dropout (CUDA's flash kernel does: false for a GPU); it keeps the fp32 dropout mask and output too",
    )


class LossRule(Rule):
    fused_linear: StrictBool = Field(
        False,
        description="the output head and the cross-entropy fused and chunked (Liger's fused linear cross-entropy): "
        "the logits are never whole, and the head input's gradient, made in the forward, is kept instead of the "
        "head input; saved_bytes and transient_bytes are then 0",
    )
    saved_bytes: float = Field(ge=0, description="bytes kept for backward per logit element (s·b·V/TP)")
    transient_bytes: float = Field(
        ge=0,
        description="bytes per logit element the loss holds beyond the saved ones at its busiest moment: the "
        "head's output, upcast copies, the logits' gradients",
    )
    moved_bytes: tuple[float, float] | None = Field(
        None,
        description="bytes the loss's kernels read and write per logit element, forward and backward, where the "
        "profile states them; null: an upcast and the softmax's passes, ε + 3ℓ forward and 2ℓ + ε backward (ℓ the "
        "saved bytes, ε the logits')",
    )


class StatesRule(Rule):
    grad_bytes: float | None = Field(
        None, gt=0, description="bytes per gradient the framework accumulates into (None: the precision recipe's)"
    )
    weights: Literal["recipe", "master_only"] = Field(
        "recipe",
        description="recipe: the recipe's weights and master copy; master_only: only the master copy persists "
        "and the compute-dtype weights exist gathered, a layer or two at a time (FSDP2 mixed precision)",
    )
    ddp_bucket_copy: StrictBool = Field(
        False,
        description="without ZeRO and with DP > 1, DDP's buckets hold a second copy of the gradients in the "
        "weights' dtype (gradient_as_bucket_view False)",
    )
    compute_grads_transient: StrictBool = Field(
        False,
        description="each backward makes the gradients in the weights' dtype before adding them into the "
        "fp32 buffer: they exist at once at the end of the backward pass",
    )
    grads_lifetime: Literal["run", "step"] = Field(
        "run",
        description="run: the gradients live in buffers allocated once for the whole run (Megatron's and "
        "nanotron's contiguous buffers, DeepSpeed's partitions); step: autograd makes each .grad during the "
        "backward and zero_grad(set_to_none=True) frees them after the optimizer step, so a step of one "
        "micro-batch begins its backward with none",
    )


class BuffersRule(Rule):
    gathered_layers: NonNegativeInt = Field(
        description="under ZeRO-3/FSDP, layers whose parameters are gathered at once (the one in use and the "
        "prefetched)",
    )
    reduce_scatter_bytes: float = Field(
        0,
        ge=0,
        description="under ZeRO-3/FSDP, bytes per parameter of one layer whose gradients are being "
        "reduce-scattered (unsharded gradients and the reduction's own buffer)",
    )
    head_gathered: StrictBool = Field(
        False,
        description="under ZeRO-3/FSDP, the output head (and final norm) stays gathered from its forward to "
        "its backward",
    )
    reduce_bucket_elements: float = Field(
        0,
        ge=0,
        description="gradient elements of the data-parallel reduce bucket a framework allocates apart from "
        "the gradients (DeepSpeed's IPG bucket), in the gradient dtype",
    )
    sequence_parallel_gather: NonNegativeInt = Field(
        0,
        description="with sequence parallelism, buffers of one full-sequence layer input (s·b·h) each for "
        "the all-gather",
    )
    pipeline_tensors: NonNegativeInt = Field(
        0, description="layer-boundary tensors (s·b·h each) pipeline send/receive holds at once"
    )
    workspace_bytes: float = Field(ge=0, description="cuBLAS and NCCL workspaces, in bytes, inside PyTorch's pool")
    communication_unit_elements: float = Field(
        0,
        ge=0,
        description="Megatron-FSDP's least communication unit, in elements: ZeRO-2 and ZeRO-3 are Megatron-FSDP, "
        "whose ZeRO-3 all-gather prefetches layers until half a unit is in flight and keeps the modules outside "
        "the layers gathered, and whose reduce-scatter queue keeps unsharded gradient buckets until more than a "
        "unit waits (engine/memory/fsdp_buffers.py); 0: gathered_layers, reduce_scatter_bytes and head_gathered "
        "count instead",
    )


class OptimizerStepRule(Rule):
    temporaries: Literal["none", "foreach"] = Field(
        description="foreach: torch.optim's multi-tensor step makes one state-sized temporary for all the "
        "parameters a GPU updates; none: a fused kernel works tensor by tensor"
    )
    fp32_grad_copy: StrictBool = Field(
        False,
        description="the step makes an fp32 copy of this GPU's share of the gradients (DeepSpeed's fp32 "
        "gradient partition)",
    )


class AllocatorRule(Rule):
    fragmentation: float = Field(
        ge=0,
        description="reserved memory over allocated, less one: what the caching allocator holds beyond live "
        "tensors at the peak",
    )
    context_bytes: float = Field(
        ge=0, description="the CUDA context and the kernels cuBLAS loads, outside PyTorch's pool, in every process"
    )
    nccl_bytes: float = Field(
        0,
        ge=0,
        description="a NCCL communicator's buffers and kernels, outside PyTorch's pool, where the run spans more "
        "than one GPU",
    )
    allowance_bytes: float = Field(
        0, ge=0, description="a flat allowance instead of the parts above (the idealised profile's)"
    )


AttentionKernel = Literal["flash2", "flash3", "eager"]
TpOverlap = Literal["none", "backward", "full"]


ZeroStages = tuple[Literal[0, 1, 2, 3], ...]


class ParallelismRule(Rule):
    """Which ZeRO stages the framework runs, alone and beside pipeline parallelism, and whether it pipelines at all:
    a layout outside them is one its users cannot launch, which ``check_layout`` refuses and the planner never
    offers."""

    source: str = Field("no ZeRO stage is refused: the framework's code was not read for one", min_length=1)
    zero_stages: ZeroStages = Field((0, 1, 2, 3), description="the ZeRO stages the framework has")
    zero_stages_with_pipeline: ZeroStages = Field(
        (0, 1, 2, 3), description="the ZeRO stages it runs beside pipeline parallelism (PP > 1)"
    )
    pipeline: StrictBool = Field(True, description="whether it trains with pipeline stages at all (PP > 1)")
    instead: str = Field("", description="what to run instead of a refused stage, for the error message")
    hsdp_shard_optimizer: StrictBool = Field(True, description="whether it can shard the optimizer across HSDP's "
                                             "groups too (HFSDP, Megatron-FSDP's); FSDP2 cannot")  # fmt: skip
    uneven_counted_split: StrictBool = Field(
        False,
        description="whether the layers and an embedding or loss counted as a layer may divide unevenly over the "
        "pipeline's parts, the earlier ones taking one more (torchtitan's generate_llm_fqn_per_model_part; "
        "Megatron-LM asserts an even split)",
    )


SelectiveRecompute = Literal["attention_core", "matmuls"]


class RecomputeRule(Rule):
    """What ``--recompute selective`` recomputes under the framework: ``attention_core``, Megatron-LM's selective
    recomputation (Korthikanti et al. 2022 §4.2.2: the attention core's tensors dropped and rebuilt); ``matmuls``,
    torchtitan's per-operator selective checkpointing (each block keeps the outputs of its matmuls but every second
    one, of its attention kernel and of routing's top-k, and recomputes every other operator;
    ``engine.memory.op_checkpoint``)."""

    source: str = Field(
        "Megatron-LM's selective recomputation of the attention core (Korthikanti et al. 2022 §4.2.2)", min_length=1
    )
    selective: SelectiveRecompute = Field("attention_core", description="what selective recomputation keeps")
    fused_qkv: StrictBool = Field(
        False, description="matmuls: Q, K and V are projected by one matmul (one output kept or recomputed), not three"
    )


class Fp8Rule(Rule):
    """What the framework keeps under an fp8 recipe (``PrecisionRecipe.fp8``): ``none``, the activation dtype's
    count (a framework whose fp8 storage lmcalc has not read); ``transformer_engine``, Transformer Engine's linear
    layers, which save their input quantised for the weight gradient, keep a quantised copy of each weight and
    quantise each output gradient in the backward (``engine.memory.fp8_storage``); ``high_precision``, linear
    layers that save their 16-bit input and weight and cast them again in the backward (torchao's float8), so that
    fp8 changes nothing stored."""

    source: str = Field("lmcalc's default: fp8 storage not read from this framework", min_length=1)
    saved: Literal["none", "transformer_engine", "high_precision"] = Field(
        "none", description="whose fp8 storage the profile follows"
    )
    primary_weights: StrictBool = Field(
        False,
        description="the layers' weights are kept quantised (fp8 primary weights: Megatron-LM's --fp8-param-gather), "
        "with no 16-bit copy beside them",
    )


class RouterKernel(Spec):
    """One memory-bound kernel an MoE layer's router launches, and the bytes it moves per (token, expert) score and
    per element of its input."""

    name: str = Field(min_length=1)
    bytes_per_score: float = Field(
        0.0, ge=0, description="bytes it reads and writes per (token, expert) score, with the logits in bf16"
    )
    bytes_per_input: float = Field(
        0.0, ge=0, description="bytes it reads and writes per element of the router's input (h a token), in bf16"
    )
    unpadded_only: StrictBool = Field(
        False, description="launched only where an expert capacity drops tokens without padding to the capacity"
    )


class RouterRule(Rule):
    """The memory-bound kernels of an MoE layer's router around its matmul (the matmul is timed with the GEMMs):
    the scores and the top-k, the load-balancing loss and its logging, forward and backward, and with an expert
    capacity the mask that drops the tokens beyond it."""

    forward: tuple[RouterKernel, ...]
    backward: tuple[RouterKernel, ...]
    capacity_forward: tuple[RouterKernel, ...] = Field(default_factory=no_items)
    capacity_backward: tuple[RouterKernel, ...] = Field(default_factory=no_items)


class SpeedRule(Rule):
    """How fast a framework runs the kernels of a step, beyond what they count: which fused attention kernel it
    calls, how much host time each GPU operation costs, and which communication it hides behind computation."""

    source: str = Field(
        "lmcalc's default for a profile that gives no speed rules: PyTorch eager with FlashAttention-2, nothing "
        "overlapped but DDP's bucketed gradient reduction",
        min_length=1,
    )
    attention_kernel: AttentionKernel = Field(
        "flash2",
        description="the fused attention kernel (with attention 'flash'): flash2 (FlashAttention-2, PyTorch SDPA's "
        "flash backend) or flash3 (FlashAttention-3, cuDNN/Transformer Engine fused attention on Hopper and later)",
    )
    host_seconds_per_op: float = Field(
        1.5e-5,
        ge=0,
        description="CPU time to issue one GPU operation (Python, autograd, the dispatcher and the launch): when a "
        "micro-batch's operations take longer to issue than to run, the host sets the pace",
    )
    tp_overlap: TpOverlap = Field(
        "none",
        description="tensor-parallel collectives hidden behind GEMMs: none; backward (the input gradient's "
        "collective overlaps the weight-gradient GEMM, Megatron-LM's async TP); full (userbuffers comm-GEMM "
        "overlap, forward and backward)",
    )
    dp_overlap: Literal["always", "without_zero", "never"] = Field(
        "always",
        description="the gradient reduction bucketed behind the last micro-batch's backward pass: always; only "
        "without ZeRO (DDP's buckets, when ZeRO's own reduction waits for the backward pass); never",
    )
    param_gather_overlap: StrictBool = Field(
        False,
        description="ZeRO's parameter all-gathers prefetched behind computation (ZeRO-1/2 after the step, ZeRO-3 "
        "every layer)",
    )
    pp_overlap: StrictBool = Field(False, description="pipeline sends and receives overlapped with computation")
    zero3_network: Literal["all_nics", "one_nic"] = Field(
        "all_nics",
        description="how ZeRO-3's parameter gathers and gradient scatters use the network: all_nics (NCCL's "
        "rings over every NIC of the node, hierarchical) or one_nic (each GPU's whole share over its own NIC)",
    )
    hsdp_reduce: Literal["every_micro_batch", "last_micro_batch"] = Field("every_micro_batch", description="under "
        "HSDP with ZeRO-3, when the groups all-reduce their gradient shards: each backward (FSDP2) or the last one's "
        "(Megatron-FSDP)")  # fmt: skip
    moe_overlap: StrictBool = Field(
        False, description="expert all-to-all hidden behind another micro-batch's computation (DualPipe)"
    )
    fused_grad_accumulation: StrictBool = Field(
        False,
        description="the weight-gradient GEMM accumulates into the fp32 gradients (Megatron-LM's gradient "
        "accumulation fusion); otherwise each micro-batch's gradients are added in by a separate pass",
    )
    router: RouterRule | None = Field(
        None,
        description="the router's memory-bound kernels, where the profile's router code was read; null: not counted",
    )
    fp8_casts: Literal["fused", "separate"] = Field(
        "separate",
        description="with fp8 GEMMs: fused (Transformer Engine: the casts ride in the norm and activation kernels "
        "and the fp8 weights are kept for the step; only the transposed copies for the weight gradient cost a "
        "pass) or separate (a cast-and-transpose kernel for every operand of every GEMM: torchao's float8)",
    )


class FrameworkProfile(NamedSpec):
    """What a training framework keeps and allocates beyond the textbook count: each rule with its source."""

    display_name: str = ""
    aliases: tuple[str, ...] = Field(default_factory=no_items)
    description: str
    version: str = Field(description="the framework version (and commit) the rules were read from")
    norm: NormRule
    mlp: MlpRule
    rotary: RotaryRule
    moe: MoeRule
    attention: AttentionRule
    loss: LossRule
    states: StatesRule
    buffers: BuffersRule
    optimizer_step: OptimizerStepRule
    allocator: AllocatorRule
    speed: SpeedRule = Field(default_factory=lambda: SpeedRule.model_validate({}))
    parallelism: ParallelismRule = Field(default_factory=lambda: ParallelismRule.model_validate({}))
    recompute: RecomputeRule = Field(default_factory=lambda: RecomputeRule.model_validate({}))
    fp8: Fp8Rule = Field(default_factory=lambda: Fp8Rule.model_validate({}))
    transients: StrictBool = Field(
        True,
        description="count the transient peaks: the loss's logit-sized tensors and one layer's activation "
        "gradients during backward (the idealised profile does not)",
    )
    not_modelled: tuple[str, ...] = Field(default_factory=no_items)

    @property
    def label(self) -> str:
        return self.display_name or self.name
