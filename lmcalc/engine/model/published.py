"""A model's parameter count against the figure its publisher printed (``ModelSpec.published_params``): what the
figure counts (``published_params_scope``), to how many significant figures, rounded or cut down."""

from __future__ import annotations

from lmcalc.specs import ModelSpec


def as_published(spec: ModelSpec, total: int) -> int:
    """``total`` as the published count counts: less the token embedding and an untied head, V·h each, where it
    leaves them out (``published_params_scope``)."""
    if spec.published_params_scope == "total":
        return total
    return total - spec.vocab_size * spec.hidden_size * (1 if spec.tied_embeddings else 2)


def matches_published(spec: ModelSpec, total: int) -> bool:
    """``total`` equals the published count, to the significant figures its source prints: both are rounded to that
    precision, so a figure written out in full (PaLM's 540.35e9) and one written rounded (540e9) both match a
    count of 540.35 B to 3 significant figures. A count published without the embeddings is compared with ``total``
    less the token embedding and an untied head."""
    digits, total = spec.published_params_sig_figs, as_published(spec, total)
    if not digits or spec.published_params is None:
        return total == spec.published_params
    if spec.published_params_rounding == "down":  # the figure cut, not rounded: 142.77 B printed as 142B
        return _cut(total, digits) == _cut(spec.published_params, digits)
    return f"{total:.{digits - 1}e}" == f"{spec.published_params:.{digits - 1}e}"


def _cut(count: int, digits: int) -> int:
    """``count`` cut down to its first ``digits`` significant figures, the rest zeros: 142,774,373,888 to 3 is
    142,000,000,000."""
    places = max(0, len(str(count)) - digits)
    return count // 10**places * 10**places


def precision_text(spec: ModelSpec) -> str:
    """How the published figure is compared, in words: "to 3 significant figures" (", cut down" where the publisher
    cut it), or "" for an exact figure."""
    digits = spec.published_params_sig_figs
    if not digits:
        return ""
    return f"to {digits} significant figures" + (", cut down" if spec.published_params_rounding == "down" else "")
