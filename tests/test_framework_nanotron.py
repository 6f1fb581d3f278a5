"""The nanotron framework profile against the Ultra-Scale Playbook's measured memory: nanotron training runs on one
node of 8 H100-80GB, 4096-token sequences, 256 sequences a step (the playbook's single-node benchmark figures).

Each measured row is compared with lmcalc's ``reserved`` bytes of the first pipeline stage, in GiB: the playbook's
figure comes from world rank 0, which is pipeline stage 0, and is torch.cuda.max_memory_reserved() or
max_memory_allocated() divided by 1024³ (labelled GB); which of the two the playbook plotted is not stated, and the
residuals point to the reserved one. The configurations the playbook lists as crashed or out of memory on one node
must not fit lmcalc's verdict on 80 GB (its most loaded GPU). docs/memory-accuracy.md shows the same comparison.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

import pytest

from lmcalc.engine.memory.gpu_memory import GpuMemory, gpu_memory, most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec
from lmcalc.units import GiB

CAPACITY = 85_028_896_768  # an H100 80GB as CUDA gives it (deviceQuery: 81090 MBytes), bytes
MEDIAN_TARGET = 0.10  # median |predicted / measured − 1| over the rows
ROW_TARGET = 0.25  # |predicted / measured − 1| of each row

# The benchmarked shapes, from huggingface/nanotron scripts/scaling_benchmarks.py @e24d2483 (branch
# nouamanetazi/ultrascale-playbook): model_configs (layers, hidden, heads, intermediate) 1B (16, 2048, 32, 8192),
# 3B (28, 3072, 32, 8192), 8B (32, 4096, 32, 14336), and the commented-out "70B" (80, 8192, 64, 28672), which at
# multi-head attention and this vocabulary has 80.0e9 parameters: the playbook's "80B". NUM_KEY_VALUE_HEADS = None,
# so num_key_value_heads = num_attention_heads (multi-head attention, no GQA); VOCAB_SIZES = [131072];
# tie_word_embeddings = intermediate_size < 10_000 (1B and 3B tied, 8B and 80B untied).
VOCAB = 131072
SEQ = 4096  # the playbook's fixed sequence length (the reference file's `fixed`)
GLOBAL_BATCH = 256  # sequences
SHAPES = {  # label: (layers, hidden, heads, intermediate)
    "1B": (16, 2048, 32, 8192),
    "3B": (28, 3072, 32, 8192),
    "8B": (32, 4096, 32, 14336),
    "80B": (80, 8192, 64, 28672),
}


def playbook_model(label: str) -> ModelSpec:
    layers, hidden, heads, ffn = SHAPES[label]
    return ModelSpec(
        name=f"playbook-{label}",
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,  # num_kv_heads left out: multi-head attention
        ffn_size=ffn,
        ffn_kind="swiglu",
        norm_kind="rmsnorm",
        tied_embeddings=ffn < 10_000,
        position_embedding="rope",
        max_seq_len=SEQ,
    )


def first_stage_layers(label: str, pp: int) -> int:
    """The decoder layers nanotron puts on pipeline stage 0: huggingface/nanotron src/nanotron/models/base.py
    build_model (67c5ebb6), with the block costs of models/llama.py get_block_compute_costs: a decoder layer costs
    4·H·d·h + 3·f·h = 4h² + 3h·f, the lm_head V·h, the embedding (and the other blocks) 0. The blocks are walked in
    order, each placed on the current rank; once the cumulative cost exceeds the rank's threshold (total · (r+1)/pp)
    the next block goes to the next rank, so stage 0 keeps the layer that crosses total/pp. At an exact tie (the 1B
    model at pp 2: ten layers are exactly half the cost) the comparison is strict and stage 0 takes one more."""
    layers, hidden, _, ffn = SHAPES[label]
    layer_cost = 4 * hidden * hidden + 3 * hidden * ffn
    threshold = (layers * layer_cost + VOCAB * hidden) / pp
    cumulative = 0
    for count in range(1, layers + 1):
        cumulative += layer_cost
        if cumulative > threshold:
            return count
    return layers


class Run(NamedTuple):
    model: str
    tp: int
    pp: int
    dp: int
    zero: int
    micro_batch: int
    grad_accum: int
    measured_gib: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.model} tp{self.tp} pp{self.pp} dp{self.dp} zero{self.zero} mbs{self.micro_batch}"


# The playbook's measured runs: vinjn/nanotron-ultrascale-playbook@924e4d0b assets/data/benchmarks/
# benchmarks_interactive.html, hover text of the Nodes: 1 points (as collected in the project's shared reference,
# playbook_single_node.yaml): model, tp, pp, dp, zero, micro-batch, grad-accum, GPU memory (GB as labelled; GiB).
ROWS = [
    Run("1B", 1, 1, 8, 0, 1, 32, 36.7),
    Run("1B", 1, 1, 8, 0, 2, 16, 50.2),
    Run("1B", 1, 1, 8, 1, 1, 32, 24.2),
    Run("1B", 1, 2, 4, 0, 1, 64, 26.8),
    Run("1B", 1, 2, 4, 1, 1, 64, 20.6),
    Run("1B", 2, 1, 4, 0, 1, 64, 19.5),
    Run("1B", 2, 1, 4, 1, 1, 64, 12.5),
    Run("1B", 4, 1, 2, 0, 1, 128, 10.4),
    Run("1B", 8, 1, 1, 0, 1, 256, 5.4),
    Run("1B", 8, 1, 1, 0, 16, 16, 38.3),
    Run("3B", 1, 1, 8, 1, 1, 32, 50.8),
    Run("3B", 1, 1, 8, 1, 2, 16, 69.8),
    Run("3B", 1, 2, 4, 0, 1, 64, 59.7),
    Run("3B", 1, 2, 4, 1, 1, 64, 41.5),
    Run("3B", 2, 1, 4, 0, 1, 64, 45.5),
    Run("3B", 2, 1, 4, 1, 1, 64, 27.3),
    Run("3B", 4, 1, 2, 0, 1, 128, 23.4),
    Run("3B", 8, 1, 1, 0, 1, 256, 11.7),
    Run("8B", 1, 4, 2, 1, 1, 128, 63.1),
    Run("8B", 1, 8, 1, 0, 1, 256, 62.5),
    Run("8B", 2, 1, 4, 1, 1, 64, 65.2),
    Run("8B", 2, 2, 2, 0, 1, 128, 63.6),
    Run("8B", 2, 2, 2, 1, 1, 128, 53.7),
    Run("8B", 4, 1, 2, 0, 1, 128, 51.4),
    Run("8B", 4, 1, 2, 1, 1, 128, 36.1),
    Run("8B", 8, 1, 1, 0, 1, 256, 24.4),
]


def workload(run: Run) -> Workload:
    return Workload(
        playbook_model(run.model),
        resolve_precision("bf16-mixed").spec,  # bf16 weights, fp32 master copy (the profile sets fp32 gradients)
        resolve_optimizer("adamw").spec,
        SEQ,
        run.micro_batch,
        "flash",  # flash_attn_varlen_func
        "none",  # the benchmark config sets no recompute_layer
        framework=framework_profile("nanotron"),
    )


def layout(run: Run) -> Layout:
    split = PipelineSplit(first_stage_layers=first_stage_layers(run.model, run.pp)) if run.pp > 1 else PipelineSplit()
    return Layout(
        dp=run.dp,
        tp=run.tp,
        pp=run.pp,
        zero=run.zero,
        sequence_parallel=run.tp > 1,  # tp_mode REDUCE_SCATTER
        grad_accum=run.grad_accum,
        split=split,
    )


def first_stage(run: Run) -> GpuMemory:
    return gpu_memory(workload(run), layout(run), 0)


def error(run: Run) -> float:
    """predicted / measured − 1, stage 0's reserved bytes against the playbook's figure (both GiB)."""
    return first_stage(run).reserved / GiB / run.measured_gib - 1


# The playbook's crashed_or_oom_on_one_node list; 'mbs>=8' is tested at 8, the 80B model ("all 80B configs") at
# layouts of 8 GPUs that its sweeps used on one node: pure TP, pure PP, and mixes with ZeRO-1.
OOM = [
    Run("1B", 1, 2, 4, 1, 8, GLOBAL_BATCH // 4 // 8),
    Run("3B", 1, 1, 8, 0, 1, GLOBAL_BATCH // 8),
    Run("8B", 1, 1, 8, 0, 1, GLOBAL_BATCH // 8),
    Run("8B", 1, 1, 8, 1, 1, GLOBAL_BATCH // 8),
    Run("8B", 2, 1, 4, 0, 1, GLOBAL_BATCH // 4),
    Run("80B", 8, 1, 1, 0, 1, GLOBAL_BATCH),
    Run("80B", 1, 8, 1, 0, 1, GLOBAL_BATCH),
    Run("80B", 4, 2, 1, 0, 1, GLOBAL_BATCH),
    Run("80B", 2, 4, 1, 0, 1, GLOBAL_BATCH),
    Run("80B", 1, 1, 8, 1, 1, GLOBAL_BATCH // 8),
]

# Rows that miss the per-row target today, each with what is known; strict, so that one that starts to pass is seen.
KNOWN_MISSES = {
    "1B tp8 pp1 dp1 zero0 mbs16": (
        "33 % low (25.6 GiB predicted, 38.3 measured): 12.7 GiB that the rules read from nanotron's source do not "
        "give; at micro-batch 1 the same layout is 18 % low (4.4 against 5.4), so the excess grows with the "
        "micro-batch at TP 8; its cause was not found in nanotron's source"
    ),
}


def _param(run: Run):
    reason = KNOWN_MISSES.get(run.label)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(run, marks=marks, id=run.label.replace(" ", "-"))


def test_the_cost_rule_splits_as_nanotron_does():
    # 1B at pp 2: layer 67,108,864, head 268,435,456, total 1,342,177,280; ten layers are exactly half, so
    # nanotron's strict '>' puts an eleventh on stage 0 (the research notes: "stage0 = embedding + 11 layers").
    assert first_stage_layers("1B", 2) == 11
    assert first_stage_layers("3B", 2) == 16  # 3,573,547,008 / 2 over 113,246,208 a layer: 15.8
    assert first_stage_layers("8B", 2) == 18
    assert first_stage_layers("8B", 4) == 9
    assert first_stage_layers("8B", 8) == 5
    # the shapes' parameter counts, as the scaling script's estimate_num_params gives them (MHA)
    from lmcalc.engine.model.params import count_params

    counts = {label: count_params(playbook_model(label)).total for label in SHAPES}
    assert round(counts["1B"] / 1e9, 3) == 1.342
    assert round(counts["3B"] / 1e9, 3) == 3.574
    assert round(counts["8B"] / 1e9, 2) == 8.86
    assert round(counts["80B"] / 1e9, 1) == 80.0


def test_rows_cover_the_global_batch():
    assert len(ROWS) == 26
    for run in ROWS:
        assert run.dp * run.micro_batch * run.grad_accum == GLOBAL_BATCH, run.label


def test_median_error_is_within_target():
    errors = [abs(error(run)) for run in ROWS]
    assert statistics.median(errors) <= MEDIAN_TARGET, f"median {statistics.median(errors):.1%}"


@pytest.mark.parametrize("run", [_param(run) for run in ROWS])
def test_each_row_is_within_target(run: Run):
    e = error(run)
    assert abs(e) <= ROW_TARGET, f"{run.label}: {e:+.1%}"


@pytest.mark.parametrize("run", OOM, ids=[run.label.replace(" ", "-") for run in OOM])
def test_what_crashed_on_one_node_does_not_fit(run: Run):
    memory = most_loaded_gpu(workload(run), layout(run))
    assert memory.verdict(CAPACITY) != "fits", f"{run.label}: {memory.total / GiB:.1f} GiB"


def test_known_misses_name_real_rows():
    assert set(KNOWN_MISSES) <= {run.label for run in ROWS}
