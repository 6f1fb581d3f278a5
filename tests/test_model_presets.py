"""The model presets, checked four ways: the published count, by hand, against PyTorch, via config.json.

1. Every file in ``presets/models``: the engine's count, rounded to the significant figures the source
   prints (``published_params_sig_figs``), equals ``published_params``. A new preset is tested by being there.
2. Hand derivations written out here, term by term, from the shapes in the papers and config files (not
   from the engine): nanoGPT's GPT-2 count, Narayanan et al. 2021 eq. (2) for GPT-3, the Llama-style count for
   the Llama / Mistral / Qwen / OLMo presets, Mixtral total and active, DeepSeek-V3 total and active.
3. Tiny ``nn.Module``s built plainly from ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.RMSNorm``:
   ``sum(p.numel() for p in module.parameters())`` equals the engine's count for the matching ``ModelSpec``.
4. Family names resolve to their documented default member, and a Hugging Face ``config.json`` gives the
   same count as the preset.

Published figures come from /work/shared/reference/published_models.yaml and the sources each preset cites.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmcalc.engine.model.params import count_params
from lmcalc.presets import builtin_dir, normalise, read_yaml, resolve_model
from lmcalc.specs import ModelSpec

PRESET_FILES = sorted((builtin_dir() / "models").glob("*.y*ml"))
HF_DATA = Path(__file__).parent / "data" / "hf"


def round_sig(n: int, sig: int) -> int:
    """``n`` rounded half-up to ``sig`` significant figures, in integers (no float error at 4e11)."""
    drop = len(str(n)) - sig
    if drop <= 0:
        return n
    unit = 10**drop
    return (n + unit // 2) // unit * unit


def preset(name: str) -> ModelSpec:
    return resolve_model(name).spec


# --- 1. every preset against its published count ------------------------------------------------------------


def test_there_are_presets_to_check():
    assert len(PRESET_FILES) >= 19, PRESET_FILES


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_count_matches_published_figure(path: Path):
    spec = resolve_model(str(path)).spec
    assert spec.name == path.stem, "a preset's name is its file name"
    assert spec.published_params, f"{path.name}: published_params is missing"
    total = count_params(spec).total
    sig = spec.published_params_sig_figs
    if spec.published_params_scope == "without_embeddings":  # the card's count: less the embedding and the head
        total -= spec.vocab_size * spec.hidden_size * (1 if spec.tied_embeddings else 2)
    shown = total if sig is None else round_sig(total, sig)
    if sig is not None and spec.published_params_rounding == "down":  # the figure cut, not rounded (142.77 B as 142B)
        places = max(0, len(str(total)) - sig)
        shown = total // 10**places * 10**places
    assert shown == spec.published_params, (
        f"{spec.name}: counted {total:,}, i.e. {shown:,} to {sig or 'all'} significant figures; "
        f"published {spec.published_params:,} ({spec.published_params_source})"
    )


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_cites_its_sources(path: Path):
    spec = resolve_model(str(path)).spec
    assert path.read_text(encoding="utf-8").startswith("#"), "a comment header names the sources"
    assert spec.display_name
    assert spec.sources
    assert spec.published_params_source
    assert (spec.training_tokens is None) == (not spec.training_tokens_source), (
        "training_tokens and training_tokens_source come together"
    )


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_dropout_only_for_the_gpt_family(path: Path):
    # GPT-2 (attn/embd/resid_pdrop 0.1 in its config.json) and GPT-3 trained with dropout, and Seed-OSS's config keeps
    # 0.1 on the attention probabilities and each sub-layer's output (SeedOssConfig, "SeedOss-36b style"); the Llama,
    # Mistral, Qwen, OLMo, DeepSeek and gpt-oss families trained without it.
    spec = resolve_model(str(path)).spec
    assert spec.dropout is spec.name.startswith(("gpt2", "gpt3", "seed-oss"))  # gpt-oss trained without it


def test_names_aliases_and_family_names_are_unambiguous():
    owners: dict[str, str] = {}
    families: dict[str, str] = {}
    for path in PRESET_FILES:
        data = read_yaml(path)
        for key in [data["name"], *data.get("aliases", [])]:
            earlier = owners.get(normalise(key))
            assert earlier is None, f"{key} names both {earlier} and {data['name']}"
            owners[normalise(key)] = data["name"]
        for family in data.get("family_aliases", []):
            assert normalise(family) not in families, f"family {family} claimed by two presets"
            families[normalise(family)] = data["name"]
    assert not set(owners) & set(families), "a family name must not also be a model name or alias"


# --- 2. hand derivations ------------------------------------------------------------------------------------


def gpt2_style(V: int, s: int, L: int, h: int) -> int:
    """nanoGPT's count: token + position embeddings, L blocks, final LayerNorm; the head is tied.

    Per block: qkv 3h^2 + 3h, attention output h^2 + h, MLP fc 4h^2 + 4h and proj 4h^2 + h, two LayerNorms
    4h: 12h^2 + 13h.
    """
    return V * h + s * h + L * (12 * h * h + 13 * h) + 2 * h


@pytest.mark.parametrize(
    "name, V, s, L, h, exact",
    [
        # published_models.yaml derived_param_count; nanoGPT '# 124M params', '# 1558M params'
        ("gpt2-124m", 50257, 1024, 12, 768, 124_439_808),
        ("gpt2-xl", 50257, 1024, 48, 1600, 1_557_611_200),
    ],
)
def test_gpt2_by_hand(name, V, s, L, h, exact):
    assert gpt2_style(V, s, L, h) == exact
    assert count_params(preset(name)).total == exact


def narayanan_eq2(layers: int, h: int, V: int, s: int) -> float:
    """Narayanan et al. 2021 eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).

    Expanded: 12lh^2 + 13lh + (V + s)h. The embedding V*h appears once (input and output share it) and the
    final LayerNorm (2h) is left out.
    """
    return 12 * layers * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * layers * h))


def test_gpt3_175b_by_narayanan_eq2():
    layers, h, V, s = 96, 12288, 50257, 2048  # the paper's l, h, V, s
    eq2 = 12 * layers * h * h + 13 * layers * h + (V + s) * h
    assert math.isclose(narayanan_eq2(layers, h, V, s), eq2, rel_tol=1e-12)
    total = count_params(preset("gpt3-175b")).total
    assert total == eq2 + 2 * h  # + the final LayerNorm's weight and bias
    assert total == gpt2_style(V, s, layers, h) == 174_604_259_328
    # GPT-3 Table D.1: 174,600M; Megatron (Narayanan et al.) Table 2: 174.6B.
    assert round_sig(total, 4) == 174_600_000_000
    # An untied output head would add V*h = 0.62B and print as 175.2B: Table D.1 says the head is tied.
    assert round_sig(total + V * h, 4) == 175_200_000_000


def test_narayanan_eq2_reproduces_its_own_table():
    # Narayanan et al. 2021 Table 1 row '145.6B': l = 80, h = 12288, their padded V = 51200, s = 2048.
    assert round_sig(round(narayanan_eq2(80, 12288, 51200, 2048)), 4) == 145_600_000_000


def llama_style(V, h, L, H, kv, d, f, tied=False, qkv_bias=False, qk_norm=False) -> int:
    """Embedding (and untied head) + L x (q, k, v, o + SwiGLU + 2 RMSNorms) + final RMSNorm.

    q and o are h x H*d, k and v are h x kv*d; gate, up and down are h x f. Qwen2 adds biases to q, k and v
    (H*d + 2*kv*d); OLMo 2 adds RMSNorms over the projected queries (H*d) and keys (kv*d).
    """
    per_layer = 2 * h * H * d + 2 * h * kv * d + 3 * h * f + 2 * h
    if qkv_bias:
        per_layer += H * d + 2 * kv * d
    if qk_norm:
        per_layer += H * d + kv * d
    return V * h * (1 if tied else 2) + L * per_layer + h


# Shapes and exact counts from published_models.yaml (HF config.json copies; derived_param_count or the HF
# safetensors total, which agree for every model here except Llama 2, see the test after this one).
LLAMA_STYLE = [
    ("llama-2-7b", dict(V=32000, h=4096, L=32, H=32, kv=32, d=128, f=11008), 6_738_415_616),
    ("llama-2-13b", dict(V=32000, h=5120, L=40, H=40, kv=40, d=128, f=13824), 13_015_864_320),
    ("llama-2-70b", dict(V=32000, h=8192, L=80, H=64, kv=8, d=128, f=28672), 68_976_648_192),
    ("llama-3-8b", dict(V=128256, h=4096, L=32, H=32, kv=8, d=128, f=14336), 8_030_261_248),
    ("llama-3.1-8b", dict(V=128256, h=4096, L=32, H=32, kv=8, d=128, f=14336), 8_030_261_248),
    ("llama-3-70b", dict(V=128256, h=8192, L=80, H=64, kv=8, d=128, f=28672), 70_553_706_496),
    ("llama-3.1-70b", dict(V=128256, h=8192, L=80, H=64, kv=8, d=128, f=28672), 70_553_706_496),
    ("llama-3.1-405b", dict(V=128256, h=16384, L=126, H=128, kv=8, d=128, f=53248), 405_853_388_800),
    ("llama-3.2-1b", dict(V=128256, h=2048, L=16, H=32, kv=8, d=64, f=8192, tied=True), 1_235_814_400),
    ("llama-3.2-3b", dict(V=128256, h=3072, L=28, H=24, kv=8, d=128, f=8192, tied=True), 3_212_749_824),
    ("mistral-7b", dict(V=32000, h=4096, L=32, H=32, kv=8, d=128, f=14336), 7_241_732_096),
    ("qwen2.5-7b", dict(V=152064, h=3584, L=28, H=28, kv=4, d=128, f=18944, qkv_bias=True), 7_615_616_512),
    ("qwen2.5-72b", dict(V=152064, h=8192, L=80, H=64, kv=8, d=128, f=29568, qkv_bias=True), 72_706_203_648),
    ("olmo-2-7b", dict(V=100352, h=4096, L=32, H=32, kv=32, d=128, f=11008, qk_norm=True), 7_298_617_344),
    # Added with the 2025 presets: shapes from each preset's config.json source; the exact figure is the one its
    # published_params_source prints, or where that source prints fewer figures, transformers' count on meta.
    ("phi-3-mini", dict(V=32064, h=3072, L=32, H=32, kv=32, d=96, f=8192), 3_821_079_552),
    ("phi-3-medium", dict(V=32064, h=5120, L=40, H=40, kv=10, d=128, f=17920), 13_960_238_080),
    ("phi-4", dict(V=100352, h=5120, L=40, H=40, kv=10, d=128, f=17920), 14_659_507_200),
    ("phi-4-mini", dict(V=200064, h=3072, L=32, H=24, kv=8, d=128, f=8192, tied=True), 3_836_021_760),
    ("smollm3-3b", dict(V=128256, h=2048, L=36, H=16, kv=4, d=128, f=11008, tied=True), 3_075_098_624),
    ("olmo-2-1b", dict(V=100352, h=2048, L=16, H=16, kv=16, d=128, f=8192, qk_norm=True), 1_484_916_736),
    ("olmo-2-13b", dict(V=100352, h=5120, L=40, H=40, kv=40, d=128, f=13824, qk_norm=True), 13_716_198_400),
    ("olmo-2-32b", dict(V=100352, h=5120, L=64, H=40, kv=8, d=128, f=27648, qk_norm=True), 32_234_279_936),
    ("mistral-nemo-12b", dict(V=131072, h=5120, L=40, H=32, kv=8, d=128, f=14336), 12_247_782_400),
    ("mistral-small-24b", dict(V=131072, h=5120, L=40, H=32, kv=8, d=128, f=32768), 23_572_403_200),
]


@pytest.mark.parametrize("name, shape, exact", LLAMA_STYLE, ids=[row[0] for row in LLAMA_STYLE])
def test_llama_style_by_hand(name, shape, exact):
    assert llama_style(**shape) == exact
    spec = preset(name)
    assert (
        spec.vocab_size,
        spec.hidden_size,
        spec.num_layers,
        spec.num_heads,
        spec.kv_heads,
        spec.head_size,
        spec.ffn_size,
    ) == tuple(shape[k] for k in ("V", "h", "L", "H", "kv", "d", "f"))
    assert spec.tied_embeddings is shape.get("tied", False)
    assert count_params(spec).total == exact


@pytest.mark.parametrize(
    "name, hf_safetensors_total",
    [("llama-2-7b", 6_738_417_664), ("llama-2-13b", 13_015_866_880), ("llama-2-70b", 68_976_653_312)],
)
def test_llama2_hf_totals_hold_rotary_buffers_too(name, hf_safetensors_total):
    # The early Llama 2 HF checkpoints store each layer's rotary inv_freq buffer, head_dim / 2 = 64 values;
    # the preset counts the architecture's trained weights only.
    spec = preset(name)
    assert hf_safetensors_total - count_params(spec).total == spec.num_layers * spec.head_size // 2


@pytest.mark.parametrize(
    "name, card_figure, digits",
    [
        ("llama-3.2-1b", 1.23e9, 3),  # Llama 3.2 model card: "1B (1.23B)"
        ("llama-3.2-3b", 3.21e9, 3),  # "3B (3.21B)"
        ("qwen2.5-7b", 7.61e9, 3),  # Qwen2.5-7B model card: 7.61B
        ("qwen2.5-72b", 72.7e9, 3),  # Qwen2.5-72B model card: 72.7B
        ("qwen3-0.6b", 0.6e9, 1),  # Qwen3-0.6B model card: 0.6B
        ("qwen3-32b", 32.8e9, 3),  # Qwen3-32B model card: 32.8B
        ("qwen3-30b-a3b", 30.5e9, 3),  # Qwen3-30B-A3B: 30.5B total (keras-hub's description of the card)
        ("phi-3-mini", 3.8e9, 2),  # Phi-3 report: a 3.8 billion parameter model
        ("gpt-oss-20b", 21e9, 2),  # gpt-oss README: 21B parameters
        ("gpt-oss-120b", 117e9, 3),  # gpt-oss README: 117B parameters
        ("deepseek-v2", 236e9, 3),  # DeepSeek-V2 README: 236B total
        ("glm-4.5-air", 106e9, 3),  # GLM-4.5 README: 106B total (this count, 106.85B, cut); MTP layer not counted
    ],
)
def test_model_card_figures_agree_to_their_last_digit(name, card_figure, digits):
    # These cards cut rather than round (1.2358B prints 1.23B, 7.6156B prints 7.61B), so the check is
    # "within one unit of the last printed digit", not equality after rounding.
    total = count_params(preset(name)).total
    last_digit = 10 ** (math.floor(math.log10(card_figure)) - digits + 1)
    assert abs(total - card_figure) < last_digit


def test_qwen2_5_7b_card_non_embedding_figure():
    # The card's 6.53B non-embedding parameters leave out both the input embedding and the untied head.
    spec = preset("qwen2.5-7b")
    total = count_params(spec).total
    assert round_sig(total - 2 * spec.vocab_size * spec.hidden_size, 3) == 6_530_000_000


def test_mixtral_8x7b_total_and_active_by_hand():
    V, h, L, H, kv, d, f, E, k = 32000, 4096, 32, 32, 8, 128, 14336, 8, 2
    attention = 2 * h * H * d + 2 * h * kv * d
    expert = 3 * h * f  # w1, w3 (gate, up) and w2 (down) of one SwiGLU expert
    router = E * h  # bias-free linear gate
    shared_per_layer = attention + 2 * h + router
    total = 2 * V * h + L * (shared_per_layer + E * expert) + h
    active = 2 * V * h + L * (shared_per_layer + k * expert) + h
    assert total == 46_702_792_704  # HF safetensors total
    assert active == 12_879_925_248  # published_models.yaml derived_active_param_count
    counts = count_params(preset("mixtral-8x7b"))
    assert (counts.total, counts.active) == (total, active)
    # Mixtral of Experts (arXiv:2401.04088): "47B parameters, 13B active".
    assert (round_sig(total, 2), round_sig(active, 2)) == (47_000_000_000, 13_000_000_000)


def test_deepseek_v3_total_and_active_by_hand():
    V, h, L, H = 129280, 7168, 61, 128
    q_rank, kv_rank, d_nope, d_rope, d_v = 1536, 512, 128, 64, 128
    f, f_expert, E, k, n_shared, n_dense = 18432, 2048, 256, 8, 1, 3
    attention = (
        h * q_rank
        + q_rank  # W_DQ and the RMSNorm on the compressed query
        + q_rank * H * (d_nope + d_rope)  # W_UQ and W_QR
        + h * (kv_rank + d_rope)  # W_DKV and W_KR
        + kv_rank  # RMSNorm on the compressed key-value latent
        + kv_rank * H * (d_nope + d_v)  # W_UK and W_UV
        + H * d_v * h  # W_O
    )
    expert = 3 * h * f_expert
    router = E * h  # sigmoid gate weights; the balancing bias is set by a rule, not trained (a buffer, not counted)
    n_moe = L - n_dense
    dense_ffn = 3 * h * f
    moe_always_on = router + n_shared * expert
    common = 2 * V * h + L * (attention + 2 * h) + n_dense * dense_ffn + n_moe * moe_always_on + h
    total = common + n_moe * E * expert
    active = common + n_moe * k * expert
    counts = count_params(preset("deepseek-v3"))
    assert (counts.total, counts.active) == (total, active)
    assert round_sig(total, 3) == 671_000_000_000  # technical report: 671B total
    # The report's "37B activated" is rounded, and README_WEIGHTS.md says 36.7B (incl. 0.9B embedding and 0.9B
    # head) without saying how it counts; every weight a token touches here (embedding, MLA, the 3 dense FFNs,
    # router, shared expert, 8 routed experts per MoE layer, head) gives 37.55B: 1.5% above 37B.
    assert abs(active / 37e9 - 1) < 0.02
    print(f"DeepSeek-V3 active parameters: {active:,} = {active / 1e9:.2f}B (report: 37B; README: 36.7B)")


# --- 3. PyTorch cross-checks --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nn():
    return pytest.importorskip("torch").nn


def numel(module) -> int:
    """Parameters of a module, each shared tensor once (a tied head adds nothing)."""
    return sum(p.numel() for p in module.parameters())


TINY = dict(vocab_size=101, max_seq_len=37)


def gpt2_like(nn, V, s, L, h, f):
    """nanoGPT / HF GPT2LMHeadModel: fused qkv, LayerNorm with bias, biases everywhere, tied head."""
    wte = nn.Embedding(V, h)
    lm_head = nn.Linear(h, V, bias=False)
    lm_head.weight = wte.weight

    def block():
        return nn.ModuleDict(
            dict(
                ln_1=nn.LayerNorm(h),
                c_attn=nn.Linear(h, 3 * h),
                c_proj=nn.Linear(h, h),
                ln_2=nn.LayerNorm(h),
                c_fc=nn.Linear(h, f),
                mlp_proj=nn.Linear(f, h),
            )
        )

    return nn.ModuleDict(
        dict(
            wte=wte,
            wpe=nn.Embedding(s, h),
            h=nn.ModuleList(block() for _ in range(L)),
            ln_f=nn.LayerNorm(h),
            lm_head=lm_head,
        )
    )


@pytest.mark.torch
def test_gpt2_like_module(nn):
    spec = ModelSpec(
        name="tiny-gpt2",
        **TINY,
        hidden_size=24,
        num_layers=2,
        num_heads=4,
        ffn_size=96,
        ffn_kind="gelu_mlp",
        norm_kind="layernorm",
        attention_bias="all",
        mlp_bias=True,
        tied_embeddings=True,
        position_embedding="learned",
        dropout=True,
    )
    module = gpt2_like(nn, V=101, s=37, L=2, h=24, f=96)
    assert numel(module) == count_params(spec).total


def swiglu(nn, h, f):
    return nn.ModuleDict(
        dict(
            gate_proj=nn.Linear(h, f, bias=False),
            up_proj=nn.Linear(h, f, bias=False),
            down_proj=nn.Linear(f, h, bias=False),
        )
    )


def llama_like(nn, V, L, h, H, kv, d, f, tied, qkv_bias=False, olmo2=False):
    """HF LlamaForCausalLM (Qwen2: q/k/v biases; OLMo 2: post-norms and full-width q/k RMSNorms)."""

    def layer():
        attention = dict(
            q_proj=nn.Linear(h, H * d, bias=qkv_bias),
            k_proj=nn.Linear(h, kv * d, bias=qkv_bias),
            v_proj=nn.Linear(h, kv * d, bias=qkv_bias),
            o_proj=nn.Linear(H * d, h, bias=False),
        )
        if olmo2:
            attention.update(q_norm=nn.RMSNorm(H * d), k_norm=nn.RMSNorm(kv * d))
            norms = dict(post_attention_layernorm=nn.RMSNorm(h), post_feedforward_layernorm=nn.RMSNorm(h))
        else:
            norms = dict(input_layernorm=nn.RMSNorm(h), post_attention_layernorm=nn.RMSNorm(h))
        return nn.ModuleDict(dict(self_attn=nn.ModuleDict(attention), mlp=swiglu(nn, h, f), **norms))

    embed = nn.Embedding(V, h)
    lm_head = nn.Linear(h, V, bias=False)
    if tied:
        lm_head.weight = embed.weight
    return nn.ModuleDict(
        dict(embed_tokens=embed, layers=nn.ModuleList(layer() for _ in range(L)), norm=nn.RMSNorm(h), lm_head=lm_head)
    )


def llama_spec(**fields) -> ModelSpec:
    return ModelSpec(
        **{"name": "tiny", **TINY, "ffn_kind": "swiglu", "norm_kind": "rmsnorm", "position_embedding": "rope", **fields}
    )


# h = 48 with 4 heads of 16: H*d = 64 does not tile h, as in models that set head_dim explicitly.
SHAPE = dict(L=3, h=48, H=4, kv=2, d=16, f=80)


def shape_fields(L, h, H, kv, d, f):
    return dict(num_layers=L, hidden_size=h, num_heads=H, num_kv_heads=kv, head_dim=d, ffn_size=f)


@pytest.mark.torch
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_like_module_with_gqa(nn, tied):
    spec = llama_spec(**shape_fields(**SHAPE), tied_embeddings=tied)
    assert numel(llama_like(nn, V=101, **SHAPE, tied=tied)) == count_params(spec).total


@pytest.mark.torch
def test_qwen_like_module_with_qkv_bias(nn):
    spec = llama_spec(**shape_fields(**SHAPE), tied_embeddings=False, attention_bias="qkv")
    assert numel(llama_like(nn, V=101, **SHAPE, tied=False, qkv_bias=True)) == count_params(spec).total


@pytest.mark.torch
def test_olmo2_like_module_with_full_qk_norm(nn):
    spec = llama_spec(**shape_fields(**SHAPE), tied_embeddings=False, qk_norm="full")
    assert numel(llama_like(nn, V=101, **SHAPE, tied=False, olmo2=True)) == count_params(spec).total


def routed_active(module, moe_layers, experts_per_token: int) -> int:
    """Total minus the routed experts a token does not use (all experts of a layer have the same size)."""
    unused = 0
    for layer in moe_layers:
        experts = layer["experts"]
        unused += numel(experts[0]) * (len(experts) - experts_per_token)
    return numel(module) - unused


@pytest.mark.torch
def test_mixtral_like_module(nn):
    V, L, h, H, kv, d, f, E, k = 101, 2, 32, 4, 2, 8, 56, 4, 2

    def layer():
        attention = nn.ModuleDict(
            dict(
                q_proj=nn.Linear(h, H * d, bias=False),
                k_proj=nn.Linear(h, kv * d, bias=False),
                v_proj=nn.Linear(h, kv * d, bias=False),
                o_proj=nn.Linear(H * d, h, bias=False),
            )
        )
        return nn.ModuleDict(
            dict(
                input_layernorm=nn.RMSNorm(h),
                self_attn=attention,
                post_attention_layernorm=nn.RMSNorm(h),
                gate=nn.Linear(h, E, bias=False),
                experts=nn.ModuleList(swiglu(nn, h, f) for _ in range(E)),
            )
        )

    layers = nn.ModuleList(layer() for _ in range(L))
    module = nn.ModuleDict(
        dict(embed_tokens=nn.Embedding(V, h), layers=layers, norm=nn.RMSNorm(h), lm_head=nn.Linear(h, V, bias=False))
    )
    spec = llama_spec(
        num_layers=L,
        hidden_size=h,
        num_heads=H,
        num_kv_heads=kv,
        head_dim=d,
        ffn_size=f,
        tied_embeddings=False,
        moe=dict(num_experts=E, experts_per_token=k, expert_ffn_size=f),
    )
    counts = count_params(spec)
    assert numel(module) == counts.total
    assert routed_active(module, layers, k) == counts.active


@pytest.mark.torch
@pytest.mark.parametrize("q_lora_rank", [24, None], ids=["low-rank-q (V3)", "plain-q (V2-Lite)"])
def test_deepseek_like_module_with_mla_and_shared_experts(nn, q_lora_rank):
    V, L, n_dense, h, H = 101, 4, 1, 32, 4
    kv_rank, d_nope, d_rope, d_v = 16, 8, 4, 8
    f, f_expert, E, k, n_shared = 72, 12, 6, 2, 2

    def attention():
        if q_lora_rank:
            query = dict(
                q_a_proj=nn.Linear(h, q_lora_rank, bias=False),
                q_a_layernorm=nn.RMSNorm(q_lora_rank),
                q_b_proj=nn.Linear(q_lora_rank, H * (d_nope + d_rope), bias=False),
            )
        else:
            query = dict(q_proj=nn.Linear(h, H * (d_nope + d_rope), bias=False))
        return nn.ModuleDict(
            dict(
                **query,
                kv_a_proj_with_mqa=nn.Linear(h, kv_rank + d_rope, bias=False),
                kv_a_layernorm=nn.RMSNorm(kv_rank),
                kv_b_proj=nn.Linear(kv_rank, H * (d_nope + d_v), bias=False),
                o_proj=nn.Linear(H * d_v, h, bias=False),
            )
        )

    def moe():
        # DeepSeek's gate: a weight of E x h and e_score_correction_bias of E (a Linear with bias has both);
        # the shared experts are one SwiGLU of width n_shared * f_expert.
        return nn.ModuleDict(
            dict(
                gate=nn.Linear(h, E, bias=True),
                experts=nn.ModuleList(swiglu(nn, h, f_expert) for _ in range(E)),
                shared_experts=swiglu(nn, h, n_shared * f_expert),
            )
        )

    def layer(i):
        mlp = swiglu(nn, h, f) if i < n_dense else moe()
        return nn.ModuleDict(
            dict(input_layernorm=nn.RMSNorm(h), self_attn=attention(), post_attention_layernorm=nn.RMSNorm(h), mlp=mlp)
        )

    layers = nn.ModuleList(layer(i) for i in range(L))
    module = nn.ModuleDict(
        dict(embed_tokens=nn.Embedding(V, h), layers=layers, norm=nn.RMSNorm(h), lm_head=nn.Linear(h, V, bias=False))
    )
    spec = llama_spec(
        num_layers=L,
        hidden_size=h,
        num_heads=H,
        ffn_size=f,
        tied_embeddings=False,
        mla=dict(
            q_lora_rank=q_lora_rank,
            kv_lora_rank=kv_rank,
            qk_nope_head_dim=d_nope,
            qk_rope_head_dim=d_rope,
            v_head_dim=d_v,
        ),
        moe=dict(
            num_experts=E,
            experts_per_token=k,
            shared_experts=n_shared,
            expert_ffn_size=f_expert,
            dense_layers=n_dense,
            router_bias=True,
        ),
    )
    counts = count_params(spec)
    assert numel(module) == counts.total
    assert routed_active(module, [block["mlp"] for block in layers[n_dense:]], k) == counts.active


# --- 4. family names and Hugging Face config.json -----------------------------------------------------------

FAMILIES = {
    "llama-1b": "llama-3.2-1b",
    "llama-3b": "llama-3.2-3b",
    "llama-7b": "llama-2-7b",
    "llama-8b": "llama-3.1-8b",
    "llama-13b": "llama-2-13b",
    "llama-70b": "llama-3.1-70b",
    "llama-405b": "llama-3.1-405b",
    "gpt2": "gpt2-124m",
    "mistral": "mistral-7b",
    "mixtral": "mixtral-8x7b",
    "qwen-7b": "qwen2.5-7b",
    "qwen-72b": "qwen2.5-72b",
    "olmo-7b": "olmo-2-7b",
    "deepseek": "deepseek-v3",
}


@pytest.mark.parametrize("family, member", FAMILIES.items())
def test_family_name_resolves_to_its_default_member_with_a_note(family, member):
    resolved = resolve_model(family)
    assert resolved.spec.name == member
    assert family in resolved.note and member in resolved.note


def test_family_names_are_normalised():
    assert resolve_model("Llama_70B").spec.name == "llama-3.1-70b"


def test_every_family_name_in_the_presets_is_documented_here():
    declared = {}
    for path in PRESET_FILES:
        data = read_yaml(path)
        declared.update({normalise(family): data["name"] for family in data.get("family_aliases", [])})
    assert declared == FAMILIES


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_names_and_aliases_resolve_without_a_note(path: Path):
    data = read_yaml(path)
    for key in [data["name"], *data.get("aliases", [])]:
        resolved = resolve_model(key)
        assert (resolved.spec.name, resolved.note) == (data["name"], "")


HF_CONFIGS = {
    "llama-3.1-8b": "llama-3.1-8b",
    "mixtral-8x7b": "mixtral-8x7b",
    "qwen2.5-7b": "qwen2.5-7b",
    "gpt2": "gpt2-124m",
    "olmo-2-7b": "olmo-2-7b",
    "deepseek-v3": "deepseek-v3",
}
SAME_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "kv_heads",
    "qk_head_dim",
    "v_head_dim",
    "ffn_kind",
    "norm_kind",
    "qk_norm",
    "attention_bias",
    "mlp_bias",
    "tied_embeddings",
    "position_embedding",
    "max_seq_len",
    "dropout",
    "dropout_at",
    "eager_softmax",
    "mla",
    "moe",
)


@pytest.mark.parametrize("folder, preset_name", HF_CONFIGS.items())
def test_hf_config_json_matches_the_preset(folder, preset_name):
    from_config = resolve_model(str(HF_DATA / folder / "config.json")).spec
    built_in = preset(preset_name)
    for field in SAME_FIELDS:
        assert getattr(from_config, field) == getattr(built_in, field), field
    assert count_params(from_config) == count_params(built_in)
