#!/usr/bin/env bash
# The GPU check of issue #5, in one call: matmul sweeps (bf16, fp16, tf32, fp8), memory bandwidth, real
# training steps of a 1B preset, validate's peak-memory row and the step's memory phase by phase
# (benchmarks/step_memory_phases.py), then benchmarks/gpu_truth.py's parts, as JSON plus a summary under OUTDIR. For
# a CUDA machine with torch (and transformers, peft for one part) already installed and no network; about 4 minutes
# on one H200 (2026-12-04: 91 s before gpu_truth.py, whose parts took about 2.5 minutes more). Each step has its own
# time limit, and no step runs past the whole budget (GPU_CHECK_BUDGET_S, default 285 s: the issue asks for under
# 5 minutes).
#   bash scripts/gpu_check.sh OUTDIR
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" XDG_DATA_HOME="$out" PYTHONUNBUFFERED=1 LMCALC_DEBUG=1
py=${PYTHON:-python3}
summary="$out/summary.txt"
budget=${GPU_CHECK_BUDGET_S:-285}
: > "$summary"
if ! $py -c "import torch, typer, pydantic, rich, yaml; assert torch.cuda.is_available()" 2>> "$out/errors.txt"; then
  echo "gpu_check: needs torch with CUDA and typer, pydantic, rich, pyyaml importable (see $out/errors.txt)" | tee -a "$summary"
  exit 2
fi
$py -c "import torch; p = torch.cuda.get_device_properties(0); print(f'device: {p.name}, {p.total_memory} bytes, torch {torch.__version__}, CUDA {torch.version.cuda}')" | tee -a "$summary"
# what CUDA gives this process against the matched preset's cuda_memory_bytes (formulas.md 5.7)
$py -c "
import torch
from lmcalc.bench.device import match_hardware
p, spec = torch.cuda.get_device_properties(0), match_hardware(torch.cuda.get_device_name(0))
have = spec.cuda_memory_bytes if spec else None
print(f'cuda memory: {p.total_memory} bytes ({p.total_memory / 2**30:.2f} GiB); preset '
      + (f'{spec.name}: {have} bytes, {100 * (p.total_memory / have - 1):+.2f} %' if have else 'none or no cuda_memory_bytes'))
" 2>> "$out/errors.txt" | tee -a "$summary"
date -u +"date: %Y-%m-%dT%H:%M:%SZ" | tee -a "$summary"

time_left() {  # time_left NAME LIMIT_S: the step's limit cut to what is left of the budget; 0: skip it
  local left=$((budget - SECONDS))
  local limit=$(($2 < left ? $2 : left))
  if ((limit < 5)); then
    echo "$1 SKIPPED: the ${budget} s budget is spent" | tee -a "$summary" >&2
    echo 0
  else
    echo "$limit"
  fi
}

failed=0
verdict() {  # verdict NAME SECONDS RC LIMIT ERR: the summary line of a step that did not succeed
  if (($3 == 124 || $3 == 137)); then
    echo "$1 TIMED OUT after $2 s (limit $4 s)" | tee -a "$summary"
  else
    echo "$1 FAILED after $2 s (exit $3): $5" | tee -a "$summary"
  fi
  failed=1
}

step() {  # step NAME TIMEOUT_S lmcalc-args...: run, keep the JSON, add one line to the summary
  local name=$1 limit
  limit=$(time_left "$1" "$2"); shift 2
  ((limit > 0)) || return 0
  local start=$SECONDS
  timeout -k 10 "$limit" $py -m lmcalc "$@" --json > "$out/$name.json" 2> "$out/$name.err"
  local rc=$? err
  err=$(tail -n 1 "$out/$name.err")
  # exit 1 from validate is a check that failed: its JSON is complete, and the summary says which row
  if ! { ((rc == 0 || rc == 1)) && [[ -s "$out/$name.json" ]]; } ||
    ! $py - "$out/$name.json" "$name" $((SECONDS - start)) $rc >> "$summary" 2> "$out/$name.summary.err" <<'PY'
import json, sys
data, name, seconds, rc = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]


def number(term):
    value = term["value"]
    return "n/a" if value is None else f"{value:.4g} {term['unit']}"


picks = []
if name.startswith("validate"):  # the judged rows only: the parts beside them are not judged
    for section, terms in data["results"].items():
        error = terms.get("error", {})
        if "pass" in error:
            mark = "ok" if error["pass"] else "FAIL"
            picks.append(f"{section}: lmcalc {number(terms['lmcalc'])}, pytorch {number(terms['pytorch'])}, {mark}")
    picks += data.get("notes", [])[:3]  # the verdict, and any row that did not run
else:
    for section, terms in data["results"].items():
        for key in ("achieved", "best", "ratio", "tokens_per_s", "mfu", "median", "predicted", "measured"):
            if key in terms:
                picks.append(f"{section}.{key}={number(terms[key])}")
    picks = picks[:24]
print(f"{name} ({seconds} s, exit {rc}): " + "; ".join(picks))
PY
  then
    verdict "$name" $((SECONDS - start)) $rc "$limit" "$err"
  elif ((rc != 0)); then
    failed=1
  fi
}

# What the issues need most comes first (one large matmul, validate's CUDA row, the step and its memory
# phase by phase), so that an overrun of the budget falls on the sweeps.
step matmul_bf16_8192 45 bench --dtype bf16 --shape 8192x8192x8192
step validate_llama_1b 60 validate --model llama-3.2-1b --seq 1024 --recompute none
step step_llama_1b 60 bench step --model llama-3.2-1b --seq 2048 --micro-batch 2
start=$SECONDS
limit=$(time_left step_memory_phases 90)
if ((limit > 0)); then
  timeout -k 10 "$limit" $py "$root/benchmarks/step_memory_phases.py" --out "$out/step_memory_phases.json" \
    > "$out/step_memory_phases.txt" 2> "$out/step_memory_phases.err"
  rc=$?
  if ((rc == 0)); then
    echo "step_memory_phases ($((SECONDS - start)) s): see step_memory_phases.txt" | tee -a "$summary"
  else
    verdict step_memory_phases $((SECONDS - start)) $rc "$limit" "$(tail -n 1 "$out/step_memory_phases.err")"
  fi
fi
step memory 20 bench memory
step sweep_bf16 45 bench --dtype bf16 --sweep --warmup 5 --repeats 20
step sweep_fp16 45 bench --dtype fp16 --sweep --warmup 5 --repeats 20
step sweep_tf32 45 bench --dtype tf32 --sweep --warmup 5 --repeats 10
step sweep_fp8 45 bench --dtype fp8 --sweep --warmup 5 --repeats 20
step model_llama_8b 45 bench --dtype bf16 --model llama-3.1-8b --seq 4096
# issue #34's measurements beyond lmcalc's own commands (benchmarks/gpu_truth.py): what lies outside PyTorch's pool,
# a transformers step against the transformers profile, the allocator's fragmentation, the harness against a bare loop
for part in context:30 transformers:90 fragmentation:60 overhead:60; do
  name=gpu_truth_${part%%:*}
  limit=$(time_left "$name" "${part##*:}")
  ((limit > 0)) || continue
  start=$SECONDS
  timeout -k 10 "$limit" $py "$root/benchmarks/gpu_truth.py" "${part%%:*}" --out "$out" > "$out/$name.txt" 2> "$out/$name.err"
  rc=$?
  if ((rc == 0)); then
    echo "$name ($((SECONDS - start)) s): see $name.txt" | tee -a "$summary"
  else
    verdict "$name" $((SECONDS - start)) $rc "$limit" "$(tail -n 1 "$out/$name.err")"
  fi
done
cp "$XDG_DATA_HOME/lmcalc/bench.json" "$out/bench.json" 2>/dev/null || true
echo "done in $SECONDS s$( ((failed)) && echo ', with failures')" | tee -a "$summary"
exit $failed
