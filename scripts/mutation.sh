#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the modules a tuning decision rests on, each against its own tests only: the exact
# solver, the cost model, vLLM's dispatch and memory rules, and validate's decision (fit check, choice, record).
# A developer tool, not part of .ci/run. Needs the `mutation` extra: pip install -e '.[test,mutation]'.
#
# usage: scripts/mutation.sh [MODULE...]     MODULE: exact costmodel dispatch memory validate (the default: these five),
#        exact_bounds exact_levels compact saving_interval check outliers, and the other engines' rulebooks
#        {sglang,trtllm}_{memory,dispatch,defaults,capture}, vLLM 0.34's
#        v034_{defaults,dispatch,drafter_cost,emit,engine,memory,settings}; ALL: every one of them
#   SAMPLE=N     mutants drawn per module, seeded (default 100; 0: every mutant)
#   SEED=K       seed of the draw (default 0)
#   ONLY=FILE    run only the mutants FILE names (one per line: a previous run's survivors, to re-judge them after
#                tests were added), instead of a draw
#   BUDGET_S=S   wall seconds per module, mutmut's clean run included (default 2400); the mutants checked by then
#                are scored, the rest stay "not checked"
#   OUT=DIR      per-module work trees and reports (default ${TMPDIR:-/tmp}/cgtune-mutation)
#   MEM_GB=G     virtual-memory limit of the mutant runs in GiB (default 0: none); exact_levels' `_row` mutant 5
#                doubles its rows on every cell and takes the machine's memory without one
# Each module runs in its own copy of the tracked files (mutmut writes mutants/ there, never into the repository),
# one test process at a time (a 2-core machine shared with others). "Its own tests" are the files that test that
# module's rules: for the solver its brute-force cases under every engine, for the cost model its drafter and
# memory-rule files too (see TESTS below).
#
# How long (2026-12-01, the project's 2-core machine, shared with the test suite and CI, one test process): the clean
# run takes 0.5-2 min per module; a mutant then about 1-2 s for the other engines' capture and defaults rules and the
# interval, 10-30 s for vLLM's dispatch and memory rules (vLLM's own code, the oracle, joined their tests) and for the
# cost model, 4-6 s for the solver's parts (brute-force cases) and up to a minute for `check` (its CLI runs), so a
# 300-mutant draw of check, validate, compact or the solver outlasts the default budget. A mutant that survives runs
# every test it reaches: 1-3 min for exact and exact_bounds (2026-12-02, two draws side by side), so their draws take
# hours; split a draw's names over two ONLY= runs (two OUT dirs) to use both cores. Module sizes: dispatch 227,
# memory 179, costmodel 1344, exact 1033, exact_bounds 928, compact 326, check 720, validate 780 (its decision).
# Score = (killed + timeout) / checked; "no tests" and survivors count against it. Read a survivor with
# `cd $OUT/<module> && mutmut show NAME`.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-${TMPDIR:-/tmp}/cgtune-mutation}
SAMPLE=${SAMPLE:-100}
SEED=${SEED:-0}
ONLY=${ONLY:-}
[ -z "$ONLY" ] || [ -f "$ONLY" ] || { echo "mutation.sh: ONLY=$ONLY is not a file" >&2; exit 2; }
[ -z "$ONLY" ] || ONLY=$(cd "$(dirname "$ONLY")" && pwd)/$(basename "$ONLY")
BUDGET_S=${BUDGET_S:-2400}
MEM_GB=${MEM_GB:-0}
for var in SAMPLE SEED BUDGET_S MEM_GB; do
  [[ ${!var} =~ ^[0-9]+$ ]] || { echo "mutation.sh: $var=${!var} must be a whole number" >&2; exit 2; }
done
command -v mutmut >/dev/null || { echo "mutation.sh: mutmut is not installed (pip install -e '.[mutation]')" >&2; exit 2; }

# module -> file to mutate | mutant-name globs (validate: its decision; the device backend and the trace are modules
# of their own) | its tests
declare -A FILE GLOBS TESTS CONF
FILE[exact]=tuner/search/exact.py; GLOBS[exact]='tuner.search.exact.*'
# The solver against brute force: vLLM's rules, and SGLang's and TensorRT-LLM's; its kept levels through the compact
# choice, its caveat through the report (21 of its 46 survivors and untested mutants were killed by those files).
TESTS[exact]='tests/test_exact.py tests/test_engines.py::test_exact_solver_equals_brute_force_for_sglang_and_trtllm
tests/test_engines.py::test_exact_solver_respects_a_budget_that_moves_with_the_lists_max tests/test_exact_solve.py
tests/test_compact.py tests/test_report.py tests/test_search.py::test_budget_that_no_list_meets_is_an_error
tests/test_exact_scaling.py::test_past_its_time_budget_the_solver_returns_its_best_list_with_a_proven_bound'
FILE[costmodel]=tuner/model/costmodel.py; GLOBS[costmodel]='tuner.model.costmodel.*'
# The cost model's tests: its own file, its drafter side, vLLM's memory cases and the other engines' rules through it
# (not the solver's brute-force cases, which exact's run covers).
TESTS[costmodel]='tests/test_costmodel.py tests/test_drafter_cost.py tests/vllm/test_memory.py tests/test_engines.py
tests/test_outliers.py tests/test_costmodel_dispatch.py tests/test_calibration.py tests/sglang/test_speculative.py
-k not(brute_force or cases_are_not_trivial or every_process)'
FILE[dispatch]=tuner/engines/vllm/dispatch.py; GLOBS[dispatch]='tuner.engines.vllm.dispatch.*'
# vLLM's dispatch and memory rules against their own cases, vLLM 0.33's own code (the oracle, where vLLM is
# installed) and the cost model that applies them.
TESTS[dispatch]='tests/vllm/test_dispatch.py tests/vllm/test_vllm_oracle.py tests/test_costmodel_dispatch.py
tests/vllm/test_drafter.py tests/vllm/test_runner.py'
FILE[memory]=tuner/engines/vllm/memory.py; GLOBS[memory]='tuner.engines.vllm.memory.*'
TESTS[memory]='tests/vllm/test_memory.py tests/vllm/test_vllm_oracle.py tests/test_costmodel.py tests/test_validate.py
-k not(gpu_box or torch_backend or cpu_eager or build_backend)'
# The other engines' rulebooks, each against its own tests and the cross-engine cases through the cost model and
# the solver (their binding cases).
for eng in sglang trtllm; do
  for part in memory dispatch defaults capture; do
    FILE[${eng}_$part]=tuner/engines/$eng/$part.py; GLOBS[${eng}_$part]="tuner.engines.$eng.$part.*"
    TESTS[${eng}_$part]="tests/$eng/test_$part.py tests/test_engines.py -k not(every_process)"
  done
done
TESTS[trtllm_memory]='tests/trtllm/test_memory.py tests/test_engines.py tests/test_exact_scaling.py
-k not(every_process or every_pass or tiers or schedules or levels_program or rounded)'
# The solver's parts, against its brute-force cases (exact's own tests) and the rounded-memory bound.
FILE[exact_bounds]=tuner/search/exact_bounds.py; GLOBS[exact_bounds]='tuner.search.exact_bounds.*'
FILE[exact_levels]=tuner/search/exact_levels.py; GLOBS[exact_levels]='tuner.search.exact_levels.*'
for part in exact_bounds exact_levels; do
  TESTS[$part]='tests/test_exact.py tests/test_exact_scaling.py tests/test_exact_bounds.py tests/test_exact_levels.py
-k not(tiers or every_pass)'
done
FILE[compact]=tuner/search/compact.py; GLOBS[compact]='tuner.search.compact.*'
# The compact choice and its record in search.json, against brute force and by hand (compact_of lives in
# search/study.py now; the run-level tests cost a minute a mutant and left 275 of 300 unchecked in 25 minutes).
TESTS[compact]='tests/test_compact.py'
FILE[saving_interval]=tuner/search/saving_interval.py; GLOBS[saving_interval]='tuner.search.saving_interval.*'
TESTS[saving_interval]='tests/test_saving_interval.py'
FILE[check]=tuner/check/predictions.py; GLOBS[check]='tuner.check.predictions.*'
TESTS[check]='tests/commands/test_check_cli.py tests/commands/test_check_rules.py tests/vllm/test_startup_log.py
tests/test_calibration.py'
FILE[outliers]=tuner/profile/outliers.py; GLOBS[outliers]='tuner.profile.outliers.*'
TESTS[outliers]='tests/test_outliers.py -k not(wild_latency or per_width_csv or bytes_below)'
# vLLM 0.34's rulebook, each part against its unit tests, vLLM 0.34's own code (the oracle, where CGTUNE_VLLM034_PATH
# names it; its `cgtune defaults` subprocess runs are left out: mutmut runs only the tests that reach a mutant in its
# own process) and the split solver and the 0.34 example run that apply it.
O34='tests/vllm034/test_vllm034_oracle.py'
F34='tests/vllm034/test_families_and_bounds_034.py'
NOT_CLI34='-k not(prints_vllm_034s_own_resolution)'
for part in defaults dispatch drafter_cost emit engine memory settings; do
  FILE[v034_$part]=tuner/engines/vllm/v034/$part.py; GLOBS[v034_$part]="tuner.engines.vllm.v034.$part.*"
done
TESTS[v034_defaults]="$F34 $O34 tests/test_vllm_versions.py $NOT_CLI34"
TESTS[v034_dispatch]="$F34 $O34 tests/test_exact_split.py $NOT_CLI34"
TESTS[v034_drafter_cost]="tests/vllm034/test_drafter_034.py $O34 tests/test_exact_split.py $NOT_CLI34"
TESTS[v034_emit]="$F34 tests/vllm034/test_emit_keys_034.py tests/vllm034/test_files_034.py tests/vllm034/test_files_engine_034.py
tests/commands/test_check_034_cli.py tests/test_vllm_versions.py"
TESTS[v034_engine]="$F34 tests/vllm034/test_engine_034.py tests/test_vllm034_kv.py tests/vllm034/test_settings_034.py
tests/test_exact_split.py tests/commands/test_check_034_cli.py tests/test_vllm_versions.py"
TESTS[v034_memory]='tests/test_vllm034_kv.py tests/vllm034/test_kv_blocks_034.py tests/test_validate_vllm.py
tests/test_exact_split.py tests/commands/test_check_034_cli.py'
TESTS[v034_settings]="$F34 tests/vllm034/test_settings_034.py tests/test_vllm_versions.py tests/test_workload.py tests/vllm034/test_files_034.py"
# mutmut limits a mutant's run to 15 x (1 s + the calls of its tests as the clean run timed them), fixtures left out;
# these tests' module fixtures (vLLM 0.34's own process, the example run) take a minute or more on a loaded machine,
# so without a constant every mutant the oracle reaches would "time out" (and count as killed).
for part in defaults dispatch drafter_cost emit engine memory settings; do
  CONF[v034_$part]='timeout_constant = 120
timeout_multiplier = 3'
done
FILE[validate]=tuner/validate/validation.py
v=tuner.validate.validation
GLOBS[validate]="$v.x_compare_list* $v.x_choose_measured* $v.x_lists_to_validate* $v.x_top_candidates*
$v.x_target_memory* $v.x_build_record* $v.x_validate_candidates* $v.x_validate_run* $v.xǁListValidationǁ*"
# The decision's tests; the subprocess, torch-backend and plot-heavy ones test other parts and cost minutes.
TESTS[validate]='tests/test_validate.py tests/test_validate_record.py
-k not(gpu_box or torch_backend or cpu_eager or build_backend or estimate_is_measured)'

run_module() {
  local name=$1 work="$OUT/$1"
  echo "== $name: ${FILE[$name]} against ${TESTS[$name]}"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$REPO" && git ls-files -z | xargs -0 cp --parents -t "$work")
  cp "$REPO/${FILE[$name]}" "$work/${FILE[$name]}"  # the working copy, committed or not
  python3 - "$work/setup.cfg" "${FILE[$name]}" "${TESTS[$name]}" "${CONF[$name]:-}" <<'EOF'
import sys
path, target, tests, conf = sys.argv[1:]
files, _, keyword = " ".join(tests.split()).partition(" -k ")  # one pytest argument per line
args = files.split() + (["-k", keyword.strip()] if keyword else [])
# Tests that read shipped workloads or the example profile, or run a benchmark, find them in mutmut's copy too.
lines = ["[mutmut]", "source_paths = tuner", f"only_mutate = {target}", "also_copy =", "    workloads", "    benchmarks",
         "pytest_add_cli_args_test_selection ="]
lines += [f"    {a}" for a in args] + conf.splitlines()
open(path, "w").write("\n".join(lines) + "\n")
EOF
  cd "$work"
  # Generate the mutants only: mutmut writes them, then refuses a name that matches none (expected here).
  mutmut run --max-children 1 "none.none" > generate.log 2>&1 || true
  mutmut results --all true 2>/dev/null | sed 's/^ *//; s/:.*//' > all.txt
  [ -s all.txt ] || { tail -20 generate.log; return 1; }
  python3 - all.txt "${GLOBS[$name]}" "$SAMPLE" "$SEED" "$ONLY" <<'EOF'
import fnmatch, random, sys
names = [n for n in open(sys.argv[1]).read().split() if n]
globs, sample, seed, only = sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
names = sorted(n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs))
open("matched.txt", "w").write("".join(f"{n}\n" for n in names))
if only:
    names, sample = sorted(set(names) & set(open(only).read().split())), 0
random.Random(seed).shuffle(names)
open("sample.txt", "w").write("".join(f"{n}\n" for n in sorted(names if sample <= 0 else names[:sample])))
EOF
  echo "   $(wc -l < sample.txt) of $(wc -l < matched.txt) mutants drawn (seed $SEED)"
  (if [ "$MEM_GB" -gt 0 ]; then ulimit -v $((MEM_GB << 20)); fi
   timeout "$BUDGET_S" nice mutmut run --max-children 1 $(cat sample.txt) > run.log 2>&1) || true
  mutmut results --all true 2>/dev/null | sed 's/^ *//' > results.txt || true
  python3 - results.txt "$name" sample.txt <<'EOF' | tee -a "$OUT/summary.txt"
import collections, sys
drawn = set(open(sys.argv[3]).read().split())
status = dict(line.rsplit(": ", 1) for line in open(sys.argv[1]).read().splitlines() if ": " in line)
status = {name: s for name, s in status.items() if name in drawn}
counts = collections.Counter(status.values())
checked = sum(v for k, v in counts.items() if k not in ("not checked", "skipped"))
caught = counts["killed"] + counts["timeout"]
score = f"{caught / checked:.0%}" if checked else "-"
print(f"{sys.argv[2]:<10} score {score:>4} ({caught}/{checked} checked; " +
      ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")")
for name, s in sorted(status.items()):
    if s not in ("killed", "timeout", "not checked"):
        print(f"    {s}: {name}")
EOF
  cd - >/dev/null
}

mkdir -p "$OUT"
: > "$OUT/summary.txt"
modules="${*:-exact costmodel dispatch memory validate}"
[ "$modules" = ALL ] && modules=$(printf '%s\n' "${!FILE[@]}" | sort | tr '\n' ' ')
for m in $modules; do
  for name in $m; do
    [ -n "${FILE[$name]:-}" ] || { echo "mutation.sh: unknown module '$name' ($(printf '%s\n' "${!FILE[@]}" | sort | tr '\n' ' '))" >&2; exit 2; }
    run_module "$name"
  done
done
echo "summary: $OUT/summary.txt"
