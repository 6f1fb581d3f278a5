"""GOT-OCR 2.0 (transformers' `got_ocr2`): its text model is Qwen2's, and its SAM image encoder and projector are
counted apart (lmcalc.hf_vision.sam_params). The class defaults' tower by hand; tests/test_hf_types.py compares tiny
ones, with and without biases and positions, with transformers' own model."""

from lmcalc.hf_vision import sam_params, vision_fields


def test_the_class_defaults_tower_by_hand():
    # SAM ViT-B at 1024 pixels: h 768, 12 layers of 12 heads (64 wide), MLP 3072, 16-pixel patches (a 64 × 64 grid),
    # windows of 14 but in layers 2, 5, 8 and 11, a neck to 256 channels; the text model's width 1024 (Qwen2's here)
    patch_embedding = 3 * 16 * 16 * 768 + 768
    positions = 64 * 64 * 768
    layer = 4 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768)
    relative = 8 * 2 * (2 * 14 - 1) * 64 + 4 * 2 * (2 * 64 - 1) * 64  # windowed layers, then the global ones
    neck = 768 * 256 + 2 * 256 + 9 * 256 * 256 + 2 * 256
    projector = 9 * 256 * 512 + 9 * 512 * 1024 + (1024 * 1024 + 1024)
    by_hand = patch_embedding + positions + 12 * layer + relative + neck + projector
    assert by_hand == 96_618_752  # = transformers' GotOcr2ForConditionalGeneration less its text model (hf-types.md)
    assert sam_params({}, 1024) == by_hand


def test_the_tower_is_reported_beside_the_text_model():
    fields = vision_fields({"model_type": "got_ocr2", "vision_config": {}}, {"hidden_size": 1024})
    assert fields["vision_params"] == 96_618_752
    assert "96,618,752 parameters" in fields["notes"][0]
