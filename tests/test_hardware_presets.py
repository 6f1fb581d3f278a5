"""Accelerator, precision-recipe and optimizer presets: they load, follow the conventions, and say what the
sources say.

Expected figures below are typed from the project's reference facts (hardware_facts.yaml) and the papers
cited next to them -- deliberately NOT read back from the preset YAML, so that a wrong edit to a preset
fails here. The kernel-level facts (measured matmul and collective figures, compute units) are compared
with the reference file itself where it has them (its copy in tests/data/reference/).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lmcalc.errors import LmcalcError
from lmcalc.presets import (
    builtin_dir,
    construct_trusted,
    load_spec_file,
    normalise,
    parse_cluster,
    registry,
    resolve_hardware,
    resolve_optimizer,
    resolve_precision,
)
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe
from lmcalc.specs import HardwareSpec

HARDWARE_FILES = sorted((builtin_dir() / "hardware").glob("*.yaml"))
TRAINING_DTYPES = ("bf16", "fp16", "fp8")
MEASURED_SOURCE_GROUPS = ("matmul", "collectives", "compute_units", "cuda_memory")


def _hw(name: str) -> HardwareSpec:
    return registry("hardware").specs[name]  # type: ignore[return-value]


def _key(alias: str) -> str:
    """Alias identity: case-insensitive, with '-', '_' and spaces equivalent."""
    return normalise(alias)


# ----------------------------------------------------------------------------------------- loading, names


def test_the_expected_accelerators_are_there():
    names = {p.stem for p in HARDWARE_FILES}
    expected = {
        "v100",
        "a100-40gb",
        "a100-80gb",
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "gh200",
        "h20",
        "h800",
        "b200",
        "b300",
        "gb200",
        "l4",
        "l40s",
        "a10g",
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "rtx-4080",
        "rtx-4060-ti-16gb",
        "rtx-a6000",
        "rtx-a5000",
        "rtx-6000-ada",
        "a40",
        "t4",
        "mi250x",
        "mi300x",
        "mi325x",
        "mi355x",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "gaudi2",
        "gaudi3",
    }
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_hardware_file_validates_and_is_named_after_its_file(path):
    spec = load_spec_file(path, HardwareSpec)
    assert spec.name == path.stem
    assert registry("hardware").specs[path.stem] == spec


def test_names_and_aliases_are_unique_across_files():
    owner: dict[str, str] = {}
    for spec in registry("hardware").specs.values():
        for alias in {_key(a) for a in [spec.name, *spec.aliases]}:
            assert owner.setdefault(alias, spec.name) == spec.name, (
                f"'{alias}' is claimed by both {owner[alias]} and {spec.name}"
            )


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("H100", "h100-sxm"),
        ("h100", "h100-sxm"),
        ("h100 sxm", "h100-sxm"),
        ("A100", "a100-80gb"),  # the bare name means the 80 GB SXM part
        ("h200-sxm", "h200"),
        ("v100-sxm2", "v100"),
        ("tpu_v5p", "tpu-v5p"),
        ("a6000", "rtx-a6000"),
        ("RTX A6000", "rtx-a6000"),
        ("RTXA6000", "rtx-a6000"),
        ("a5000", "rtx-a5000"),
        ("6000-ada", "rtx-6000-ada"),
        ("RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("t4", "t4"),
        ("RTX4080", "rtx-4080"),
        ("rtx-4060-ti", "rtx-4060-ti-16gb"),
    ],
)
def test_short_aliases(alias, preset):
    assert resolve_hardware(alias).spec.name == preset


# torch.cuda.get_device_name strings from the reference's pytorch_device_apis section ('NVIDIA H100 NVL'
# and 'NVIDIA A10G' are inferred there from Lightning's matcher, not observed).
TORCH_DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA H200": "h200",
    "NVIDIA H20": "h20",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    "Tesla V100-SXM2-16GB": "v100",
    "AMD Instinct MI300X VF": "mi300x",
    "NVIDIA A10G": "a10g",
    # Not in the reference: the names these cards report, as the presets' sources print them (device-query
    # dumps, Lightning's matcher, public GPU tables keyed by torch device name).
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA RTX A5000": "rtx-a5000",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA A40": "a40",
    "Tesla T4": "t4",
    "NVIDIA GeForce RTX 4080": "rtx-4080",
    "NVIDIA GeForce RTX 4060 Ti": "rtx-4060-ti-16gb",  # the 8 GB card reports the same name (preset note)
}


@pytest.mark.parametrize(("device_name", "preset"), TORCH_DEVICE_NAMES.items())
def test_torch_device_names_are_aliases(device_name, preset):
    assert resolve_hardware(device_name).spec.name == preset


@pytest.mark.parametrize(
    ("device_name", "wrong"),
    [
        # A PCIe card must never pick up an SXM preset's power and NVLink figures.
        ("NVIDIA A100-PCIE-40GB", {"a100-40gb", "a100-80gb"}),
        # H800 PCIe measures like H100 PCIe (504 TFLOP/s bf16), not like the H800 SXM preset.
        ("NVIDIA H800 PCIe", {"h800"}),
        # The RTX 4080 SUPER has 80 SMs, not the 4080's 76.
        ("NVIDIA GeForce RTX 4080 SUPER", {"rtx-4080"}),
    ],
)
def test_torch_names_of_other_variants_do_not_match_the_wrong_preset(device_name, wrong):
    try:
        matched = resolve_hardware(device_name).spec.name
    except LmcalcError:
        return
    assert matched not in wrong


# ----------------------------------------------------------------------------------------- dense peaks

# (preset, dtype, dense TFLOP/s) typed from hardware_facts.yaml; the comment says which source it quotes.
DENSE_PEAKS = [
    # NVIDIA H100 datasheet / whitepaper v1.04 Table 1: "Peak BF16 Tensor Core 989.4 TFLOPS | 1978.9 TFLOPS";
    # product page "BFLOAT16* 1,979, FP8* 3,958 ... * With sparsity" -> 989.5 and 1979 dense.
    ("h100-sxm", "bf16", 989.5),
    ("h100-sxm", "fp16", 989.5),
    ("h100-sxm", "tf32", 494.5),  # product page "TF32* 989" / 2
    ("h100-sxm", "fp8", 1979),
    ("h200", "bf16", 989.5),  # H200 page: same tensor figures as H100 SXM
    ("h100-pcie", "bf16", 756),  # whitepaper Table 1 PCIe column "756 | 1513"
    ("h100-nvl", "bf16", 835.5),  # H100 page NVL column "BFLOAT16* 1,671" / 2
    ("h800", "bf16", 989.5),  # third-party page "BF16 1,979*" / 2
    ("h20", "bf16", 148),  # Baidu Baike; dense per crowd torch.mm 142
    ("gh200", "bf16", 989),  # stas00 comparison table (w/o sparsity)
    ("a100-40gb", "bf16", 312),  # A100 datasheet "BFLOAT16 312 | 624*"
    ("a100-80gb", "bf16", 312),
    ("a100-80gb", "tf32", 156),  # A100 datasheet "TF32 156 | 312*"
    ("v100", "fp16", 125),  # V100 datasheet / A100 whitepaper GV100 column
    ("b200", "bf16", 2250),  # HGX page "FP16/BF16 4.5 PFLOPS(2)", (2) = sparse
    ("b200", "fp8", 4500),
    ("b300", "bf16", 2250),  # Blackwell Ultra datasheet HGX column "4.5 PFLOPS" sparse
    ("gb200", "bf16", 2500),  # GB200 NVL72 page "FP16/BF16(2) 5 PFLOPS" sparse
    ("l4", "bf16", 121),  # L4 datasheet "BFLOAT16 242*" / 2
    ("l40s", "bf16", 362.05),  # L40S datasheet "362.05 | 733*"
    ("a10g", "bf16", 70),  # A10G datasheet "70 TFLOPS (140 with sparsity)"
    ("rtx-4090", "bf16", 165.2),  # Ada whitepaper App. A "BF16 ... FP32 Accumulate 165.2/330.4"
    ("rtx-3090", "fp16", 71),  # GA102 whitepaper App. A "FP16 ... FP32 Accumulate 71"
    # Cards the reference lacks, typed from the datasheets their presets cite:
    ("rtx-a6000", "bf16", 154.8),  # RTX A6000 datasheet "Tensor Performance 309.7" (sparse) / 2; Microway 154.8
    ("rtx-a6000", "tf32", 77.4),  # Lightning _CUDA_FLOPS['a6000']
    ("a40", "bf16", 149.7),  # A40 datasheet "BF16 ... with FP32 Accumulate 149.7 | 299.4*"
    ("a40", "tf32", 74.8),  # A40 datasheet "TF32 Tensor 74.8 | 149.6*"
    ("rtx-a5000", "bf16", 111.1),  # RTX A5000 datasheet "Tensor Performance 222.2" (sparse) / 2
    ("rtx-6000-ada", "fp8", 728.5),  # RTX 6000 Ada datasheet "1457.0", "effective FP8 ... sparsity" / 2
    ("rtx-6000-ada", "bf16", 364.25),  # dense FP8 / 2, full-rate FP32 accumulate (professional Ada)
    ("t4", "fp16", 65),  # T4 datasheet "Mixed Precision (FP16/FP32) 65 FP16 TFLOPS" (Turing: dense)
    ("t4", "fp32", 8.1),
    ("rtx-4080", "int8", 389.9),  # Ada whitepaper via Lightning _CUDA_FLOPS['rtx 4080']
    ("rtx-4080", "bf16", 97.5),  # int8 / 4: GeForce FP32 accumulate (the whitepaper's RTX 4090 ratio)
    ("rtx-4060-ti-16gb", "bf16", 44.1),  # NVIDIA "353 AI TOPS" (8-bit, sparse) / 8
    ("mi250x", "bf16", 383),  # AMD launch table "FP16|bf16 383.0 TF"
    ("mi250x-gcd", "bf16", 191.5),  # reference per_gcd_note: halve per GCD
    ("mi300x", "bf16", 1307.4),  # AMD MI300X page; ROCm blog "1307.4 FP16 non-sparse"
    ("mi300x", "fp8", 2614.9),
    ("mi325x", "bf16", 1307.4),  # stas00: same compute as MI300X
    ("mi355x", "bf16", 2500),  # AMD MI355X page via stas00
    ("tpu-v4", "bf16", 275),  # Cloud TPU v4 doc
    ("tpu-v5e", "bf16", 197),  # Cloud TPU v5e doc
    ("tpu-v5p", "bf16", 459),  # Cloud TPU v5p doc
    ("tpu-v6e", "bf16", 918),  # Cloud TPU v6e doc
    ("gaudi2", "bf16", 432),  # Intel Hot Chips 2024 slide
    ("gaudi3", "bf16", 1835),  # Intel Hot Chips 2024 slide
    ("b200", "fp4", 9000),  # HGX page 'FP4 18 PFLOPS' (sparse), halved
    ("b300", "fp4", 14000),  # Blackwell Ultra datasheet '18 PFLOPS | 14 PFLOPS' (sparse | dense)
    ("gb200", "fp4", 10000),  # GB200 NVL72 page, NVFP4 20 PFLOPS sparse per GPU, halved
    ("gb300", "fp4", 15000),  # Blackwell Ultra datasheet GB300 column '20 | 15 PFLOPS' (sparse | dense)
]


@pytest.mark.parametrize(("preset", "dtype", "tflops"), DENSE_PEAKS)
def test_dense_peaks_match_the_reference(preset, dtype, tflops):
    assert _hw(preset).peak_tflops_dense[dtype] == pytest.approx(tflops, rel=1e-12)


def test_h100_fp8_is_twice_bf16():
    # Both from the NVIDIA H100 datasheet (dense BF16 989.5, dense FP8 1,979 = 3,958 sparse / 2).
    h100 = _hw("h100-sxm")
    assert h100.peak_tflops_dense["fp8"] == pytest.approx(2 * h100.peak_tflops_dense["bf16"])


def test_lecture_napkin_figure_is_half_the_sparse_headline():
    # The lecture takes NVIDIA's 1,979 TFLOP/s (with 2:4 sparsity) and halves it.
    assert resolve_hardware("H100").spec.peak_flops("bf16") == pytest.approx(1979e12 / 2, rel=1e-12)


@pytest.mark.parametrize(
    ("preset", "dtype", "sparse_headline"),
    [
        ("h100-sxm", "bf16", 1979),
        ("l40s", "bf16", 733),
        ("b200", "bf16", 4500),
        ("gb200", "bf16", 5000),
        ("l4", "bf16", 242),
        ("mi300x", "bf16", 2614.9),
        ("rtx-a6000", "bf16", 309.7),
        ("a40", "bf16", 299.4),
        ("rtx-a5000", "bf16", 222.2),
        ("rtx-6000-ada", "fp8", 1457.0),
        ("rtx-4080", "int8", 780),
        ("rtx-4060-ti-16gb", "int8", 353),
    ],
)
def test_no_sparse_headline_figure_is_stored(preset, dtype, sparse_headline):
    # Dense is half the 2:4-sparse headline (L40S prints 362.05 | 733, a little under half).
    assert _hw(preset).peak_tflops_dense[dtype] <= 0.5 * sparse_headline + 1e-9


@pytest.mark.parametrize(
    ("preset", "missing"),
    [
        ("v100", ["bf16", "tf32"]),  # Volta: no BF16/TF32 hardware
        ("a100-40gb", ["fp8"]),  # Ampere: no FP8 hardware
        ("a100-80gb", ["fp8"]),
        ("rtx-3090", ["bf16"]),  # not read in any source (reference gaps)
        ("b300", ["int8"]),  # NVIDIA documents disagree
        ("mi355x", ["tf32"]),  # AMD publishes none
        ("t4", ["bf16", "tf32", "fp8"]),  # Turing: FP16/INT8/INT4 tensor cores only
        ("rtx-a6000", ["fp8"]),  # Ampere: no FP8 hardware
        ("a40", ["fp8"]),
        ("rtx-a5000", ["fp8", "tf32"]),  # tf32: the datasheet prints none
    ],
)
def test_unsupported_or_unsourced_dtypes_are_left_out_with_a_note(preset, missing):
    spec = _hw(preset)
    for dtype in missing:
        assert dtype not in spec.peak_tflops_dense
        assert any(dtype in note for note in spec.notes), f"{preset}: no note explains the missing {dtype}"


@pytest.mark.parametrize(
    ("preset", "ai_tops"),
    [
        ("rtx-4090", 1321.2),  # Ada whitepaper App. A: INT8 660.6 / 1321.2 sparse; bf16 165.2 -- the rule's check
        ("rtx-4080", 780),  # NVIDIA GeForce RTX 40 spec table "780 AI TOPS"
        ("rtx-4060-ti-16gb", 353),  # "353 AI TOPS"
    ],
)
def test_geforce_ada_bf16_is_an_eighth_of_the_sparse_ai_tops(preset, ai_tops):
    # GeForce Ada: 8-bit sparse = 2 x 8-bit dense = 4 x fp16 (FP16 accumulate) = 8 x bf16 (FP32 accumulate, half
    # rate). The RTX 4090's whitepaper figures fix the rule; the 4080 and 4060 Ti presets are derived with it.
    assert _hw(preset).peak_tflops_dense["bf16"] == pytest.approx(ai_tops / 8, abs=0.05)


@pytest.mark.parametrize(("preset", "full_rate"), [("rtx-a6000", True), ("a40", True), ("rtx-3090", False)])
def test_professional_ampere_cards_do_not_halve_fp32_accumulate(preset, full_rate):
    # A40 datasheet: "Peak BF16 Tensor TFLOPS with FP32 Accumulate 149.7", equal to "FP16 ... with FP16 Accumulate
    # 149.7"; GA102 whitepaper App. A (RTX 3090): FP16 with FP32 accumulate 71 of 142.
    spec = _hw(preset)
    sparse_fp16_acc = {"rtx-a6000": 309.7, "a40": 299.4, "rtx-3090": 284}[preset]
    fp32_acc = spec.peak_tflops_dense["fp16"]
    assert fp32_acc == pytest.approx(sparse_fp16_acc / 2 if full_rate else sparse_fp16_acc / 4, abs=0.1)


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_missing_training_dtype_is_explained(path):
    spec = _hw(path.stem)
    for dtype in TRAINING_DTYPES:
        if dtype not in spec.peak_tflops_dense:
            explained = any(dtype in note for note in spec.notes)
            assert explained, f"{spec.name}: no note explains the missing {dtype}"


# ----------------------------------------------------------------------------------------- memory, links


@pytest.mark.parametrize(
    ("preset", "memory_bytes"),
    [
        ("h200", 141_000_000_000),  # H200 page "141GB"
        ("h100-sxm", 80_000_000_000),  # "80GB HBM3"
        ("a100-40gb", 40_000_000_000),
        ("mi300x", 192_000_000_000),  # AMD page "192 GB"
        ("gb200", 186_000_000_000),  # GB200 page "186 GB HBM3E" per GPU
        ("tpu-v4", 32 * 2**30),  # TPU v4 doc "32 GiB"
        ("tpu-v5e", 16_000_000_000),  # TPU v5e doc "16 GB"
        ("rtx-a6000", 48_000_000_000),  # "48 GB GDDR6 with ECC"
        ("a40", 48_000_000_000),  # A40 datasheet "48 GB GDDR6 with ECC"
        ("rtx-a5000", 24_000_000_000),  # "24GB GDDR6"
        ("rtx-6000-ada", 48_000_000_000),  # "48GB GDDR6"
        ("t4", 16_000_000_000),  # "16 GB GDDR6"
        ("rtx-4080", 16_000_000_000),  # "16 GB GDDR6X"
        ("rtx-4060-ti-16gb", 16_000_000_000),  # "16 GB GDDR6"
    ],
)
def test_memory_bytes(preset, memory_bytes):
    assert _hw(preset).memory_bytes == memory_bytes


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_memory_bytes_is_the_label_read_exactly(path):
    spec = _hw(path.stem)
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*(GB|GiB)\b", spec.memory_label)
    assert match, f"{spec.name}: memory_label {spec.memory_label!r} does not start with 'N GB' or 'N GiB'"
    amount, unit = float(match[1]), match[2]
    assert spec.memory_bytes == round(amount * (10**9 if unit == "GB" else 2**30))
    assert "overhead" in spec.memory_note and ("decimal" in spec.memory_note or "GiB" in spec.memory_note)


@pytest.mark.parametrize(
    ("preset", "printed_gib"),
    [
        ("h100-sxm", 79.19),  # deviceQuery 81090 MBytes (driver 570); torch prints 79.11-79.20 by driver
        ("h200", 139.80),  # torch: total capacity of 139.80 GiB
        ("b200", 178.35),  # pytorch/ao PR 4002: 'Total Global Memory: 178.35 GB' (GiB)
        ("gb200", 184.31),
        ("gb300", 276.50),
        ("b300", 267.69),
        ("a100-80gb", 79.15),  # deviceQuery 81051 MBytes (driver 535)
        ("rtx-4090", 23.52),  # deviceQuery 24081 MBytes under Linux
        ("t4", 14.75),  # Colab's T4 with ECC on
        ("l4", 22.03),  # a GCE L4: 'device visible = 22563 MiB'
        ("rtx-5090", 31.35),  # deviceQuery 32101 MBytes (torch's message: 31.36)
        ("mi300x", 191.98),  # ROCm's torch: 'HIP out of memory ... 191.98 GiB'
    ],
)
def test_cuda_memory_is_what_torch_prints(preset, printed_gib):
    """What CUDA gives a process, as torch prints it to 0.01 GiB; the budget is that figure."""
    spec = _hw(preset)
    assert spec.cuda_memory_bytes is not None and round(spec.cuda_memory_bytes / 2**30, 2) == printed_gib
    assert spec.capacity_bytes == spec.cuda_memory_bytes and "to CUDA" in spec.capacity_label
    assert "cuda_memory" in spec.sources and f"{spec.cuda_memory_bytes:,}" in spec.memory_note


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_cuda_memory_lies_below_the_label_read_in_gib(path):
    """The driver keeps part of the physical memory, which is the label read in GiB (an H100's 80 GiB), or less on a
    GDDR card with ECC on: CUDA's total is below it, and an HBM GPU's is above the label read in decimal GB."""
    spec = _hw(path.stem)
    if spec.cuda_memory_bytes is None:
        assert spec.capacity_bytes == spec.memory_bytes and "cuda_memory" not in spec.sources
        return
    label_gb = float(re.match(r"\s*(\d+(?:\.\d+)?)", spec.memory_label)[1])
    assert spec.cuda_memory_bytes < label_gb * 2**30
    if "HBM" in spec.memory_label:
        assert spec.cuda_memory_bytes > label_gb * 10**9


@pytest.mark.parametrize(
    ("preset", "intra", "inter", "per_node"),
    [
        ("h100-sxm", 450, 50, 8),  # NVLink4 900 duplex; DGX H100 400 Gb/s NDR per GPU
        ("a100-80gb", 300, 25, 8),  # NVLink3 600 duplex; DGX A100 200 Gb/s HDR per GPU
        ("b300", 900, 100, 8),  # NVLink5 1800 duplex; DGX B300 800 Gb/s per GPU
        ("gb200", 900, 50, 4),  # NVLink5; DGX GB200 tray: 4 GPUs, 4x 400 Gb/s
        ("gaudi3", 600, 75, 8),  # 21x 200GbE intra-node; 3x 200GbE = 600 Gb/s out
        ("tpu-v5e", 200, 3.125, 8),  # ICI 400 GB/s duplex; 2x 100 Gbps per 8-chip host
    ],
)
def test_bandwidth_units(preset, intra, inter, per_node):
    spec = _hw(preset)
    assert spec.intra_node_gbps == pytest.approx(intra)
    assert spec.inter_node_gbps == pytest.approx(inter)
    assert spec.gpus_per_node == per_node


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_figure_group_names_its_source(path):
    spec = _hw(path.stem)
    assert {"compute", "memory", "interconnect", "power"} <= set(spec.sources)
    assert set(spec.sources) <= {"compute", "memory", "interconnect", "power", *MEASURED_SOURCE_GROUPS}
    assert all(text.strip() for text in spec.sources.values())
    assert spec.sparsity_note.strip()
    assert path.read_text(encoding="utf-8").startswith("#"), "each file opens with a comment header"


def test_cluster_shapes_use_the_presets_node_size():
    assert parse_cluster("16xH100").nodes == 2
    assert parse_cluster("16xgb200").nodes == 4
    assert parse_cluster("4xrtx-4090").nodes == 4
    assert parse_cluster("2xa6000").nodes == 2


# ----------------------------------------------------------------------------------------- kernel-level facts
#
# What the kernel-level step-time model reads: the chip generation, its compute units (wave quantisation),
# measured matmul rates and measured collective bus bandwidths. Where practical the figures are compared
# with the reference file itself (tests/data/reference/hardware_facts.yaml, the copy of ../shared/reference that
# test_published_runs.py keeps identical), so that this checks the preset
# against its source rather than against numbers copied into the test.

REFERENCE_FACTS = Path(__file__).resolve().parent / "data" / "reference" / "hardware_facts.yaml"
ARCHITECTURES = {
    "NVIDIA": {"volta", "turing", "ampere", "ada", "hopper", "blackwell"},
    "AMD": {"cdna2", "cdna3", "cdna4"},
    "Intel (Habana)": {"gaudi2", "gaudi3"},
    "Google": {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"},
}
MATMUL_DTYPES = ("tf32", "bf16", "fp16", "fp8")

# Each preset's entry in the reference's accelerators list.
REFERENCE_ENTRY = {
    "gb300": "NVIDIA GB300 (per Blackwell Ultra GPU in GB300 NVL72)",
    "v100": "NVIDIA V100 SXM2 32GB",
    "a100-40gb": "NVIDIA A100 SXM4 40GB",
    "a100-80gb": "NVIDIA A100 SXM4 80GB",
    "a10g": "NVIDIA A10G",
    "l4": "NVIDIA L4",
    "l40s": "NVIDIA L40S",
    "rtx-3090": "NVIDIA GeForce RTX 3090",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
    "rtx-5090": "NVIDIA GeForce RTX 5090",
    "h100-sxm": "NVIDIA H100 SXM 80GB",
    "h100-pcie": "NVIDIA H100 PCIe",
    "h100-nvl": "NVIDIA H100 NVL",
    "h200": "NVIDIA H200 SXM 141GB",
    "h800": "NVIDIA H800 SXM",
    "h20": "NVIDIA H20",
    "gh200": "NVIDIA GH200 Grace Hopper Superchip (GPU part)",
    "b200": "NVIDIA B200 (HGX B200, per GPU)",
    "b300": "NVIDIA B300 / Blackwell Ultra (HGX B300, per GPU)",
    "gb200": "NVIDIA GB200 (per Blackwell GPU in GB200 NVL72)",
    "mi250x": "AMD Instinct MI250X",
    "mi250x-gcd": "AMD Instinct MI250X",
    "mi300x": "AMD Instinct MI300X",
    "mi325x": "AMD Instinct MI325X",
    "mi355x": "AMD Instinct MI355X",
    "tpu-v4": "Google TPU v4",
    "tpu-v5e": "Google TPU v5e",
    "tpu-v5p": "Google TPU v5p",
    "tpu-v6e": "Google TPU v6e (Trillium)",
    "gaudi2": "Intel Gaudi 2",
    "gaudi3": "Intel Gaudi 3",
}

# The device names under which the reference's 'achievable' rows measure each preset's chip. Deliberately
# absent: the H800 PCIe row for h800 (another card), the A100 80GB and PCIe crowd rows for a100-40gb, and the
# per-GCD MI250X row for the mi250x package (one matmul runs on one GCD).
ACHIEVABLE_DEVICES = {
    "v100": ["Tesla V100-SXM2-16GB"],
    "a100-40gb": ["NVIDIA A100 SXM"],
    "a100-80gb": ["NVIDIA A100 SXM", "NVIDIA A100 SXM4 80GB"],
    "l4": ["NVIDIA L4"],
    "l40s": ["NVIDIA L40S"],
    "rtx-3090": ["NVIDIA GeForce RTX 3090"],
    "rtx-4090": ["NVIDIA GeForce RTX 4090"],
    "rtx-5090": ["NVIDIA GeForce RTX 5090"],
    "h100-sxm": ["NVIDIA H100 SXM", "NVIDIA H100 80GB HBM3 (SXM)"],
    "h100-pcie": ["NVIDIA H100 PCIe"],
    "h200": ["NVIDIA H200 SXM", "NVIDIA H200"],
    "h20": ["NVIDIA H20"],
    "gh200": ["NVIDIA GH200 (900W, 141GB HBM3e)", "NVIDIA GH200"],
    "b200": ["NVIDIA B200 SXM", "NVIDIA B200 180GB"],
    "b300": ["NVIDIA B300 SXM"],
    "gb200": ["NVIDIA GB200"],
    "mi250x-gcd": ["AMD MI250X (1 GCD)"],
    "mi300x": ["AMD MI300X"],
    "mi325x": ["AMD MI325X (1000W)", "AMD MI325X"],
    "mi355x": ["AMD MI355X"],
    "gaudi2": ["Intel Gaudi 2"],
    "gaudi3": ["Intel Gaudi 3"],
}
# A measurement of one chip that its source says holds for a sibling: (preset, dtype) -> the row's device.
MEASURED_HERE = {("h200", "bf16"): 812.6, ("h200", "fp16"): 780.3, ("h200", "tf32"): 417.9}
"""lmcalc bench --sweep on an H200, 2026-12-04 (docs/bench-results.md): this project's own measurement of the chip,
preferred over the reference's rows (stas00's bf16 row was the H100's, 'H200 is the same')."""


@pytest.fixture(scope="module")
def reference() -> dict:
    return yaml.safe_load(REFERENCE_FACTS.read_text(encoding="utf-8"))


def _reference_entry(reference: dict, preset: str) -> dict:
    (entry,) = [a for a in reference["accelerators"] if a["name"] == REFERENCE_ENTRY[preset]]
    return entry


def _achievable_rows(reference: dict) -> list[tuple[str, str, float, str, str]]:
    """(device, dtype, TFLOP/s, source, note) for every single-figure row of the reference's 'achievable'
    section: the per-dtype rows (stas00, AMD) and the crowd rows with one column per dtype."""
    rows = []
    for row in reference["achievable"]:
        source, note = row.get("source", ""), row.get("note", "")
        if "dtype" in row:
            if "tflops" in row:
                rows.append((row["device"], row["dtype"], float(row["tflops"]), source, note))
            continue
        columns = [d for d in ("fp32", "tf32", "fp16", "bf16") if d in row]
        rows.extend((row["device"], d, float(row[d]), source, note) for d in columns)
    return rows


def _source_rank(source: str) -> int:
    """The brief's order of preference: stas00 MAMF v2, then AMD's MAF, then stas00's older v1, then the
    crowd's square torch.mm."""
    if source == "stas00 MAMF table":
        return 0
    if source.startswith("rocm-blogs MAF"):
        return 1
    if "stas00 MAMF v1" in source:
        return 2
    assert "zzc0721" in source, source
    return 3


def _notes_about(spec: HardwareSpec, *words: str) -> list[str]:
    return [note for note in spec.notes if all(word in note for word in words)]


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_preset_names_its_architecture(path):
    spec = _hw(path.stem)
    assert spec.architecture in ARCHITECTURES[spec.vendor], f"{spec.name}: {spec.architecture!r}"


@pytest.mark.parametrize("preset", sorted(REFERENCE_ENTRY))
def test_architecture_agrees_with_the_reference(reference, preset):
    described = _reference_entry(reference, preset).get("architecture")
    if described is None:  # TPU and Gaudi entries name no generation beyond the product itself
        pytest.skip("the reference entry has no architecture line")
    # 'Hopper (GH100)', 'Ada Lovelace', 'CDNA 3, 304 CUs' -> hopper, ada, cdna3
    assert _hw(preset).architecture in described.lower().replace(" ", "")


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_gpus_count_their_compute_units_with_a_source(path):
    spec = _hw(path.stem)
    if spec.vendor in ("NVIDIA", "AMD") and not _notes_about(spec, "compute_units left out"):
        assert spec.compute_units, f"{spec.name}: SMs / CUs missing, and no note says why"
        assert spec.sources.get("compute_units", "").strip()
    else:  # a GPU whose count no source gives (GB300) says so, as a chip without SMs does
        assert spec.compute_units is None
        assert _notes_about(spec, "compute_units left out"), f"{spec.name}: no note says why compute_units is absent"


@pytest.mark.parametrize("preset", sorted(REFERENCE_ENTRY))
def test_compute_units_agree_with_the_reference_where_it_counts_them(reference, preset):
    entry = _reference_entry(reference, preset)
    text = f"{entry.get('architecture', '')} {entry.get('compute_source', {}).get('via', '')}"
    counts = {int(n) for n in re.findall(r"(\d+) (?:SMs|CUs?)\b", text)}
    if not counts:
        pytest.skip("the reference does not count this chip's SMs / CUs")
    assert counts == {_hw(preset).compute_units}


# Counts the reference does not give, typed from the sources each preset cites (mostly
# torch.cuda.get_device_properties().multi_processor_count printed in public logs).
@pytest.mark.parametrize(
    ("preset", "units"),
    [
        ("v100", 80),  # 'Tesla V100-SXM2-16GB' multi_processor_count=80
        ("a100-80gb", 108),  # 'NVIDIA A100-SXM4-80GB' multi_processor_count=108
        ("h100-pcie", 114),  # H100 datasheet 'SMs 132 | 114'
        ("h800", 132),  # DeepSeek-V3 §3.5.1: '20 out of the 132 SMs available in the H800 GPU'
        ("h20", 78),  # 'NVIDIA H20' multi_processor_count=78
        ("b200", 148),  # Chips and Cheese: 74 SMs per die x 2
        ("gb200", 152),  # 'NVIDIA GB200, 152 SMs' in measured benchmark notes
        ("rtx-4090", 128),  # multi_processor_count=128; 16,384 CUDA cores / 128 per SM
        ("rtx-3090", 82),  # 'GeForce RTX 3090' multi_processor_count=82
        ("rtx-a6000", 84),  # 10,752 CUDA cores / 128 per GA102 SM; 84 RT cores
        ("a40", 84),  # the same GA102 configuration
        ("rtx-a5000", 64),  # 8,192 CUDA cores / 128; 64 RT cores
        ("rtx-6000-ada", 142),  # device query on 'NVIDIA RTX 6000 Ada Generation': 142 SMs
        ("t4", 40),  # 2,560 CUDA cores / 64 per Turing SM
        ("rtx-4080", 76),  # 9,728 CUDA cores / 128 per Ada SM
        ("rtx-4060-ti-16gb", 34),  # 4,352 CUDA cores / 128; The FPS Review '34 Streaming Multiprocessors'
        ("mi250x-gcd", 110),  # rocprofv3: 'AMD Instinct MI250X, 110 CUs' per GCD device
    ],
)
def test_compute_units(preset, units):
    assert _hw(preset).compute_units == units


def test_the_mi250x_package_counts_both_gcds():
    assert _hw("mi250x").compute_units == 2 * _hw("mi250x-gcd").compute_units


@pytest.mark.parametrize("preset", sorted(REFERENCE_ENTRY))
def test_matmul_figures_are_the_references_preferred_measurement(reference, preset):
    # Each figure is the reference's measurement of this chip, from the most careful source it has: stas00's
    # mamf-finder v2, else AMD's MAF, else stas00's v1, else the crowd's square torch.mm (best row).
    spec = _hw(preset)
    devices = ACHIEVABLE_DEVICES.get(preset, [])
    rows = _achievable_rows(reference)
    for dtype, tflops in spec.matmul_tflops.items():
        if (preset, dtype) in MEASURED_HERE:
            assert tflops == MEASURED_HERE[preset, dtype], f"{preset} {dtype}"
            continue
        candidates = [r for r in rows if r[1] == dtype and r[0] in devices]
        assert candidates, f"{preset} {dtype}: no measurement in the reference"
        best_rank = min(_source_rank(r[3]) for r in candidates)
        preferred = max(r[2] for r in candidates if _source_rank(r[3]) == best_rank)
        assert tflops == pytest.approx(preferred, rel=1e-12), f"{preset} {dtype}"
    measured = {r[1] for r in rows if r[0] in devices}
    for dtype in measured - set(spec.matmul_tflops):
        assert _notes_about(spec, "matmul_tflops", dtype), f"{preset}: a {dtype} measurement exists but is not used"


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_matmul_figures_cite_their_source_and_stay_below_the_peak(path):
    spec = _hw(path.stem)
    if not spec.matmul_tflops:
        assert [n for n in spec.notes if n.startswith("matmul_tflops:")], f"{spec.name}: no note says none was found"
        return
    source = spec.sources.get("matmul", "")
    assert source.strip(), f"{spec.name}: sources['matmul'] missing"
    if "zzc0721" in source:
        assert "optimistic" in source, "the crowd rows flush no cache: the source must say they are optimistic"
    for dtype, tflops in spec.matmul_tflops.items():
        peak = spec.peak_tflops_dense.get(dtype)
        if peak is None:
            assert _notes_about(spec, "matmul_tflops", dtype, "no spec peak"), f"{spec.name} {dtype}"
        elif tflops >= peak:
            # Consumer cards boost above the spec clock (reference achievable_rules_of_thumb).
            assert _notes_about(spec, "matmul_tflops", dtype, "exceeds"), f"{spec.name} {dtype}: {tflops} >= {peak}"


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_unmeasured_matmul_dtype_is_explained(path):
    spec = _hw(path.stem)
    if not spec.matmul_tflops:
        return  # the preceding test asks for the 'none found' note
    for dtype in MATMUL_DTYPES:
        if dtype in spec.peak_tflops_dense and dtype not in spec.matmul_tflops:
            assert _notes_about(spec, "matmul_tflops", dtype), f"{spec.name}: no note says {dtype} was not measured"


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_bus_bandwidth_never_exceeds_the_wire(path):
    # A ring's bus bandwidth is what each GPU puts on its own link: it cannot beat the link's spec
    # (only NVLS, which reduces inside the switch, can -- and it is never stored here).
    spec = _hw(path.stem)
    for measured, wire in (
        (spec.intra_node_busbw_gbps, spec.intra_node_gbps),
        (spec.inter_node_busbw_gbps, spec.inter_node_gbps),
    ):
        if measured is None:
            continue
        assert wire is not None and measured <= wire * 1.0, f"{spec.name}: busbw {measured} on a {wire} GB/s link"
        assert spec.sources.get("collectives", "").strip(), f"{spec.name}: sources['collectives'] missing"


# Intra-node Ring measurements: preset -> the reference's measured_collectives system (and algorithm).
INTRA_NODE_RING = {
    "h100-sxm": ("8x H200", "Ring (NCCL_NVLS_ENABLE=0)"),
    "h200": ("8x H200", "Ring (NCCL_NVLS_ENABLE=0)"),
    "a100-40gb": ("8x A100 SXM (NVLink3, 300 GB/s uni)", None),
    "a100-80gb": ("8x A100 SXM (NVLink3, 300 GB/s uni)", None),
    "b200": ("8x B200 (p6-b200)", "Ring"),
    "mi300x": ("8x MI300X", None),
    "mi325x": ("8x MI300X", None),
}
# The reference entry of the chip each of those systems measured, to check that a borrowed figure crosses
# only between chips the reference gives the same fabric.
MEASURED_ON = {
    "8x H200": "h200",
    "8x A100 SXM (NVLink3, 300 GB/s uni)": "a100-80gb",
    "8x B200 (p6-b200)": "b200",
    "8x MI300X": "mi300x",
}
NDR_PER_GPU = {"h100-sxm", "h200", "b200", "gb200", "h800"}  # one 400 Gb/s NDR NIC per GPU
HDR_PER_GPU = {"a100-40gb", "a100-80gb"}  # one 200 Gb/s HDR NIC per GPU (DGX A100)


def _collective_row(reference: dict, system: str, **match) -> dict:
    rows = [r for r in reference["interconnect"]["measured_collectives"] if r["system"] == system]
    rows = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    (row,) = rows
    return row


def test_only_sourced_presets_carry_a_measured_bus_bandwidth():
    specs = registry("hardware").specs.values()
    assert {s.name for s in specs if s.intra_node_busbw_gbps} == {*INTRA_NODE_RING, "h800"}
    assert {s.name for s in specs if s.inter_node_busbw_gbps} == NDR_PER_GPU | HDR_PER_GPU | {"b300"}


@pytest.mark.parametrize(("preset", "row"), INTRA_NODE_RING.items())
def test_intra_node_busbw_is_the_references_ring_measurement(reference, preset, row):
    system, algo = row
    measured = _collective_row(reference, system, collective="all_reduce", **({"algo": algo} if algo else {}))
    assert _hw(preset).intra_node_busbw_gbps == pytest.approx(measured["busbw_GBps"], rel=1e-12)
    sibling = MEASURED_ON[system]
    if sibling != preset:  # same fabric: the reference gives both chips one interconnect block
        assert (
            _reference_entry(reference, preset)["interconnect"] == _reference_entry(reference, sibling)["interconnect"]
        )


def test_h800_intra_node_busbw_is_deepseeks_nvlink_figure():
    # DeepSeek-V3 technical report (arXiv:2412.19437) §3.2.2: "NVLink offers a bandwidth of 160 GB/s, roughly
    # 3.2 times that of IB (50 GB/s)" -- on their H800 cluster.
    h800 = _hw("h800")
    assert h800.intra_node_busbw_gbps == 160
    assert "2412.19437" in h800.sources["collectives"]


@pytest.mark.parametrize("preset", sorted(NDR_PER_GPU | HDR_PER_GPU))
def test_inter_node_busbw_is_the_maintainers_per_nic_figure(reference, preset):
    spec = _hw(preset)
    if preset in NDR_PER_GPU:  # nccl-tests #290: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"
        assert spec.inter_node_gbps == 400 / 8
        low, high = _collective_row(reference, "multi-node, NDR 400 Gb/s NICs, ring")["per_nic_GBps"]
        assert low <= spec.inter_node_busbw_gbps <= high
    else:  # nccl-tests #160: 24 GB/s per 200 Gb/s HDR NIC
        assert spec.inter_node_gbps == 200 / 8
        per_nic = _collective_row(reference, "multi-node, HDR 200 Gb/s NICs, ring")["per_nic_GBps"]
        assert spec.inter_node_busbw_gbps == per_nic


def test_b300_inter_node_busbw_is_the_measured_ring_over_eight_nics():
    # NVIDIA/nccl #2035: 16 nodes of 8 B300 with a ConnectX-8 each, "Ring: 2/4/8/16 ==> 760GBps +" all_reduce
    # busbw. A ring over 8-GPU nodes runs a channel through each GPU's NIC, so the node's ring busbw is eight NICs'
    # worth: 760 / 8 = 95 GB/s per GPU, under its 800 Gb/s (100 GB/s) NIC.
    b300 = _hw("b300")
    assert b300.inter_node_gbps == 800 / 8
    assert b300.inter_node_busbw_gbps == 760 / 8
    assert "nccl issue #2035" in b300.sources["collectives"]


def test_h800_network_and_fp8():
    # DeepSeek (arXiv:2505.09343): "each node is equipped with eight 400G Infiniband (IB) CX7 NICs" -> 50 GB/s
    # per GPU. FP8: H800 keeps H100 SXM's tensor compute; dense FP8 = 3,958 sparse / 2.
    h800 = _hw("h800")
    assert h800.inter_node_gbps == 50
    assert h800.peak_tflops_dense["fp8"] == 1979 == _hw("h100-sxm").peak_tflops_dense["fp8"]
    assert _notes_about(h800, "fp8 1979")


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_multi_node_presets_give_a_network_figure_or_say_it_is_unknown(path):
    spec = _hw(path.stem)
    if spec.gpus_per_node >= 4 and spec.inter_node_gbps is None:
        assert [n for n in spec.notes if n.startswith("unknown:") and "inter_node_gbps" in n], spec.name


@pytest.mark.parametrize(
    ("preset", "gen"),
    [
        ("a10g", 4),
        ("l4", 4),
        ("l40s", 4),
        ("rtx-3090", 4),
        ("rtx-4090", 4),
        ("rtx-5090", 5),
        ("rtx-4080", 4),
        ("rtx-a6000", 4),  # a 2-way NVLink bridge exists: notes say PCIe is the figure
        ("rtx-a5000", 4),
        ("a40", 4),
        ("rtx-6000-ada", 4),
    ],
)
def test_cards_without_nvlink_talk_over_pcie(reference, preset, gen):
    spec = _hw(preset)
    (pcie,) = [r for r in reference["interconnect"]["pcie_per_x16"] if r.get("gen") == gen]
    assert spec.intra_node_gbps == pcie["unidir_GBps"]  # stas00 PCIe table: Gen4 31, Gen5 63 one way
    assert spec.gpus_per_node == 1
    assert _notes_about(spec, "intra_node_gbps", "PCIe")


@pytest.mark.parametrize(
    ("preset", "gbps"),
    [
        ("t4", 8 * 16 * 128 / 130 / 8),  # PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b -> 15.75 GB/s one way
        ("rtx-4060-ti-16gb", 31 / 2),  # PCIe 4.0 x8: half the stas00 Gen4 x16 figure
    ],
)
def test_cards_on_other_pcie_links(preset, gbps):
    spec = _hw(preset)
    assert spec.intra_node_gbps == pytest.approx(gbps, rel=2e-3)
    assert spec.gpus_per_node == 1
    assert _notes_about(spec, "intra_node_gbps", "PCIe")


def test_scale_up_domains():
    # GB200 and GB300 NVL72: 72 GPUs in one NVLink domain. TPU pods (Cloud TPU docs, 'TPU Pod size'): v4 4096,
    # v5e 256, v5p 8960 (largest schedulable slice 6144), v6e 256.
    expected = {"gb200": 72, "gb300": 72, "tpu-v4": 4096, "tpu-v5e": 256, "tpu-v5p": 8960, "tpu-v6e": 256}
    assert {s.name: s.scale_up_gpus for s in registry("hardware").specs.values() if s.scale_up_gpus} == expected


def test_gb200_domain_is_the_references_nvlink_domain(reference):
    assert _hw("gb200").scale_up_gpus == _reference_entry(reference, "gb200")["interconnect"]["nvlink_domain"]


def test_tpu_ici_per_chip_one_way(reference):
    # Google prints bidirectional ICI per chip for v5e/v5p/v6e; one way is half. v4 has no per-chip figure
    # from Google: 6 ICI links x 4.5e10 bytes/s one way (jax-ml scaling book, 'TPU v4p' row).
    bidir = reference["interconnect"]["tpu_ici_bidir_GBps_per_chip"]
    for version in ("v5e", "v5p", "v6e"):
        assert _hw(f"tpu-{version}").intra_node_gbps == bidir[version] / 2
    assert _hw("tpu-v4").intra_node_gbps == 6 * 45


# ----------------------------------------------------------------------------------------- precisions


def _bytes_per_param(recipe: PrecisionRecipe, optimizer: OptimizerSpec) -> float:
    """Model-state bytes per parameter for unfactored optimizers (ZeRO §3.1 accounting)."""
    total = recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes
    for state in optimizer.states:
        assert not state.factored
        total += state.bytes if state.bytes is not None else recipe.optimizer_state_bytes
        if state.quantization_block:
            total += 4 / state.quantization_block  # for a large tensor: its quantisation map is negligible
    return total


@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [
        ("bf16-mixed", "adamw", 16),  # Rajbhandari et al. 2020 (ZeRO) §3.1: 2 + 2 + 12
        ("fp16-mixed", "adam", 16),  # same accounting, fp16 instead of bf16
        ("fp8-mixed", "adamw", 16),  # fp8 changes the matmul rate, not the stored state
        ("fp32", "adam", 16),  # 4 + 4 + 2 x 4
        ("tf32", "adam", 16),
        ("bf16-pure", "adam", 8),  # 2 + 2 + 2 x 2
        ("bf16-mixed", "sgd", 8),  # 2 + 2 + 4 (master only)
        ("bf16-mixed", "adam-8bit", 10 + 2 * 4 / 256),  # 1 byte + fp32 absmax / 256 (bitsandbytes 0.50)
    ],
)
def test_bytes_per_parameter(precision, optimizer, expected):
    recipe = resolve_precision(precision).spec
    assert _bytes_per_param(recipe, resolve_optimizer(optimizer).spec) == pytest.approx(expected)


@pytest.mark.parametrize("alias", ["bf16", "mixed-bf16", "amp-bf16"])
def test_bf16_aliases(alias):
    assert resolve_precision(alias).spec.name == "bf16-mixed"


def test_every_recipe_runs_on_h100_or_blackwell_and_is_documented():
    h100, b200 = _hw("h100-sxm"), _hw("b200")
    recipes = registry("precisions").specs.values()
    assert {r.name for r in recipes} >= {"fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-pure", "fp8-mixed"}
    for recipe in recipes:  # MXFP8 and NVFP4 run on compute capability 10.x only (Transformer Engine)
        gpu = b200 if recipe.fp8 and recipe.fp8.sm100_only else h100
        assert recipe.compute_dtype in gpu.peak_tflops_dense, recipe.name
        assert recipe.description and recipe.sources, recipe.name


# ----------------------------------------------------------------------------------------- optimizers


def test_optimizer_presets():
    specs = registry("optimizers").specs
    expected = {"sgd", "sgd-momentum", "adagrad", "rmsprop", "adam", "adamw", "lion", "adafactor", "adam-8bit"}
    expected |= {"paged-adamw-8bit", "paged-adamw"}
    assert expected <= set(specs)
    assert [s.name for s in specs["lion"].states] == ["momentum"]  # Chen et al. 2023: momentum only
    (adafactor,) = specs["adafactor"].states  # Shazeer & Stern 2018: factored 2nd moment, no 1st moment
    assert adafactor.factored
    adam8 = specs["adam-8bit"].states  # Dettmers et al. 2022: 2 states, 8-bit; bitsandbytes 0.50's block of 256
    assert [(s.bytes, s.quantization_block) for s in adam8] == [(1, 256), (1, 256)]
    assert all(s.bytes is None for name in ("adam", "adamw", "sgd-momentum") for s in specs[name].states)


def _torch_state_after_one_step(make_optimizer):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = make_optimizer(model.parameters())
    model(torch.randn(3, 8)).square().sum().backward()
    optimizer.step()
    return model, optimizer


TORCH_OPTIMIZERS = {
    "sgd": lambda torch: lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.0),
    "sgd-momentum": lambda torch: lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda torch: lambda p: torch.optim.Adagrad(p, lr=0.1),
    "rmsprop": lambda torch: lambda p: torch.optim.RMSprop(p, lr=0.1),
    "adam": lambda torch: lambda p: torch.optim.Adam(p, lr=0.1),
    "adamw": lambda torch: lambda p: torch.optim.AdamW(p, lr=0.1),
}


@pytest.mark.torch
@pytest.mark.parametrize("preset", TORCH_OPTIMIZERS)
def test_optimizer_state_count_matches_torch(preset):
    torch = pytest.importorskip("torch")
    model, optimizer = _torch_state_after_one_step(TORCH_OPTIMIZERS[preset](torch))
    spec = resolve_optimizer(preset).spec
    for param in model.parameters():
        state = optimizer.state.get(param, {})
        # Parameter-shaped tensors only: torch also keeps a scalar `step` tensor per parameter.
        full = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == param.shape}
        elements = sum(v.numel() for v in full.values())
        assert elements / param.numel() == len(spec.states)
        assert set(full) == {s.name for s in spec.states}  # preset names are torch's state-dict keys


@pytest.mark.torch
def test_adafactor_state_matches_torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Adafactor"):
        pytest.skip("torch.optim.Adafactor needs torch >= 2.5")
    model, optimizer = _torch_state_after_one_step(lambda p: torch.optim.Adafactor(p, lr=0.01))
    (state_spec,) = resolve_optimizer("adafactor").spec.states
    assert state_spec.factored
    for param in model.parameters():
        tensors = [v for k, v in optimizer.state[param].items() if torch.is_tensor(v) and k != "step"]
        elements = sum(v.numel() for v in tensors)
        # A factored state costs rows + columns for a matrix, a full copy for a vector.
        expected = sum(param.shape) if param.dim() == 2 else param.numel()
        assert elements == expected


@pytest.mark.parametrize("kind", ["models", "hardware", "precisions", "optimizers"])
def test_fast_construction_equals_validation(kind):
    # Built-in presets skip the validator at run time (lmcalc.presets.construct_trusted); that is only
    # sound if every built-in file already holds exactly what validation would produce (no coercion).
    reg = registry(kind)
    for name, validated in reg.specs.items():
        trusted = construct_trusted(type(validated), reg.entries[name].data)
        assert trusted == validated, name
        assert trusted.model_dump() == validated.model_dump(), name
