"""Accelerator, precision-recipe and optimizer presets: they load, follow the conventions, and say what the
sources say.

Expected figures below are typed from the project's reference facts (hardware_facts.yaml) and the papers
cited next to them -- deliberately NOT read back from the preset YAML, so that a wrong edit to a preset
fails here.
"""

from __future__ import annotations

import re

import pytest

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
from lmcalc.specs import HardwareSpec, OptimizerSpec, PrecisionRecipe

HARDWARE_FILES = sorted((builtin_dir() / "hardware").glob("*.yaml"))
TRAINING_DTYPES = ("bf16", "fp16", "fp8")


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
    ],
)
def test_unsupported_or_unsourced_dtypes_are_left_out_with_a_note(preset, missing):
    spec = _hw(preset)
    for dtype in missing:
        assert dtype not in spec.peak_tflops_dense
        assert any(dtype in note for note in spec.notes), f"{preset}: no note explains the missing {dtype}"


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
    assert set(spec.sources) == {"compute", "memory", "interconnect", "power"}
    assert all(text.strip() for text in spec.sources.values())
    assert spec.sparsity_note.strip()
    assert path.read_text(encoding="utf-8").startswith("#"), "each file opens with a comment header"


def test_cluster_shapes_use_the_presets_node_size():
    assert parse_cluster("16xH100").nodes == 2
    assert parse_cluster("16xgb200").nodes == 4
    assert parse_cluster("4xrtx-4090").nodes == 4


# ----------------------------------------------------------------------------------------- precisions


def _bytes_per_param(recipe: PrecisionRecipe, optimizer: OptimizerSpec) -> float:
    """Model-state bytes per parameter for unfactored optimizers (ZeRO §3.1 accounting)."""
    total = recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes
    for state in optimizer.states:
        assert not state.factored
        total += state.bytes if state.bytes is not None else recipe.optimizer_state_bytes
        if state.quantization_block:
            total += 4 / state.quantization_block
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
        ("bf16-mixed", "adam-8bit", 10 + 2 * 4 / 2048),  # Dettmers et al. 2022: 1 byte + fp32 absmax / 2048
    ],
)
def test_bytes_per_parameter(precision, optimizer, expected):
    recipe = resolve_precision(precision).spec
    assert _bytes_per_param(recipe, resolve_optimizer(optimizer).spec) == pytest.approx(expected)


@pytest.mark.parametrize("alias", ["bf16", "mixed-bf16", "amp-bf16"])
def test_bf16_aliases(alias):
    assert resolve_precision(alias).spec.name == "bf16-mixed"


def test_every_recipe_runs_on_h100_and_is_documented():
    h100 = _hw("h100-sxm")
    recipes = registry("precisions").specs.values()
    assert {r.name for r in recipes} >= {"fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-pure", "fp8-mixed"}
    for recipe in recipes:
        assert recipe.compute_dtype in h100.peak_tflops_dense, recipe.name
        assert recipe.description and recipe.sources, recipe.name


# ----------------------------------------------------------------------------------------- optimizers


def test_optimizer_presets():
    specs = registry("optimizers").specs
    expected = {"sgd", "sgd-momentum", "adagrad", "rmsprop", "adam", "adamw", "lion", "adafactor", "adam-8bit"}
    assert expected <= set(specs)
    assert [s.name for s in specs["lion"].states] == ["momentum"]  # Chen et al. 2023: momentum only
    (adafactor,) = specs["adafactor"].states  # Shazeer & Stern 2018: factored 2nd moment, no 1st moment
    assert adafactor.factored
    adam8 = specs["adam-8bit"].states  # Dettmers et al. 2022: 2 states, 8-bit, block 2048
    assert [(s.bytes, s.quantization_block) for s in adam8] == [(1, 2048), (1, 2048)]
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
