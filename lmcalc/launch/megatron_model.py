"""The model a Megatron-LM launch gives by its shape flags, read as the Hugging Face config of the same architecture
would be (``hf_config``): Llama-like (SwiGLU, RMSNorm, RoPE), Mixtral-like (with ``--num-experts``), or GPT-like
(GELU, LayerNorm, learned positions).

The vocabulary is Megatron's padded one: ``_vocab_size_with_padding`` (megatron/training/tokenizer/tokenizer.py)
rounds the tokenizer's size up to a multiple of ``--make-vocab-size-divisible-by`` (128) × TP, and the embedding
and output layer are that size. The tokenizer's own size is ``--vocab-size``, or that of the built-in preset the
``--tokenizer-model`` names (``meta-llama/Meta-Llama-3-8B``: 128,256).
"""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError
from lmcalc.launch.config import Reading, Taken, VocabPadding, number, whole

VOCAB_DIVISOR = 128
"""``--make-vocab-size-divisible-by``'s default (megatron/training/arguments.py)."""
REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads")
TOKENIZER_SIZES = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
"""Tokenizers whose size their type says (``--tokenizer-type``, GPT2BPETokenizer by default): GPT-2's byte-level BPE
of 50,257 tokens (its vocab.json and merges), and Llama 2's SentencePiece model of 32,000 (Mixtral's too)."""


def model_of_flags(flags: dict[str, Any], reading: Reading) -> None:
    """The model the flags describe, as a ``ModelSpec`` (``reading.model``), or what is missing said."""
    present = [name for name in REQUIRED if name in flags]
    if not present:
        return  # an argument list without the model: --model names it
    if len(present) < len(REQUIRED) or any(isinstance(flags[n], str) and "$" in flags[n] for n in REQUIRED):
        missing = [n for n in REQUIRED if n not in flags or "$" in str(flags[n])]
        reading.cannot(", ".join(missing), "", "the model's shape is incomplete; give --model")
        return
    if "--multi-latent-attention" in flags or "--moe-layer-freq" in flags:
        return  # said by the reader (UNMODELLED): a shape this does not build
    padding = _vocab(flags, reading)
    if padding is None:
        reading.cannot("--vocab-size", "", "no vocabulary size, nor a tokenizer of a built-in preset; give --model")
        return
    if "--swiglu" not in flags:  # GPT's shape (GELU, LayerNorm, learned positions, biases, every head its own K, V)
        for name in ("--group-query-attention", "--kv-channels", "--disable-bias-linear", "--normalization",
                     "--position-embedding-type"):  # fmt: skip
            if name in flags:
                reading.cannot(name, flags[name], "lmcalc builds a GELU model as GPT-2's shape: give --model")
    config = _hf_config(flags, padding.padded(), reading.source)
    from lmcalc import presets as pr
    from lmcalc.hf_config import model_from_hf_config
    from lmcalc.specs import ModelSpec

    name = reading.source.rsplit("/", 1)[-1].removesuffix(".sh")
    origin = f"{reading.source} (Megatron-LM's shape flags)"
    data = model_from_hf_config(config, name, origin) | {"display_name": f"{name} (Megatron-LM's shape flags)"}
    try:
        spec = pr.validate(ModelSpec, data, origin)
    except LmcalcError as exc:
        raise LmcalcError(f"{reading.source}: its shape flags do not make a model: {exc}") from None
    reading.model = Taken("model", spec, "--num-layers, --hidden-size, …")
    reading.vocab_padding = padding


def _vocab(flags: dict[str, Any], reading: Reading) -> VocabPadding | None:
    """Megatron's padded vocabulary: the tokenizer's size, to be rounded up to a multiple of the divisor × TP."""
    size = None
    tokenizer = str(flags.get("--tokenizer-type", "GPT2BPETokenizer"))
    if "--vocab-size" in flags and "$" not in str(flags["--vocab-size"]):
        size = whole(flags["--vocab-size"], "--vocab-size", reading.source)
    elif isinstance(flags.get("--tokenizer-model"), str) and "$" not in flags["--tokenizer-model"]:
        size = _preset_vocab(flags["--tokenizer-model"])
    elif tokenizer in TOKENIZER_SIZES:
        size = TOKENIZER_SIZES[tokenizer]
    if size is None:
        return None
    divisor = whole(flags.get("--make-vocab-size-divisible-by", VOCAB_DIVISOR), "--make-vocab-size-divisible-by",
                    reading.source)  # fmt: skip
    if divisor < 1:
        raise LmcalcError(f"{reading.source}: --make-vocab-size-divisible-by is {divisor}; a whole number from 1")
    tp = reading.taken["tp"].value if "tp" in reading.taken else 1
    return VocabPadding(size, divisor, max(tp, 1))  # a TP of 0 is the layout's to refuse


def _preset_vocab(tokenizer: str) -> int | None:
    from lmcalc import presets as pr
    from lmcalc.preset_names import builtin_model_named
    from lmcalc.specs import ModelSpec

    name = builtin_model_named(tokenizer.rstrip("/").rsplit("/", 1)[-1])
    spec = pr.registry("models").spec(name) if name else None
    return spec.vocab_size if isinstance(spec, ModelSpec) else None


def _hf_config(flags: dict[str, Any], vocab: int, source: str) -> dict[str, Any]:
    """The Hugging Face config of the architecture the flags describe."""

    def count(name: str, default: int | None = None) -> int:
        if name not in flags:
            if default is None:
                raise LmcalcError(f"{source}: {name} is not given")
            return default
        return whole(flags[name], name, source)

    hidden, heads = count("--hidden-size"), count("--num-attention-heads")
    groups = count("--num-query-groups", heads) if "--group-query-attention" in flags else heads
    ffn = count("--ffn-hidden-size", 4 * hidden)
    positions = count("--max-position-embeddings", count("--seq-length", 4096))
    tied = "--untie-embeddings-and-output-weights" not in flags
    bias = "--disable-bias-linear" not in flags
    epsilon = number(flags.get("--norm-epsilon", 1e-5), "--norm-epsilon", source)
    common = {"vocab_size": vocab, "tie_word_embeddings": tied}
    if "--swiglu" in flags:
        config = {
            **common, "model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn,
            "num_hidden_layers": count("--num-layers"), "num_attention_heads": heads, "num_key_value_heads": groups,
            "max_position_embeddings": positions, "hidden_act": "silu", "rms_norm_eps": epsilon,
            "attention_bias": "--add-qkv-bias" in flags or bias, "mlp_bias": bias,
        }  # fmt: skip
        if "--kv-channels" in flags:
            config["head_dim"] = count("--kv-channels")
        if "--num-experts" in flags:
            config |= {
                "model_type": "mixtral", "num_local_experts": count("--num-experts"),
                "num_experts_per_tok": count("--moe-router-topk", 2),
                "intermediate_size": count("--moe-ffn-hidden-size", ffn),
            }  # fmt: skip
        return config
    return {
        **common, "model_type": "gpt2", "n_embd": hidden, "n_layer": count("--num-layers"), "n_head": heads,
        "n_inner": ffn, "n_positions": positions, "layer_norm_epsilon": epsilon,
    }  # fmt: skip
