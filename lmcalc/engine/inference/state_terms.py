"""The serving rows of what a sequence keeps whatever its length (``serving.state_bytes``): a hybrid's mixers' states,
and what some models' attention keeps beside its K and V. ``engine.inference.terms`` renders them in its KV section."""

from __future__ import annotations

from lmcalc.engine.inference.serving import InferenceMemory
from lmcalc.engine.model.prefix import prefix_tokens
from lmcalc.result import Term
from lmcalc.specs import ModelSpec


def state_terms(spec: ModelSpec, memory: InferenceMemory, kv_bytes: float) -> tuple[Term, ...]:
    """What a sequence keeps whatever its length: a hybrid's state-space, recurrent or linear-attention layers' state
    (``_mixer_state``), or beside the K and V of the layers what a model's own attention keeps (``_beside_kv``)."""
    b = f"{kv_bytes:g} B"
    state = _beside_kv(spec, b) or _mixer_state(spec, b)
    if state is None:
        return ()
    kind, formula, substituted, source = state
    note = "the same at any context; whole on every TP rank (lmcalc does not split these layers)"
    before = bool(spec.prompt or spec.image_prefix)
    label = f"{kind} per sequence" if before else f"{kind} layers' state per sequence"
    if before:
        note = "the same at any context; counted whole on every TP rank, an upper bound where TP splits the heads"
    return (
        Term("state", label, memory.state_per_sequence, "bytes", formula, substituted, source, note=note),
    )  # fmt: skip


State = tuple[str, str, str, str]
"""A state row's kind, formula, numbers substituted and source."""


def _mixer_state(spec: ModelSpec, b: str) -> State | None:
    """A hybrid's other mixers' state (their convolutions' last inputs, recurrent or SSM states), at ``b`` an
    element unless the cache keeps them in fp32."""
    layers = spec.other_mixer_layers
    if spec.short_conv:
        c = spec.short_conv
        state = ("Short-convolution", "L_conv · h · K · bytes",
                 f"{layers} × {spec.hidden_size} × {c.conv_kernel} × {b}",
                 "transformers' LFM2 cache (the convolution's last K inputs)")  # fmt: skip
    elif spec.lightning:
        lt = spec.lightning
        state = ("Lightning-attention", "L_lin · H · d² · bytes", f"{layers} × {lt.heads} × {lt.head_dim}² × {b}",
                 "MiniMax 2025 §2.2; transformers' MiniMax cache (the K·V state per head)")  # fmt: skip
    elif spec.mamba2:
        m2 = spec.mamba2
        state = ("Mamba-2", "L_ssm · ((I + 2·G·N) · K · bytes + H · P · N · 4 B)",
                 f"{layers} × ({m2.conv_channels} × {m2.conv_kernel} × {b} + {m2.heads} × {m2.head_dim} × {m2.state} "
                 "× 4 B)", "Dao & Gu 2024 §7; transformers' Bamba cache (conv state, fp32 SSM state)")  # fmt: skip
    elif spec.deltanet:
        g = spec.deltanet
        state = ("Gated DeltaNet", "L_lin · (c_d · K · bytes + H_v · d_k · d_v · 4 B)",
                 f"{layers} × ({g.conv_channels} × {g.conv_kernel} × {b} + {g.value_heads} × {g.key_head_dim} × "
                 f"{g.value_head_dim} × 4 B)",
                 "Yang et al. 2025 §3; transformers' Qwen3-Next cache (conv state, fp32 recurrent state)")  # fmt: skip
    elif spec.mamba:
        m = spec.mamba
        state = ("State-space", "L_ssm · d_in · (d_conv + N) · bytes",
                 f"{layers} × {m.d_inner} × ({m.d_conv} + {m.d_state}) × {b}",
                 "Gu & Dao 2023 §3.3; transformers' Jamba cache (conv and SSM states)")  # fmt: skip
    elif spec.mlstm:
        x = spec.mlstm
        state = ("mLSTM matrix-memory", "L · NH · (d_k · d_v + d_k + 1) · bytes",
                 f"{layers} × {x.heads} × ({x.key_head_dim} × {x.value_head_dim} + {x.key_head_dim} + 1) × {b}",
                 "Beck et al. 2025 (xLSTM-7B); transformers' xLSTMCache (C, n, m a head)")  # fmt: skip
    elif spec.rwkv:
        state = ("RWKV time- and channel-mix", "L · h · (2 · bytes + 3 · 4 B)",
                 f"{layers} × {spec.hidden_size} × (2 × {b} + 3 × 4 B)",
                 "Peng et al. 2023; transformers' RwkvModel state (token shifts; WKV's three sums, fp32)")  # fmt: skip
    elif spec.rglru:
        r = spec.rglru
        state = ("Recurrent-block", "L_lin · w · ((K − 1) · bytes + 4 B)",
                 f"{layers} × {r.width} × (({r.conv_kernel} − 1) × {b} + 4 B)",
                 "De et al. 2024 (Griffin); RecurrentGemma's blocks (conv state, fp32 RG-LRU state)")  # fmt: skip
    else:
        return None
    return state


def _beside_kv(spec: ModelSpec, b: str) -> State | None:
    """What a model's own attention keeps beside its K and V: Inkling's branch convolutions' last inputs (fp32),
    ZAYA's convolutions' last inputs and delayed value, CPM-Ant's prompt's or GIT's images' K and V."""
    if spec.branch_convs:
        K = spec.branch_convs.kernel
        state = ("Branch-convolution", "Σ layers (2·H_kv·d + 2·h) · K · 4 B",
                 f"{spec.num_layers} layers × (2·H_kv·d + 2×{spec.hidden_size}) × {K} × 4 B",
                 "transformers' Inkling cache (four fp32 conv states a layer)")  # fmt: skip
    elif spec.cca:
        cca, C = spec.cca, (spec.num_heads + spec.kv_heads) * spec.head_size
        state = ("CCA convolution and delayed-value", "L · (C · (t0 + t1 − 2) + H_kv·d/2) · bytes",
                 f"{spec.attention_layers} × ({C} × ({cca.depthwise} + {cca.grouped} − 2) + "
                 f"{spec.kv_heads * spec.head_size // 2}) × {b}",
                 "transformers' ZAYA cache (conv and recurrent states)")  # fmt: skip
    elif spec.prompt or spec.image_prefix:
        P, kind = prefix_tokens(spec), "Prompt" if spec.prompt else "Image"
        state = (f"{kind} tokens' K and V", "P · L · 2·H_kv·d · bytes",
                 f"{P} × {spec.num_layers} × 2·{spec.kv_heads}·{spec.head_size} × {b}",
                 "Han et al. 2022 (CPM-Ant), Wang et al. 2022 (GIT): P tokens before every sequence's")  # fmt: skip
    else:
        return None
    return state
