#!/usr/bin/env bash
# One prepared run on a CUDA machine (written for one H200), at most 8 minutes: the GPU tests, then
# `cgtune profile` of the DFlash-like and suffix-like Llama-3.1-8B workloads and of one whose KV budget
# binds, then a short table of graph memory and eager vs graph latency at 512, 2176 and 6400 tokens.
#
# Needs python3 with torch (CUDA), pyyaml, tqdm, pytest, nvidia-ml-py; not optuna. Run from anywhere:
#   OUT=/some/dir bash scripts/gpu_profile.sh
# Everything lands under $OUT (default reports/gpu-profile-<UTC time>): profiles/<workload>.csv + .json,
# gpu_profile.log (all output) and summary.md (the table). Commit profiles under reports/<gpu>/ with it.
#
# Sizing (why these numbers): each sweep is thinned to a fixed number of widths (--max-widths keeps the
# ends, the 512 ceiling and the widest decode batch) so it finishes, because widths run largest first and
# a cut-short sweep would miss the small ones; --max-seconds and `timeout` are only safety nets. A cut
# sweep is resumable: rerun this script with the same OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-reports/gpu-profile-$(date -u +%Y%m%dT%H%M%SZ)}"
PROFILES="$OUT/profiles"
mkdir -p "$PROFILES"
LOG="$OUT/gpu_profile.log"
exec > >(tee -a "$LOG") 2>&1
BUDGET_S=${BUDGET_S:-470}   # whole script; the device lease allows 8 minutes
DEVICE=${DEVICE:-cuda}      # DEVICE=cpu only rehearses this script's plumbing on a CPU (eager rows only)
# name:max widths:max seconds, run in order
WORKLOADS=${WORKLOADS:-"dflash-llama-3.1-8b:64:120 suffix-llama-3.1-8b:40:130 dflash-llama-3.1-8b-shared:32:80"}
START=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - START) )); }

echo "== $(date -u +%FT%TZ) gpu_profile.sh in $PWD -> $OUT"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                               "available", torch.cuda.is_available())'
if [[ $DEVICE == cuda ]]; then
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device: stopping"
    exit 1
  fi
fi

echo "== GPU tests"
timeout -s INT -k 10 200 python3 -m pytest -q -m gpu tests/measure -p no:cacheprovider
TESTS_RC=$?
echo "gpu tests exit code: $TESTS_RC"

# cgtune without an install, as a command `timeout` can run (not a shell function): main() reads sys.argv,
# and -c keeps one copy of tuner.cli (python -m would load it twice, as __main__ and as tuner.cli).
CGTUNE=(python3 -c 'import sys; from tuner.cli import main; sys.exit(main())')

profile() {  # workload, max widths, max seconds
  local workload=$1 widths=$2 seconds=$3
  local hard=$(( seconds + 60 ))
  if (( $(left) < hard )); then
    hard=$(( $(left) - 5 ))
    seconds=$(( hard - 60 ))
  fi
  if (( seconds < 20 )); then
    echo "== skipping $workload: $(left) s left in the budget"
    return
  fi
  echo "== profile $workload (max $widths widths, $seconds s; $(left) s left)"
  timeout -s INT -k 15 "$hard" "${CGTUNE[@]}" profile "workloads/$workload.yaml" --out "$PROFILES" \
    --device "$DEVICE" --max-widths "$widths" --max-seconds "$seconds" --no-progress
  echo "exit code: $?"
}

for entry in $WORKLOADS; do
  IFS=: read -r name widths seconds <<<"$entry"
  profile "$name" "$widths" "$seconds"
done

echo "== summary"
python3 - "$PROFILES" "$OUT/summary.md" <<'PY'
"""Read the profiles just written and print graph memory and eager vs graph latency at the key widths."""
import sys
from pathlib import Path

from tuner.profile_table import read_profile

profiles, summary = Path(sys.argv[1]), Path(sys.argv[2])
KEY_WIDTHS = (512, 2176, 6400)
MIB = 2**20


def cell(value, fmt):
    return "-" if value is None else format(value, fmt)


lines = []
for csv_path in sorted(profiles.glob("*.csv")):
    p = read_profile(csv_path)
    m = p.metadata
    full, eager = p.by_mode("full", ok_only=False), p.by_mode("eager", ok_only=False)
    deltas = [r.capture_delta_bytes for r in full.values() if r.status == "ok" and r.capture_delta_bytes]
    done = len(m.get("widths_done", []))
    per_width = m["sweep_s"] / done if done else None
    peak = m.get("activation_peak_bytes")
    lines.append(f"### {csv_path.name}: {m['device_name']}, {done} widths "
                 f"({'complete' if m.get('complete') else 'INCOMPLETE'}), sweep {m['sweep_s']:.1f} s "
                 f"({cell(per_width, '.2f')} s/width), graph pool {sum(deltas) / MIB:.0f} MiB, "
                 f"activation peak {cell(peak and peak / MIB, '.0f')} MiB, "
                 f"attention {m.get('attention_kernel')}")
    lines.append("| tokens | eager ms | graph ms | eager/graph | capture delta MiB | standalone MiB | capture s |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    for w in KEY_WIDTHS:
        if w not in eager:
            lines.append(f"| {w} | not measured | | | | | |")
            continue
        e, f = eager[w], full.get(w)
        el = e.latency_ms if e.status == "ok" else None
        fl = f.latency_ms if f is not None and f.status == "ok" else None
        ratio = el / fl if el and fl else None
        lines.append(
            f"| {w} | {cell(el, '.3f') if e.status == 'ok' else e.status} | "
            f"{cell(fl, '.3f') if f is None or f.status == 'ok' else f.status} | {cell(ratio, '.2f')} | "
            f"{cell(f and f.capture_delta_bytes and f.capture_delta_bytes / MIB, '.1f')} | "
            f"{cell(f and f.standalone_bytes and f.standalone_bytes / MIB, '.1f')} | "
            f"{cell(f and f.capture_s, '.2f')} |")
    lines.append("")
text = "\n".join(lines) if lines else "no profiles were written"
summary.write_text(text + "\n")
print(text)
PY
echo "== done in $(( SECONDS - START )) s (gpu tests exit code $TESTS_RC); files under $OUT"
