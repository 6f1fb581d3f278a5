"""Training FLOPs: the napkin rule 6·N·D, the detailed matmul count, and the PaLM convention.

A matmul of an (m × n) by an (n × p) matrix costs 2·m·n·p FLOPs (one multiply and one add per term).
Per token, a weight matrix of n·p elements therefore costs 2·n·p FLOPs in the forward pass; the
backward pass computes the gradient with respect to both the input and the weight, twice as much
(Kaplan et al. 2020 §2.1; Narayanan et al. 2021 §5.1). Hence forward 2·N·D, backward 4·N·D, total
6·N·D for N parameters and D tokens.

The detailed count adds what 6·N·D leaves out and removes what it wrongly includes:
  * the attention score and value products, 2·s·H·d each per token and layer, which have no weights
    (full convention: every query against all s keys, as ``FlopCounterMode`` counts them; causal:
    query i only against keys 1..i, an average of (s+1)/2);
  * the output logits, 2·h·V, counted once whether or not the head is tied to the embedding;
  * no FLOPs for the embedding lookup, norms, biases, activations or softmax (element-wise work is
    negligible next to matmuls and is not what MFU conventions count).
For MoE only the routed experts a token visits count (k of E), plus the router.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from lmcalc.engine.choices import AttnConvention, Recompute
from lmcalc.engine.model.attended import attended_keys, attended_widths, effective_keys, local_keys
from lmcalc.engine.model.branch_convs import branch_conv_flops
from lmcalc.engine.model.byte_latent import GROUPS as BYTE_LATENT_GROUPS
from lmcalc.engine.model.byte_latent import byte_latent_flops, byte_latent_terms
from lmcalc.engine.model.cca import cca_flops
from lmcalc.engine.model.compressed_attention import compressed_terms, indexer_flops, stream_mixing_flops
from lmcalc.engine.model.drafter import drafter_logits, forward_alone, frozen_inputs
from lmcalc.engine.model.layer_reuse import runs_note
from lmcalc.engine.model.mixer_flops import ssm_flops
from lmcalc.engine.model.op_policy import ATTENTION_CORE, Redone
from lmcalc.engine.model.params import weight_tensors
from lmcalc.engine.model.prefix import encoder_terms, prefix_note, prefix_tokens, prefixed
from lmcalc.engine.model.width_params import altup_flops
from lmcalc.errors import LmcalcError
from lmcalc.result import Section, Term
from lmcalc.specs import NO_TOP_K, ModelSpec
from lmcalc.units import group, sci

BACKWARD_TO_FORWARD = 2  # Kaplan et al. 2020 §2.1: backward costs twice the forward
FLOPS_PER_PARAM_PER_TOKEN = 2 * (1 + BACKWARD_TO_FORWARD)  # the 6 of 6·N·D: 2 forward + 4 backward


@dataclass(frozen=True)
class ForwardFlops:
    """Forward-pass FLOPs per token, by where they are spent."""

    projections: float  # attention Q/K/V/O (and MLA low-rank) weight matmuls; a hybrid's state-space projections
    mlp: float  # dense MLP, routed experts visited, shared experts, router
    attention_scores: float  # Q·K^T
    attention_values: float  # softmax(QK^T)·V
    logits: float
    ssm: float = 0.0  # a hybrid's state-space layers: the causal convolution and the scan's read-out (ssm_flops)
    indexer: float = 0.0  # DeepSeek sparse attention's indexer, run forward only (indexer_scores)
    streams: float = 0.0  # hyper-connections' projections and stream mixing (DeepSeek-V4's mHC)
    untrained: float = 0.0  # of the above, what runs without gradients (HRM's early runs, a drafter's post-projection)
    encoder: float = 0.0  # an image encoder's matmuls (GIT's), per text token
    stem: float = 0.0  # of the above, matmuls whose input needs no gradient (GIT's patch embedding, ZAYA's zero token)
    byte_latent: float = 0.0  # BLT's encoder, global transformer over patches and cross-attention, per byte
    byte_forward_only: float = 0.0  # BLT's entropy model and overwritten cross-attention: no gradients, per byte

    @property
    def forward_only(self) -> float:
        """What training runs forward alone: a sparse-attention indexer, and what runs without gradients."""
        return self.indexer + self.untrained + self.byte_forward_only

    @property
    def layers(self) -> float:
        core = self.attention_scores + self.attention_values
        return self.projections + self.mlp + core + self.ssm + self.indexer + self.streams + self.byte_latent

    @property
    def total(self) -> float:
        return self.layers + self.logits + self.encoder + self.byte_forward_only


@dataclass(frozen=True)
class ModelPart:
    """The part of a model one pipeline stage computes (``sharding.stage_part``): the share of each weight
    tensor's copies it holds, in ``weight_tensors`` order; its layers; whether it computes the logits."""

    shares: tuple[float, ...]
    layers: int
    logits: bool


def forward_flops_per_token(
    spec: ModelSpec, seq_len: int, convention: AttnConvention = "causal", part: ModelPart | None = None
) -> ForwardFlops:
    """Every matmul of one forward pass, per token, for sequences of ``seq_len`` tokens: of the whole model,
    or of the ``part`` a pipeline stage computes; where tokens come before the text (CPM-Ant's prompt, GIT's
    images), theirs too."""
    return prefixed(spec, seq_len, lambda whole: _forward_flops(spec, whole, convention, part))


def _forward_flops(spec: ModelSpec, seq_len: int, convention: AttnConvention, part: ModelPart | None) -> ForwardFlops:
    if spec.moe and spec.moe.experts_per_token is None:  # the routed experts' share is unknown
        raise LmcalcError(NO_TOP_K)
    projections = mlp = indexer = streams = 0.0
    tensors = weight_tensors(spec)
    shares = part.shares if part else (1,) * len(tensors)
    for t, share in zip(tensors, shares, strict=True):
        if not t.matmul or t.group in BYTE_LATENT_GROUPS:  # BLT's: by the bytes or patches each runs on (below)
            continue
        used = 2 * t.active_total * share
        if t.group in ("attention", "ssm", "shared_attention", "loop_messages"):  # the loop's gates: attention's inputs
            projections += used
        elif t.group == "indexer":
            indexer += used
        elif t.group == "hyper_connections":
            streams += used
        else:
            mlp += used
    # a stage's layers are taken at the model's average
    qk_width, v_width = attended_widths(spec, seq_len, convention)
    L, H = spec.num_layers if part is None else part.layers, spec.num_heads
    # a hybrid's stage: its layers taken at the model's mix; differential attention runs the core twice
    attending = L / spec.num_layers * spec.attention_uses * spec.attention_calls  # Zamba 2: each shared block's use
    layer_share = 1 if part is None else part.layers / spec.num_layers
    mlp += altup_flops(spec) * layer_share  # Gemma 3n's stream mixing
    indexer += indexer_flops(spec, seq_len, convention) * layer_share  # DeepSeek-V4's CSA indexers
    convolved, stem = (f * layer_share for f in cca_flops(spec, seq_len))  # ZAYA's convolutions, its delayed value
    convolved += branch_conv_flops(spec, seq_len) * layer_share  # Inkling's convolutions and relative logits
    scores, values = 2 * attending * H * qk_width, 2 * attending * H * v_width
    forward = ForwardFlops(
        projections=projections + convolved,
        mlp=mlp,
        attention_scores=scores,
        attention_values=values,
        logits=drafter_logits(spec) if part is None or part.logits else 0.0,
        ssm=L * spec.other_mixer_share * ssm_flops(spec, seq_len),
        indexer=indexer + L * spec.indexer_layers / spec.num_layers * indexer_scores(spec, seq_len, convention),
        streams=streams + stream_mixing_flops(spec) * layer_share,
        stem=stem + frozen_inputs(spec, scores + values) * layer_share,  # a drafter's backbone inputs
    )
    if spec.byte_latent:
        trained, forward_only = byte_latent_flops(spec, seq_len, convention)
        return replace(forward, byte_latent=trained, byte_forward_only=forward_only)
    if spec.drafter:  # post_projection and the clusters' scores: no gradient reaches them from the logits
        return replace(forward, untrained=forward_alone(spec) * layer_share)
    reuse = spec.layer_reuse  # runs without gradients: the average run's share (model_rules: every run alike)
    if reuse is None or not reuse.no_grad_runs:
        return forward
    return replace(forward, untrained=forward.layers * len(reuse.no_grad_runs) / spec.num_layers)


def indexer_scores(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> float:
    """Forward FLOPs per token of one lightning indexer beyond its projections (DeepSeek-V3.2 §2.1: I_t,s =
    Σ_j w_t,j · ReLU(q_t,j · k_s)): each query head against every key it may pick, 2·H_I·d_I a key, and the weighted
    sum over the heads, 2·H_I a key; over s keys (full: transformers scores every key, then masks) or (s+1)/2
    (causal)."""
    ix = spec.indexer
    if ix is None:
        return 0.0
    return effective_keys(seq_len, convention) * 2 * ix.heads * (ix.head_dim + 1)


def recompute_flops_per_token(fwd: ForwardFlops, recompute: Recompute, redone: Redone = ATTENTION_CORE) -> float:
    """Extra forward work redone in the backward pass (Korthikanti et al. 2022 Appendix A).

    Selective recomputation redoes the attention core (scores and values) and, where the framework says so
    (``op_policy.selective_redone``: Megatron-Core's modules, torchtitan's every second matmul), a share of the
    layers' weight matmuls; full recomputation redoes the whole forward pass of every layer (not the logits).
    """
    if recompute == "full":  # a run without gradients keeps nothing to redo
        return fwd.layers - fwd.untrained
    if recompute == "selective":
        core = fwd.attention_scores + fwd.attention_values if redone.attention_core else 0.0
        return core + redone.matmuls * (fwd.projections + fwd.mlp)
    return 0.0


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per token of one training step: the forward pass, the backward (twice the forward, Kaplan et al.
    2020 §2.1), and the forward work recomputation redoes. Model FLOPs (what MFU counts) leave out the
    recomputation; hardware FLOPs (what HFU counts, what the GPUs execute) include it (Chowdhery et al. 2022
    §4.1)."""

    forward: ForwardFlops
    recomputed: float
    scale: float = 1.0  # of full training's model FLOPs, what a fine-tuning method's step does (engine.finetune.flops)

    @property
    def model(self) -> float:
        """3 · forward: forward and backward (times ``scale`` under a fine-tuning method); what runs without
        gradients once: a sparse-attention indexer (DeepseekV32Indexer's ``torch.no_grad``), a looped model's runs
        under ``torch.no_grad`` (HRM's); a matmul whose input needs no gradient twice, its backward the weight's
        alone (an image encoder's patch embedding, ZAYA's delayed value of a zero token)."""
        trained = self.forward.total - self.forward.forward_only
        return ((1 + BACKWARD_TO_FORWARD) * trained + self.forward.forward_only - self.forward.stem) * self.scale

    @property
    def hardware(self) -> float:
        return self.model + self.recomputed


def step_flops(
    spec: ModelSpec,
    seq_len: int,
    recompute: Recompute = "none",
    convention: AttnConvention = "full",
    part: ModelPart | None = None,
    redone: Redone = ATTENTION_CORE,
) -> StepFlops:
    """A training step's FLOPs per token, of the whole model or of one stage's ``part``: the one count that
    ``lmcalc flops``, the step-time model, ``validate`` and ``bench step`` all use. ``redone``: what selective
    recomputation runs again (``op_policy.selective_redone``; Megatron's attention core unless said)."""
    forward = forward_flops_per_token(spec, seq_len, convention, part)
    return StepFlops(forward, recompute_flops_per_token(forward, recompute, redone))


def detailed_section(
    spec: ModelSpec, tokens: float, seq_len: int, convention: AttnConvention, recompute: Recompute
) -> Section:
    step = step_flops(spec, seq_len, recompute, convention)
    terms = (*_forward_terms(spec, step.forward, seq_len, convention), *_training_terms(step, tokens, recompute))
    return Section("detailed", f"Detailed matmul count ({convention} attention)", terms)


class _Keys(NamedTuple):
    """The keys a query is scored against, as the attention rows write them: the symbol, its value, and a note."""

    symbol: str
    text: str
    note: str


def _keys_text(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> _Keys:
    """s or (s+1)/2 keys per query; with local layers under the causal convention, k̄, the average over the global
    layers' (s+1)/2 and the local layers' window."""
    keys = attended_keys(spec, seq_len, convention)
    keys_text = f"{seq_len}" if convention == "full" else f"({seq_len}+1)/2"
    s_sym = "s" if convention == "full" else "(s+1)/2"
    keys_note = f"{convention} convention: each query scored against {keys:g} keys on average"
    c = spec.compressed_attention
    if c is not None:  # DeepSeek-V4: the window and the compressed entries, by layer kind
        kinds = f"{len(c.csa_layer_ids)} CSA layers (m = {c.csa_rate}), {len(c.hca_layer_ids)} HCA (m' = {c.hca_rate})"
        if convention == "full":
            keys_note += f": the s tokens and s // m compressed entries in the {kinds} (the window's mask counted too)"
        else:
            k_w = local_keys(seq_len, spec.sliding_window or seq_len, "sliding")
            keys_note += (
                f": the window's k_w = {k_w:.6g} and the entries gone by, ⌊i/m⌋ at query i, at most "
                f"k_I = {c.indexer.top_k} in the {kinds} (DeepSeek-V4 §2.3)"
            )
        return _Keys("k̄", f"{keys:.6g}", keys_note)
    if spec.indexer and convention == "causal":  # DeepSeek sparse attention: min(i, k_I) keys, as a window of k_I
        k = spec.indexer.top_k
        keys_note += f": query i attends to the min(i, {k}) keys its indexer picks (DeepSeek-V3.2 §2.1)"
        if spec.sliding_window:  # dots.3 Note: the indexer in the global layers, a window in the local ones
            w = spec.sliding_window
            keys_note += (f" in the {spec.attention_layers - spec.local_layers} global layers, k = "
                          f"{local_keys(seq_len, k, 'sliding'):.6g}; the {spec.local_layers} local layers' window of "
                          f"{w}, k_w = {local_keys(seq_len, w, spec.local_attention):.6g}")  # fmt: skip
        return _Keys("k̄", f"{keys:.6g}", keys_note)
    if spec.dynamic_mask_window and convention == "causal":  # Doge: the top keep_window_size keys of its mask
        keys_note += f": query i attends to the min(i, {spec.dynamic_mask_window}) keys its dynamic mask keeps"
        return _Keys("k̄", f"{keys:.6g}", keys_note)
    if spec.indexer:
        keys_note += f" (transformers masks all but the indexer's top {spec.indexer.top_k}; every key counted)"
    if spec.sliding_window is not None:
        local, w = spec.local_layers, spec.sliding_window
        if convention == "full":
            keys_note += f" (the {local} {spec.local_attention} layers' masked-out keys counted too)"
        else:  # k̄: the average over the global layers' (s+1)/2 and the local layers' window
            s_sym, keys_text = "k̄", f"{keys:.6g}"
            keys_note += (
                f": k̄ = ({spec.num_layers - local}·(s+1)/2 + {local}·k_w)/L, with k_w = "
                f"{local_keys(seq_len, w, spec.local_attention):.6g} keys in the {spec.local_attention} layers' "
                f"window of {w}"
            )
    return _Keys(s_sym, keys_text, keys_note)


def _forward_terms(spec: ModelSpec, fwd: ForwardFlops, seq_len: int, convention: AttnConvention) -> tuple[Term, ...]:
    """One forward pass per token, matmul by matmul: the projections, the MLP, the attention core, the logits."""
    keys = _keys_text(spec, seq_len + prefix_tokens(spec), convention)  # a prompt's or images' tokens first
    return (
        Term(
            "projections",
            "Attention projections (fwd, per token)",
            fwd.projections,
            "FLOPs",
            "2 · Σ attention weight elements",
            f"2 × {group(fwd.projections / 2)}",
            note=runs_note(spec)
            or (
                "with the convolutions' (and relative logits') FLOPs beside the weights' (formulas §2.32, §2.33)"
                if spec.cca or spec.branch_convs
                else ""
            ),
        ),
        Term(
            "mlp",
            "MLP / experts (fwd, per token)",
            fwd.mlp,
            "FLOPs",
            *_mlp_formula(spec, fwd),
        ),
        *_attention_terms(spec, fwd, keys, convention, seq_len),
        *_mixer_terms(spec, fwd, seq_len, convention),
        Term(
            "logits",
            "Output logits (fwd, per token)",
            fwd.logits,
            "FLOPs",
            "2 · h · V",
            f"2 × {spec.hidden_size} × {spec.vocab_size}",
        ),
        *encoder_terms(spec, fwd.encoder, seq_len),
        *byte_latent_terms(spec, fwd.byte_latent, fwd.byte_forward_only, seq_len),
        Term(
            "forward_per_token",
            "Forward per token",
            fwd.total,
            "FLOPs",
            "sum of the rows above",
            note=prefix_note(spec, seq_len),
        ),  # fmt: skip
    )


def _mlp_formula(spec: ModelSpec, fwd: ForwardFlops) -> tuple[str, str]:
    """The MLP row: its weights' elements a token uses, and with Gemma 3n's and 4's per-layer inputs and AltUp, theirs
    and AltUp's stream mixing (``width_params.altup_flops``)."""
    if not (spec.per_layer_input or spec.altup):
        formula = "2 · Σ FFN weight elements a token uses" + (" (k routed + shared + router)" if spec.moe else "")
        return formula, f"2 × {group(fwd.mlp / 2)}"
    mixing = altup_flops(spec)
    weights = (fwd.mlp - mixing) / 2
    if not mixing:
        return "2 · Σ FFN and per-layer input weight elements a token uses", f"2 × {group(weights)}"
    return (
        "2 · Σ FFN, per-layer input, AltUp and LAuReL weight elements a token uses + L · (2·h·n + 2·h·n²)",
        f"2 × {group(weights)} + {group(mixing)}",
    )


def _attention_terms(
    spec: ModelSpec, fwd: ForwardFlops, keys: _Keys, convention: AttnConvention, seq_len: int
) -> tuple[Term, ...]:
    """QKᵀ and AV: 2 · L · k̄ · H · d each, or where the global layers have a head size of their own (Gemma 4), the
    local layers' keys k_w at d and the global layers' k at d_g, averaged over the A attention layers; where P tokens
    come before the s (a prompt, images), (s + P)/s of it a token."""
    L, H, dqk, dv = spec.num_layers, spec.num_heads, spec.qk_head_dim, spec.v_head_dim
    P = prefix_tokens(spec)
    names = (("attention_scores", "Attention scores QKᵀ", "d_qk", dqk), ("attention_values", "Attention values AV",
                                                                            "d_v", dv))  # fmt: skip
    terms = []
    for (name, label, d_sym, d), value in zip(names, (fwd.attention_scores, fwd.attention_values), strict=True):
        formula, numbers = f"2 · L · {keys.symbol} · H · {d_sym}", f"2 × {L} × {keys.text} × {H} × {d}"
        g, m = spec.global_attention, spec.mla.local if spec.mla else None
        if g is not None:
            local, A = spec.local_layers, spec.attention_layers
            formula = "2 · L · H · (A_local·k_w·d + A_global·k·d_g)/A"
            numbers = f"2 × {L} × {H} × ({local}·k_w·{spec.head_size} + {A - local}·k·{g.head_dim})/{A}"
        if m is not None:  # dots.3 Note: the local layers' MLA at heads and widths of their own
            local, A = spec.local_layers, spec.attention_layers
            d_local = m.qk_head_dim if d_sym == "d_qk" else m.v_head_dim
            formula = f"2 · L · (A_local·k_w·H_local·{d_sym},local + A_global·k·H·{d_sym})/A"
            numbers = f"2 × {L} × ({local}·k_w·{m.heads}·{d_local} + {A - local}·k·{H}·{d})/{A}"
        if P:
            formula, numbers = formula + " · (s+P)/s", numbers + f" × {seq_len + P}/{seq_len}"
        note = keys.note if name == "attention_scores" else ""
        terms.append(Term(name, f"{label} (fwd, per token, {convention})", value, "FLOPs", formula, numbers,
                          note=note))  # fmt: skip
    return tuple(terms)


def _mixer_terms(spec: ModelSpec, fwd: ForwardFlops, seq_len: int, convention: AttnConvention) -> tuple[Term, ...]:
    """The rows beyond attention and the MLP: a hybrid's other mixers' convolution and scan, and a sparse-attention
    indexer's projections and key scores."""
    terms = []
    if fwd.ssm:
        terms.append(
            Term("ssm", "State-space / linear-attention core (fwd, per token)", fwd.ssm, "FLOPs",
                 "(L − A) · (convolution + scan per token)", f"{spec.other_mixer_layers} layers",
                 note="§2.8 of docs/formulas.md, per mixer kind")
        )  # fmt: skip
    ix = spec.indexer
    if ix is not None:
        keys = effective_keys(seq_len, convention)
        scores = spec.indexer_layers * indexer_scores(spec, seq_len, convention)
        terms.append(
            Term("indexer", "Sparse-attention indexer (fwd only, per token)", fwd.indexer, "FLOPs",
                 "2 · Σ indexer weight elements + 2 · L_I · keys · H_I · (d_I + 1)",
                 f"2 × {group((fwd.indexer - scores) / 2)} + 2 × {spec.indexer_layers} × {keys:g} × {ix.heads} × "
                 f"({ix.head_dim} + 1)",
                 "DeepSeek-AI 2025 (DeepSeek-V3.2) §2.1",
                 note=f"scores every key it may pick; run without gradients, so counted once in training; the "
                 f"attention then reads min(i, {ix.top_k}) keys")
        )  # fmt: skip
    return (*terms, *compressed_terms(spec, fwd.indexer, fwd.streams, seq_len, convention))


def _taken_back(fwd: ForwardFlops) -> tuple[str, str]:
    """What the training row takes back from 3 × forward: 2 × the forward of what runs without gradients, and the
    input gradient of a matmul whose input needs none (its forward once: GIT's patch embedding, ZAYA's zero token)."""
    idle = fwd.untrained + fwd.byte_forward_only
    parts = [name for name, flops in (("indexer", fwd.indexer), ("no-gradient work", idle)) if flops]
    formula = f" − 2 · ({' + '.join(parts)})" if len(parts) > 1 else f" − 2 · {parts[0]}" if parts else ""
    numbers = f" − 2 × {sci(fwd.forward_only, 4)}" if fwd.forward_only else ""
    if fwd.stem:
        formula, numbers = formula + " − no input gradient", numbers + f" − {sci(fwd.stem, 4)}"
    return formula, numbers


def _training_terms(step: StepFlops, tokens: float, recompute: Recompute) -> tuple[Term, ...]:
    """Forward and backward per token and over the D tokens (model FLOPs), then with recomputation (hardware
    FLOPs)."""
    per_token, extra = step.model, step.recomputed
    model_total = per_token * tokens
    hardware_total = (per_token + extra) * tokens
    return (
        Term(
            "training_per_token",
            "Training per token (fwd + bwd)",
            per_token,
            "FLOPs",
            "3 · forward (backward = 2 × forward)" + _taken_back(step.forward)[0],
            f"3 × {sci(step.forward.total, 4)}" + _taken_back(step.forward)[1],
        ),
        Term(
            "model_flops",
            "Total model FLOPs",
            model_total,
            "FLOPs",
            "training per token · D",
            f"{sci(per_token, 4)} × {sci(tokens)}",
            note="what MFU is measured against",
        ),
        Term(
            "recompute_per_token",
            f"Recompute per token ({recompute})",
            extra,
            "FLOPs",
            {
                "none": "0",
                "selective": "attention scores + values, forward again",
                "full": "forward of every layer again (not the logits)",
            }[recompute],
            source="Korthikanti et al. 2022 Appendix A",
        ),
        Term(
            "hardware_flops",
            "Total hardware FLOPs",
            hardware_total,
            "FLOPs",
            "(training per token + recompute per token) · D",
            f"({sci(per_token, 4)} + {sci(extra, 4)}) × {sci(tokens)}",
            note="what the GPUs actually execute (HFU is measured against this)",
        ),
    )
