"""The prepared device run: profile the shipped DFlash-like and suffix-like workloads, validate the exact solver's lists
from those profiles, run the GPU tests, in one command of at most 9 minutes, and leave everything it measured in at
most 8 files directly under OUT (re-packed after every stage, so a run killed midway still returns what it had).

    PYTHONUNBUFFERED=1 python3 scripts/gpu_run.py --out "$OUT"                         # on the GPU machine
    python3 scripts/gpu_run.py --out /tmp/r --device cpu --workloads tiny-cpu --budget-s 300   # CPU rehearsal

Needs python3 with torch, numpy, pyyaml, tqdm, pytest, matplotlib (nvidia-ml-py for NVML readings); not optuna (the
lists come from the exact solver), not an install (cgtune runs from this tree). OUT gets: `run.log` (everything,
written as it happens), `summary.md` (the table printed last), `results.tar.gz` (profiles/, runs/<workload>/ with
validation.json, report.md and plots, one log per stage) and each profile's CSV and JSON as they fit in 8 files.
Each profile takes `cgtune profile`'s default instrument (`--backend auto`): vLLM's own engine where this host has
a CUDA build of vLLM at a version the adapter was written for, the stand-in decoder otherwise (the GPU machine lent
so far has no vLLM); the summary names the backend of each profile.

Budget (why these numbers; see also the stage table in summary.md, which records what each stage really took).
The machine is lent for 15 minutes, a 1-3 minute start included, and one command may run 10; this run is given
540 s, leaving a minute's margin. Stages share the time left, each by its weight: when one ends early the later
ones get more, when one runs long (its own limit caps it) the later ones get less, and a stage whose share falls
below its floor is skipped and says so. Each stage is a child process given its seconds: a profile gets them as
`--max-seconds` less a grace, then SIGINT (which writes the partial profile and exits), then SIGKILL.
  - profile, weights 165 (DFlash) and 125 (suffix): python and torch start (~10 s, assumed), 16 GB of random
    weights, then compilation: no number measured on a GPU yet; the tiny CPU model compiles in 32 s cold and 14 s
    from Inductor's cache here (2 shared cores, torch 2.11, tests/measure/test_compile_cache.py's probe); an 8B
    model's three graphs are assumed 40-70 s cold on the H200, less for the second workload (same kernels). Then
    widths until `--max-seconds`: the sweep prices each width from the ones it measured (a timed mode costs what
    `measure` spends on one step: 125 ms at small widths, ~6 steps = ~2 s at 2176 tokens if a step takes 0.35 s,
    ~6 s at 6400 at 1 s, the issue's figures) and keeps key widths first, so a slow compile costs widths, not the
    sweep.
  - validate, weights 110 (DFlash first: if time runs short, one workload validated beats two half-done) and 70:
    the exact solver (CPU, seconds), then `cgtune validate`: start and compile (half the profile's compile_s: the
    cache now hits, see CACHED_COMPILE_SHARE), each list's graphs captured twice (vLLM's estimate, then the real
    pool) at the profile's largest measured capture_s of that mode plus a warm-up step each, and the trace: its
    steps are sized to the seconds left at 1.5x the model's predicted step (host gaps, logits), between 100 and
    3000; when even 100 do not fit the predicted time, the stage is skipped rather than killed midway (validate
    writes its whole record at the end, and validation.partial.json after each list, so a kill keeps those). At the start the shares are about 170, 129, 113, 72 and 41 s of 525.
  - GPU tests, weight 40 (floor 30): replay-equals-eager checks on small models; last, since they check the
    measurements rather than make them.
  - summary and packing: 15 s kept aside.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from the tree, not installed: as the GPU machine runs it

MAX_FILES = 8
"""Files the device returns from OUT."""
MAX_FILE_BYTES = 16 * 2**20
"""Largest file it returns."""
PACK_RESERVE_S = 15.0
"""Seconds kept for the summary and the packing at the end."""
KILL_GRACE_S = 20.0
"""Seconds between the SIGINT that ends a stage and the SIGKILL that follows if it has not exited."""
PROFILE_WRITE_S = 15.0
"""Of a profile stage's seconds, what `--max-seconds` leaves for the last width's write and the process exit."""
CACHED_COMPILE_SHARE = 0.5
"""Share of the profile's (cold) compile_s that validation's compile is budgeted at: its graphs come from Inductor's
cache, which took the tiny CPU model from 32 s to 14 s here (tests/measure/test_compile_cache.py's probe, torch 2.11);
an assumption for the H200, where no compile has been timed yet."""
MIN_STEPS, MAX_STEPS = 100, 3000
"""Bounds on a validation trace."""
CLI = [sys.executable, "-c", "import sys; from tuner.cli import main; sys.exit(main())"]
"""cgtune from this tree (-c keeps one copy of tuner.cli; `python -m` would load it twice)."""


@dataclass
class Stage:
    """One step of the run and what it did."""

    kind: str
    """`profile`, `validate` or `gpu-tests`."""
    workload: str | None
    """The workload's name (workloads/<name>.yaml), None for the tests."""
    weight: float
    """Its share of the time left, against the stages still to run."""
    floor_s: float
    """Below this many seconds it is skipped."""
    budget_s: float | None = None
    """Seconds it was given (None: not started)."""
    used_s: float = 0.0
    """Seconds it took."""
    outcome: str = "not run"
    """What happened, in a few words."""
    notes: list[str] = field(default_factory=list)
    """What the summary says about it."""

    @property
    def name(self) -> str:
        return f"{self.kind} {self.workload}" if self.workload else self.kind


def plan_stages(workloads: list[str], profile_weights: list[float], validate_weights: list[float]) -> list[Stage]:
    """Profiles first (they are what search and report reuse anywhere), then validations, then the GPU tests."""
    stages = [Stage("profile", w, weight, 60.0) for w, weight in zip(workloads, profile_weights)]
    stages += [Stage("validate", w, weight, 60.0) for w, weight in zip(workloads, validate_weights)]
    return stages + [Stage("gpu-tests", None, 40.0, 30.0)]


def share_s(stages: list[Stage], index: int, left_s: float) -> float:
    """Seconds stage `index` gets of `left_s`: its weight against the weights of it and every later stage."""
    weights = sum(s.weight for s in stages[index:])
    return left_s * stages[index].weight / weights if weights > 0 else 0.0


# ------------------------------------------------------------------------------------------------ processes
class Log:
    """Everything printed goes to stdout and to OUT/run.log, line by line, so a killed run still has its log."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open("a", buffering=1)

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self.fh.write(text + "\n")


def run_child(cmd: list[str], seconds: float, log: Log, stage_log: Path, env: dict[str, str]) -> int:
    """Run `cmd` for at most `seconds`: then SIGINT (a profile writes what it has and exits), after KILL_GRACE_S
    SIGKILL. Its output goes to the log and to `stage_log`, line by line. Returns its exit code (negative: the
    signal that ended it)."""
    log(f"$ {' '.join(cmd[3:] if cmd[:3] == CLI else cmd)}")
    with stage_log.open("w", buffering=1) as own:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True)

        def copy() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log(f"  {line.rstrip()}")
                own.write(line)

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            log(f"  [{seconds:.0f} s are up: SIGINT]")
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                log("  [still running: SIGKILL]")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        except KeyboardInterrupt:  # the run itself is stopped: stop the child the same way, then pack
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            reader.join(timeout=5)
    return proc.returncode


# ------------------------------------------------------------------------------------------------ validation sizing
def validation_seconds(run_dir: Path, start_s: float = 10.0) -> tuple[float, float]:
    """(seconds `cgtune validate` needs besides its trace, seconds per trace step), from the run directory and the
    profile it was solved on: start-up (`start_s`, assumed), CACHED_COMPILE_SHARE of the profile's compile_s
    (measured cold; Inductor's cache holds the graphs by now), every list's graphs captured twice (vLLM's estimate, the real pool) at the
    profile's largest measured capture_s of that mode plus one eager step of warm-up each, and per step of the
    trace 1.5x the mean of the lists' predicted step (host gaps and logits beyond the model's prediction)."""
    from tuner.profile.table import read_profile
    from tuner.decision.run_dir import load_run

    model, search = load_run(run_dir)
    profile = read_profile(run_dir / "profile.csv")
    compile_s = CACHED_COMPILE_SHARE * float(profile.metadata.get("compile_s") or 0.0)
    capture_s = {mode.upper(): max((r.capture_s or 0.0 for r in profile.by_mode(mode).values()), default=0.0)
                 for mode in ("full", "piecewise")}
    lists = [search.default, search.chosen] + ([search.exact.best] if search.exact.best.capture_sizes not in
                                               (search.default.capture_sizes, search.chosen.capture_sizes) else [])
    graphs_s = 0.0
    for e in lists:
        for mode, width in model.graphs(e.capture_sizes):
            graphs_s += 2 * (capture_s.get(mode, capture_s["FULL"]) + float(model.eager_ms(width)) / 1e3)
    per_step_s = 1.5 * sum(e.expected_step_ms for e in lists) / 1e3
    return start_s + compile_s + graphs_s, per_step_s


def steps_for(seconds: float, fixed_s: float, per_step_s: float, most: int = MAX_STEPS) -> int | None:
    """Trace steps that fit `seconds` (at most `most`); None when not even min(MIN_STEPS, most) do."""
    if per_step_s <= 0:
        return most
    steps = int((seconds - fixed_s) / per_step_s)
    return None if steps < min(MIN_STEPS, most) else min(most, steps)


# ------------------------------------------------------------------------------------------------ stages
@dataclass
class Run:
    """Where the run writes and what it was asked."""

    out: Path
    work: Path
    device: str
    workload_dir: Path
    validate_profiles: Path | None
    log: Log
    env: dict[str, str]
    max_widths: int | None = None
    max_steps: int = MAX_STEPS

    @property
    def profiles(self) -> Path:
        return self.work / "profiles"

    @property
    def logs(self) -> Path:
        return self.work / "logs"


def profile_stage(run: Run, stage: Stage, seconds: float) -> None:
    cmd = CLI + ["profile", str(run.workload_dir / f"{stage.workload}.yaml"), "--out", str(run.profiles),
                 "--device", run.device, "--max-seconds", f"{max(1.0, seconds - PROFILE_WRITE_S):.0f}",
                 "--no-progress"] + (["--max-widths", str(run.max_widths)] if run.max_widths else [])
    code = run_child(cmd, seconds, run.log, run.logs / f"profile-{stage.workload}.log", run.env)
    meta_path = run.profiles / f"{stage.workload}.json"
    done = json.loads(meta_path.read_text()).get("widths_done", []) if meta_path.is_file() else []
    stage.outcome = f"exit {code}, {len(done)} widths"


def validate_stage(run: Run, stage: Stage, seconds: float) -> None:
    from tuner.validate.validation import ValidationError, exact_run

    t0 = time.monotonic()
    source = run.validate_profiles or run.profiles
    csv = source / f"{stage.workload}.csv"
    run_dir = run.work / "runs" / stage.workload
    if not csv.is_file():
        stage.outcome = f"skipped: no profile {csv.name}"
        return
    if run.validate_profiles is not None:
        stage.notes.append(f"validated the profile in {csv} (given with --validate-profiles), not one measured here")
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        exact_run(run.workload_dir / f"{stage.workload}.yaml", csv, run_dir,
                  command=f"scripts/gpu_run.py: exact solver on {csv.name}")
        fixed_s, per_step_s = validation_seconds(run_dir)
    except ValidationError as exc:
        stage.outcome = f"skipped: {exc}"
        return
    left_s = seconds - (time.monotonic() - t0)
    steps = steps_for(left_s - KILL_GRACE_S, fixed_s, per_step_s, run.max_steps)
    run.log(f"  predicted: {fixed_s:.0f} s of start, compile and captures + {per_step_s * 1e3:.1f} ms per step; "
            f"{left_s:.0f} s left -> {steps} steps")
    if steps is None:
        least = min(MIN_STEPS, run.max_steps)
        stage.outcome = f"skipped: {least} steps need {fixed_s + least * per_step_s:.0f} s, {left_s:.0f} s left"
        return
    cmd = CLI + ["validate", str(run_dir), "--steps", str(steps), "--device", run.device]
    code = run_child(cmd, left_s, run.log, run.logs / f"validate-{stage.workload}.log", run.env)
    partial = run_dir / "validation.partial.json"
    stage.outcome = f"exit {code}, {steps} steps" + ("" if (run_dir / "validation.json").is_file()
                                                     else ", partial: validation.partial.json" if partial.is_file()
                                                     else ", no validation.json")


def tests_stage(run: Run, stage: Stage, seconds: float) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/measure",
           "tests/test_validate_gpu.py"]
    code = run_child(cmd, seconds, run.log, run.logs / "gpu-tests.log", run.env)
    stage.outcome = f"exit {code}"


# ------------------------------------------------------------------------------------------------ summary and pack
def _cell(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def profile_summary(csv_path: Path, key_widths: tuple[int, ...] = (1, 512, 2176, 6400)) -> list[str]:
    """A profile's lines: compile and sweep time, memory, errors, widths left for time, and eager / PIECEWISE / FULL
    / LM-head latency with graph memory at the key widths measured (each read from the profile, nothing else)."""
    from tuner.profile.table import read_profile

    p = read_profile(csv_path)
    m = p.metadata
    mib = 2**20
    rows = {mode: p.by_mode(mode, ok_only=False) for mode in ("eager", "piecewise", "full", "logits")}
    done = m.get("widths_done", [])
    b = m.get("backend") if isinstance(m.get("backend"), dict) else {"name": "stand-in"}
    backend = " ".join(str(v) for v in (b.get("name"), b.get("version"), b.get("runner")) if v)
    lines = [f"### {csv_path.name}: {m.get('device_name')}, backend {backend}, {len(done)} widths "
             f"({'complete' if m.get('complete') else 'incomplete'}), compiled={m.get('compiled')} in "
             f"{_cell(m.get('compile_s'), '.1f')} s, sweep {_cell(m.get('sweep_s'), '.1f')} s, non-KV "
             f"{_cell(m.get('non_kv_cache_bytes') and m['non_kv_cache_bytes'] / mib, '.0f')} MiB, eager kernels per "
             f"layer {_cell(m.get('eager_kernels_per_layer'), 'g')}, attention {m.get('attention_kernel')}, noisy "
             f"widths {len(m.get('noisy_widths') or [])}"]
    from tuner.profile.host_cost import host_line

    host = host_line(m)
    if host:
        lines.append(f"- {host}")
    for e in m.get("capture_errors") or []:
        lines.append(f"- capture error at {e['num_tokens']} tokens ({e['mode']}): {e['error']}")
    if m.get("widths_left_for_time"):
        lines.append(f"- {len(m['widths_left_for_time'])} widths left for time (a rerun resumes them)")
    lines += ["| tokens | eager ms | piecewise ms | full ms | logits ms | eager/full | pw delta MiB | full delta MiB "
              "| full capture s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def lat(row: Any) -> tuple[float | None, str]:
        if row is None:
            return None, "-"
        return (row.latency_ms, f"{row.latency_ms:.3f}") if row.status == "ok" else (None, row.status)

    for w in key_widths:
        if w not in rows["eager"]:
            continue
        (el, e), (_, pw), (fl, fu), (_, lo) = (lat(rows[mode].get(w)) for mode in ("eager", "piecewise", "full",
                                                                                    "logits"))
        f, pr = rows["full"].get(w), rows["piecewise"].get(w)
        lines.append(f"| {w} | {e} | {pw} | {fu} | {lo} | {_cell(el / fl if el and fl else None, '.2f')} | "
                     f"{_cell(pr and pr.capture_delta_bytes and pr.capture_delta_bytes / mib, '.1f')} | "
                     f"{_cell(f and f.capture_delta_bytes and f.capture_delta_bytes / mib, '.1f')} | "
                     f"{_cell(f and f.capture_s, '.3f')} |")
    return lines + [""]


def validation_summary(path: Path) -> list[str]:
    """A validation's lines: predicted vs measured per list (read from validation.json, or the partial record a run
    killed midway left, nothing else)."""
    r = json.loads(path.read_text())
    t = r["trace"]
    gib = 2**30
    partial = f" (PARTIAL: not measured {', '.join(r.get('pending', []))})" if r.get("partial") else ""
    lines = [f"### validation of {path.parent.name} on {r.get('device_name')}: {t.get('replayed')} steps replayed"
             f"{partial}",
             "| list | graphs | pred GiB | meas GiB | mem err | pred ms | meas ms | lat err | p99 ms | fits |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in r["lists"]:
        x = r[name]
        mem = x.get("measured_graph_bytes")
        lines.append(f"| {name} | {x['num_graphs']} | {x['predicted_graph_bytes'] / gib:.3f} | "
                     f"{_cell(mem and mem / gib, '.3f')} | {_cell(x.get('memory_error'), '+.1%')} | "
                     f"{_cell(x.get('predicted_trace_step_ms'), '.3f')} | {_cell(x.get('measured_step_ms'), '.3f')} | "
                     f"{_cell(x.get('latency_error'), '+.1%')} | {_cell(x.get('p99_step_ms'), '.3f')} | "
                     f"{'yes' if x.get('fits') else 'NO'} |")
    lines.append(f"measured speedup tuned/default {_cell(r.get('measured_speedup_tuned_over_default'), '.3f')}x")
    return lines + [f"WARNING: {w}" for w in r.get("warnings", [])] + [""]


def summary(run: Run, stages: list[Stage], started: float, budget_s: float) -> str:
    lines = [f"# cgtune device run: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, device {run.device}, "
             f"{time.monotonic() - started:.0f} s of {budget_s:.0f}", "",
             "| stage | given s | took s | outcome |", "|---|---:|---:|---|"]
    for s in stages:
        lines.append(f"| {s.name} | {_cell(s.budget_s, '.0f')} | {s.used_s:.0f} | {s.outcome} |")
    lines.append("")
    for s in stages:
        lines += [f"- {s.name}: {n}" for n in s.notes]
    for csv_path in sorted(run.profiles.glob("*.csv")):
        try:
            lines += profile_summary(csv_path)
        except Exception as exc:  # a summary must not lose the packing that follows
            lines.append(f"{csv_path.name}: unreadable ({exc})")
    for run_dir in sorted(p for p in (run.work / "runs").glob("*") if p.is_dir()):
        path = run_dir / "validation.json"
        if not path.is_file():  # killed midway: what it measured before
            path = run_dir / "validation.partial.json"
        if not path.is_file():
            continue
        try:
            lines += validation_summary(path)
        except Exception as exc:
            lines.append(f"{path}: unreadable ({exc})")
    return "\n".join(lines) + "\n"


def pack(run: Run, summary_text: str) -> list[Path]:
    """OUT gets run.log (already there), summary.md, results.tar.gz of the work directory (split into parts when
    larger than the device returns), and each profile's CSV and JSON while the files stay within MAX_FILES. Every
    file is written under a temporary name and renamed, so OUT never holds half a file. Returns OUT's files."""
    out = run.out
    (out / ".summary.md.tmp").write_text(summary_text)
    os.replace(out / ".summary.md.tmp", out / "summary.md")
    archive = out / ".results.tar.gz.tmp"
    with tarfile.open(archive, "w:gz") as tar:
        for sub in ("profiles", "runs", "logs"):
            if (run.work / sub).exists():
                tar.add(run.work / sub, arcname=sub)
    for old in out.glob("results.tar.gz*"):
        old.unlink()
    size = archive.stat().st_size
    if size <= MAX_FILE_BYTES:
        os.replace(archive, out / "results.tar.gz")
    else:  # reassemble with `cat results.tar.gz.part* > results.tar.gz`
        data = archive.read_bytes()
        archive.unlink()
        for i in range(math.ceil(len(data) / MAX_FILE_BYTES)):
            (out / f"results.tar.gz.part{i}").write_bytes(data[i * MAX_FILE_BYTES:(i + 1) * MAX_FILE_BYTES])
    for old in out.glob("*.csv"):
        old.unlink()
    for old in out.glob("*.json"):
        old.unlink()
    room = MAX_FILES - len([p for p in out.iterdir() if p.is_file()])
    for csv_path in sorted(run.profiles.glob("*.csv")):
        meta = csv_path.with_suffix(".json")
        if room < 2 or not meta.is_file():
            break
        if csv_path.stat().st_size + meta.stat().st_size > 2 * MAX_FILE_BYTES:
            continue
        shutil.copyfile(csv_path, out / csv_path.name)
        shutil.copyfile(meta, out / meta.name)
        room -= 2
    return sorted(p for p in out.iterdir() if p.is_file())


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="what the device returns: at most 8 files land here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a rehearsal (eager rows only)")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole run (default 540)")
    p.add_argument("--workloads", nargs="+", default=["dflash-llama-3.1-8b", "suffix-llama-3.1-8b"],
                   help="workload names under --workload-dir, profiled and validated in this order")
    p.add_argument("--workload-dir", type=Path, default=ROOT / "workloads")
    p.add_argument("--work", type=Path, help="where profiles and runs are written (default: a new temp directory)")
    p.add_argument("--max-widths", type=int, help="passed to each profile (a short rehearsal; on the GPU the time "
                                                    "plan decides)")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS, help=f"longest validation trace (default {MAX_STEPS})")
    p.add_argument("--validate-profiles", type=Path,
                   help="validate <workload>.csv from this directory instead of the profiles measured here (a CPU "
                        "rehearsal: a CPU profile has no graph rows to solve on)")
    args = p.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="cgtune-run-"))
    run = Run(out=args.out, work=work, device=args.device, workload_dir=args.workload_dir,
              validate_profiles=args.validate_profiles, log=Log(args.out / "run.log"),
              env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)), max_widths=args.max_widths,
              max_steps=args.max_steps)
    for sub in (run.profiles, run.logs, run.work / "runs"):
        sub.mkdir(parents=True, exist_ok=True)
    weights = {"dflash-llama-3.1-8b": (165.0, 110.0), "suffix-llama-3.1-8b": (125.0, 70.0)}
    stages = plan_stages(args.workloads, [weights.get(w, (145.0, 90.0))[0] for w in args.workloads],
                         [weights.get(w, (145.0, 90.0))[1] for w in args.workloads])
    run.log(f"== cgtune device run in {ROOT} -> {args.out} (work: {work}); device {args.device}, budget "
            f"{args.budget_s:.0f} s")
    _environment(run)
    signal.signal(signal.SIGTERM, _interrupt)  # an outer `timeout`: stop the stage, pack, print the summary
    actions = {"profile": profile_stage, "validate": validate_stage, "gpu-tests": tests_stage}
    try:
        for i, stage in enumerate(stages):
            left_s = deadline - time.monotonic() - PACK_RESERVE_S
            seconds = share_s(stages, i, left_s)
            if seconds < stage.floor_s:
                stage.outcome = f"skipped: {seconds:.0f} s left for it, floor {stage.floor_s:.0f} s"
                run.log(f"== {stage.name}: {stage.outcome}")
                continue
            stage.budget_s = seconds
            run.log(f"== {stage.name}: {seconds:.0f} s ({left_s:.0f} s left)")
            t0 = time.monotonic()
            try:
                actions[stage.kind](run, stage, seconds)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one stage's failure must not cost the others
                stage.outcome = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            stage.used_s = time.monotonic() - t0
            run.log(f"== {stage.name}: {stage.outcome} ({stage.used_s:.0f} s)")
            pack(run, summary(run, stages, started, args.budget_s))  # what is done is in OUT now
    except KeyboardInterrupt:
        run.log("== interrupted: packing what was written")
    text = summary(run, stages, started, args.budget_s)
    files = pack(run, text)
    run.log("== OUT: " + ", ".join(f"{f.name} ({f.stat().st_size:,} B)" for f in files))
    run.log(text)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _environment(run: Run) -> None:
    """What ran where: torch, CUDA, the GPU (the log's first lines)."""
    probe = ("import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', "
             "torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run.env, timeout=120)
    run.log((done.stdout + done.stderr).strip())


if __name__ == "__main__":
    sys.exit(main())
