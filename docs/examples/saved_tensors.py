"""List, tensor by tensor, what lmcalc counts as saved for the backward pass of one layer.

    python docs/examples/saved_tensors.py MODEL [--seq S] [--micro-batch B] [--attention flash|eager]
                                          [--recompute none|selective|full] [--framework NAME]
                                          [--moe] [--outside] [--mixer attention|other]

It prints the list that ``lmcalc memory`` adds up (``layer_kept_tensors`` and ``model_saved_tensors``
in ``lmcalc/engine/memory/activations.py``) for a bf16 model: each tensor's bytes per element, its shape in the
symbols of docs/formulas.md, and its bytes. ``--framework`` names the framework profile (default: idealised,
the papers' count; docs/formulas.md §5.9). ``--moe`` lists an MoE layer instead of a dense one;
``--outside`` lists what is saved outside the layers (token ids, final norm, head input, logits); ``--mixer``
lists one of a hybrid's layers of that kind (one that attends, or one of its other mixer) instead of their average.
Used by docs/formulas.md §5.4 and §5.9.
"""

import argparse

from lmcalc.engine.memory.activations import layer_kept_tensors
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.engine.workload import Workload
from lmcalc.presets import resolve_framework, resolve_model, resolve_optimizer, resolve_precision

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--seq", type=int, default=8192)
parser.add_argument("--micro-batch", type=int, default=1)
parser.add_argument("--attention", default="flash", choices=("flash", "eager"))
parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
parser.add_argument("--framework", default="idealised")
group = parser.add_mutually_exclusive_group()
group.add_argument("--moe", action="store_true")
group.add_argument("--outside", action="store_true")
parser.add_argument("--mixer", default="average", choices=("average", "attention", "other"))
args = parser.parse_args()

spec = resolve_model(args.model).spec
bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
framework = resolve_framework(args.framework).spec
w = Workload(spec, bf16, adamw, args.seq, args.micro_batch, args.attention, args.recompute, framework=framework)
tensors = model_saved_tensors(w) if args.outside else layer_kept_tensors(w, args.moe, args.mixer)
for t in tensors:
    print(f"{t.label:<52} {t.bytes_per_element:>2g} B · {t.symbol:<12} {t.bytes:>16,.0f}")
print(f"{'total':<52} {'':<17} {sum(t.bytes for t in tensors):>16,.0f}")
