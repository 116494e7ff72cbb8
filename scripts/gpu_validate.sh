#!/usr/bin/env bash
# One prepared run on a CUDA machine (written for one H200), at most 8 minutes: the validation GPU tests, then
# for the DFlash-like and suffix-like Llama-3.1-8B workloads: a profile (a recorded one from PROFILE_DIR when
# given, else a short compiled sweep here, the DFlash drafter's rows with it), the exact solver's list (this
# machine has no optuna), and `cgtune validate` of vLLM's default against it: the decoder compiled as the profile
# was, FULL steps replayed whole and PIECEWISE steps replayed split at every attention call (the target only: the
# drafter's passes are the model's prediction); a short predicted-vs-measured table last.
#
# Needs python3 with torch (CUDA), pyyaml, numpy, matplotlib, tqdm, pytest, nvidia-ml-py; not optuna. Run:
#   OUT=/some/dir bash scripts/gpu_validate.sh
#   OUT=/some/dir PROFILE_DIR=reports/h200/profiles bash scripts/gpu_validate.sh   # reuse recorded profiles
# Everything lands under $OUT (default reports/gpu-validate-<UTC time>): profiles/ (when swept here),
# runs/<workload>/ (compilation_config.json, report.md, validation.json, plots/), gpu_validate.log, summary.md.
# Commit runs/<workload>/ under reports/<gpu>/ with the log.
#
# Sizing (why these numbers): a sweep here is thinned to a few widths (--max-widths keeps the ends, the
# ceiling and the widest decode batch) so profile + validation fit; the trace length of each validation is
# sized from the cost model's own predicted step latency to the seconds left for that workload (clamped to
# MIN_STEPS..MAX_STEPS) -- predictions size the run, they never stand in for a result. `timeout` is a safety net.
# Compiled, with PIECEWISE replay, costs more than the plain FULL-only run this was first sized for; assumed, not
# yet measured on the H200 (replace with gpu_profile.sh's compile_s and validate's capture_s once they exist):
#  - the sweep compiles the step and its three kinds of PIECEWISE piece, and the DFlash drafter's pass, before its
#    first width: 60-100 s cold; `cgtune validate` compiles the decoder again in its own process, 20-40 s with
#    Inductor's caches warm, inside the 20 s of set-up steps_for assumed before plus the slack below;
#  - a PIECEWISE graph is 33 piece captures after a split warm-up, assumed 0.4 s; a FULL graph 0.1 s; each list's
#    graphs are captured twice (vLLM's estimate in a throwaway pool, then the real pool).
# Hence DFlash gets a longer sweep with fewer widths (110 s, 10 widths) and the larger share, the suffix one 8
# widths in 80 s; steps_for counts each list's PIECEWISE and FULL graphs apart.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-reports/gpu-validate-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT/runs" "$OUT/profiles"
LOG="$OUT/gpu_validate.log"
exec > >(tee -a "$LOG") 2>&1
BUDGET_S=${BUDGET_S:-470}        # whole script; the device lease allows 8 minutes
PROFILE_DIR=${PROFILE_DIR:-}     # recorded <workload>.csv (+ .json) measured on this GPU; empty: sweep here
MIN_STEPS=${MIN_STEPS:-500}
MAX_STEPS=${MAX_STEPS:-3000}
# name:max widths:sweep seconds:share of the seconds left when this workload starts
WORKLOADS=${WORKLOADS:-"dflash-llama-3.1-8b:10:110:0.6 suffix-llama-3.1-8b:8:80:1.0"}
START=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - START) )); }

echo "== $(date -u +%FT%TZ) gpu_validate.sh in $PWD -> $OUT"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "no CUDA device: stopping"; exit 1; }

echo "== GPU tests (validation)"
timeout -s INT -k 10 120 python3 -m pytest -q -m gpu tests/test_validate_gpu.py -p no:cacheprovider
TESTS_RC=$?
echo "gpu tests exit code: $TESTS_RC"

# cgtune without an install, as a command `timeout` can run (a shell function it cannot): -c keeps one copy of
# tuner.cli (python -m would load it twice, as __main__ and as tuner.cli).
CGTUNE=(python3 -c 'import sys; from tuner.cli import main; sys.exit(main())')

# Trace length for a run directory's default and tuned lists to fit SECONDS (predicted ms per step, 1.5x for
# eager warm-ups, logits and host gaps; per graph, captured twice, 0.4 s PIECEWISE and 0.1 s FULL for warm-up and
# capture; 40 s to build and compile the model). The predicted step includes a drafter's passes, which validation
# does not replay: a longer trace than needed, never a shorter one.
steps_for() {  # run dir, seconds
  python3 - "$1" "$2" "$MIN_STEPS" "$MAX_STEPS" <<'PY'
import sys
from tuner.report import load_run
run, seconds, lo, hi = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model, search = load_run(run)
lists = [search.default, search.chosen]
ms = sum(e.expected_step_ms for e in lists)
graph_s = 2 * sum(0.4 if mode == "PIECEWISE" else 0.1 for e in lists for mode, _ in model.graphs(e.capture_sizes))
usable = seconds - 40 - graph_s
print(max(lo, min(hi, int(usable * 1000 / (1.5 * ms)))) if ms > 0 else lo)
PY
}

validate() {  # workload, max widths, sweep seconds, share
  local name=$1 widths=$2 sweep=$3 share=$4
  local budget=$(( $(left) - 5 ))
  local mine
  mine=$(python3 -c "print(int($budget * $share))")
  if (( mine < 90 )); then
    echo "== skipping $name: $(left) s left in the budget"
    return
  fi
  local t0=$SECONDS
  local csv=""
  if [[ -n $PROFILE_DIR && -f $PROFILE_DIR/$name.csv ]]; then
    csv="$PROFILE_DIR/$name.csv"
    echo "== $name: recorded profile $csv ($mine s for this workload)"
  else
    echo "== $name: profile sweep here (max $widths widths, $sweep s; $mine s for this workload)"
    timeout -s INT -k 15 $(( sweep + 60 )) "${CGTUNE[@]}" profile "workloads/$name.yaml" --out "$OUT/profiles" \
      --max-widths "$widths" --max-seconds "$sweep" --no-progress
    echo "profile exit code: $?"
    csv="$OUT/profiles/$name.csv"
    [[ -f $csv ]] || { echo "no profile for $name: skipping"; return; }
  fi
  local run="$OUT/runs/$name"
  rm -rf "$run"
  # The run directory from the exact solver (no optuna here); the GPU is not used by this step.
  python3 - "workloads/$name.yaml" "$csv" "$run" <<'PY' || { echo "no run directory for $name: skipping"; return; }
import sys
from tuner.validate import exact_run
exact_run(sys.argv[1], sys.argv[2], sys.argv[3], command=f"scripts/gpu_validate.sh: exact_run({sys.argv[1]}, {sys.argv[2]})")
PY
  local remaining=$(( mine - (SECONDS - t0) ))
  local steps
  steps=$(steps_for "$run" "$remaining")
  echo "== validate $name: $steps steps ($remaining s for it; $(left) s left)"
  timeout -s INT -k 15 "$(( remaining + 30 ))" "${CGTUNE[@]}" validate "$run" --steps "$steps"
  echo "validate exit code: $?"
}

for entry in $WORKLOADS; do
  IFS=: read -r name widths sweep share <<<"$entry"
  validate "$name" "$widths" "$sweep" "$share"
done

echo "== summary"
python3 - "$OUT/runs" "$OUT/summary.md" <<'PY'
"""Print predicted vs measured for each validated run (numbers read from validation.json, nothing else)."""
import json
import math
import sys
from pathlib import Path

runs, summary = Path(sys.argv[1]), Path(sys.argv[2])
GIB = 2**30


def f(x, spec):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


lines = []
for path in sorted(runs.glob("*/validation.json")):
    r = json.loads(path.read_text())
    t = r["trace"]
    lines.append(f"### {path.parent.name} on {r['device_name']}: {t['replayed']} steps replayed "
                 f"({t.get('excluded', 0)} wider than {t.get('max_num_tokens')} left out), profile {r['profile']['path']}")
    lines.append("| list | graphs | pred GiB | meas GiB | mem err | pred ms | meas ms | lat err | p50 ms | p99 ms | tok/s | fits |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in r["lists"]:
        x = r[name]
        mem = x["measured_graph_bytes"]
        lines.append(
            f"| {name} | {x['num_graphs']} | {x['predicted_graph_bytes'] / GIB:.3f} | {f(mem and mem / GIB, '.3f')} | "
            f"{f(x['memory_error'], '+.1%')} | {f(x['predicted_trace_step_ms'], '.3f')} | {f(x['measured_step_ms'], '.3f')} | "
            f"{f(x['latency_error'], '+.1%')} | {f(x['p50_step_ms'], '.3f')} | {f(x['p99_step_ms'], '.3f')} | "
            f"{f(x['tokens_per_s'], ',.0f')} | {'yes' if x['fits'] else 'NO'} |")
    sp = r.get("measured_speedup_tuned_over_default")
    lines.append(f"measured speedup tuned/default {f(sp, '.3f')}x (predicted "
                 f"{f(r.get('predicted_speedup_tuned_over_default'), '.3f')}x); emitted: {r.get('emitted')}; "
                 f"goals: memory within 5%, latency within 3%")
    lines += [f"WARNING: {w}" for w in r.get("warnings", [])] + [""]
text = "\n".join(lines) if lines else "no validation was written"
summary.write_text(text + "\n")
print(text)
PY
echo "== done in $(( SECONDS - START )) s (gpu tests exit code $TESTS_RC); files under $OUT"
