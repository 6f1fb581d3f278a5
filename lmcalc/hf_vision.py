"""The vision tower of a multimodal config.json, counted beside its text model (never in it): Gemma 3's SigLIP
encoder and projector, GIT's CLIP encoder and projection, GOT-OCR 2.0's SAM encoder and projector, Fuyu's linear patch
embedding, tensor by tensor as transformers builds them. lmcalc estimates the language model's training; the tower is
reported so that the total a model card gives can be reconciled with the text model's."""

from __future__ import annotations

from typing import Any

SIGLIP = ("siglip_vision_model",)
"""Vision configs counted here; another tower is named in a note, not counted."""


def _linear(inputs: int, outputs: int, bias: bool = True) -> int:
    return inputs * outputs + (outputs if bias else 0)


def siglip_params(vision: dict[str, Any]) -> int:
    """SigLIP's vision transformer (Zhai et al. 2023): a patch embedding (a strided convolution with a bias), one
    learned position per patch, pre-norm layers (LayerNorm with biases; q, k, v and output projections and a
    GELU MLP, all with biases), a final LayerNorm and, unless ``vision_use_head`` is false, the attention-pooling
    head (a probe, an attention with packed in-projection, a LayerNorm and an MLP). Defaults are
    SiglipVisionConfig's."""
    h, f = vision.get("hidden_size", 768), vision.get("intermediate_size", 3072)
    patch, image = vision.get("patch_size", 16), vision.get("image_size", 224)
    channels = vision.get("num_channels", 3)
    embeddings = channels * patch * patch * h + h + (image // patch) ** 2 * h
    mlp = _linear(h, f) + _linear(f, h)
    layer = 2 * h + 4 * _linear(h, h) + 2 * h + mlp
    total = embeddings + vision.get("num_hidden_layers", 12) * layer + 2 * h
    if vision.get("vision_use_head", True):
        total += h + _linear(h, 3 * h) + _linear(h, h) + 2 * h + mlp
    return total


def clip_params(vision: dict[str, Any]) -> int:
    """CLIP's vision transformer as GIT builds it (Radford et al. 2021; GitVisionModel): a class embedding, a patch
    embedding (a strided convolution without a bias), one learned position per patch and for the class token, a
    LayerNorm before the layers and one after, pre-norm layers (LayerNorms with biases; q, k, v and output projections
    and a two-matrix MLP, all with biases). Defaults are GitVisionConfig's (ViT-B/16)."""
    h, f = vision.get("hidden_size", 768), vision.get("intermediate_size", 3072)
    patch, image = vision.get("patch_size", 16), vision.get("image_size", 224)
    embeddings = h + vision.get("num_channels", 3) * patch * patch * h + ((image // patch) ** 2 + 1) * h
    layer = 2 * h + 4 * _linear(h, h) + 2 * h + _linear(h, f) + _linear(f, h)
    return embeddings + 2 * h + vision.get("num_hidden_layers", 12) * layer + 2 * h


def sam_params(vision: dict[str, Any], text_hidden: int) -> int:
    """GOT-OCR 2.0's image encoder and projector (GotOcr2VisionEncoder, GotOcr2MultiModalProjector; SAM's ViT, Kirillov
    et al. 2023): a patch embedding (a strided convolution with a bias), one learned position per patch, pre-norm
    layers (LayerNorms with biases, a fused qkv projection with biases where ``qkv_bias``, an output projection and a
    GELU MLP with biases, and relative positions, 2·n − 1 rows of the head size for each axis, n the window or, in
    the global layers, the patch grid), a neck (a 1 × 1 and a 3 × 3 convolution to C channels, no biases, each with a
    LayerNorm), then the projector: two stride-2 3 × 3 convolutions, C → 2C → h_text, no biases, and an h_text linear
    layer with a bias. Defaults are GotOcr2VisionConfig's (SAM ViT-B at 1024 pixels)."""
    h, mlp, heads = vision.get("hidden_size", 768), vision.get("mlp_dim", 3072), vision.get("num_attention_heads", 12)
    patch, image, c = vision.get("patch_size", 16), vision.get("image_size", 1024), vision.get("output_channels", 256)
    grid, head = image // patch, h // heads
    total = (
        vision.get("num_channels", 3) * patch * patch * h
        + h
        + (grid * grid * h if vision.get("use_abs_pos", True) else 0)
    )
    globals_ = set(vision.get("global_attn_indexes", (2, 5, 8, 11)))
    for i in range(vision.get("num_hidden_layers", 12)):
        span = grid if i in globals_ else vision.get("window_size", 14)
        relative = 2 * (2 * span - 1) * head if vision.get("use_rel_pos", True) else 0
        total += 4 * h + _linear(h, 3 * h, vision.get("qkv_bias", True)) + _linear(h, h) + relative
        total += _linear(h, mlp) + _linear(mlp, h)
    neck = h * c + 2 * c + 9 * c * c + 2 * c
    return total + neck + 9 * c * 2 * c + 9 * 2 * c * text_hidden + _linear(text_hidden, text_hidden)


PHI4_VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "image_size": 448,
               "patch_size": 14, "num_channels": 3}  # fmt: skip
"""Phi4MultimodalVisionConfig's defaults, where they differ from SiglipVisionConfig's."""


def phi4_image_params(vision: dict[str, Any], text_hidden: int) -> int:
    """Phi-4-multimodal's image embedding (Phi4MultimodalImageEmbedding): a SigLIP encoder with its pooling head, the
    global and sub-image separators (v each) and a two-layer projection v → h → h, with biases. Defaults are
    Phi4MultimodalVisionConfig's."""
    vision = {**PHI4_VISION, **vision}
    v = vision["hidden_size"]
    return siglip_params(vision) + 2 * v + _linear(v, text_hidden) + _linear(text_hidden, text_hidden)


def phi4_audio_params(audio: dict[str, Any], text_hidden: int) -> int:
    """Phi-4-multimodal's audio embedding (Phi4MultimodalAudioEmbedding, Phi4MultimodalAudioModel): NeMo's conv
    subsampling (a 3 × 3 convolution, then log2(time_reduction) − 1 depthwise 3 × 3 and pointwise pairs, C channels,
    and a linear layer from C × nemo_final_size), a relative attention bias table (bias_max_distance rows, twice where
    not symmetric, a head), Conformer blocks (two macaron MLPs of a LayerNorm and a gated h → 2·f → h, attention with
    biases, a convolution module: a LayerNorm, a GLU pointwise convolution with its two biases, a depthwise separable
    convolution, a pointwise convolution; two LayerNorms), and the speech and vision-speech projections, each h_a → h
    → h. Defaults are Phi4MultimodalAudioConfig's."""
    h, f = audio.get("hidden_size", 1024), audio.get("intermediate_size", 1536)
    channels, kernel = audio.get("nemo_conv_channels", 1024), audio.get("kernel_size", 3)
    ext, mult = audio.get("ext_pw_out_channel", 1024), audio.get("depthwise_multiplier", 1)
    stages = max(audio.get("time_reduction", 8).bit_length() - 1, 1)  # int(log2(time_reduction))
    embed = (9 * channels + channels) + (stages - 1) * (10 * channels + _linear(channels, channels))
    embed += _linear(channels * audio.get("nemo_final_size", 10), h)
    buckets = audio.get("bias_max_distance", 1000) * (1 if audio.get("bias_symmetric", False) else 2)
    mlp = 2 * h + _linear(h, 2 * f) + _linear(f, h)
    conv = 2 * h + _linear(h, 2 * ext) + 2 * ext + (h * mult * kernel + h * mult)
    conv += _linear(h * mult, audio.get("depthwise_separable_out_channel", 1024)) + _linear(h, ext)
    block = 2 * mlp + 4 * _linear(h, h) + conv + 2 * 2 * h
    projections = 2 * (_linear(h * audio.get("downsample_rate", 1), text_hidden) + _linear(text_hidden, text_hidden))
    return embed + buckets * audio.get("num_attention_heads", 16) + audio.get("num_blocks", 24) * block + projections


def vision_params(config: dict[str, Any], text_hidden: int) -> int | None:
    """The vision tower and projector of a multimodal ``config``, or None when lmcalc does not count its kind."""
    vision = config.get("vision_config") or {}
    if config.get("model_type") == "gemma3" and vision.get("model_type", "siglip_vision_model") in SIGLIP:
        # Gemma3MultiModalProjector: an (h_vision × h_text) projection and an RMSNorm on the vision side
        return siglip_params(vision) + vision.get("hidden_size", 768) * (text_hidden + 1)
    if config.get("model_type") == "phi4_multimodal":  # its image and audio embeddings, both inside the causal LM
        audio = config.get("audio_config") or {}
        return phi4_image_params(vision, text_hidden) + phi4_audio_params(audio, text_hidden)
    if config.get("model_type") == "git":  # GitProjection: h_vision → h_text and a LayerNorm; a frame's embedding each
        frames = config.get("num_image_with_embedding") or 0
        width = vision.get("hidden_size", 768)
        return clip_params(vision) + _linear(width, text_hidden) + 2 * text_hidden + frames * width
    if config.get("model_type") == "got_ocr2":
        return sam_params(vision, text_hidden)
    if config.get("model_type") == "fuyu":  # FuyuModel's vision_embed_tokens: each patch's pixels, one linear layer
        patch, channels = config.get("patch_size") or 30, config.get("num_channels") or 3  # FuyuConfig's defaults
        whole = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (patch, channels, text_hidden))
        return _linear(patch * patch * channels, text_hidden) if whole else None
    return None


def vision_fields(config: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """What a multimodal config holds beside its text model: a note, and the vision tower's count where known
    (Phi-4-multimodal's image and audio encoders both)."""
    kind = str(config.get("model_type", "")).lower()
    tower = vision_params(config, text.get("hidden_size", 0))
    towers = "image and audio encoders and projections" if kind == "phi4_multimodal" else "vision tower and projector"
    if tower is None:
        note = f"the text model of a {kind or 'multimodal'} config; its {towers} are not counted"
        return {"notes": [note]}
    note = f"the text model of a {kind} config; its {towers} ({tower:,} parameters) are apart"
    if kind == "phi4_multimodal":  # its encoders' modules share the text layers' names
        note += ("; PEFT's all-linear, and the module names the encoders share (o_proj, gate_up_proj, down_proj), "
                 "adapt their linear layers too, which lmcalc's adapter count leaves out")  # fmt: skip
    return {"notes": [note], "vision_params": tower}
