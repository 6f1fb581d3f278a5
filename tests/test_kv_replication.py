"""Tensor parallelism past the KV heads: what one GPU holds when TP exceeds the KV heads (GQA, MQA).

The issue asked for K/V weights replicated over the TP ranks that share a KV head. Megatron-Core does not
replicate them. Since core_v0.16.0 (commit f7dfb997, "Support TP greater than num_kv_heads by supporting QKV
activation sub-sharding"; read here at core_v0.16.1, 55ac7082):

- megatron/core/transformer/transformer_config.py:939-946 accepts query groups that are "a multiple or divisor of
  tensor_model_parallel_size";
- attention.py:1264 keeps one fused Q/K/V projection of (H + 2·H_kv)·d output rows, column-parallel, and
  tensor_parallel/layers.py:842 divides its rows evenly by TP (so TP must divide them): no weight is replicated,
  each rank holds 1/TP of the fused weight whatever the heads;
- attention.py:289-301 then gives each rank one query group (one KV head) and H/TP query heads;
  attention.py:1398-1411 all-gathers the fused output over TP and slices out the rank's group (q1 q2 k1 v1 | …),
  and attention.py:1465-1475 keeps the rank's H/TP query heads of it.

So per GPU the parameters (and the model states) stay the whole model's split by TP, and so do the FLOPs of the
projections (each rank computes 1/TP of the fused output) and of attention (H/TP heads against one KV head); what
changes is K and V: each rank keeps one whole KV head's, as many bytes as at TP = H_kv. (What the all-gather costs
in time is the step-time model's; that the gathered storage stays alive where a profile keeps the fused output
alive is noted in engine/memory/activations.py, not modelled.) Replication is what vLLM does when serving
(engine/inference/serving.py), and there the K/V weights per GPU do grow.

The figures below were measured with Megatron-Core itself: megatron-core 0.16.1 (PyPI) on the CPU, torch
2.13.0+cpu, 4 gloo processes as a TP group of 4, the local layer spec's SelfAttention (h 256, 8 heads of 32, no
bias), ``use_cpu_initialization``, the all-gather's ``torch.cuda.current_device`` stood in by the CPU;
``MEGATRON_SCRIPT`` is the script, and ``test_megatron_core_itself_on_the_cpu`` reruns it where megatron-core is
installed (it is not in the development environment, so it skips there).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.gpu_memory import bytes_on_gpu
from lmcalc.engine.model.params import count_params, weight_tensors
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout, check_tp_heads
from lmcalc.engine.parallel.sharding import stage_params, tp_divisor
from lmcalc.engine.search.plan import Pins, layouts, plan
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

BF16 = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec

# Megatron-Core's SelfAttention per rank at TP = 4, by query groups: the rows of linear_qkv (of 256 inputs), the
# columns of linear_proj (of 256 outputs), and the shapes [s, b, heads, d] of the query, key and value
# get_query_key_value_tensors returns for s 16, b 2.
MCORE_TP4 = {
    2: {"qkv_rows": 96, "proj_columns": 64, "q": [16, 2, 2, 32], "k": [16, 2, 1, 32], "v": [16, 2, 1, 32]},
    1: {"qkv_rows": 80, "proj_columns": 64, "q": [16, 2, 2, 32], "k": [16, 2, 1, 32], "v": [16, 2, 1, 32]},
}


def shaped(heads: int, kv_heads: int, head_size: int, hidden: int, layers: int = 1) -> ModelSpec:
    """A Llama-like model of these attention shapes (no bias, SwiGLU, RMSNorm)."""
    return ModelSpec(
        name=f"h{heads}-kv{kv_heads}-d{head_size}", vocab_size=1024, hidden_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_size, ffn_size=688, ffn_kind="swiglu",
        norm_kind="rmsnorm", tied_embeddings=False, position_embedding="rope", max_seq_len=128,
    )  # fmt: skip


def small(kv_heads: int) -> ModelSpec:
    """The measured attention's shapes: h 256, 8 heads of 32, ``kv_heads`` query groups."""
    return shaped(8, kv_heads, 32, 256)


def attention_weights_per_gpu(model: ModelSpec, tp: int) -> float:
    """The attention projections' weights one TP rank holds (lmcalc's split, ``sharding.tp_divisor``)."""
    return sum(t.numel / tp_divisor(t, model, tp) for t in weight_tensors(model) if t.group == "attention")


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_attention_weights_per_gpu_are_megatron_cores_past_the_kv_heads(kv_heads):
    # Per rank at TP 4: the fused Q/K/V projection (H + 2·H_kv)·d·h / t and the output projection h·H·d / t.
    # GQA, 2 groups: (8 + 4)·32·256/4 = 24,576 and 256·256/4 = 16,384, 40,960 in all;
    # MQA, 1 group: (8 + 2)·32·256/4 = 20,480 and 16,384, 36,864: no K/V weight is replicated.
    model, measured = small(kv_heads), MCORE_TP4[kv_heads]
    expected = (8 + 2 * kv_heads) * 32 * 256 // 4 + 256 * 8 * 32 // 4
    assert measured["qkv_rows"] * 256 + 256 * measured["proj_columns"] == expected
    assert attention_weights_per_gpu(model, 4) == expected
    check_tp_heads(model, 4)  # accepted, as Megatron-Core accepts it


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_each_rank_keeps_one_kv_head_past_the_kv_heads(kv_heads):
    # s 16, b 2, bf16, d 32: at TP 4 each rank keeps one KV head's K and V (Megatron-Core: k and v [16, 2, 1, 32]),
    # 16·2·1·32·2 = 2,048 bytes each, where an even split would give 16·2·H_kv·32·2/4 = 1,024·H_kv bytes;
    # Q keeps H/t = 2 heads (q [16, 2, 2, 32]): 16·2·2·32·2 = 4,096 bytes, split as before.
    w = Workload(small(kv_heads), BF16, ADAMW, 16, 2, "flash", "none", framework=framework_profile("idealised"))
    on_gpu = {t.label: bytes_on_gpu(t, Layout(tp=4)) for t in layer_saved_tensors(w, False)}
    measured = MCORE_TP4[kv_heads]
    assert on_gpu["K (after RoPE)"] == on_gpu["V"] == 16 * 2 * 1 * 32 * 2 == measured["k"][2] * 16 * 2 * 32 * 2
    assert on_gpu["Q (after RoPE)"] == 16 * 2 * 2 * 32 * 2 == measured["q"][2] * 16 * 2 * 32 * 2


def test_kv_bytes_per_gpu_stop_falling_at_the_kv_heads():
    # Llama 3.1 70B, 8 KV heads of 128, s 8192, b 1, bf16: K on one GPU is 8192·8·128·2/t bytes up to t = 8,
    # then one head's, 8192·128·2 = 2,097,152 bytes, at t = 16 and 32 as at 8; Q keeps halving (64 heads).
    w = Workload(
        resolve_model("llama-3.1-70b").spec, BF16, ADAMW, 8192, 1, "flash", "none", framework=framework_profile()
    )
    saved = {t.label: t for t in layer_saved_tensors(w, False)}
    k = [bytes_on_gpu(saved["K (after RoPE)"], Layout(tp=t)) for t in (4, 8, 16, 32)]
    q = [bytes_on_gpu(saved["Q (after RoPE)"], Layout(tp=t)) for t in (4, 8, 16, 32)]
    assert k == [2 * 2_097_152, 2_097_152, 2_097_152, 2_097_152]
    assert q == [8192 * 64 * 128 * 2 / t for t in (4, 8, 16, 32)]


def test_eager_attention_expands_kv_to_the_ranks_query_heads():
    # Eager attention (no selective recomputation) keeps K and V expanded to every query head: H/t heads a rank,
    # however few the KV heads. MQA, s 16, b 2, at TP 4: 2 heads of 32, 16·2·2·32·2 = 4,096 bytes.
    w = Workload(small(1), BF16, ADAMW, 16, 2, "eager", "none", framework=framework_profile("idealised"))
    k = next(t for t in layer_saved_tensors(w, False) if t.label.startswith("K"))
    assert bytes_on_gpu(k, Layout(tp=4)) == 16 * 2 * 2 * 32 * 2


def test_parameters_per_gpu_past_the_kv_heads_are_the_model_split_by_tp():
    # Llama 3.1 70B at TP 16 (8 KV heads): every matrix is split 16 ways, the norms are replicated.
    # 70,553,706,496 parameters; norms 2·80·8192 + 8192 = 1,318,912; the rest 70,552,387,584 / 16 = 4,409,524,224;
    # per GPU 4,409,524,224 + 1,318,912 = 4,410,843,136. The model's own count is unchanged.
    model = resolve_model("llama-3.1-70b").spec
    w = Workload(model, BF16, ADAMW, 8192, framework=framework_profile())
    assert count_params(model).total == 70_553_706_496
    assert stage_params(w, Layout(tp=16), 0).total == 4_410_843_136


@pytest.mark.parametrize(
    "heads,kv_heads,head_size,tp,message",
    [
        (24, 6, 128, 4, "TP=4 does not divide the 6 KV heads"),
        (24, 8, 128, 12, "TP=12 is not a multiple of the 8 KV heads"),
        # PaLM 540B's shape (48 heads of 256, multi-query): (48 + 2)·256 = 12,800 fused rows, not divisible by 12
        (48, 1, 256, 12, "TP=12 does not divide the \\(H \\+ 2·H_kv\\)·d = 12,800 rows"),
    ],
)
def test_tp_past_the_kv_heads_is_refused_where_megatron_core_refuses_it(heads, kv_heads, head_size, tp, message):
    with pytest.raises(LmcalcError, match=message):
        check_tp_heads(shaped(heads, kv_heads, head_size, heads * head_size), tp)


def test_palm_shaped_multi_query_at_tp_8_and_16_is_accepted():
    # 48 heads of 256, one KV head: 48/8 and 48/16 query heads a rank, 12,800/8 = 1,600 and 12,800/16 = 800 rows.
    # Serving replicates instead (vLLM), with no fused-rows rule: TP 12 is accepted there.
    spec = shaped(48, 1, 256, 18432)
    for tp in (8, 16):
        check_tp_heads(spec, tp)
    check_tp_heads(spec, 12, replicate_kv=True)


def test_the_search_tries_tp_past_the_kv_heads():
    # Llama 3.1 70B (64 heads, 8 KV heads) on nodes of 16: TP 16 is among the degrees tried, and is planned.
    model = resolve_model("llama-3.1-70b").spec
    cluster = parse_cluster("2x16xH100")
    w = Workload(model, BF16, ADAMW, 8192, overhead_bytes=0.0, framework=framework_profile())
    assert {layout.tp for layout, _ in layouts(w, cluster, 64, Pins(pp=1, cp=1, zero=3, micro_batch=1))} == {
        1,
        2,
        4,
        8,
        16,
    }
    found = plan(w, cluster, 64, Pins(tp=16, pp=2, cp=1, zero=1, recompute="selective"))
    assert found.fitting and {c.tp for c in found.fitting} == {16}
    check_layout(found.fitting[0].workload, found.fitting[0].layout, cluster)


MEGATRON_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, world, out, port):
    torch.cuda.current_device = lambda: "cpu"  # the all-gather allocates on the current CUDA device
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    for groups in (2, 1):  # both KV-head counts in one start: torch and Megatron-Core are imported once
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        config = TransformerConfig(
            num_layers=1, hidden_size=256, num_attention_heads=8, num_query_groups=groups, kv_channels=32,
            ffn_hidden_size=688, use_cpu_initialization=True, add_bias_linear=False, tensor_model_parallel_size=world,
            params_dtype=torch.float32,
        )
        spec = get_gpt_layer_local_spec().submodules.self_attention
        attention = SelfAttention(config, spec.submodules, layer_number=1, attn_mask_type=AttnMaskType.causal)
        q, k, v = attention.get_query_key_value_tensors(torch.randn(16, 2, 256))
        found = {
            "qkv_rows": attention.linear_qkv.weight.shape[0], "proj_columns": attention.linear_proj.weight.shape[1],
            "q": list(q.shape), "k": list(k.shape), "v": list(v.shape),
        }
        with open(os.path.join(out, f"rank{rank}-kv{groups}.json"), "w") as f:
            json.dump(found, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    out = sys.argv[1]
    with socket.socket() as probe:  # a port free now, not a fixed one another run may hold
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(run, args=(4, out, port), nprocs=4)
"""


@pytest.fixture(scope="module")
def megatron_core_measured(tmp_path_factory) -> Path:
    """Megatron-Core's SelfAttention at TP 4 over gloo, with 2 and with 1 KV head: one rank{r}-kv{n}.json each."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("mcore")
    script = out / "measure.py"
    script.write_text(MEGATRON_SCRIPT)
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True, timeout=600)
    return out


@pytest.mark.torch  # and it starts processes
@pytest.mark.cli
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_megatron_core_itself_on_the_cpu(kv_heads, megatron_core_measured):
    for rank in range(4):
        found = json.loads((megatron_core_measured / f"rank{rank}-kv{kv_heads}.json").read_text())
        assert found == MCORE_TP4[kv_heads]
