"""Quantity parsing, tensor sizes and float formats (the lecture's first napkin math)."""

import pytest

from lmcalc.engine.model.numerics import FORMATS, dtype_bytes
from lmcalc.errors import LmcalcError
from lmcalc.estimates.counts import tensor
from lmcalc.units import parse_bytes, parse_count, parse_shape


@pytest.mark.parametrize(
    "text,value",
    [
        ("15T", 15e12),
        ("1.4T", 1.4e12),
        ("300B", 300e9),
        ("4M", 4e6),
        ("1e12", 1e12),
        ("8192", 8192.0),
        ("2k", 2e3),
        ("0.5P", 5e14),
    ],
)
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "abc", "15X", "-3T", "0", "1e999", "T"])
def test_parse_count_rejects(text):
    with pytest.raises(LmcalcError):
        parse_count(text, "--tokens")


def test_sequence_lengths_use_binary_k():
    # Context lengths are quoted in binary units: an "8K context" holds 8192 tokens; token counts stay decimal.
    assert parse_count("8K", binary=True) == 8192 and parse_count("128k", binary=True) == 131072
    assert parse_count("8K") == 8000


def test_parse_bytes_decimal_and_binary():
    assert parse_bytes("80GB") == 80e9
    assert parse_bytes("2GiB") == 2 * 1024**3
    assert parse_bytes("0") == 0
    with pytest.raises(LmcalcError):
        parse_bytes("2 parsecs")


def test_parse_shape():
    assert parse_shape("12288x49152") == (12288, 49152)
    with pytest.raises(LmcalcError):
        parse_shape("12x0")


def test_four_by_eight_fp32_is_128_bytes():
    # Lecture: a 4×8 fp32 tensor is 32 elements × 4 bytes = 128 bytes.
    assert tensor(shape=(4, 8), dtype="fp32").value("bytes") == 128


def test_gpt3_ffn_matrix_is_2_4_gb():
    # Lecture: one 12288 × 49152 fp32 matrix (a GPT-3 feed-forward weight) ≈ 2.4 GB.
    result = tensor(shape=(12288, 49152), dtype="fp32")
    assert result.value("bytes") == 12288 * 49152 * 4
    assert result.value("gb") == pytest.approx(2.4, abs=0.02)


def test_dtype_bytes():
    assert dtype_bytes("bf16") == 2 and dtype_bytes("fp8") == 1 and dtype_bytes("int4") == 0.5
    with pytest.raises(LmcalcError, match="accepted"):
        dtype_bytes("fp12")


TORCH_NAMES = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8-e4m3": "float8_e4m3fn",
    "fp8-e5m2": "float8_e5m2",
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(TORCH_NAMES))
def test_float_formats_match_torch_finfo(name):
    torch = pytest.importorskip("torch")
    info = torch.finfo(getattr(torch, TORCH_NAMES[name]))
    fmt = FORMATS[name]
    assert fmt.bits == info.bits
    assert fmt.max == info.max
    assert fmt.smallest_normal == info.smallest_normal
    assert fmt.eps == info.eps
    assert fmt.storage_bytes * 8 == info.bits


def test_e4m3_max_is_448():
    # Micikevicius et al. 2022 Table 1: E4M3 max normal 448, E5M2 max normal 57344.
    assert FORMATS["fp8-e4m3"].max == 448
    assert FORMATS["fp8-e5m2"].max == 57344
