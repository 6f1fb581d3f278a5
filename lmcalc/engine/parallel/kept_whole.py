"""The layers lmcalc keeps whole on each rank, and the tensor- and context-parallel layouts it refuses for them:
a recurrence's state across the sequence, a mask or convolutions reaching over it, weights it does not split."""

from __future__ import annotations

from lmcalc.errors import LmcalcError
from lmcalc.specs import ModelSpec


def check_kept_whole(model: ModelSpec, tp: int, cp: int) -> None:
    """Refuse TP or CP over the layers lmcalc keeps whole on each rank, in one line naming what the split would
    divide: a recurrence's state across the sequence, a mask or convolutions reaching over it, weights not split."""
    if tp == 1 and cp == 1:  # the planner asks for every layout: most split neither
        return
    degree = {"tp": tp, "cp": cp}
    recurrent = bool(model.rglru or model.rwkv or model.mlstm)
    use = {("cp",): "use CP=1", ("tp",): "use TP=1", ("tp", "cp"): "use TP=1 and CP=1"}
    rules = (
        (recurrent, ("cp",), "{degree} splits the sequence, which {name}'s recurrent layers scan token by token: "
         "lmcalc does not model handing each rank's last state to the next"),
        (bool(model.dynamic_mask_window), ("tp", "cp"), "{degree} would split {name}'s dynamic mask, which lmcalc "
         "keeps whole: dt_proj reads every KV head's values, and each query keeps its top keys over the sequence"),
        (bool(model.cca), ("tp", "cp"), "{degree} would split {name}'s CCA convolutions, which reach tokens back over "
         "the sequence, and the router state each layer hands the next, which lmcalc keeps whole"),
        (recurrent, ("tp",), "{degree} would split {name}'s recurrent blocks, whose weights and scan lmcalc keeps "
         "whole on each tensor-parallel rank"),
        (bool(model.compressed_attention), ("tp", "cp"), "{degree} would split {name}'s compressors, indexers and one "
         "K=V head (DeepSeek-V4's compressed attention), which lmcalc keeps whole on each rank and over the whole "
         "sequence"),
        (bool(model.mla and model.mla.rope_key_norm), ("tp", "cp"), "{degree} would split {name}'s attention (dots.3 "
         "Note's MLA of two widths, its RoPE key's norm, a gate a head, an indexer over the whole sequence), which "
         "lmcalc counts as transformers runs it, whole on one rank"),
        (bool(model.image_prefix), ("tp", "cp"), "{degree} would split {name}'s image encoder, whose weights "
         "lmcalc keeps whole, and the image's tokens, which every text token attends to"),
        (bool(model.prompt), ("tp", "cp"), "{degree} would split {name}'s score bias and mask over the prompt and the "
         "text, which lmcalc keeps whole on each rank"),
        (model.ngpt_scales, ("tp", "cp"), "{degree} would split {name}'s nGPT layers, which lmcalc counts as "
         "transformers runs them, whole on one rank: their L2 sub-norms over the attention's and the MLP's whole "
         "width, their loops over the whole sequence"),
        (bool(model.byte_latent), ("tp", "cp"), "{degree} would split {name}'s encoder, global transformer and "
         "cross-attention between bytes and patches, which lmcalc counts as transformers runs them, whole on one rank: "
         "each patch's maximum over its bytes, a dense mask over every byte and patch"),
        (bool(model.branch_convs), ("tp", "cp"), "{degree} would split {name}'s branch convolutions and relative "
         "logits, which lmcalc counts as transformers runs them, whole on one rank: fp32 convolutions over the whole "
         "width and sequence, a dense bias over every query and key"),
    )  # fmt: skip
    for applies, degrees, text in rules:
        if not applies:
            continue
        split = [f"{d.upper()}={degree[d]}" for d in degrees if degree[d] > 1]
        if split:
            raise LmcalcError(f"{text.format(degree=split[0], name=model.name)}; {use[degrees]}")
