"""Framework profiles: each rule's bytes against a hand derivation, the verdict, and max-params against memory.

The rules themselves are checked against the frameworks elsewhere (tests/test_framework_transformers.py runs
transformers' own models; tests/test_framework_references.py restates Megatron's and DeepSpeed's formulas;
tests/test_framework_nanotron.py compares with the Ultra-Scale Playbook's measurements). Here each rule is switched on
alone, from the idealised profile, and the difference it makes is derived by hand.
"""

import json
from dataclasses import replace

import pytest

import lmcalc
from lmcalc import presets as pr
from lmcalc.cli import main
from lmcalc.engine.memory.gpu_memory import GpuMemory, gpu_memory, stage_activations
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.presets import framework_profile

IDEAL = framework_profile("idealised")
LLAMA = pr.resolve_model("llama-3.1-8b").spec  # h 4096, H 32, H_kv 8, d 128, f 14336, L 32, V 128256, RMSNorm
GPT2 = pr.resolve_model("gpt2-124m").spec  # h 768, f 3072, L 12, LayerNorm, GELU MLP, learned positions
MIXTRAL = pr.resolve_model("mixtral-8x7b").spec  # 8 experts, top-2, f_e 14336
BF16 = pr.resolve_precision("bf16-mixed").spec
ADAMW = pr.resolve_optimizer("adamw").spec
S, B = 4096, 2
T = S * B  # tokens in a micro-batch


def with_rule(part: str, **fields) -> FrameworkProfile:
    """The idealised profile with one rule changed."""
    return IDEAL.model_copy(update={part: getattr(IDEAL, part).model_copy(update=fields)})


def activations(framework: FrameworkProfile, model=LLAMA, attention="flash", recompute="none") -> float:
    w = Workload(model, BF16, ADAMW, S, B, attention, recompute, framework=framework)
    return stage_activations(w, Layout(), 0).total


def memory(framework: FrameworkProfile, layout: Layout = Layout(), model=LLAMA) -> GpuMemory:  # noqa: B008
    return gpu_memory(Workload(model, BF16, ADAMW, S, B, framework=framework), layout, 0)


def test_an_upcast_rmsnorm_keeps_an_fp32_copy_and_the_normalised_value():
    # transformers' LlamaRMSNorm: x.to(fp32) (4 bytes) replaces the bf16 input (2), and the normalised value before
    # the weight's multiply is kept in bf16 (2): +4·h bytes per token for each norm, two per layer and the final one.
    h, norms = LLAMA.hidden_size, 2 * LLAMA.num_layers + 1
    extra = activations(with_rule("norm", rmsnorm="fp32_input")) - activations(IDEAL)
    assert extra == norms * T * h * 4
    # a LayerNorm model is untouched by the RMSNorm rule
    assert activations(with_rule("norm", rmsnorm="fp32_input"), GPT2) == activations(IDEAL, GPT2)


def test_a_fused_swiglu_keeps_no_activation_output():
    # Megatron's fused bias-SwiGLU keeps its input [gate ‖ up] and fc2 its own input: SiLU(gate) is not kept,
    # 2·f bytes per token per layer less.
    saved = activations(IDEAL) - activations(with_rule("mlp", gated="fused"))
    assert saved == LLAMA.num_layers * T * LLAMA.ffn_size * 2


def test_gelu_written_op_by_op_keeps_three_more_tensors():
    # GPT-2's code calls gelu_new = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): pow keeps x, tanh its output, the
    # last multiply 0.5·x and (1 + tanh), against a fused GELU's input: three more f-wide bf16 tensors per token per
    # layer, under the rule that follows the model's code. A model whose code calls torch's GELU keeps none more.
    extra = activations(with_rule("mlp", gelu="model"), GPT2) - activations(IDEAL, GPT2)
    assert extra == GPT2.num_layers * T * GPT2.ffn_size * 2 * 3
    torch_gelu = GPT2.model_copy(update={"activation": "gelu"})
    assert activations(with_rule("mlp", gelu="model"), torch_gelu) == activations(IDEAL, torch_gelu)


def test_the_rmsnorm_rule_model_follows_the_models_weight_multiply():
    # Gemma 2's RMSNorm multiplies by (1 + w) in fp32 before the cast back (norm_weight_fp32): the normalised value
    # it keeps is fp32, 2·h bytes a token more per norm than Llama's, cast first (fp32_input).
    gemma = pr.resolve_model("gemma-2-2b").spec
    assert activations(with_rule("norm", rmsnorm="model"), gemma) == activations(
        with_rule("norm", rmsnorm="fp32_normalised"), gemma
    )
    assert activations(with_rule("norm", rmsnorm="model")) == activations(with_rule("norm", rmsnorm="fp32_input"))
    as_model = with_rule("norm", rmsnorm="model")
    extra = activations(as_model, LLAMA.model_copy(update={"norm_weight_fp32": True})) - activations(as_model)
    assert extra == (2 * LLAMA.num_layers + 1) * T * LLAMA.hidden_size * 2


def test_rotary_tables_are_kept_once_per_forward():
    # cos and sin, [1, 1, s, d] in bf16, made once per forward and shared by the layers: 2 · s · d · 2 bytes.
    extra = activations(with_rule("rotary", tables=True)) - activations(IDEAL)
    assert extra == 2 * S * LLAMA.head_size * 2
    assert activations(with_rule("rotary", tables=True), GPT2) == activations(IDEAL, GPT2)  # learned positions


def test_an_fp32_eager_softmax_keeps_its_output_and_a_cast_copy():
    # softmax(dtype=float32) keeps its fp32 output (4 bytes per score) and the matmul with V its bf16 cast (2),
    # where the idealised count keeps one bf16 output: +4 bytes per score, b·H·s² scores per layer.
    fp32 = with_rule("attention", eager_softmax="fp32")
    extra = activations(fp32, attention="eager") - activations(IDEAL, attention="eager")
    assert extra == LLAMA.num_layers * B * LLAMA.num_heads * S * S * 4
    assert activations(fp32) == activations(IDEAL)  # a fused kernel keeps no scores


def test_copies_of_q_k_and_v_kept_alive():
    # Megatron keeps its fused QKV output alive beside the kernel's Q and K: one more Q (H·d) and one more K (H_kv·d)
    # per token per layer, in bf16.
    extra = activations(with_rule("attention", q_copies=2, k_copies=2)) - activations(IDEAL)
    d, heads, kv = LLAMA.head_size, LLAMA.num_heads, LLAMA.kv_heads
    assert extra == LLAMA.num_layers * T * (heads + kv) * d * 2


def test_the_loss_keeps_its_saved_bytes_per_logit():
    # a chunked loss keeps nothing logit-sized: 4 bytes per logit (the idealised fp32 log-softmax) less
    saved = activations(IDEAL) - activations(with_rule("loss", saved_bytes=0))
    assert saved == T * LLAMA.vocab_size * 4


def test_routing_tensors_follow_the_moe_rule():
    # transformers' grouped experts: 40 bytes per (token, expert) assignment and no second copy of the weighted
    # outputs; the idealised rule: 28 bytes and the copy (k·h bf16 per token)
    hf = with_rule("moe", routing_bytes=40, weighted_outputs=False)
    k, h, moe_layers = MIXTRAL.moe.experts_per_token, MIXTRAL.hidden_size, MIXTRAL.moe_layers
    difference = activations(IDEAL, MIXTRAL) - activations(hf, MIXTRAL)
    assert difference == moe_layers * T * k * (2 * h - (40 - 28))


def test_fp32_gradients_and_the_ddp_bucket_copy():
    # Megatron's main_grad: 4 bytes per gradient instead of the recipe's 2; DDP's bucket copy: 2 more bytes per
    # parameter, with DP > 1 and no ZeRO only.
    n = count_params(LLAMA).total
    fp32 = memory(with_rule("states", grad_bytes=4))
    assert fp32.grads == 4 * n
    ddp = with_rule("states", ddp_bucket_copy=True)
    assert memory(ddp, Layout(dp=8)).grad_buckets == 2 * n
    assert memory(ddp, Layout(dp=8, zero=1)).grad_buckets == 0
    assert memory(ddp, Layout(dp=1)).grad_buckets == 0


def test_master_only_weights_with_fsdp_buffers():
    # FSDP2: only the fp32 shard persists (no 16-bit weights), two layers are gathered in bf16 and one layer's
    # gradients wait for their reduce-scatter (2 bf16 + 4 fp32 bytes per parameter); [norm, output] stays gathered.
    fsdp = IDEAL.model_copy(
        update={
            "states": IDEAL.states.model_copy(update={"weights": "master_only", "grad_bytes": 4}),
            "buffers": IDEAL.buffers.model_copy(update={"reduce_scatter_bytes": 6, "head_gathered": True}),
        }
    )
    m = memory(fsdp, Layout(dp=8, zero=3))
    n, layers = count_params(LLAMA).total, LLAMA.num_layers
    assert m.params == 0
    assert m.states == (4 + 4 + 4 * 2) * n / 8  # master, fp32 gradients, Adam's two states, sharded 8 ways
    head = LLAMA.vocab_size * LLAMA.hidden_size * 2
    assert m.zero3_buffers == pytest.approx(n / layers * (2 * 2 + 6) + head, rel=1e-12)


def test_step_transients_apply_when_the_activations_are_freed():
    # at the end of the step: a foreach AdamW's sqrt(exp_avg_sq) (one fp32 state), DeepSpeed's fp32 copy of this
    # GPU's gradient partition, nanotron's bf16 .grad before it is added into the fp32 buffer
    n = count_params(LLAMA).total
    foreach = memory(with_rule("optimizer_step", temporaries="foreach"), Layout(dp=8, zero=1))
    assert foreach.step_transient == pytest.approx(4 * n / 8, rel=1e-12)
    copy = memory(with_rule("optimizer_step", fp32_grad_copy=True), Layout(dp=8, zero=2))
    assert copy.step_transient == pytest.approx(4 * n / 8, rel=1e-12)
    bf16_grads = memory(with_rule("states", compute_grads_transient=True), Layout(dp=8, zero=1))
    assert bf16_grads.step_transient == 2 * n
    # none of them is larger than the activations here, so the busiest moment is still the activations'
    for m in (foreach, copy, bf16_grads):
        assert m.transient == 0 and m.allocated == m.states + m.framework_buffers + m.activations


def test_the_loss_transient_sits_on_the_last_stage():
    # the head's logit-sized tensors: transient_bytes per logit (s·b·V/TP), on the stage that holds the head
    counted = IDEAL.model_copy(
        update={"transients": True, "loss": IDEAL.loss.model_copy(update={"transient_bytes": 8})}
    )
    w = Workload(LLAMA, BF16, ADAMW, S, B, framework=counted)
    layout = Layout(tp=2, pp=2, grad_accum=4)
    last, first = gpu_memory(w, layout, 1), gpu_memory(w, layout, 0)
    loss = 8 * T * LLAMA.vocab_size / 2
    mlp = 2 * T * LLAMA.ffn_size * 2 / 2  # a layer's gate and up gradients, bf16, split by TP
    mlp += T * LLAMA.hidden_size * 2  # beside the gradient of the layer's output (whole on every TP rank)
    assert last.backward_transient == loss
    assert first.backward_transient == mlp


def test_fragmentation_turns_allocated_into_reserved_and_the_context_adds_to_it():
    real = framework_profile("megatron")
    m = memory(real, Layout(dp=8, zero=1))
    assert m.reserved == pytest.approx(m.allocated * (1 + real.allocator.fragmentation), rel=1e-12)
    # eight GPUs: the CUDA context and cuBLAS's kernels, and NCCL's communicator; one GPU has no NCCL
    assert m.total == pytest.approx(m.reserved + real.allocator.context_bytes + real.allocator.nccl_bytes, rel=1e-12)
    one = memory(real, Layout())
    assert one.total == pytest.approx(one.reserved + real.allocator.context_bytes, rel=1e-12)


def test_the_verdict_fits_tight_or_does_not_fit():
    m = memory(framework_profile("megatron"), Layout(dp=8, zero=1))
    without_fragmentation = m.total - m.fragmentation
    assert m.verdict(m.total) == "fits"
    assert m.verdict((m.total + without_fragmentation) / 2) == "tight"
    assert m.verdict(without_fragmentation - 1) == "does not fit"


def run_json(argv: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    return json.loads(out)


def test_the_memory_note_names_the_verdict_and_what_overflows(capsys):
    # Llama 3.1 8B on one 80 GB GPU needs 18 bytes per parameter of states alone under Megatron (144 GB)
    notes = run_json(["memory", "-m", "llama-3.1-8b", "--gpus", "1xH100", "--seq", "4096"], capsys)["notes"]
    assert any(note.startswith("does NOT fit") and "the largest part is model states" in note for note in notes)


def test_tight_is_reported_when_only_fragmentation_overflows():
    # find the micro-batch where megatron's reserved figure crosses an H100's memory (85,028,896,768 bytes as CUDA
    # gives it: deviceQuery's 81090 MBytes) but its allocated figure does not
    h100 = 85_028_896_768
    for micro_batch in range(1, 64):
        estimate = lmcalc.memory(model="llama-3.2-1b", gpus="8xH100", seq=2048, micro_batch=micro_batch, zero=1)
        gpu = estimate.gpu
        if gpu.verdict(h100) == "tight":
            assert gpu.total > h100 >= gpu.total - gpu.fragmentation
            assert any(note.startswith("tight:") for note in estimate.report.notes)
            return
    pytest.fail("no micro-batch lands in the tight band")


def test_idealised_is_the_papers_count():
    # ZeRO §5.1: 2 + 2 + 12 = 16 bytes per parameter without ZeRO; a flat 2 GiB allowance; no transients
    m = memory(IDEAL, Layout(dp=8))
    assert m.states == 16 * count_params(LLAMA).total
    assert m.total == m.states + m.activations + 2 * 2**30


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("framework", ["megatron", "transformers", "torchtitan"])
def test_max_params_offers_only_shapes_memory_accepts(zero, framework):
    """The largest shape max-params names fits when lmcalc memory costs it on the same GPUs, and the next larger
    shape (one more KV group) does not: the two use one figure."""
    from lmcalc.engine.search.maxparams import scaled_shape

    found = lmcalc.max_params(gpus="8xH100", framework=framework)
    row = next((r for r in found.rows if r.zero_stage == zero), None)
    if framework == "torchtitan" and zero == 1:  # FSDP2 shards everything or nothing (torchtitan's configs.py)
        assert row is None and [r.zero_stage for r in found.rows] == [0, 2, 3]
        return
    assert row is not None
    assert row.activation_shape is not None
    assert row.with_activations == count_params(row.activation_shape).total  # never rounded up
    settings = {"gpus": "8xH100", "seq": 4096, "dp": 8, "zero": zero, "framework": framework}
    assert lmcalc.memory(model=row.activation_shape, **settings).fits
    bigger = scaled_shape(pr.resolve_model("llama-3.1-8b").spec, row.activation_shape.kv_heads + 1)
    assert not lmcalc.memory(model=bigger, **settings).fits


def test_a_misspelt_framework_gets_a_close_match():
    with pytest.raises(LmcalcError, match="unknown framework 'megatrn'; did you mean megatron"):
        lmcalc.memory(model="llama-3.1-8b", framework="megatrn")


def test_a_users_own_profile_file(tmp_path, monkeypatch, capsys):
    """A profile in the user's presets directory is found by name, validated, and listed; a path works too."""
    data = IDEAL.model_dump()
    data.update(name="my-stack", aliases=[], description="a test stack", version="mine 1.0")
    data["allocator"] = {**data["allocator"], "allowance_bytes": 0, "context_bytes": 2**30, "source": "measured"}
    folder = tmp_path / "frameworks"
    folder.mkdir()
    import yaml

    (folder / "mine.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv(pr.PRESET_PATH_ENV, str(tmp_path))
    pr.registry.cache_clear()
    try:
        m = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3, framework="my-stack")
        assert m.gpu.context == 2**30 and m.workload.framework.name == "my-stack"
        listed = {row["name"] for row in run_json(["presets", "list", "frameworks"], capsys)["frameworks"]}
        assert {"my-stack", "megatron", "idealised"} <= listed
        by_path = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", framework=str(folder / "mine.yaml"))
        assert by_path.gpu.context == 2**30
        (folder / "mine.yaml").write_text(yaml.safe_dump({**data, "norm": {"rmsnorm": "fp16", "source": "x"}}))
        pr.registry.cache_clear()
        with pytest.raises(LmcalcError, match="norm"):
            lmcalc.memory(model="llama-3.1-8b", framework="my-stack")
    finally:
        monkeypatch.delenv(pr.PRESET_PATH_ENV)
        pr.registry.cache_clear()


def test_every_training_output_names_its_profile(capsys):
    for command in (
        ["memory", "-m", "llama-3.1-8b", "--gpus", "8xH100"],
        ["fit", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--zero", "3"],
        ["plan", "-m", "llama-3.2-1b", "--gpus", "8xH100", "--top", "1"],
        ["max-params", "--gpus", "8xH100"],
    ):
        inputs = run_json([*command, "--framework", "nanotron"], capsys)["inputs"]
        assert inputs["framework"]["value"] == "nanotron", command


def test_the_workload_keys_caches_by_its_profile():
    """Two workloads that differ only in their profile are different values: a cached figure of one is never
    returned for the other."""
    a = Workload(LLAMA, BF16, ADAMW, S, B, framework=IDEAL)
    b = replace(a, framework=framework_profile("transformers"))
    assert a != b and hash(a) != hash(b)
    assert stage_activations(a, Layout(), 0).total != stage_activations(b, Layout(), 0).total


def test_checkpointed_eager_layers_keep_their_mask():
    # transformers binds a checkpointed layer's keyword arguments with functools.partial: the eager [b, 1, s, s]
    # bf16 mask and the int64 position ids live until the rebuilt layers have run (full recomputation only)
    keeps = with_rule("attention", checkpoint_keeps_mask=True)
    extra = activations(keeps, attention="eager", recompute="full") - activations(
        IDEAL, attention="eager", recompute="full"
    )
    assert extra == B * S * S * 2 + S * 8
    assert activations(keeps, attention="eager") == activations(IDEAL, attention="eager")
    assert activations(keeps, recompute="full") == activations(IDEAL, recompute="full")


def test_the_memory_bar_stacks_to_the_total():
    """Every part of the total is drawn (none cut off for want of a style), and no part that is zero everywhere."""
    from lmcalc.render import BAR_STYLES

    for framework in ("megatron", "idealised", "transformers"):
        report = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3, framework=framework).report
        ((_, terms, _),) = report.stack_rows()
        assert sum(t.value for t in terms) == pytest.approx(report.term("total.total").value, rel=1e-12)
        assert all(t.value for t in terms) and len(terms) <= len(BAR_STYLES)
