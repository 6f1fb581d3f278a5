"""Layers that are a mixer or an FFN alone, behind one norm (Nemotron-H: NemotronHBlock holds one norm and one of
Mamba-2, attention, an MLP or an MoE). Every figure here is derived by hand from the shapes below; transformers' own
count, FLOPs, cache and saved tensors are compared in tests/test_hf_types.py, tests/test_validate_hf.py,
tests/test_mamba2.py and tests/test_framework_transformers.py (``nemotron-h-small``)."""

from __future__ import annotations

import pytest

from lmcalc.engine.inference.serving import Serving, inference_memory
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.blocks import block_kind
from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.model.params import count_params, layer_params
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

V, h, H, H_kv, d, f = 512, 64, 4, 2, 16, 96  # the vocabulary, width, heads, KV heads, head size, MLP width
INNER, HEADS, G, N, K = 128, 8, 2, 16, 4  # Mamba-2: inner width, heads, groups, state, kernel
E, k, f_e, f_s = 4, 2, 32, 48  # experts, top-k, an expert's width, the shared expert's
BLOCKS = "M-*E"  # layer 0 Mamba-2 alone, 1 an MLP alone, 2 attention alone, 3 an MoE alone


def nemotron_like(blocks: str = BLOCKS) -> ModelSpec:
    ids = {letter: [i for i, b in enumerate(blocks) if b == letter] for letter in "M*-E"}
    return ModelSpec.model_validate({
        "name": "single-blocks", "vocab_size": V, "hidden_size": h, "num_layers": len(blocks), "num_heads": H,
        "num_kv_heads": H_kv, "head_dim": d, "ffn_size": f, "ffn_kind": "gelu_mlp", "activation": "relu2",
        "norm_kind": "rmsnorm", "position_embedding": "none", "max_seq_len": 4096, "tied_embeddings": False,
        "mixer_only_layer_ids": ids["M"] + ids["*"], "ffn_only_layer_ids": ids["-"] + ids["E"],
        "mamba2": {"inner": INNER, "heads": HEADS, "groups": G, "state": N, "conv_kernel": K, "chunk": 16,
                   "attention_layer_ids": ids["*"]},
        "moe": {"num_experts": E, "experts_per_token": k, "expert_ffn_size": f_e, "shared_experts": 1,
                "shared_expert_ffn_size": f_s, "dense_layer_ids": ids["-"], "router_fp32": True} if ids["E"] else None,
    })  # fmt: skip


MAMBA = h * (2 * INNER + 2 * G * N + HEADS) + (INNER + 2 * G * N) * (K + 1) + 3 * HEADS + INNER + h * INNER
ATTENTION = h * H * d + 2 * h * H_kv * d + H * d * h
MLP = 2 * h * f
MOE = E * h + E * 2 * h * f_e + 2 * h * f_s
"""Each block by hand: Mamba-2's in_proj to z, x, B, C and Δ, its convolution (weight and bias) over x‖B‖C, Δ's
bias, A and D per head, the gated norm and out_proj; q, k, v and o; the MLP's two matrices; the router, the experts'
two matrices each and the shared expert's."""


def test_each_block_holds_its_own_tensors_and_one_norm():
    counts = count_params(nemotron_like())
    embedding_and_head, norms = 2 * V * h, 4 * h + h  # one norm a block, and the final norm
    assert counts.total == embedding_and_head + norms + MAMBA + MLP + ATTENTION + MOE
    # one token: every block but the 4 − 2 experts it is not routed to
    assert counts.active == counts.total - (E - k) * 2 * h * f_e


def test_the_average_layers_add_up_to_the_blocks():
    # the dense layers (0, 1, 2) and the MoE layer (3) at their averages: each holds the mixers and the norms at the
    # model's mix (L = 4), the dense layers the one MLP among their 3, the MoE layer its MoE
    spec = nemotron_like()
    assert layer_params(spec, True) == round((MAMBA + ATTENTION + 4 * h) / 4 + MOE)
    assert layer_params(spec, False) == round((MAMBA + ATTENTION + 4 * h) / 4 + MLP / 3)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "qwen3.5-397b-a17b", "lfm2-1.2b"])
def test_a_hybrids_layers_add_up_to_its_layer_tensors(name: str):
    # every layer of Qwen3-Next routes; its average layer held no attention or Gated DeltaNet tensors before (its
    # first and last layers' gradients, in the step's peak, were short of them)
    spec = resolve_model(name).spec
    counts = count_params(spec)
    outside = counts.embedding + counts.by_group.get("head", 0) + spec.hidden_size  # and the final norm
    layers = spec.moe_layers * layer_params(spec, True) + (spec.num_layers - spec.moe_layers) * layer_params(
        spec, False
    )
    assert layers == pytest.approx(counts.total - outside, abs=spec.num_layers)


def test_attention_and_the_mixers_run_in_their_blocks_alone():
    # forward FLOPs per token at s = 256: the weights' matmuls, 2 a weight (the router and the k experts of the
    # MoE block); the attention core in its one block of four, 2·keys·H·d for the scores and the values, the causal
    # kernel's keys (s + 1)/2; the logits
    spec, s = nemotron_like(), 256
    flops = forward_flops_per_token(spec, s)
    assert flops.projections == 2 * (ATTENTION + h * (2 * INNER + 2 * G * N + HEADS) + h * INNER)
    assert flops.mlp == 2 * (MLP + E * h + k * 2 * h * f_e + 2 * h * f_s)
    assert flops.attention_scores == flops.attention_values == 2 * 1 * (s + 1) / 2 * H * d
    assert flops.logits == 2 * h * V


def workload(spec: ModelSpec) -> Workload:
    return Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 256, 2,
                    framework=framework_profile("transformers"))  # fmt: skip


@pytest.mark.parametrize("blocks", [BLOCKS, "ME*EM-", "*-*E", "MM*-"])
def test_the_average_layers_keep_what_the_blocks_keep(blocks: str):
    # summed over the layers, the average dense and MoE layers keep what each block keeps as one of its kind: a
    # mixer block its norm and mixer, an FFN block its norm and FFN
    spec = nemotron_like(blocks)
    w = workload(spec)

    def kept(moe: bool, kind: str = "average") -> float:
        return sum(t.bytes for t in layer_saved_tensors(w, moe, kind))  # type: ignore[arg-type]

    blocks_kept = sum(kept(spec.is_moe_layer(i), block_kind(spec, i)) for i in range(spec.num_layers))
    routed = spec.moe_layers
    average = routed * kept(True) + (spec.num_layers - routed) * (kept(False) if routed < spec.num_layers else 0)
    assert average == pytest.approx(blocks_kept, rel=1e-12)


def test_a_mixer_block_keeps_no_ffn_and_an_ffn_block_no_mixer():
    spec = nemotron_like()
    w = workload(spec)
    attention = layer_saved_tensors(w, False, "attention")
    ffn_alone = layer_saved_tensors(w, True, "none")
    assert attention and all(t.block != "mlp" for t in attention)
    assert ffn_alone and all(t.block == "mlp" for t in ffn_alone)


def test_only_the_attention_block_keeps_a_kv_cache():
    # bf16 cache, 1 sequence of 1,000 tokens: K and V of H_kv·d each, in the one attention block of four; the two
    # Mamba-2 blocks would keep a state (here one), the FFN blocks nothing
    spec = nemotron_like("M*-E")
    memory = inference_memory(Serving(spec, batch=1, context=1000), 80 * 2**30)
    assert memory.layers == 1
    assert memory.kv_cache - memory.state_per_sequence == 1000 * 2 * H_kv * d * 2
    assert memory.state_per_sequence == (INNER + 2 * G * N) * K * 2 + HEADS * (INNER // HEADS) * N * 4


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"mixer_only_layer_ids": [0], "ffn_only_layer_ids": [0]}, "listed twice"),
        ({"mixer_only_layer_ids": [4]}, "not below num_layers"),
        ({"ffn_only_layer_ids": [0, 1, 2, 3]}, "leaves no layer with a mixer"),
        ({"ffn_only_layer_ids": [1], "norms_per_layer": 4}, "need norms_per_layer 2"),
    ],
)
def test_inconsistent_blocks_are_refused(fields: dict, says: str):
    base = nemotron_like().model_dump(exclude={"mixer_only_layer_ids", "ffn_only_layer_ids", "mamba2", "moe"})
    with pytest.raises(ValueError, match=says):
        ModelSpec.model_validate(base | fields)


def test_an_moe_needs_a_layer_with_an_ffn():
    # a model of mixer blocks alone (Mamba's) has no FFN, so no MoE either
    spec = nemotron_like().model_dump(exclude={"mixer_only_layer_ids", "ffn_only_layer_ids", "mamba2"})
    with pytest.raises(ValueError, match="moe: no layer is an MoE layer"):
        ModelSpec.model_validate(spec | {"mixer_only_layer_ids": [0, 1, 2, 3]})


def test_a_model_of_mixer_blocks_alone_holds_no_ffn():
    # Mamba-2 in all four layers, each behind its one norm (transformers' Mamba2Block): the mixers, four norms and
    # the final norm, the embedding and the head, and no FFN or attention tensor at all
    spec = nemotron_like("MMMM")
    counts = count_params(spec)
    assert counts.total == 2 * V * h + 5 * h + 4 * MAMBA
    assert set(counts.by_group) == {"embedding", "ssm", "norm", "head"}
    assert forward_flops_per_token(spec, 64).mlp == 0
