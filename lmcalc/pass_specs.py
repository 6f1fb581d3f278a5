"""How a forward pass runs a model's layers beyond one pass over its own tokens: layers whose weights run more than
once (looped transformers: Dory, HRM), tokens every layer computes before the text (CPM-Ant's prompt, GIT's images),
and a drafter that reads its backbone's hidden state and K and V (Gemma 4's assistants). ``specs.ModelSpec`` holds
them; the rest of lmcalc takes them from ``specs``.

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

import functools
from typing import Literal, Self

from pydantic import Field, model_validator

from lmcalc.spec_base import Dimension, LayerIndex, Spec, StrictBool, no_items


class LoopMessageSpec(Spec):
    """Inkling 2's loop messages (transformers' Inkling2LoopMessageAttentionResidual and Inkling2LoopMessageGate): each
    run of a looped layer after its first reads the previous pass, four learned queries of h attending over that
    pass's block states and its output, and four gates (a weightless norm of both, 2·h → r, then r → h twice) mix
    those messages into the queries', keys', values' and MLP's inputs. Every looped layer holds its queries and gates,
    whether or not a later pass runs them."""

    gate_rank: Dimension = Field(description="r, the gates' rank (loop_gate_rank)")
    layers: LayerIndex = Field(description="the looped layers, each holding four queries and four gates "
                               "(loop_layer_index_end − loop_layer_index_start)")  # fmt: skip
    query_layers: LayerIndex | None = Field(
        None,
        description="the layers the queries are held for, where the loop section reaches past the last layer "
        "(transformers holds queries for loop_layer_index_end − loop_layer_index_start, loops the layers there are); "
        "None: layers",
    )


class LayerReuseSpec(Spec):
    """Layers whose weights run more than once in a forward pass: looped transformers (Dory's recurrent section, run
    n_recurrent_loops times between its input and output layers; the Hierarchical Reasoning Model's low- and
    high-level stacks, run in cycles). ``ModelSpec.num_layers`` counts the runs, L, in the order they compute;
    ``weights`` names each run's held layer, so the model holds L_w = max + 1 layers. The FLOPs and the KV cache
    come from the runs, the parameters from the held layers."""

    weights: tuple[LayerIndex, ...] = Field(
        min_length=1, description="for each run (a layer of the forward pass), the held layer whose weights it runs"
    )
    no_grad_runs: tuple[LayerIndex, ...] = Field(
        default_factory=no_items,
        description="the runs computed without gradients (HRM's early low-level cycles): forward only in training",
    )
    cache: Literal["every_run", "last_run"] = Field(
        "every_run",
        description="every run caches its own K and V (Dory's per_loop, HRM's); last_run: only each held layer's "
        "last run does, the earlier ones reading it (Dory's last_loop)",
    )
    start_state: StrictBool = Field(
        False, description="a learned first input of the low-level stack, h wide (HRM's z_L_init, never trained)"
    )
    messages: LoopMessageSpec | None = Field(None, description="Inkling 2's loop messages between passes")

    @model_validator(mode="after")
    def _every_layer_runs(self) -> Self:
        if set(self.weights) != set(range(self.held)):
            missing = min(set(range(self.held)) - set(self.weights))
            raise ValueError(f"layer_reuse.weights never runs held layer {missing}: the held layers are 0 to "
                             f"{self.held - 1}, each run at least once")  # fmt: skip
        beyond = [run for run in self.no_grad_runs if run >= len(self.weights)]
        if beyond:
            raise ValueError(f"layer_reuse.no_grad_runs names run {beyond[0]}, but the runs are 0 to "
                             f"{len(self.weights) - 1}")  # fmt: skip
        return self

    @property
    def held(self) -> int:
        """L_w, the layers whose weights the model holds."""
        return max(self.weights) + 1

    @functools.cached_property  # a frozen spec's
    def repeats(self) -> tuple[int, ...]:
        """The runs of a held layer after its first: those that read a previous pass's messages."""
        first = {layer: run for run, layer in reversed(list(enumerate(self.weights)))}
        return tuple(run for run, layer in enumerate(self.weights) if first[layer] != run)

    @functools.cached_property  # a frozen spec's
    def cached_runs(self) -> frozenset[int]:
        """The runs that keep a KV cache: every one, or each held layer's last."""
        if self.cache == "every_run":
            return frozenset(range(len(self.weights)))
        last = {layer: run for run, layer in enumerate(self.weights)}
        return frozenset(last.values())


class PromptSpec(Spec):
    """CPM-Ant's prompt and segments (Han et al. 2022, CPM-Ant; transformers' CpmAntModel): ``length`` prompt tokens,
    their rows in the embedding beyond the vocabulary (``types`` prompts of ``length`` rows), are prepended to every
    sequence, so every layer computes s + P tokens and attends over them, and the head reads the s alone; a segment
    embedding of ``segments`` rows is added to each token's, and a bias on the scores comes from a table of
    segments² + ``buckets`` rows a head (segment pairs, and bucketed relative positions), shared by the layers."""

    length: Dimension = Field(description="P, the prompt tokens prepended to every sequence (prompt_length)")
    types: Dimension = Field(description="the prompts the embedding holds rows for, P each (prompt_types)")
    segments: Dimension = Field(description="the segment embedding's rows (segment_types)")
    buckets: Dimension = Field(description="the relative positions' buckets (position_bias_num_buckets)")


class ImagePrefixSpec(Spec):
    """An image encoder whose tokens come before the text's (GIT, Wang et al. 2022; transformers' GitModel): a ViT of
    ``layers`` pre-norm layers of ``width`` over the image's patches and a class token, each image's tokens projected
    to the decoder's width and prepended, so every decoder layer computes them and the text attends over them; the
    head runs on every position. Its weights are counted apart (``ModelSpec.vision_params``)."""

    width: Dimension = Field(description="v, the encoder's width (vision_config.hidden_size)")
    ffn_size: Dimension = Field(description="f_v, its MLP's width (vision_config.intermediate_size)")
    layers: Dimension = Field(description="its layers (vision_config.num_hidden_layers)")
    heads: Dimension = Field(12, description="H_v, its attention heads (vision_config.num_attention_heads)")
    image: Dimension = Field(description="the image's side in pixels (vision_config.image_size)")
    patch: Dimension = Field(description="a patch's side in pixels (vision_config.patch_size)")
    channels: Dimension = Field(3, description="the image's channels (vision_config.num_channels)")
    images: Dimension = Field(1, description="images a sequence (GIT's video frames: num_image_with_embedding)")

    @property
    def tokens(self) -> int:
        """n, one image's tokens: a class token and (image / patch)² patches."""
        return (self.image // self.patch) ** 2 + 1

    @property
    def prefix(self) -> int:
        """P, the tokens the images put before the text."""
        return self.images * self.tokens


DRAFTER_COUNTED_ONLY = (
    "Gemma 4's drafters are counted by lmcalc params, lmcalc flops, lmcalc train-time (full training, at an MFU) and "
    "the serving memory (memory --inference) alone: transformers 5.24 defines no training step for them (no labels, "
    "no loss; generation runs a drafter without gradients, one position at a time, on its backbone's last hidden "
    "state and K and V), its forward over more than one position lets each attend to the backbone's later K and V, "
    "and a workload cannot state the backbone run that makes those inputs, so lmcalc's training memory, fine-tuning "
    "and step-time model do not take them (docs/hf-types.md)"
)


class DrafterSpec(Spec):
    """A drafter for speculative decoding (Gemma 4's assistants; transformers' Gemma4AssistantForCausalLM): its text
    model reads the backbone's hidden state and the token's embedding (2 × ``backbone_width``, projected to h), and
    every layer attends with the backbone's K and V (``kv_sharing`` over all its layers: no K or V of its own, no
    cache); its last hidden state is projected back to the backbone's width. With ``centroids``, its logits are those
    of the ``top_centroids`` best of that many clusters of the vocabulary (h → C, then the clusters' rows of the
    tied head) instead of the whole head."""

    backbone_width: Dimension = Field(description="h_b, the backbone's width (backbone_hidden_size)")
    centroids: Dimension | None = Field(None, description="C, the vocabulary's clusters (num_centroids), where "
                                        "use_ordered_embeddings; None: the whole head")  # fmt: skip
    top_centroids: Dimension = Field(32, description="the clusters each token's logits come from "
                                     "(centroid_intermediate_top_k)")  # fmt: skip
