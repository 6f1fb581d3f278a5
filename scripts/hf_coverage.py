"""How many of transformers' decoder-only model types lmcalc reads from config.json, and whether each count is exact.

Issue #31's measure, kept here so that every session can rerun it. The types are those transformers registers both
as a configuration and as a causal LM, less the encoders, the decoder halves of encoder-decoders and the audio
models (``LEFT_OUT``, with the reason). Each type is tried in four cases, each built by transformers on the meta
device (no weights) and read by lmcalc as plain JSON:

* ``defaults``: the configuration class's defaults, written out in full (``to_dict``), which usually describe the
  family's flagship;
* ``defaults-diff``: the same model as ``save_pretrained`` writes it, only the fields that differ from the class
  defaults (``to_diff_dict``): what most config.json files on the Hub hold, where every other field takes the
  class default;
* ``variant`` and ``variant-diff``: the defaults with fields a real checkpoint changes: fewer layers, the head tied
  the other way round;
* for a type whose defaults leave a mechanism off, cases with it on (``MORE_CASES``: Doge's CDMoE), likewise.

A case is ``exact`` when lmcalc's count (a multimodal model's vision tower included) equals transformers' (less the
weights transformers builds that the model never reads, ``hf_layers.transformers_unused``, said in the case), ``text
only`` when lmcalc counts a multimodal model's text model alone and says so, ``off`` when the count differs (a
defect: lmcalc must refuse rather than guess), ``refused`` when lmcalc says it cannot read the type, and
``unbuilt`` when transformers itself cannot build the case (its defaults leave a required field empty;
``BUILD_FIELDS`` supplies those fields).

    python scripts/hf_coverage.py            # the summary and each type's line
    python scripts/hf_coverage.py --write    # and docs/hf-types.md
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lmcalc.atomic import write_atomic  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.hf_layers import transformers_unused  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

ENCODERS = ("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert",
            "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm", "xlm-roberta",
            "xlm-roberta-xl", "xmod", "xlnet", "reformer")  # fmt: skip
DECODER_HALVES = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus",
                  "plbart", "prophetnet", "trocr", "whisper")  # fmt: skip
AUDIO = ("musicgen", "musicgen_melody", "moshi", "moss_transcribe_diarize")
LEFT_OUT = (
    {kind: "an encoder with a causal-LM head (is_decoder)" for kind in ENCODERS}
    | {kind: "the decoder half of an encoder-decoder" for kind in DECODER_HALVES}
    | {kind: "an audio model" for kind in AUDIO}
)
BUILD_FIELDS: dict[str, dict[str, Any]] = {
    "hunyuan_v1_dense": {"head_dim": 128},
    "hunyuan_v1_moe": {"head_dim": 128},
    "ministral": {"head_dim": 128},
    "nemotron": {"num_key_value_heads": 8},
    "dots1": {"n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6},
    "dbrx": {"attn_config": {"rope_theta": 500000.0}},
    # Lfm2MoeConfig leaves layer_types None, which its model indexes: three convolution layers to one attention
    "lfm2_moe": {"layer_types": ["full_attention" if i % 4 == 3 else "conv" for i in range(32)]},
}
"""Fields a type's class defaults leave empty and transformers needs to build the model at all."""


MORE_CASES: dict[str, dict[str, dict[str, Any]]] = {
    "doge": {
        "moe": {"is_moe": True},  # DogeCDMoE at its defaults: 16,384 single-neuron experts, 64 a token
        "moe-tied": {"is_moe": True, "num_experts": 4096, "num_experts_per_tok": 32, "tie_word_embeddings": True},
    },
}
"""Further cases for a type whose class defaults leave a mechanism off (Doge's CDMoE, ``is_moe``): each the defaults
with these fields, written in full and as ``save_pretrained`` writes it (``<name>-diff``: the fields at their
defaults absent, the tie among them where it is the default)."""

NEEDS: dict[str, str] = {}
"""What each type lmcalc does not read yet needs that the engine lacks (docs/hf-types.md's last section)."""


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    outcome: str  # exact, text only, off, refused, unbuilt
    detail: str = ""


def decoder_only_types() -> dict[str, str]:
    """model_type → configuration class name, for every decoder-only type transformers registers as a causal LM."""
    from transformers.models.auto import configuration_auto, modeling_auto

    configs = configuration_auto.CONFIG_MAPPING_NAMES
    return {
        kind: configs[kind]
        for kind in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if kind in configs and kind not in LEFT_OUT
    }


def configs(kind: str, class_name: str) -> dict[str, dict[str, Any]]:
    """The four cases' config.json contents (a case transformers cannot build is left out)."""
    import transformers

    cls = getattr(transformers, class_name)
    default = cls(**BUILD_FIELDS.get(kind, {}))
    cases = {"defaults": default.to_dict(), "defaults-diff": default.to_diff_dict()}
    layers = getattr(default, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > 2:
        try:
            variant = cls(**BUILD_FIELDS.get(kind, {}))
            half = variant.num_hidden_layers = max(2, layers // 2)
            variant.tie_word_embeddings = not getattr(default, "tie_word_embeddings", False)
            # per-layer lists follow the depth (Nemotron-H's blocks make it: its num_hidden_layers is their number)
            for key in ("layer_types", "mlp_layer_types", "layers_block_type"):
                if isinstance(getattr(variant, key, None), list):
                    setattr(variant, key, getattr(variant, key)[:half])
            cases |= {"variant": variant.to_dict(), "variant-diff": variant.to_diff_dict()}
        except Exception:  # noqa: BLE001 (a class that refuses the change: the defaults still count)
            pass
    for name, fields in MORE_CASES.get(kind, {}).items():
        more = cls(**BUILD_FIELDS.get(kind, {}), **fields)
        cases |= {name: more.to_dict(), f"{name}-diff": more.to_diff_dict()}
    return cases


def transformers_count(config: dict[str, Any]) -> int:
    import torch
    import transformers

    built = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    return sum(p.numel() for p in model.parameters())


def try_case(kind: str, name: str, config: dict[str, Any]) -> Case:
    try:
        theirs = transformers_count(config)
    except Exception as error:  # noqa: BLE001 (whatever transformers raises, the case is not built)
        return Case(kind, name, "unbuilt", f"{type(error).__name__}: {str(error).splitlines()[0][:90]}")
    try:
        spec = ModelSpec.model_validate(model_from_hf_config(config, kind, f"{kind} {name}"))
    except LmcalcError as error:
        return Case(kind, name, "refused", str(error).split(": ", 1)[-1][:90])
    except Exception as error:  # noqa: BLE001 (a pydantic refusal or a reader defect: both reported)
        return Case(kind, name, "refused", f"{type(error).__name__}: {str(error).splitlines()[0][:80]}")
    ours = count_params(spec).total + (spec.vision_params or 0)  # a multimodal model's tower, counted apart
    if ours == theirs:
        return Case(kind, name, "exact", f"{theirs:,}")
    unused = transformers_unused(spec)  # weights transformers builds and the model never reads (LongCat-Flash's)
    if unused and ours + unused == theirs:
        return Case(kind, name, "exact", f"{ours:,}; transformers builds {unused:,} more that no token reads")
    if "text_config" in config and spec.vision_params is None:
        return Case(kind, name, "text only", f"its text model; the other {theirs - ours:,} parameters are not counted")
    return Case(kind, name, "off", f"lmcalc {ours:,}, transformers {theirs:,} ({ours - theirs:+,})")


def run(kinds: list[str] | None = None) -> list[Case]:
    import transformers

    transformers.logging.set_verbosity_error()
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, class_name in decoder_only_types().items():
            if kinds and kind not in kinds:
                continue
            try:
                cases = configs(kind, class_name)
            except Exception as error:  # noqa: BLE001 (the class's defaults do not construct)
                found.append(Case(kind, "defaults", "unbuilt", f"{type(error).__name__}: {str(error)[:90]}"))
                continue
            found += [try_case(kind, name, config) for name, config in cases.items()]
    return found


def summary(cases: list[Case]) -> str:
    kinds = sorted({c.kind for c in cases})
    by_kind = {k: [c for c in cases if c.kind == k] for k in kinds}
    built = [c for c in cases if c.outcome != "unbuilt"]
    outcomes = Counter(c.outcome for c in built)
    accepted = [k for k in kinds if by_kind[k] and all(c.outcome in ("exact", "unbuilt") for c in by_kind[k])
                and any(c.outcome == "exact" for c in by_kind[k])]  # fmt: skip
    return (
        f"{len(kinds)} decoder-only types, {len(built)} cases transformers builds: {outcomes['exact']} exact, "
        f"{outcomes['text only']} text only, {outcomes['off']} off, {outcomes['refused']} refused "
        f"({len(cases) - len(built)} not built by "
        f"transformers); {len(accepted)} types read exactly in every case"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kinds", nargs="*", help="model types to try (default: all)")
    parser.add_argument("--write", action="store_true", help="write docs/hf-types.md")
    args = parser.parse_args()
    cases = run(args.kinds)
    for case in cases:
        print(f"{case.kind:26} {case.name:14} {case.outcome:8} {case.detail}")
    print(summary(cases))
    if args.write:
        write_atomic(ROOT / "docs" / "hf-types.md", page(cases))


def page(cases: list[Case]) -> str:
    import transformers

    lines = [
        "# Every decoder-only type in transformers",
        "",
        f"Written by `python scripts/hf_coverage.py --write` (transformers {transformers.__version__}). Each "
        "type transformers registers as a causal LM, less encoders, decoder halves and audio models, is built on the "
        "meta device in up to four cases (its class defaults in full and as `save_pretrained` writes them, and a "
        "variant with half the layers and the head tied the other way, likewise; Doge also with its CDMoE, `moe` and "
        "`moe-tied`) and read by lmcalc from the same JSON. See the script's docstring for the cases.",
        "",
        summary(cases) + ".",
        "",
        "| type | case | lmcalc | parameters or reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{c.kind}` | {c.name} | {c.outcome} | {c.detail.replace('|', '/')} |" for c in cases]
    refused = sorted({c.kind for c in cases if c.outcome == "refused"})
    lines += ["", "## What the refused types need", "",
              "A type lmcalc cannot model yet is refused in one line, deliberately: a count or an estimate by the "
              "nearest model lmcalc knows would be wrong without saying so. Where transformers is installed, "
              "`lmcalc params` counts such a type on the meta device, and says which estimates that count can "
              "feed."]  # fmt: skip
    if refused:
        lines += ["", "| type | what it needs |", "|---|---|"]
        lines += [f"| `{kind}` | {NEEDS.get(kind, 'not yet described')} |" for kind in refused]
    else:  # every type transformers builds is read: only its unbuilt ones (a config.json that builds) reach the count
        lines += ["", "None is refused: every type transformers 5.24 builds in these cases is read. A config.json of "
                  "a type none of whose cases transformers builds at its defaults (the unbuilt rows above) is still "
                  "counted on the meta device where the file's own fields let transformers build it."]  # fmt: skip
    return "\n".join(lines) + "\n\n" + hand_written()


HAND_WRITTEN = "## Beyond a plain decoder layer"
"""The heading of docs/hf-types.md's last part, written by hand (what each type beyond a plain decoder adds, and how
close its training memory is to transformers'): ``--write`` keeps it as it is."""


def hand_written(path: Path = ROOT / "docs" / "hf-types.md") -> str:
    """docs/hf-types.md from its hand-written heading (``HAND_WRITTEN``) to its end."""
    text = path.read_text(encoding="utf-8")
    if HAND_WRITTEN not in text:
        raise SystemExit(f"{path}: no heading starting {HAND_WRITTEN!r}, the part --write keeps")
    return text[text.index(HAND_WRITTEN) :]


if __name__ == "__main__":
    main()
