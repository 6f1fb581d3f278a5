"""Reading the looped transformers of transformers 5.24, whose layers' weights run more than once a forward pass
(``LayerReuseSpec``): Dory (DoryModel: input layers, a recurrent section run ``n_recurrent_loops`` times, output
layers; nGPT's unit-norm layers) and the Hierarchical Reasoning Model's text model (HrmTextModel: a low-level and a
high-level stack of ``num_layers_per_stack`` layers each, the low one run ``L_cycles`` times before each run of the
high one, ``H_cycles`` times). ``looped_config`` gives the common reader the runs as layers (their count and, Dory's,
their layer types); ``dory`` and ``hrm_text`` finish the fields with which held layer each run is."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_attention import inkling
from lmcalc.hf_fields import get

LOOPED = ("dory", "hrm_text", "inkling2_loop_text")
LOOP_CONFIG = {"core_start": "loop_layer_index_start", "core_end": "loop_layer_index_end",
               "num_passes": "loop_num_passes", "gate_rank": "loop_gate_rank"}  # fmt: skip
"""Inkling2LoopTextConfig's ``loop_config`` (a released file's), each key over the field it names."""


def _whole(config: dict[str, Any], origin: str, key: str, least: int) -> int:
    value = get(config, origin, key)
    if value < least:
        raise LmcalcError(f"{origin}: config.json {key} must be at least {least}, not {token(value)}")
    return int(value)


def looped_config(config: dict[str, Any], kind: str, origin: str) -> dict[str, Any]:
    """``config`` with ``num_hidden_layers`` the layer runs of a forward pass, as its class lays them out."""
    if kind == "hrm_text":  # HrmTextConfig: num_hidden_layers is the inflated runs once num_layers_per_stack is set
        stack = config.get("num_layers_per_stack") or _whole(config, origin, "num_hidden_layers", 1)
        cycles = _whole(config, origin, "H_cycles", 1) * (_whole(config, origin, "L_cycles", 1) + 1)
        return {**config, "num_layers_per_stack": stack, "num_hidden_layers": stack * cycles}
    types, layers = config.get("layer_types"), _whole(config, origin, "num_hidden_layers", 1)
    if kind == "inkling2_loop_text":
        return _inkling2_loop_config(config, types, layers, origin)
    sections = {key: config.get(key) for key in ("n_input_layers", "n_recurrent_layers", "n_output_layers")}
    if types and "mlp" in types:  # DoryConfig: a released file lists attention and MLP blocks, two a layer
        types, layers = types[::2], layers // 2
        sections = {key: n // 2 if isinstance(n, int) else n for key, n in sections.items()}
    if not types:  # DoryConfig: every fourth layer full
        types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
    if len(types) != layers:
        raise LmcalcError(f"{origin}: config.json layer_types lists {len(types)} layers for {layers}")
    given = {**config, **sections}
    first, last = _whole(given, origin, "n_input_layers", 0), _whole(given, origin, "n_output_layers", 0)
    looped = given.get("n_recurrent_layers")
    looped = layers - first - last if looped is None else _whole(given, origin, "n_recurrent_layers", 0)
    if first + looped + last != layers or looped < 0:
        raise LmcalcError(f"{origin}: config.json n_input_layers + n_recurrent_layers + n_output_layers "
                          f"({first} + {looped} + {last}) must equal the {layers} layers, none below 0")  # fmt: skip
    loops = _whole(config, origin, "n_recurrent_loops", 1)
    runs = _runs(types, first, looped, loops)
    return {**config, "layer_types": runs, "num_hidden_layers": len(runs), "n_input_layers": first,
            "n_recurrent_layers": looped}  # fmt: skip


def _runs(types: list[str], first: int, looped: int, loops: int) -> list[str]:
    """The layer types of each run: the first layers once, the next ``looped`` ``loops`` times, the rest once."""
    return [*types[:first], *types[first : first + looped] * loops, *types[first + looped :]]


def _inkling2_loop_config(config: dict[str, Any], types: Any, layers: int, origin: str) -> dict[str, Any]:
    """Inkling2LoopTextConfig: layers loop_layer_index_start to loop_layer_index_end − 1 run loop_num_passes times
    (``loop_config``'s core_start, core_end and num_passes over them), every sixth layer global where config.json
    gives no layer_types; both ends multiples of n_layers_per_attn_res_block and the start above 0 (as its class
    checks). An end past the last layer loops the layers there are, as its slice of the layers does."""
    loop = config.get("loop_config") or {}
    if not isinstance(loop, dict):
        raise LmcalcError(f"{origin}: config.json loop_config must be an object, not {token(loop)}")
    config = {**config, **{field: loop[key] for key, field in LOOP_CONFIG.items() if key in loop}}
    start, end = _whole(config, origin, "loop_layer_index_start", 1), _whole(config, origin, "loop_layer_index_end", 0)
    passes = _whole(config, origin, "loop_num_passes", 1)
    block = _whole(config, origin, "n_layers_per_attn_res_block", 1)
    if start % block or end % block or not start <= min(end, layers):
        raise LmcalcError(f"{origin}: config.json loop_layer_index_start ({start}) and loop_layer_index_end ({end}) "
                          f"must be multiples of n_layers_per_attn_res_block ({block}), in order, the start within "
                          f"the {layers} layers")  # fmt: skip
    types = types or ["hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding" for i in range(layers)]
    if len(types) != layers:
        raise LmcalcError(f"{origin}: config.json layer_types lists {len(types)} layers for {layers}")
    runs = _runs(types, start, min(end, layers) - start, passes)  # the layers there are loop (its slice)
    return {**config, "layer_types": runs, "num_hidden_layers": len(runs), "n_input_layers": start,
            "n_recurrent_layers": min(end, layers) - start, "n_recurrent_loops": passes,
            "loop_layer_index_end": end}  # fmt: skip


def inkling2_loop(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Inkling 2's looped text model (Inkling2LoopTextModel): Inkling 2's layers (``hf_attention.inkling``), the
    looped ones run in each pass with caches of their own, and the loop messages (``layer_reuse.messages``)."""
    first, looped, loops = config["n_input_layers"], config["n_recurrent_layers"], config["n_recurrent_loops"]
    held = config["num_hidden_layers"] - looped * (loops - 1)
    weights = [*range(first), *list(range(first, first + looped)) * loops, *range(first + looped, held)]
    rank, section = _whole(config, origin, "loop_gate_rank", 1), config["loop_layer_index_end"] - first
    messages = {"gate_rank": rank, "layers": looped, **({"query_layers": section} if section != looped else {})}
    fields = inkling(config, origin, fields, "inkling2_text")
    return fields | {"layer_reuse": {"weights": weights, "messages": messages}}


def dory(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Dory's layers (DoryDecoderLayer): AFMoE's attention with a sigmoid gate from gate_proj, every norm nGPT's
    weightless L2 norm (four a layer, Q and K a head, one before o_proj and down_proj), nGPT's scales and residual
    rates; the recurrent section's layers run once a loop, each run caching its own K and V (``per_loop``) or the
    last loop's alone (``last_loop``)."""
    mode = config.get("recurrent_kv_cache_mode", "per_loop")
    if mode not in ("per_loop", "last_loop"):
        raise LmcalcError(f"{origin}: config.json recurrent_kv_cache_mode must be per_loop or last_loop, not "
                          f"{token(mode)}")  # fmt: skip
    first, looped, runs = config["n_input_layers"], config["n_recurrent_layers"], config["num_hidden_layers"]
    loops = _whole(config, origin, "n_recurrent_loops", 1)
    held = runs - looped * (loops - 1)
    weights = [*range(first), *list(range(first, first + looped)) * loops, *range(first + looped, held)]
    return fields | {
        "norm_weight": False,
        "norms_per_layer": 4,
        "qk_norm": "per_head",
        "attention_output_gate": True,
        "attention_gate_proj": True,
        "residual_scales": True,
        "ngpt_scales": True,
        "layer_reuse": {"weights": weights, "cache": "every_run" if mode == "per_loop" else "last_run"},
    }


def hrm_text(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """HRM's layers (HrmTextDecoderLayer): Llama's, every head its own K and V, a sigmoid gate on the attention's
    output from gate_proj, weightless RMSNorms. Each high-level cycle h runs the low-level stack L_cycles times, the
    first L_cycles − L_bp_cycles[h] under torch.no_grad (L_bp_cycles left-padded with 1s to H_cycles), then the
    high-level stack; every run caches its own K and V. z_L_init, the low stack's first input (h), is a parameter."""
    if config.get("attention_bias"):
        raise LmcalcError(f"{origin}: config.json attention_bias is true: HRM's gate_proj bias is not modelled")
    stack, high, low = config["num_layers_per_stack"], config["H_cycles"], config["L_cycles"]
    raw = config.get("L_bp_cycles") or [2]
    trained = [1] * max(0, high - len(raw)) + list(raw)  # HrmTextModel.L_bp_cycles_padded
    weights: list[int] = []
    no_grad: list[int] = []
    for h in range(high):
        for cycle in range(low):
            if cycle < low - (trained[h] if h < len(trained) else 1):
                no_grad += range(len(weights), len(weights) + stack)
            weights += range(stack)
        weights += range(stack, 2 * stack)
    return fields | {
        "norm_weight": False,
        "num_kv_heads": None,
        "attention_output_gate": True,
        "attention_gate_proj": True,
        "layer_reuse": {"weights": weights, "no_grad_runs": no_grad, "start_state": True},
    }
