"""Which layer of a model is what: whether it attends, locally or not, or runs a hybrid's other mixer, whether it
has an FFN and whether that FFN routes to experts, and how many layers of each kind the model has. ``LayerKinds`` is
a base of ``specs.ModelSpec``, which holds the fields these read; a frozen spec counts each kind once
(``cached_property``), as the planner asks per layout."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from lmcalc.layer_specs import moe_layers_in
from lmcalc.mixer_specs import (
    DeltaNetSpec,
    LightningSpec,
    Mamba2Spec,
    MambaSpec,
    MLstmSpec,
    RgLruSpec,
    RwkvSpec,
    ShortConvSpec,
)

if TYPE_CHECKING:
    from lmcalc.layer_specs import GlobalAttentionSpec, KvSharingSpec, MLASpec, MoESpec, SharedBlockSpec

OtherMixer = MambaSpec | Mamba2Spec | DeltaNetSpec | ShortConvSpec | LightningSpec | RwkvSpec | RgLruSpec | MLstmSpec
"""The mixer of a hybrid's layers that do not attend."""


class LayerKinds:
    """The layer-by-layer predicates and counts of a model spec (``specs.ModelSpec``)."""

    if TYPE_CHECKING:  # ModelSpec's fields these read
        num_layers: int
        ffn_only_layer_ids: tuple[int, ...]
        mixer_only_layer_ids: tuple[int, ...]
        sliding_window: int | None
        global_layer_ids: tuple[int, ...]
        global_every: int | None
        global_from_first: bool
        moe: MoESpec | None
        mamba: MambaSpec | None
        mamba2: Mamba2Spec | None
        deltanet: DeltaNetSpec | None
        short_conv: ShortConvSpec | None
        lightning: LightningSpec | None
        rwkv: RwkvSpec | None
        rglru: RgLruSpec | None
        mlstm: MLstmSpec | None
        shared_block: SharedBlockSpec | None
        local_kv_heads: int | None
        sinks_local_only: bool
        local_qk_l2_norm: bool
        global_attention: GlobalAttentionSpec | None
        kv_sharing: KvSharingSpec | None
        mla: MLASpec | None

    @property
    def hybrid(self) -> OtherMixer | None:
        """The mixer of a hybrid's layers that do not attend: Mamba (Jamba), Mamba-2 (Bamba, Granite 4), Gated
        DeltaNet (Qwen3-Next), the short convolution (LFM2), lightning attention (MiniMax-01), RWKV-4's time mix
        (every layer), Griffin's recurrent block (RecurrentGemma) or xLSTM's mLSTM (every layer); None where every
        layer attends."""
        return (
            self.mamba
            or self.mamba2
            or self.deltanet
            or self.short_conv
            or self.lightning
            or self.rwkv
            or self.rglru
            or self.mlstm
        )

    def has_mixer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) mixes tokens: every layer but an FFN block alone (Nemotron-H)."""
        return layer not in self.ffn_only_layer_ids

    def has_ffn(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) has an FFN: every layer but a mixer block alone (Nemotron-H)."""
        return layer not in self.mixer_only_layer_ids

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def mixer_layers(self) -> int:
        """Layers with a token mixer, attention or another: L less the FFN blocks alone."""
        return self.num_layers - len(self.ffn_only_layer_ids)

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def ffn_layers(self) -> int:
        """Layers with an FFN, dense or MoE: L less the mixer blocks alone."""
        return self.num_layers - len(self.mixer_only_layer_ids)

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def single_blocks(self) -> bool:
        """Whether some layers are a mixer or an FFN alone, behind one norm (Nemotron-H)."""
        return bool(self.mixer_only_layer_ids or self.ffn_only_layer_ids)

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def parallel_mixers(self) -> bool:
        """Whether every layer runs attention and the hybrid's other mixer side by side (Falcon-H1)."""
        return isinstance(self.mamba2, Mamba2Spec) and self.mamba2.parallel

    def _attends_by_pattern(self, layer: int) -> bool:
        m = self.hybrid
        if isinstance(m, (Mamba2Spec, ShortConvSpec, LightningSpec, RgLruSpec)):
            return layer in m.attention_layer_ids
        if m is None:
            return True
        if isinstance(m, (RwkvSpec, MLstmSpec)):  # no layer attends
            return False
        if isinstance(m, DeltaNetSpec) and m.attention_layer_ids:
            return layer in m.attention_layer_ids
        return m.attention_every is not None and layer % m.attention_every == m.attention_offset

    def is_attention_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) attends: every layer with a mixer but a hybrid's state-space, linear or
        convolution ones (every one where the mixers run side by side)."""
        return self.has_mixer(layer) and (self.parallel_mixers or self._attends_by_pattern(layer))

    def is_other_mixer_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) runs a hybrid's other mixer (state-space, linear attention or
        convolution): its layers that do not attend, or every one where the mixers run side by side."""
        return (
            self.has_mixer(layer)
            and bool(self.hybrid)
            and (self.parallel_mixers or not self._attends_by_pattern(layer))
        )

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def attention_layers(self) -> int:
        return sum(self.is_attention_layer(i) for i in range(self.num_layers))

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def attention_uses(self) -> int:
        """Attention run in one forward pass: the attention layers', and each use of a shared block's (Zamba 2)."""
        return self.attention_layers + (self.shared_block.uses if self.shared_block else 0)

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def other_mixer_layers(self) -> int:
        """Layers that run a hybrid's other mixer (state-space, linear attention or convolution): M − A, or M where
        the mixers run side by side."""
        return sum(self.is_other_mixer_layer(i) for i in range(self.num_layers))

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def attention_share(self) -> float:
        """Of the layers, the share that attends: 1 but in a hybrid, or where some layers are an FFN alone."""
        return self.attention_layers / self.num_layers

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def other_mixer_share(self) -> float:
        """Of the layers, the share whose mixer is a hybrid's other one: (M − A)/L."""
        return self.other_mixer_layers / self.num_layers

    def is_local_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) attends over the sliding window (or chunk) only."""
        if self.sliding_window is None:
            return False
        if self.global_layer_ids:
            return layer not in self.global_layer_ids
        if self.global_every is None:
            return True
        return (layer if self.global_from_first else layer + 1) % self.global_every != 0

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def local_layers(self) -> int:
        """Attention layers that attend locally."""
        return sum(self.is_local_layer(i) and self.is_attention_layer(i) for i in range(self.num_layers))

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    @functools.cached_property  # a frozen spec's; the step time asks per micro-batch
    def tp_blocks(self) -> tuple[float, float]:
        """The blocks a layer's tensor-parallel collectives gather, on average over the dense and over the MoE
        layers: a mixer and an FFN in a dense layer (2), a mixer and the shared experts in an MoE layer (the routed
        experts are the expert TP group's); a layer that is a mixer or an FFN alone (Nemotron-H's blocks, a Mamba
        model's layers) has only its one."""
        moe_layers = [i for i in range(self.num_layers) if self.is_moe_layer(i)]
        moe_ids = set(moe_layers)
        dense = [int(self.has_mixer(i)) + int(self.has_ffn(i)) for i in range(self.num_layers) if i not in moe_ids]
        shared = 1 if self.moe is not None and self.moe.shared_experts > 0 else 0
        moe = [int(self.has_mixer(i)) + shared for i in moe_layers]
        return (sum(dense) / len(dense) if dense else 2.0), (sum(moe) / len(moe) if moe else 1.0 + shared)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) routes to experts: an MoE model's layer with an FFN that MoESpec makes
        sparse."""
        return bool(self.moe and self.has_ffn(layer) and self.moe.is_moe_layer(layer))

    def moe_layers_in(self, start: int, stop: int) -> int:
        """MoE layers among layers ``start`` to ``stop - 1``."""
        return moe_layers_in(self.moe, self.mixer_only_layer_ids, start, stop) if self.moe else 0

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def dense_ffn_layers(self) -> int:
        """Layers with a dense FFN of ffn_size: every layer with an FFN that is not an MoE one."""
        return self.ffn_layers - self.moe_layers

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def local_attention_differs(self) -> bool:
        """Whether the local layers have KV heads, sinks, a QK-norm or MLA widths of their own (MiMo-V2-Flash, Llama 4,
        dots.3 Note), or the global layers widths of their own, or the last layers reuse earlier ones' K and V (Gemma
        4)."""
        return bool(
            self.local_kv_heads or self.sinks_local_only or self.local_qk_l2_norm or self.global_attention
            or self.kv_sharing or (self.mla and self.mla.local)
        )  # fmt: skip

    def reuses_kv(self, layer: int) -> bool:
        """Whether ``layer`` attends with an earlier layer's K and V (one of the last ``kv_sharing.layers``)."""
        return bool(self.kv_sharing) and layer >= self.num_layers - (self.kv_sharing.layers if self.kv_sharing else 0)
