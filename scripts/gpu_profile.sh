#!/usr/bin/env bash
# One prepared run on a CUDA machine (written for one H200), at most 8 minutes: the GPU tests, then
# `cgtune profile` (compiled, as vLLM runs by default, with PIECEWISE and FULL graphs and LM-head rows) of the
# DFlash-like and suffix-like Llama-3.1-8B workloads and of one whose KV budget binds (both DFlash-like ones with
# their 5-layer drafter: drafter_eager and drafter_full rows, its FULL graphs captured after the target's), then a
# short table of graph memory and eager / PIECEWISE / FULL / LM-head latency at 512, 2176 and 6400 tokens, and the
# drafter's eager / FULL latency and graph memory at 512 and 2176.
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
# What a sweep now costs, and what is assumed (no compiled + PIECEWISE sweep has run on the H200 yet: the
# figures below are estimates to be replaced by the summary's compile_s and s/width after the first run):
#  - once per workload: python start-up, 16 GB of random weights, torch.compile of the step and of the three
#    kinds of PIECEWISE piece (one compilation each for every width: the token count is unbacked), assumed
#    40-70 s cold, less for the second and third workload (Triton's kernel cache is shared); non-KV memory and
#    the activation peaks (three profiling steps) in seconds;
#  - per width: PIECEWISE capture of 33 pieces twice (alone and shared) plus warm-ups, assumed 0.3-0.5 s; FULL
#    capture twice, under 0.1 s; four timed modes at 25 + 100 ms each, 0.5 s, more at the widest widths where one
#    step outlasts rep_ms / 5: about 1-1.5 s per width in all, against about 1.9 s per width (set-up included)
#    that the plain, FULL-only sweep of the previous script was sized for.
# Hence fewer widths than before (64/40/32 plain): 32, 24 and 12. --max-seconds now includes the compilation and
# is checked while the PIECEWISE graphs are captured against the time the captured widths still need, so a slow
# compile costs widths, not the whole sweep; `timeout` gets 45 s on top for the last width and the write.
# The DFlash drafter (5 layers, V2: FULL graphs only, no request-count widths since its one query pass runs
# N x 17 tokens) comes on top, also assumed, not measured: its 2.2 GB of weights and 5 layers of KV cache in
# seconds; one more compilation (its forward only, no PIECEWISE pieces; Triton kernels of the same widths are
# cached by then) assumed 10-30 s; per width two FULL captures of 5 layers and two timed modes at 25 + 100 ms,
# about 0.3 s. So the DFlash sweeps drop to 24 widths with 15 s more (about 24 x 1.6 s + 60-100 s of compiling:
# 100-140 s), the shared one to 10, and the suffix one (no drafter) to 20 widths to leave them the time.
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
# name:max widths:max seconds, run in order; each is WORKLOAD_DIR/<name>.yaml
WORKLOADS=${WORKLOADS:-"dflash-llama-3.1-8b:24:135 suffix-llama-3.1-8b:20:100 dflash-llama-3.1-8b-shared:10:70"}
WORKLOAD_DIR=${WORKLOAD_DIR:-workloads}  # another directory only to rehearse with a workload of one's own
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

echo "== GPU tests"  # two of them compile a small model (about a minute cold); FULL and PIECEWISE replay checks
timeout -s INT -k 10 200 python3 -m pytest -q -m gpu tests/measure -p no:cacheprovider
TESTS_RC=$?
echo "gpu tests exit code: $TESTS_RC"

# cgtune without an install, as a command `timeout` can run (not a shell function): main() reads sys.argv,
# and -c keeps one copy of tuner.cli (python -m would load it twice, as __main__ and as tuner.cli).
CGTUNE=(python3 -c 'import sys; from tuner.cli import main; sys.exit(main())')

profile() {  # workload, max widths, max seconds
  local workload=$1 widths=$2 seconds=$3
  local hard=$(( seconds + 45 ))
  if (( $(left) < hard )); then
    hard=$(( $(left) - 5 ))
    seconds=$(( hard - 45 ))
  fi
  if (( seconds < 20 )); then
    echo "== skipping $workload: $(left) s left in the budget"
    return
  fi
  echo "== profile $workload (max $widths widths, $seconds s; $(left) s left)"
  timeout -s INT -k 15 "$hard" "${CGTUNE[@]}" profile "$WORKLOAD_DIR/$workload.yaml" --out "$PROFILES" \
    --device "$DEVICE" --max-widths "$widths" --max-seconds "$seconds" --no-progress
  echo "exit code: $?"
}

for entry in $WORKLOADS; do
  IFS=: read -r name widths seconds <<<"$entry"
  profile "$name" "$widths" "$seconds"
done

echo "== summary"
python3 - "$PROFILES" "$OUT/summary.md" <<'PY'
"""Read the profiles just written and print graph memory and eager / PIECEWISE / FULL / LM-head latency at the key
widths, with each profile's compile time, time per width, non-KV memory, kernels per layer and noisy widths; for a
profile with a drafter, its rows at the key widths it was measured at."""
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
    rows = {mode: p.by_mode(mode, ok_only=False) for mode in ("eager", "piecewise", "full", "logits")}
    deltas = [r.capture_delta_bytes for mode in ("piecewise", "full") for r in rows[mode].values()
              if r.status == "ok" and r.capture_delta_bytes]
    done = len(m.get("widths_done", []))
    per_width = (m["sweep_s"] - (m.get("compile_s") or 0)) / done if done else None
    peak, non_kv = m.get("activation_peak_bytes"), m.get("non_kv_cache_bytes")
    noisy = m.get("noisy_widths") or []
    in_table = len(set(m.get("widths_done", [])) | set((m.get("drafter") or {}).get("widths_done", [])))
    lines.append(f"### {csv_path.name}: {m['device_name']}, {done} widths "
                 f"({'complete' if m.get('complete') else 'INCOMPLETE'}), compiled={m.get('compiled')} "
                 f"in {cell(m.get('compile_s'), '.1f')} s, sweep {m['sweep_s']:.1f} s "
                 f"({cell(per_width, '.2f')} s/width besides compiling), target graph pool "
                 f"{sum(deltas) / MIB:.0f} MiB (PIECEWISE + FULL, {m.get('capture_order')}), non-KV "
                 f"{cell(non_kv and non_kv / MIB, '.0f')} MiB, "
                 f"activation peak {cell(peak and peak / MIB, '.0f')} MiB, eager kernels per layer "
                 f"{cell(m.get('eager_kernels_per_layer'), 'g')}, attention {m.get('attention_kernel')}, "
                 f"noisy widths {len(noisy)} of {in_table}")
    lines.append("| tokens | eager ms | piecewise ms | full ms | logits ms | eager/full | eager/piecewise "
                 "| pw delta MiB | full delta MiB | full standalone MiB | full capture s |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def lat(row):
        if row is None:
            return None, "-"
        return (row.latency_ms, f"{row.latency_ms:.3f}") if row.status == "ok" else (None, row.status)

    for w in KEY_WIDTHS:
        if w not in rows["eager"]:
            lines.append(f"| {w} | not measured | | | | | | | | | |")
            continue
        (el, e), (pl, pw), (fl, fu), (_, lo) = (lat(rows[mode].get(w)) for mode in ("eager", "piecewise", "full",
                                                                                      "logits"))
        f, pr = rows["full"].get(w), rows["piecewise"].get(w)
        lines.append(
            f"| {w} | {e} | {pw} | {fu} | {lo} | {cell(el / fl if el and fl else None, '.2f')} | "
            f"{cell(el / pl if el and pl else None, '.2f')} | "
            f"{cell(pr and pr.capture_delta_bytes and pr.capture_delta_bytes / MIB, '.1f')} | "
            f"{cell(f and f.capture_delta_bytes and f.capture_delta_bytes / MIB, '.1f')} | "
            f"{cell(f and f.standalone_bytes and f.standalone_bytes / MIB, '.1f')} | "
            f"{cell(f and f.capture_s, '.2f')} |")
    drafter = m.get("drafter")
    if drafter:
        d_rows = {mode: p.by_mode(f"drafter_{mode}", ok_only=False) for mode in ("eager", "piecewise", "full")}
        d_deltas = [r.capture_delta_bytes for mode in ("piecewise", "full") for r in d_rows[mode].values()
                    if r.status == "ok" and r.capture_delta_bytes]
        lines.append(f"drafter: {drafter['method']}, {drafter['shape']['num_layers']} layer(s), runner "
                     f"{drafter['runner']}, graphs {'/'.join(drafter['graph_modes']) or 'none'}, "
                     f"{len(drafter.get('widths_done', []))} widths, own weights "
                     f"{cell(drafter.get('weights_bytes') and drafter['weights_bytes'] / MIB, '.0f')} MiB (in non-KV), "
                     f"its graphs {sum(d_deltas) / MIB:.0f} MiB of the pool")
        lines.append("| drafter tokens | eager ms | piecewise ms | full ms | eager/full | full delta MiB "
                     "| full standalone MiB |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for w in (512, 2176):
            if w not in d_rows["eager"]:
                lines.append(f"| {w} | not measured | | | | | |")
                continue
            (el, e), (_, pw), (fl, fu) = (lat(d_rows[mode].get(w)) for mode in ("eager", "piecewise", "full"))
            f = d_rows["full"].get(w)
            lines.append(f"| {w} | {e} | {pw} | {fu} | {cell(el / fl if el and fl else None, '.2f')} | "
                         f"{cell(f and f.capture_delta_bytes and f.capture_delta_bytes / MIB, '.1f')} | "
                         f"{cell(f and f.standalone_bytes and f.standalone_bytes / MIB, '.1f')} |")
    lines.append("")
text = "\n".join(lines) if lines else "no profiles were written"
summary.write_text(text + "\n")
print(text)
PY
echo "== done in $(( SECONDS - START )) s (gpu tests exit code $TESTS_RC); files under $OUT"
